"""crane_scheduler."""
