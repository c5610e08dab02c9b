"""crane-annotator: node load (Prometheus) and hot value (Redis) as node annotations; see README.md."""
