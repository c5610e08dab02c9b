"""``cranectl nodes``: what the load-aware scheduler sees of each node, in one table.

Per node: the real usage of every policy metric (the annotator's annotations, read by ``node_load`` as the
Dynamic plugin reads them; ``!`` marks a value above the policy's threshold, ``?`` one that is stale or
unreadable; ``r`` then the regular usage, the metric less the batch pods' share of it as a regular pod is judged,
where a share is taken), the CPU and memory requested by the pods bound to it against its allocatable, its hot
value, and the age of its oldest usage annotation; with the policy's ``spec.loadTaint`` (or nodes carrying it), the
annotator's ``crane.io/load-hot`` taint. With batch capacity (the policy's ``spec.reclaim``, or nodes
publishing it): the ``crane.io/batch-cpu`` / ``crane.io/batch-memory`` the batch pods request against what the
node lends, and what they use (the annotator's ``crane.io/batch-*-usage``). Rendering is a pure function of the
API objects, so it is tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from crane_shared.annotations import HOT_VALUE_KEY, AnnotationError, decode
from crane_shared.batch import BATCH_CPU, BATCH_CPU_USAGE_KEY, BATCH_MEMORY, BATCH_MEMORY_USAGE_KEY
from crane_shared.loadaware.dynamic import DynamicArgs, MetricReading, node_load
from crane_shared.loadtaintpolicy import OPT_OUT_KEY, is_ours
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
    batch_cpu: str = "-"
    """batch pods' crane.io/batch-cpu requests / the node's reclaimable (cores) (their measured use)"""
    batch_mem: str = "-"
    load_taint: str = "-"
    """the annotator's ``crane.io/load-hot`` taint: its effect and metric, ``off`` (opted out), ``-`` (none)"""


def pod_requests(pod: Mapping[str, Any], cpu_name: str = "cpu", memory_name: str = "memory") -> tuple[float, float]:
    """(cores, bytes) requested by a pod's containers, as kube-scheduler counts a pod without init containers
    (``crane.io/batch-cpu`` is in millicores: pass it as ``cpu_name`` and divide by 1000)."""
    cpu = mem = 0.0
    for container in pod.get("spec", {}).get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        cpu += float(parse_quantity(requests.get(cpu_name, "0")))
        mem += float(parse_quantity(requests.get(memory_name, "0")))
    return cpu, mem


def _batch_cell(requested: float, lent: Any, usage_text: str | None, used_total: float, scale: float, unit: str) -> str:
    """``requested/lent (used)`` in cores or GiB (requests and the lent capacity are in millicores or bytes, the
    use a fraction of ``used_total`` cores or GiB); ``-`` when the node lends nothing and nothing is requested."""
    try:
        lent_value = float(parse_quantity(lent)) if lent is not None else None
    except ValueError:
        return "?"
    if lent_value is None and not requested:
        return "-"
    used = "-"
    if usage_text:
        try:
            used = f"{decode(usage_text).value * used_total:.1f}"
        except AnnotationError:
            used = "?"
    lent_text = "-" if lent_value is None else f"{lent_value / scale:.1f}"
    return f"{requested / scale:.1f}/{lent_text}{unit} ({used})"


