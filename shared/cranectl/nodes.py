"""``cranectl nodes``: what the load-aware scheduler sees of each node, in one table.

Per node: the real usage of every policy metric (the annotator's annotations, read by ``node_load`` as the
Dynamic plugin reads them; ``!`` marks a value above the policy's threshold, ``?`` one that is stale or
unreadable), the CPU and memory requested by the pods bound to it against its allocatable, its hot value, and the
age of its oldest usage annotation. Rendering is a pure function of the API objects, so it is tested without a
cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from crane_shared.annotations import HOT_VALUE_KEY, AnnotationError, decode
from crane_shared.loadaware.dynamic import DynamicArgs, MetricReading, node_load
from crane_shared.policy import DynamicSchedulerPolicy
from crane_shared.quantity import parse_quantity

GI = 1024**3


@dataclass(frozen=True)
class NodeRow:
    name: str
    usage: dict[str, str]
    cpu_requested: float
    cpu_allocatable: float
    mem_requested: float
    mem_allocatable: float
    hot: str
    age: str


def pod_requests(pod: Mapping[str, Any]) -> tuple[float, float]:
    """(cores, bytes) requested by a pod's containers, as kube-scheduler counts a pod without init containers."""
    cpu = mem = 0.0
    for container in pod.get("spec", {}).get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        cpu += float(parse_quantity(requests.get("cpu", "0")))
        mem += float(parse_quantity(requests.get("memory", "0")))
    return cpu, mem


def node_rows(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], policy: DynamicSchedulerPolicy, now: datetime
) -> list[NodeRow]:
    requested: dict[str, tuple[float, float]] = {}
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        if not node or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        cpu, mem = pod_requests(pod)
        before = requested.get(node, (0.0, 0.0))
        requested[node] = (before[0] + cpu, before[1] + mem)
    thresholds = {p.name: p.max_limit_percent for p in policy.predicate}
    args = DynamicArgs(policy)
    rows = []
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        name = str(node["metadata"]["name"])
        annotations = node["metadata"].get("annotations") or {}
        readings = node_load(name, annotations, args, now).readings
        usage = {metric: _usage_cell(reading, thresholds.get(metric)) for metric, reading in readings.items()}
        stamps = [r.timestamp for r in readings.values() if r.timestamp is not None]
        oldest = min(stamps, default=None)
        hot = annotations.get(HOT_VALUE_KEY)
        try:
            hot_text = str(int(decode(hot).value)) if hot else "-"
        except AnnotationError:
            hot_text = "?"
        allocatable = node.get("status", {}).get("allocatable") or {}
        cpu_req, mem_req = requested.get(name, (0.0, 0.0))
        rows.append(
            NodeRow(
                name=name,
                usage=usage,
                cpu_requested=cpu_req,
                cpu_allocatable=float(parse_quantity(allocatable.get("cpu", "0"))),
                mem_requested=mem_req,
                mem_allocatable=float(parse_quantity(allocatable.get("memory", "0"))),
                hot=hot_text,
                age="-" if oldest is None else f"{max(0, round((now - oldest).total_seconds()))}s",
            )
        )
    return rows


def _usage_cell(reading: MetricReading, threshold: float | None) -> str:
    """The annotated value as the scheduler reads it: ``-`` missing, ``?`` unreadable or not fresh, ``!`` above
    the threshold."""
    if reading.state == "missing":
        return "-"
    if reading.annotated is None:
        return "?"
    mark = "?" if reading.state != "fresh" else "!" if threshold is not None and reading.annotated > threshold else ""
    return f"{reading.annotated:.2f}{mark}"


def render(rows: list[NodeRow], policy: DynamicSchedulerPolicy) -> str:
    metrics = policy.metrics()
    header = ["NODE", *metrics, "CPU REQ", "MEM REQ", "HOT", "AGE"]
    table = [header]
    for r in rows:
        table.append(
            [
                r.name,
                *(r.usage.get(m, "-") for m in metrics),
                f"{r.cpu_requested:g}/{r.cpu_allocatable:g}",
                f"{r.mem_requested / GI:.1f}/{r.mem_allocatable / GI:.0f}Gi",
                r.hot,
                r.age,
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    thresholds = ", ".join(f"{p.name} {p.max_limit_percent:g}" for p in policy.predicate)
    lines.append(f"(usage: fraction of the node; ! above threshold [{thresholds}], ? stale or unreadable)")
    return "\n".join(lines)
