"""Batch pods and per-pod usage on nodes: the contract between the annotator, the scheduler and the descheduler.

A **batch** pod runs on capacity that real usage leaves idle: it requests the extended resources the annotator
publishes in node status (``crane.io/batch-cpu`` in millicores, ``crane.io/batch-memory`` in bytes). kube's
NodeResourcesFit counts extended resources, so crane-scheduler and the stock kube-scheduler both place it. Every
other pod is **regular**.

The annotator writes, in the same patch as the usage annotations:

- ``batch.crane.io/<metric>`` (``batch_metric_key``), per policy metric: the batch pods' share of that metric,
  ``"<fraction>,<timestamp>"`` (the usage codec), with the metric's own timestamp. It comes from a Prometheus
  expression (``spec.reclaim.batchMetrics``, a recording rule in the same group as the metric's) that averages
  the sum of the batch pods' usage on the node over the metric's window and instants, zero where none ran, and
  is queried in the same round as the metric: ``metric - share`` is the regular pods' (and the system's) usage
  at every instant. A regular pod is judged by it (batch work yields to regular work); a batch pod by the whole
  usage. The share counts only with the same timestamp as its metric (``same_round``): one from another round
  (its query failed, its node was missing from the answer) takes nothing out, so the reading fails closed.
- ``crane.io/batch-cpu-usage`` and ``crane.io/batch-memory-usage``: the batch pods' usage now as a fraction of
  the node's capacity (``cranectl nodes``; and, for a metric without its own share, the older approximation:
  taken out of every metric of the resource while fresh). A value now is not inside a window average yet, so a
  regular pod would read a node whose batch pods just started as emptier than it is; hence the per-metric share.
- ``crane.io/pod-usage``: every measured pod on the node, ``{"t": "<timestamp>", "p": {"<namespace>/<name>":
  [cpu_cores, memory_bytes]}}`` (compact JSON). Preemption's what-if takes its victims' usage out of the node, and
  the learned estimate reads a workload's running pods from it.

Pure: no I/O. Decoding raises only ``PodUsageError`` so callers skip, count and log once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from crane_shared.annotations import AnnotationError, annotation_key, decode, format_timestamp
from crane_shared.quantity import parse_quantity

BATCH_CPU = "crane.io/batch-cpu"
"""Extended resource, millicores of reclaimable CPU."""
BATCH_MEMORY = "crane.io/batch-memory"
"""Extended resource, bytes of reclaimable memory."""
BATCH_RESOURCES = (BATCH_CPU, BATCH_MEMORY)

BATCH_CPU_USAGE_KEY = "crane.io/batch-cpu-usage"
BATCH_MEMORY_USAGE_KEY = "crane.io/batch-memory-usage"
POD_USAGE_KEY = "crane.io/pod-usage"
BATCH_METRIC_PREFIX = "batch.crane.io/"
"""prefix of the per-metric batch shares: ``batch.crane.io/<the metric's annotation key>``"""


def batch_metric_key(metric: str) -> str:
    """The annotation holding the batch pods' share of ``metric`` (the metric's own key after the prefix)."""
    return BATCH_METRIC_PREFIX + annotation_key(metric)


def same_round(share_at: datetime, metric_at: datetime | None) -> bool:
    """Whether a batch share was written with its metric (the same round's timestamp): only then is ``metric -
    share`` measured over the same samples."""
    return metric_at is not None and share_at == metric_at


class PodUsageError(ValueError):
    """A ``crane.io/pod-usage`` annotation that cannot be read; the message names what is wrong."""


@dataclass(frozen=True)
class PodUsage:
    """Measured usage of one pod: CPU in cores, memory (working set) in bytes."""

    cpu_cores: float
    memory_bytes: float

    def of(self, resource: str) -> float:
        """The usage of ``resource`` (``cpu`` in cores, anything else memory in bytes)."""
        return self.cpu_cores if resource == "cpu" else self.memory_bytes


@dataclass(frozen=True)
class NodePodUsage:
    """The pods measured on one node at ``at``, by ``namespace/name``."""

    at: datetime
    pods: Mapping[str, PodUsage]


def _requests_batch(resources: Mapping[str, Any] | None) -> bool:
    for section in ("requests", "limits"):
        named = (resources or {}).get(section) or {}
        if any(name in named for name in BATCH_RESOURCES):
            return True
    return False


def is_batch(spec: Mapping[str, Any] | None) -> bool:
    """A pod is batch when any container, init container or the pod itself names a batch resource."""
    spec = spec or {}
    if _requests_batch(spec.get("resources")):
        return True
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or ():
            if _requests_batch(container.get("resources")):
                return True
    return False


def regular_resources_of_batch_pod(spec: Mapping[str, Any] | None) -> str | None:
    """For a batch pod, the first non-zero cpu or memory request or limit it sets, as a field path
    (``spec.containers[0].resources.requests.cpu``); None for a regular pod or a batch pod without any.

    A batch pod must be BestEffort: that is what protects the regular pods beside it (lowest CPU shares, first OOM
    victim). A cpu or memory request would count against the node's regular requests, which the loan is not, and
    would make it Burstable (CPU shares by its request, OOM-killed after BestEffort pods); a limit alone becomes
    the request by the API server's defaulting. Schedulers refuse such a pod (``batch_refusal``)."""
    spec = spec or {}
    if not is_batch(spec):
        return None
    places: list[tuple[str, Mapping[str, Any] | None]] = [("spec.resources", spec.get("resources"))]
    for key in ("initContainers", "containers"):
        places += [(f"spec.{key}[{i}].resources", c.get("resources")) for i, c in enumerate(spec.get(key) or ())]
    for where, resources in places:
        for section in ("requests", "limits"):
            named = (resources or {}).get(section) or {}
            for resource in ("cpu", "memory"):
                if resource in named and not _zero(named[resource]):
                    return f"{where}.{section}.{resource}"
    return None


