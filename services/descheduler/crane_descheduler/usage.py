"""Per-pod measured usage from Prometheus: the shared queries (``crane_shared.podusage``), read by the plan as
``crane_shared.batch.PodUsage``. A pod missing from either answer has no usage and is never chosen (no eviction on
missing data); a failed or partial answer raises ``PrometheusError`` (the caller evicts nothing that round)."""

from __future__ import annotations

from crane_shared.podusage import CPU_METRIC, MEMORY_METRIC, MEMORY_QUERY, combine, cpu_query, per_pod
from crane_shared.podusage import fetch_pod_usage as fetch_usage

__all__ = ["CPU_METRIC", "MEMORY_METRIC", "MEMORY_QUERY", "combine", "cpu_query", "fetch_usage", "per_pod"]