def node_rows(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], policy: DynamicSchedulerPolicy, now: datetime
) -> list[NodeRow]:
    requested: dict[str, tuple[float, float]] = {}
    batch: dict[str, tuple[float, float]] = {}
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        if not node or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for into, names in ((requested, ("cpu", "memory")), (batch, (BATCH_CPU, BATCH_MEMORY))):
            cpu, mem = pod_requests(pod, *names)
            before = into.get(node, (0.0, 0.0))
            into[node] = (before[0] + cpu, before[1] + mem)
    thresholds = {p.name: p.max_limit_percent for p in policy.predicate}
    args = DynamicArgs(policy)
    rows = []
    for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
        name = str(node["metadata"]["name"])
        annotations = node["metadata"].get("annotations") or {}
        readings = node_load(name, annotations, args, now, regular=True).readings
        usage = {metric: _usage_cell(reading, thresholds.get(metric)) for metric, reading in readings.items()}
        stamps = [r.timestamp for r in readings.values() if r.timestamp is not None]
        oldest = min(stamps, default=None)
        hot = annotations.get(HOT_VALUE_KEY)
        try:
            hot_text = str(int(decode(hot).value)) if hot else "-"
        except AnnotationError:
            hot_text = "?"
        allocatable = node.get("status", {}).get("allocatable") or {}
        capacity = node.get("status", {}).get("capacity") or allocatable
        cpu_req, mem_req = requested.get(name, (0.0, 0.0))
        batch_cpu, batch_mem = batch.get(name, (0.0, 0.0))
        cores = float(parse_quantity(capacity.get("cpu", "0")))
        memory_gib = float(parse_quantity(capacity.get("memory", "0"))) / GI
        ours = next((t for t in (node.get("spec") or {}).get("taints") or [] if is_ours(t)), None)
        opted_out = str(annotations.get(OPT_OUT_KEY, "")).strip().lower() == "off"
        taint = f"{ours.get('effect')} ({ours.get('value') or '?'})" if ours else "off" if opted_out else "-"
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
                batch_cpu=_batch_cell(
                    batch_cpu, allocatable.get(BATCH_CPU), annotations.get(BATCH_CPU_USAGE_KEY), cores, 1000, ""
                ),
                batch_mem=_batch_cell(
                    batch_mem,
                    allocatable.get(BATCH_MEMORY),
                    annotations.get(BATCH_MEMORY_USAGE_KEY),
                    memory_gib,
                    GI,
                    "Gi",
                ),
                load_taint=taint,
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

    def marked(value: float) -> str:
        over = threshold is not None and value > threshold
        return f"{value:.2f}{'?' if reading.state != 'fresh' else '!' if over else ''}"

    regular = reading.usage
    return marked(reading.annotated) + (f" r{marked(regular)}" if reading.batch and regular is not None else "")


def render(rows: list[NodeRow], policy: DynamicSchedulerPolicy) -> str:
    metrics = policy.metrics()
    batch = policy.reclaim is not None or any(r.batch_cpu != "-" or r.batch_mem != "-" for r in rows)
    taint = policy.load_taint is not None or any(r.load_taint != "-" for r in rows)
    header = [
        "NODE",
        *metrics,
        "CPU REQ",
        "MEM REQ",
        *(["BATCH CPU", "BATCH MEM"] if batch else []),
        "HOT",
        "AGE",
        *(["LOAD TAINT"] if taint else []),
    ]
    table = [header]
    for r in rows:
        table.append(
            [
                r.name,
                *(r.usage.get(m, "-") for m in metrics),
                f"{r.cpu_requested:g}/{r.cpu_allocatable:g}",
                f"{r.mem_requested / GI:.1f}/{r.mem_allocatable / GI:.0f}Gi",
                *([r.batch_cpu, r.batch_mem] if batch else []),
                r.hot,
                r.age,
                *([r.load_taint] if taint else []),
            ]
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]
    thresholds = ", ".join(f"{p.name} {p.max_limit_percent:g}" for p in policy.predicate)
    lines.append(
        f"(usage: fraction of the node; ! above threshold [{thresholds}], ? stale or unreadable; r: regular usage, "
        "less the batch pods' share)"
    )
    if taint:
        lines.append(
            "(load taint: crane.io/load-hot set by the annotator on nodes hot by the policy (effect and metric); "
            'off: the node opted out with crane.io/load-taint: "off")'
        )
    if batch:
        lines.append(
            "(batch: crane.io/batch-* requested by batch pods / reclaimable capacity the node lends (batch use))"
        )
    return "\n".join(lines)