def _zero(value: Any) -> bool:
    try:
        return parse_quantity(value) == 0
    except (TypeError, ValueError):
        return False


def batch_refusal(path: str) -> str:
    """Why a batch pod with regular resources is not placed (its FailedScheduling message)."""
    return (
        f"batch pod sets {path}: a pod requesting crane.io/batch-cpu or crane.io/batch-memory must request no cpu "
        "or memory (they would count against the node's regular requests and make it Burstable instead of "
        "BestEffort, which is what protects the regular pods); ask for crane.io/batch-* only"
    )


def encode_pod_usage(pods: Mapping[str, PodUsage], at: datetime) -> str:
    """Compact JSON, keys sorted (equal inputs give equal text, so an unchanged node is not rewritten)."""
    body = {
        key: [round(u.cpu_cores, 3), round(u.memory_bytes)]
        for key, u in sorted(pods.items())
        if math.isfinite(u.cpu_cores) and math.isfinite(u.memory_bytes) and u.cpu_cores >= 0 and u.memory_bytes >= 0
    }
    return json.dumps({"t": format_timestamp(at), "p": body}, separators=(",", ":"))


def decode_pod_usage(text: str) -> NodePodUsage:
    """Read ``crane.io/pod-usage``; any malformed entry refuses the whole annotation (never half a node)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise PodUsageError(f"{POD_USAGE_KEY}: not JSON ({e.msg})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("t"), str) or not isinstance(raw.get("p"), dict):
        raise PodUsageError(f'{POD_USAGE_KEY}: expected {{"t": "<timestamp>", "p": {{...}}}}')
    try:
        at = decode(f"0,{raw['t']}").timestamp
    except AnnotationError as e:
        raise PodUsageError(f"{POD_USAGE_KEY}.t: {e}") from None
    pods: dict[str, PodUsage] = {}
    for key, value in raw["p"].items():
        if (
            "/" not in key
            or not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
            or not all(math.isfinite(v) and v >= 0 for v in value)
        ):
            raise PodUsageError(f"{POD_USAGE_KEY}.p[{key!r}]: expected [cpu_cores, memory_bytes], got {value!r}")
        pods[key] = PodUsage(float(value[0]), float(value[1]))
    return NodePodUsage(at, pods)


# --- withdrawing a loan ------------------------------------------------------------------------------------------
# A loan outlives its lender unless someone takes it back: batch pods would keep landing on capacity nobody
# measures. The annotator withdraws it when spec.reclaim is removed (or was absent at start) and when a node's
# inputs go stale; ``cranectl withdraw-batch`` (the chart's pre-delete hook) when the annotator is uninstalled.
# Three merge patches per node, in this order: the extended resources to 0 in node status (no new batch pod fits
# from then on, also if the next steps fail), then removed from it, then the batch annotations removed.

BATCH_ANNOTATION_KEYS = (BATCH_CPU_USAGE_KEY, BATCH_MEMORY_USAGE_KEY, POD_USAGE_KEY)
"""the per-resource batch usage and the per-pod usage the batch part of a round writes (beside the per-metric
shares, ``batch.crane.io/<metric>``)"""


def batch_annotations(annotations: Mapping[str, Any] | None) -> list[str]:
    """The keys among a node's annotations that the annotator's batch part writes."""
    return sorted(
        key for key in (annotations or {}) if key in BATCH_ANNOTATION_KEYS or key.startswith(BATCH_METRIC_PREFIX)
    )


def lent(status: Mapping[str, Any] | None) -> dict[str, str]:
    """The batch resources in a node's status (capacity or allocatable) as written: resource -> quantity."""
    status = status or {}
    out: dict[str, str] = {}
    for section in ("allocatable", "capacity"):
        for resource in BATCH_RESOURCES:
            value = (status.get(section) or {}).get(resource)
            if value is not None:
                out.setdefault(resource, str(value))
    return out


def loan_status(cpu_milli: int | None, memory_bytes: int | None) -> dict[str, Any]:
    """The ``nodes/status`` merge patch of a loan: the same values as capacity and allocatable (integers: extended
    resources take no fractions); None removes the resource."""
    resources = {
        BATCH_CPU: None if cpu_milli is None else str(cpu_milli),
        BATCH_MEMORY: None if memory_bytes is None else str(memory_bytes),
    }
    return {"status": {"capacity": resources, "allocatable": dict(resources)}}


WITHDRAW_TO_ZERO = loan_status(0, 0)
WITHDRAW_REMOVE = loan_status(None, None)


def removed_annotations(keys: list[str]) -> dict[str, Any]:
    """The merge patch removing ``keys`` from a node's annotations."""
    return {"metadata": {"annotations": dict.fromkeys(keys)}}
