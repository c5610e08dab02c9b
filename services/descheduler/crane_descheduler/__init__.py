"""crane-descheduler: evicts pods from nodes whose measured load stays above the scheduler policy's thresholds."""
