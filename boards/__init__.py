"""somatile.boards."""
