"""The descheduler's policy file: thresholds per node pool, debounce, which pods may go, and the budgets.

Read with the scheduler policy's readers (``crane_shared.policyyaml``): strict YAML, unknown keys refused with a
suggestion, every problem reported at once, one line each, naming its field path. The file is optional; every
field has a default, and the thresholds default to the scheduler policy's own predicate thresholds, so a node the
descheduler calls hot is one the scheduler's Dynamic filter refuses (the loop is closed; see the README).

    apiVersion: descheduler.policy.crane.io/v1alpha1
    kind: LoadAwareDeschedulerPolicy
    spec:
      anomaly: {consecutiveAbnormalities: 3, consecutiveNormalities: 2}
      nodePools:                      # first match wins; nodes no pool selects are left alone
        - name: default
          nodeSelector: {}            # label -> value, all must match ({} selects every node)
          highThresholds: {cpu_usage_avg_5m: 0.65, mem_usage_avg_5m: 0.65}
          lowThresholds: {cpu_usage_avg_5m: 0.35, mem_usage_avg_5m: 0.35}
      evictable:
        minPodAge: 5m
        evictLocalStorage: false
        recreatingOwnerKinds: [ReplicaSet, StatefulSet, Job]
        excludeNamespaces: [kube-system]
      limits:
        maxPerNodePerRound: 1
        maxPerNamespacePerRound: 2
        maxUnavailablePerWorkload: 1  # or "25%"
        maxPerMinute: 5
      drain:                          # opt-in (absent: off): empty the nodes real usage and requests leave idle
        usageBelow: {}                # metric -> ratio; default: each pool's lowThresholds
        requestsBelow: {cpu: 0.5, memory: 0.5}   # the pods' requests / the node's allocatable
        consecutiveRounds: 3          # idle this many rounds in a row (fresh data every round)
        maxNodes: 1                   # nodes drained at once

The drain (LowNodeUtilization's idea by measured usage, so an autoscaler can remove the node): see ``drain``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from crane_shared.loadaware.dynamic import resource_of
from crane_shared.policy import DynamicSchedulerPolicy
from crane_shared.policyyaml import PolicyError, check_keys, count, describe, duration, number, read_yaml

__all__ = [
    "API_VERSION",
    "DEFAULT_OWNER_KINDS",
    "KIND",
    "AnomalyCondition",
    "DeschedulerPolicy",
    "Drain",
    "Evictable",
    "Limits",
    "NodePool",
    "default_policy",
    "load_policy",
    "parse_policy",
]

API_VERSION = "descheduler.policy.crane.io/v1alpha1"
KIND = "LoadAwareDeschedulerPolicy"
DEFAULT_OWNER_KINDS = ("ReplicaSet", "StatefulSet", "Job")
SHORT_WINDOW = timedelta(minutes=5)
"""Default thresholds cover the predicate metrics synced at most this often: the 5-minute averages. A max over
an hour keeps a relieved node looking hot for an hour, so a descheduler fed by it keeps evicting."""
WINDOW_MAXIMUM = "_max_"
"""crane's names for a maximum over a window (``cpu_usage_max_avg_1h``): no eviction lowers it before the window
has passed, whatever its sync period (the sandbox syncs the hour's maximum every 15 s), so it is never a high
threshold: a node hot by it would read hot after every relief and lose a pod every round."""
LOW_BELOW_HIGH = 0.3
"""Default low threshold: this far under the high one."""

_TOP = ("apiVersion", "kind", "spec")
_SPEC = ("anomaly", "nodePools", "evictable", "limits", "drain")
_DRAIN = ("usageBelow", "requestsBelow", "consecutiveRounds", "maxNodes")
_ANOMALY = ("consecutiveAbnormalities", "consecutiveNormalities")
_POOL = ("name", "nodeSelector", "highThresholds", "lowThresholds")
_EVICTABLE = ("minPodAge", "evictLocalStorage", "recreatingOwnerKinds", "excludeNamespaces")
_LIMITS = ("maxPerNodePerRound", "maxPerNamespacePerRound", "maxUnavailablePerWorkload", "maxPerMinute")
_PERCENT = re.compile(r"([0-9]+)%")


@dataclass(frozen=True)
class AnomalyCondition:
    """Hot after ``hot_rounds`` consecutive hot rounds, normal again after ``normal_rounds`` consecutive others."""

    hot_rounds: int = 3
    normal_rounds: int = 2


@dataclass(frozen=True)
class NodePool:
    name: str
    selector: Mapping[str, str]
    high: Mapping[str, float]
    """metric -> ratio: the node is hot when one metric is strictly above its high threshold"""
    low: Mapping[str, float]
    """metric -> ratio: the node is idle when every metric is strictly below its low threshold"""

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.selector.items())


@dataclass(frozen=True)
class Evictable:
    min_pod_age: timedelta = timedelta(minutes=5)
    evict_local_storage: bool = False
    owner_kinds: frozenset[str] = frozenset(DEFAULT_OWNER_KINDS)
    exclude_namespaces: frozenset[str] = frozenset({"kube-system"})


@dataclass(frozen=True)
class Limits:
    per_node_per_round: int = 1
    per_namespace_per_round: int = 2
    max_unavailable_per_workload: int | str = 1
    """a count, or a percent of the workload's pods (``"25%"``, rounded down)"""
    per_minute: int = 5


@dataclass(frozen=True)
class Drain:
    """Empty nodes whose real usage and requests are both low, so an autoscaler can remove them (``drain``)."""

    usage_below: Mapping[str, float] = field(default_factory=dict)
    """metric -> ratio; empty: each pool's low thresholds"""
    requests_below: Mapping[str, float] = field(default_factory=lambda: {"cpu": 0.5, "memory": 0.5})
    """resource -> requested / allocatable"""
    rounds: int = 3
    max_nodes: int = 1


@dataclass(frozen=True)
class DeschedulerPolicy:
    pools: tuple[NodePool, ...]
    anomaly: AnomalyCondition = field(default_factory=AnomalyCondition)
    evictable: Evictable = field(default_factory=Evictable)
    limits: Limits = field(default_factory=Limits)
    drain: Drain | None = None
    """None: no node is drained"""

    def pool_of(self, labels: Mapping[str, str]) -> NodePool | None:
        return next((pool for pool in self.pools if pool.selects(labels)), None)


def default_thresholds(scheduler: DynamicSchedulerPolicy) -> dict[str, float]:
    """The scheduler's enabled predicate thresholds of its short-window averages that measure CPU or memory (no
    maximum over a window: ``WINDOW_MAXIMUM``)."""
    return {
        p.name: p.max_limit_percent
        for p in scheduler.predicate
        if p.max_limit_percent > 0
        and resource_of(p.name)
        and scheduler.period_of(p.name) <= SHORT_WINDOW
        and WINDOW_MAXIMUM not in p.name
    }


def _low_of(high: Mapping[str, float]) -> dict[str, float]:
    return {metric: round(max(0.0, limit - LOW_BELOW_HIGH), 6) for metric, limit in high.items()}


def default_policy(scheduler: DynamicSchedulerPolicy) -> DeschedulerPolicy:
    high = default_thresholds(scheduler)
    return DeschedulerPolicy(pools=(NodePool("default", {}, high, _low_of(high)),))


def load_policy(path: str | os.PathLike[str], scheduler: DynamicSchedulerPolicy) -> DeschedulerPolicy:
    source = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(source, [f"cannot read policy file: {exc}"]) from None
    return parse_policy(text, scheduler, source)


def parse_policy(text: str, scheduler: DynamicSchedulerPolicy, source: str = "<policy>") -> DeschedulerPolicy:
    """Parse and validate; thresholds may name only metrics the scheduler policy syncs (the annotator writes)."""
    document = read_yaml(text, source)
    problems: list[str] = []
    policy = _read(document, scheduler, problems)
    if problems or policy is None:
        raise PolicyError(source, problems)
    return policy


def _read(document: object, scheduler: DynamicSchedulerPolicy, problems: list[str]) -> DeschedulerPolicy | None:
    if not isinstance(document, dict):
        problems.append(f"document: must be a mapping with {', '.join(_TOP)}, got {describe(document)}")
        return None
    check_keys(document, "", _TOP, problems)
    for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
        if document.get(key) != expected:
            got = f", got {describe(document[key])}" if key in document else ""
            problems.append(f'{key}: must be "{expected}"{got}')
    spec = document.get("spec") or {}
    if not isinstance(spec, dict):
        problems.append(f"spec: must be a mapping, got {describe(spec)}")
        return None
    check_keys(spec, "spec", _SPEC, problems)
    anomaly = _anomaly(_section(spec, "anomaly", problems), problems)
    pools = _pools(spec.get("nodePools"), scheduler, problems)
    evictable = _evictable(_section(spec, "evictable", problems), problems)
    limits = _limits(_section(spec, "limits", problems), problems)
    drain = _drain(spec.get("drain"), scheduler, problems) if "drain" in spec else None
    if problems:
        return None
    return DeschedulerPolicy(pools, anomaly, evictable, limits, drain)


def _section(spec: Mapping[str, Any], key: str, problems: list[str]) -> dict[str, Any]:
    raw = spec.get(key)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"spec.{key}: must be a mapping, got {describe(raw)}")
        return {}
    return raw


