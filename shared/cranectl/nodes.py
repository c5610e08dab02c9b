"""``cranectl nodes``: what the load-aware scheduler sees of each node, in one table.

Per node: the real usage of every policy metric (from the annotator's annotations; ``!`` marks a value above
the policy's threshold, ``?`` one that is stale or unreadable), the CPU and memory requested by the pods bound
to it against its allocatable, its hot value, and the age of its oldest usage annotation. Rendering is a pure
function of the API objects, so it is tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from crane_shared.annotations import (
    HOT_VALUE_KEY,
    AnnotationError,
    Freshness,
    annotation_key,
    decode,
    freshness,
    metric_freshness_window,
)
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
    rows = []
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        name = str(node["metadata"]["name"])
        annotations = node["metadata"].get("annotations") or {}
        usage: dict[str, str] = {}
        oldest: datetime | None = None
        for metric in policy.metrics():
            text = annotations.get(annotation_key(metric))
            if text is None:
                usage[metric] = "-"
                continue
            try:
                sample = decode(text)
            except AnnotationError:
                usage[metric] = "?"
                continue
            mark = ""
            if freshness(sample.timestamp, now, metric_freshness_window(policy.period_of(metric))) != Freshness.FRESH:
                mark = "?"
            elif metric in thresholds and sample.value > thresholds[metric]:
                mark = "!"
            usage[metric] = f"{sample.value:.2f}{mark}"
            oldest = sample.timestamp if oldest is None or sample.timestamp < oldest else oldest
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
