"""Load-aware scheduling: crane's Dynamic policy (Filter and Score over node load annotations), pure."""
