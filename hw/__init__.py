"""somatile.hw."""
