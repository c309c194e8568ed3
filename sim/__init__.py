"""somatile.sim."""
