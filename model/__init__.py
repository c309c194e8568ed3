"""somatile.model."""