def _anomaly(section: Mapping[str, Any], problems: list[str]) -> AnomalyCondition:
    path = "spec.anomaly"
    check_keys(section, path, _ANOMALY, problems)
    base = AnomalyCondition()
    return AnomalyCondition(
        count(section, path, "consecutiveAbnormalities", base.hot_rounds, 1, problems),
        count(section, path, "consecutiveNormalities", base.normal_rounds, 1, problems),
    )


def _pools(raw: object, scheduler: DynamicSchedulerPolicy, problems: list[str]) -> tuple[NodePool, ...]:
    defaults = default_thresholds(scheduler)
    if raw is None:
        return (NodePool("default", {}, defaults, _low_of(defaults)),)
    if not isinstance(raw, list) or not raw:
        problems.append(f"spec.nodePools: must be a non-empty list, got {describe(raw)}")
        return ()
    pools: list[NodePool] = []
    names: dict[str, str] = {}
    for index, item in enumerate(raw):
        path = f"spec.nodePools[{index}]"
        if not isinstance(item, dict):
            problems.append(f"{path}: must be a mapping, got {describe(item)}")
            continue
        check_keys(item, path, _POOL, problems)
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            problems.append(f"{path}.name: must be a non-empty string, got {describe(name)}")
        elif name in names:
            problems.append(f'{path}.name: duplicate pool "{name}" (first at {names[name]})')
        else:
            names[name] = path
        selector = _selector(item.get("nodeSelector"), f"{path}.nodeSelector", problems)
        high = _thresholds(item, path, "highThresholds", defaults, scheduler, problems)
        low = _thresholds(item, path, "lowThresholds", _low_of(high), scheduler, problems)
        for metric, limit in low.items():
            if metric not in high:
                problems.append(f"{path}.lowThresholds.{metric}: has no high threshold")
            elif limit > high[metric]:
                problems.append(
                    f"{path}.lowThresholds.{metric}: must be <= the high threshold {high[metric]:g}, got {limit:g}"
                )
        if not high and "highThresholds" not in item:
            problems.append(f"{path}.highThresholds: required (the scheduler policy has no short-window predicate)")
        elif isinstance(item.get("highThresholds"), dict) and not item["highThresholds"]:
            problems.append(f"{path}.highThresholds: must name at least one metric")
        pools.append(NodePool(str(name), selector, high, low))
    return tuple(pools)


