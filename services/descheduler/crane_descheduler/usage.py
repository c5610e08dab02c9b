"""Per-pod measured usage from Prometheus: one query per metric per round, for all pods at once.

cAdvisor's series (the kubelet's ``/metrics/cadvisor``; the sandbox's fleet exports the same names and labels):
``container_cpu_usage_seconds_total`` (a counter: its rate is cores) and ``container_memory_working_set_bytes``,
per container, summed per pod. The pause container (``container="POD"``) and the pod-level cgroup series
(``container=""``) are left out so nothing is counted twice. A sample without its labels, or whose value is not
a finite non-negative number, is dropped and counted; a pod missing from either answer has no usage and is
never chosen (no eviction on missing data).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from crane_descheduler.plan import PodUsage
from crane_shared.prometheus import PrometheusError, QueryClient, QueryResult, Series

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


def combine(cpu: dict[str, float], memory: dict[str, float]) -> dict[str, PodUsage]:
    """Pods measured in both answers only."""
    return {key: PodUsage(cpu[key], memory[key]) for key in cpu.keys() & memory.keys()}


async def fetch_usage(client: QueryClient, window_seconds: float) -> tuple[dict[str, PodUsage], int]:
    """Both queries; raises ``PrometheusError`` when either fails or is partial (the caller evicts nothing that
    round). A partial answer (a Thanos store or replica down, VictoriaMetrics' ``isPartial``) is refused whatever
    ``--prometheus-partial-response`` says for the annotator: an eviction is not undone, so it waits for whole data."""
    cpu, dropped_cpu = per_pod(_whole(await client.query(cpu_query(window_seconds)), CPU_METRIC))
    memory, dropped_memory = per_pod(_whole(await client.query(MEMORY_QUERY), MEMORY_METRIC))
    return combine(cpu, memory), dropped_cpu + dropped_memory


def _whole(result: QueryResult, metric: str) -> list[Series]:
    if result.partial:
        raise PrometheusError("bad_response", f"{metric}: partial answer ({'; '.join(result.warnings)[:200]})")
    return result.series
