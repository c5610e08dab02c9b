"""Per-pod measured usage from Prometheus: the shared queries (``crane_shared.podusage``) as the plan's
``PodUsage``. A pod missing from either answer has no usage and is never chosen (no eviction on missing data)."""

from __future__ import annotations

from collections.abc import Mapping

from crane_descheduler.plan import PodUsage
from crane_shared import batch, podusage
from crane_shared.podusage import CPU_METRIC, MEMORY_METRIC, MEMORY_QUERY, cpu_query, per_pod
from crane_shared.prometheus import QueryClient

__all__ = ["CPU_METRIC", "MEMORY_METRIC", "MEMORY_QUERY", "combine", "cpu_query", "fetch_usage", "per_pod"]


def _plan(usage: Mapping[str, batch.PodUsage]) -> dict[str, PodUsage]:
    return {key: PodUsage(u.cpu_cores, u.memory_bytes) for key, u in usage.items()}


def combine(cpu: Mapping[str, float], memory: Mapping[str, float]) -> dict[str, PodUsage]:
    """Pods measured in both answers only."""
    return _plan(podusage.combine(cpu, memory))


async def fetch_usage(client: QueryClient, window_seconds: float) -> tuple[dict[str, PodUsage], int]:
    """``crane_shared.podusage.fetch_pod_usage``: raises ``PrometheusError`` on a failed or partial answer (the
    caller evicts nothing that round)."""
    usage, dropped = await podusage.fetch_pod_usage(client, window_seconds)
    return _plan(usage), dropped
