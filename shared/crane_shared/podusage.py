"""Per-pod measured usage from Prometheus: one query per metric per round, for all pods at once.

Shared by the annotator (batch usage, reclaimable capacity, ``crane.io/pod-usage``) and the descheduler (victims'
usage). cAdvisor's series (the kubelet's ``/metrics/cadvisor``; the sandbox's fleet exports the same names and
labels): ``container_cpu_usage_seconds_total`` (a counter: its rate is cores) and
``container_memory_working_set_bytes``, per container, summed per pod. The pause container (``container="POD"``)
and the pod-level cgroup series (``container=""``) are left out so nothing is counted twice. A sample without its
labels, or whose value is not a finite non-negative number, is dropped and counted; a pod missing from either
answer has no usage (callers treat it as unmeasured, never as idle).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence

from crane_shared.batch import PodUsage
from crane_shared.prometheus import PrometheusError, QueryClient, QueryResult, Series

__all__ = [
    "CPU_METRIC",
    "MEMORY_METRIC",
    "MEMORY_QUERY",
    "combine",
    "cpu_query",
    "fetch_pod_usage",
    "per_pod",
]

CPU_METRIC = "container_cpu_usage_seconds_total"
MEMORY_METRIC = "container_memory_working_set_bytes"
_CONTAINERS = 'container!="",container!="POD"'


def cpu_query(window_seconds: float) -> str:
    window = max(1, round(window_seconds))
    return f"sum by (namespace, pod) (rate({CPU_METRIC}{{{_CONTAINERS}}}[{window}s]))"


MEMORY_QUERY = f"sum by (namespace, pod) ({MEMORY_METRIC}{{{_CONTAINERS}}})"


def per_pod(series: Sequence[Series]) -> tuple[dict[str, float], int]:
    """``namespace/pod`` -> value, and how many samples were dropped."""
    out: dict[str, float] = {}
    dropped = 0
    for s in series:
        namespace, pod = s.labels.get("namespace"), s.labels.get("pod")
        try:
            value = float(s.value)
        except ValueError:
            value = math.nan
        if not namespace or not pod or not math.isfinite(value) or value < 0:
            dropped += 1
            continue
        out[f"{namespace}/{pod}"] = value
    return out, dropped


def combine(cpu: Mapping[str, float], memory: Mapping[str, float]) -> dict[str, PodUsage]:
    """Pods measured in both answers only."""
    return {key: PodUsage(cpu[key], memory[key]) for key in cpu.keys() & memory.keys()}


async def fetch_pod_usage(client: QueryClient, window_seconds: float) -> tuple[dict[str, PodUsage], int]:
    """Both queries, concurrently; raises ``PrometheusError`` when either fails or is partial. A partial answer (a
    Thanos store or replica down, VictoriaMetrics' ``isPartial``) is refused whatever
    ``--prometheus-partial-response`` says for node metrics: a pod missing from it would read as gone (its usage
    leaving the node), which an eviction or a batch allowance must not act on. Callers keep their last whole
    answer instead."""
    cpu_result, memory_result = await asyncio.gather(
        client.query(cpu_query(window_seconds)), client.query(MEMORY_QUERY)
    )
    cpu, dropped_cpu = per_pod(_whole(cpu_result, CPU_METRIC))
    memory, dropped_memory = per_pod(_whole(memory_result, MEMORY_METRIC))
    return combine(cpu, memory), dropped_cpu + dropped_memory


def _whole(result: QueryResult, metric: str) -> list[Series]:
    if result.partial:
        raise PrometheusError("bad_response", f"{metric}: partial answer ({'; '.join(result.warnings)[:200]})")
    return result.series