def _selector(raw: object, path: str, problems: list[str]) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping of label to value, got {describe(raw)}")
        return {}
    out = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str):
            problems.append(f"{path}.{key}: label and value must be strings, got {describe(value)}")
            continue
        out[key] = value
    return out


def _thresholds(
    item: Mapping[str, Any],
    path: str,
    key: str,
    default: Mapping[str, float],
    scheduler: DynamicSchedulerPolicy,
    problems: list[str],
) -> dict[str, float]:
    raw = item.get(key)
    if raw is None:
        return dict(default)
    if not isinstance(raw, dict):
        problems.append(f"{path}.{key}: must be a mapping of metric to ratio, got {describe(raw)}")
        return dict(default)
    synced = set(scheduler.metrics())
    out: dict[str, float] = {}
    for metric in raw:
        where = f"{path}.{key}.{metric}"
        if metric not in synced:
            problems.append(f'{where}: metric "{metric}" has no syncPolicy entry in the scheduler policy')
            continue
        if resource_of(str(metric)) is None:
            problems.append(f"{where}: measures neither CPU nor memory (names start with cpu or mem)")
            continue
        limit = number(raw, f"{path}.{key}", metric, problems)
        if limit is None:
            continue
        if not 0 <= limit <= 1:
            problems.append(f"{where}: must be within [0, 1], got {limit:g}")
            continue
        if key == "highThresholds" and WINDOW_MAXIMUM in str(metric):
            problems.append(
                f"{where}: a maximum over a window; no eviction lowers it before the window has passed, so the node"
                " would be relieved again every round (use an average such as cpu_usage_avg_5m)"
            )
            continue
        if key == "highThresholds" and limit == 0:
            problems.append(f"{where}: must be > 0 (0 would call every node hot; leave the metric out instead)")
            continue
        out[metric] = limit
    return out


