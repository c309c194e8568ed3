"""somatile.host."""
