"""The ``spec.reclaim`` section of the ``DynamicSchedulerPolicy``: how the annotator computes and publishes the
capacity real usage leaves idle, for batch pods (``crane.io/batch-cpu``, ``crane.io/batch-memory``).

Absent, nothing is reclaimed and no batch annotation is written. Present (``reclaim: {}`` takes every default),
koordinator's choices with its defaults (``pkg/util/sloconfig/colocation_config.go``)::

    reclaim:
      cpu:    {policy: usage, reclaimThreshold: 0.60, nodeMetric: cpu_usage_avg_5m}
      memory: {policy: usage, reclaimThreshold: 0.65, nodeMetric: mem_usage_avg_5m}
      podUsageWindow: 5m        # rate window of the pods' CPU counters
      degradeAfter: 15m         # inputs older than this: reclaimable falls to zero (koordinator degradeTimeMinutes)
      changeThreshold: 0.1      # rewrite node status when a value moves by more than this fraction of capacity
      maxAge: 5m                # ... or when the last write is this old (koordinator updateTimeThresholdSeconds)
      batchMetrics:             # per policy metric, PromQL for the batch pods' share of it (none by default)
        mem_usage_avg_5m: batch_mem_usage_avg_5m

``batchMetrics``: for a CPU or memory metric of ``syncPolicy``, an expression (a recording rule name, as the
metric's own name is) giving each node's batch pods' share of that metric, in the metric's units and labels,
measured over the metric's own window and instants (``crane_shared.batch``; the rules in
``deploy/helm/crane-scheduler/files/recording-rules.yml``). The annotator queries it in the same round as the
metric and writes it as ``batch.crane.io/<metric>`` with the metric's timestamp. A metric without one falls back
to the batch pods' usage now (``crane.io/batch-*-usage``), which lags no window and so under-reads regular usage
right after batch pods start.

``policy`` per resource is koordinator's: ``usage`` (total x threshold - max(system usage, reserved) - usage of
the regular pods), ``request`` (regular pods' requests instead of their usage, and reserved instead of system
usage: fewer batch kills on memory), ``maxUsageRequest`` (the larger of the two per regular pod). A node may
narrow or switch it off with the ``crane.io/batch-reclaim`` annotation (``parse_override``).

Pure: no I/O. Problems are appended to the caller's list, each naming its field path, as every policy reader does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, get_args

from crane_shared.durations import format_duration
from crane_shared.policyyaml import check_keys, describe, duration, number

__all__ = [
    "OVERRIDE_KEY",
    "NodeOverride",
    "OverrideError",
    "ReclaimPolicy",
    "ResourceReclaim",
    "dump_reclaim",
    "parse_override",
    "read_reclaim",
]

Basis = Literal["usage", "request", "maxUsageRequest"]
BASES: tuple[str, ...] = get_args(Basis)

OVERRIDE_KEY = "crane.io/batch-reclaim"
"""Node annotation: ``off``, or ``cpu=<fraction>,memory=<fraction>`` (either left out keeps the policy's)."""


@dataclass(frozen=True)
class ResourceReclaim:
    policy: Basis
    reclaim_threshold: float
    """fraction of the node's capacity that node usage plus batch pods may reach (the rest is the safety margin)"""
    node_metric: str
    """the synced metric (a usage fraction of capacity) read as the node's usage"""


@dataclass(frozen=True)
class ReclaimPolicy:
    cpu: ResourceReclaim = ResourceReclaim("usage", 0.60, "cpu_usage_avg_5m")
    memory: ResourceReclaim = ResourceReclaim("usage", 0.65, "mem_usage_avg_5m")
    pod_usage_window: timedelta = timedelta(minutes=5)
    degrade_after: timedelta = timedelta(minutes=15)
    change_threshold: float = 0.1
    max_age: timedelta = timedelta(minutes=5)
    batch_metrics: tuple[tuple[str, str], ...] = ()
    """(policy metric, PromQL of the batch pods' share of it), sorted by metric"""

    def resource(self, name: str) -> ResourceReclaim:
        return self.cpu if name == "cpu" else self.memory


_KEYS = ("cpu", "memory", "podUsageWindow", "degradeAfter", "changeThreshold", "maxAge", "batchMetrics")
_RESOURCE_KEYS = ("policy", "reclaimThreshold", "nodeMetric")


def read_reclaim(raw: object, synced: set[str], problems: list[str]) -> ReclaimPolicy | None:
    """``spec.reclaim`` as written (None when absent); ``synced`` are the metric names of ``spec.syncPolicy``."""
    if raw is None:
        return None
    path = "spec.reclaim"
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping, got {describe(raw)}")
        return None
    check_keys(raw, path, _KEYS, problems)
    before = len(problems)
    default = ReclaimPolicy()
    cpu = _resource(raw.get("cpu"), f"{path}.cpu", default.cpu, synced, problems)
    memory = _resource(raw.get("memory"), f"{path}.memory", default.memory, synced, problems)
    window = _duration(raw, path, "podUsageWindow", default.pod_usage_window, problems)
    degrade = _duration(raw, path, "degradeAfter", default.degrade_after, problems)
    max_age = _duration(raw, path, "maxAge", default.max_age, problems)
    change = _fraction(raw, path, "changeThreshold", default.change_threshold, problems, upper_open=True)
    shares = _batch_metrics(raw.get("batchMetrics"), f"{path}.batchMetrics", synced, problems)
    if window is not None and window < timedelta(seconds=1):
        problems.append(f"{path}.podUsageWindow: must be at least 1s, got {format_duration(window)!r}")
    if (
        len(problems) > before
        or cpu is None
        or memory is None
        or window is None
        or degrade is None
        or max_age is None
        or change is None
        or shares is None
    ):
        return None
    return ReclaimPolicy(cpu, memory, window, degrade, change, max_age, shares)


def dump_reclaim(policy: ReclaimPolicy) -> dict[str, Any]:
    """The section as YAML data that reads back equal."""

    def resource(r: ResourceReclaim) -> dict[str, Any]:
        return {"policy": r.policy, "reclaimThreshold": r.reclaim_threshold, "nodeMetric": r.node_metric}

    return {
        "cpu": resource(policy.cpu),
        "memory": resource(policy.memory),
        "podUsageWindow": format_duration(policy.pod_usage_window),
        "degradeAfter": format_duration(policy.degrade_after),
        "changeThreshold": policy.change_threshold,
        "maxAge": format_duration(policy.max_age),
        **({"batchMetrics": dict(policy.batch_metrics)} if policy.batch_metrics else {}),
    }


def _resource(
    raw: object, path: str, default: ResourceReclaim, synced: set[str], problems: list[str]
) -> ResourceReclaim | None:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping, got {describe(raw)}")
        return None
    check_keys(raw, path, _RESOURCE_KEYS, problems)
    basis = raw.get("policy", default.policy)
    if basis not in BASES:
        problems.append(f"{path}.policy: must be one of {', '.join(BASES)}, got {describe(basis)}")
        basis = None
    threshold = _fraction(raw, path, "reclaimThreshold", default.reclaim_threshold, problems)
    metric = raw.get("nodeMetric", default.node_metric)
    if not isinstance(metric, str) or not metric:
        problems.append(f"{path}.nodeMetric: must be a metric name, got {describe(metric)}")
        metric = None
    elif metric not in synced:
        problems.append(f'{path}.nodeMetric: metric "{metric}" has no syncPolicy entry')
        metric = None
    if basis is None or threshold is None or metric is None:
        return None
    return ResourceReclaim(basis, threshold, metric)


def _batch_metrics(raw: object, path: str, synced: set[str], problems: list[str]) -> tuple[tuple[str, str], ...] | None:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping of metric name to PromQL, got {describe(raw)}")
        return None
    before = len(problems)
    for metric, query in raw.items():
        if metric not in synced:
            problems.append(f'{path}.{metric}: metric "{metric}" has no syncPolicy entry')
        elif not str(metric).startswith(("cpu", "mem")):
            problems.append(f"{path}.{metric}: not a CPU or memory metric (cpu_*, mem_*): nothing to take it from")
        if not isinstance(query, str) or not query.strip():
            problems.append(f"{path}.{metric}: must be a PromQL expression, got {describe(query)}")
    if len(problems) > before:
        return None
    return tuple(sorted((str(m), str(q).strip()) for m, q in raw.items()))


def _fraction(
    raw: dict[Any, Any], path: str, key: str, default: float, problems: list[str], *, upper_open: bool = False
) -> float | None:
    if key not in raw:
        return default
    value = number(raw, path, key, problems)
    if value is None:
        return None
    if not (0 <= value < 1 if upper_open else 0 <= value <= 1):
        problems.append(f"{path}.{key}: must be within [0, 1{')' if upper_open else ']'}, got {value:g}")
        return None
    return value


def _duration(raw: dict[Any, Any], path: str, key: str, default: timedelta, problems: list[str]) -> timedelta | None:
    return duration(raw, path, key, problems) if key in raw else default


# --- the per-node override annotation ---------------------------------------------------------------------------


class OverrideError(ValueError):
    """A ``crane.io/batch-reclaim`` annotation that cannot be read; the message says what is wrong."""


@dataclass(frozen=True)
class NodeOverride:
    off: bool = False
    cpu_threshold: float | None = None
    memory_threshold: float | None = None

    def threshold(self, resource: str, policy: ResourceReclaim) -> float:
        mine = self.cpu_threshold if resource == "cpu" else self.memory_threshold
        return policy.reclaim_threshold if mine is None else mine


NO_OVERRIDE = NodeOverride()


def parse_override(text: str | None) -> NodeOverride:
    """``None`` (no annotation) -> no override; ``off`` -> nothing reclaimed on the node; ``cpu=0.4`` or
    ``cpu=0.4,memory=0.5`` -> those reclaim thresholds (fractions of capacity in [0, 1]) for this node."""
    if text is None:
        return NO_OVERRIDE
    text = text.strip()
    if text.lower() == "off":
        return NodeOverride(off=True)
    values: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or key not in ("cpu", "memory"):
            raise OverrideError(f'{OVERRIDE_KEY}: expected "off" or "cpu=<fraction>,memory=<fraction>", got {text!r}')
        if key in values:
            raise OverrideError(f"{OVERRIDE_KEY}: {key} given twice in {text!r}")
        try:
            number_ = float(value)
        except ValueError:
            raise OverrideError(f"{OVERRIDE_KEY}: {key}={value!r} is not a number") from None
        if not 0 <= number_ <= 1:
            raise OverrideError(f"{OVERRIDE_KEY}: {key}={value} must be a fraction within [0, 1]")
        values[key] = number_
    return NodeOverride(cpu_threshold=values.get("cpu"), memory_threshold=values.get("memory"))