def _drain(raw: object, scheduler: DynamicSchedulerPolicy, problems: list[str]) -> Drain | None:
    path = "spec.drain"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping, got {describe(raw)}")
        return None
    check_keys(raw, path, _DRAIN, problems)
    base = Drain()
    usage = _thresholds(raw, path, "usageBelow", {}, scheduler, problems)
    requests = dict(base.requests_below)
    given = raw.get("requestsBelow")
    if given is not None and not isinstance(given, dict):
        problems.append(f"{path}.requestsBelow: must be a mapping of cpu and memory to a ratio, got {describe(given)}")
    elif given is not None:
        for resource in given:
            if resource not in ("cpu", "memory"):
                problems.append(f"{path}.requestsBelow.{resource}: only cpu and memory")
                continue
            value = number(given, f"{path}.requestsBelow", resource, problems)
            if value is not None and not 0 < value <= 1:
                problems.append(f"{path}.requestsBelow.{resource}: must be within (0, 1], got {value:g}")
            elif value is not None:
                requests[resource] = value
    return Drain(
        usage,
        requests,
        count(raw, path, "consecutiveRounds", base.rounds, 1, problems),
        count(raw, path, "maxNodes", base.max_nodes, 1, problems),
    )


def _evictable(section: Mapping[str, Any], problems: list[str]) -> Evictable:
    path = "spec.evictable"
    check_keys(section, path, _EVICTABLE, problems)
    base = Evictable()
    age = base.min_pod_age
    if "minPodAge" in section:
        age = duration(section, path, "minPodAge", problems) or base.min_pod_age
    local = section.get("evictLocalStorage", base.evict_local_storage)
    if not isinstance(local, bool):
        problems.append(f"{path}.evictLocalStorage: must be true or false, got {describe(local)}")
        local = base.evict_local_storage
    kinds = _strings(section, path, "recreatingOwnerKinds", base.owner_kinds, problems)
    if "DaemonSet" in kinds:
        problems.append(f"{path}.recreatingOwnerKinds: DaemonSet pods are never evicted")
    namespaces = _strings(section, path, "excludeNamespaces", base.exclude_namespaces, problems)
    return Evictable(age, local, kinds, namespaces)


def _strings(
    section: Mapping[str, Any], path: str, key: str, default: frozenset[str], problems: list[str]
) -> frozenset[str]:
    if key not in section:
        return default
    raw = section[key]
    if not isinstance(raw, list) or not all(isinstance(v, str) and v for v in raw):
        problems.append(f"{path}.{key}: must be a list of non-empty strings, got {describe(raw)}")
        return default
    return frozenset(raw)


def _limits(section: Mapping[str, Any], problems: list[str]) -> Limits:
    path = "spec.limits"
    check_keys(section, path, _LIMITS, problems)
    base = Limits()
    unavailable: int | str = base.max_unavailable_per_workload
    if "maxUnavailablePerWorkload" in section:
        raw = section["maxUnavailablePerWorkload"]
        if (isinstance(raw, str) and _PERCENT.fullmatch(raw) and int(raw[:-1]) <= 100) or (
            isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0
        ):
            unavailable = raw
        else:
            expected = 'must be a count >= 0 or a percent like "25%"'
            problems.append(f"{path}.maxUnavailablePerWorkload: {expected}, got {describe(raw)}")
    return Limits(
        count(section, path, "maxPerNodePerRound", base.per_node_per_round, 0, problems),
        count(section, path, "maxPerNamespacePerRound", base.per_namespace_per_round, 0, problems),
        unavailable,
        count(section, path, "maxPerMinute", base.per_minute, 0, problems),
    )
