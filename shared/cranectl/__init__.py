"""cranectl."""
