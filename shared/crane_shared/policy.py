"""The crane ``DynamicSchedulerPolicy``: metrics to sync, filter on and score with, and the hot-value rules.

The file format is upstream's, misspelling included (``maxLimitPecent``; ``maxLimitPercent`` is accepted as an
alias). Upstream loads it without validation, so a zero weight sum, ``count: 0`` or a typo'd key crashes or
silently misbehaves at scheduling time; here every problem is collected at load time and reported together,
each naming its field path, so a bad policy refuses to start instead.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import resources
from typing import Any

import yaml

from crane_shared.annotations import HOT_VALUE_KEY, AnnotationKeyError, annotation_key
from crane_shared.durations import format_duration
from crane_shared.loadtaintpolicy import (
    LoadTaintPolicy,
    NewNodesPolicy,
    ScoringPolicy,
    dump_load_taint,
    dump_new_nodes,
    dump_scoring,
    read_load_taint,
    read_new_nodes,
    read_scoring,
)
from crane_shared.policyyaml import PolicyError, check_keys, describe, duration, number, read_yaml
from crane_shared.reclaimpolicy import ReclaimPolicy, dump_reclaim, read_reclaim

__all__ = [
    "API_VERSION",
    "KIND",
    "DynamicSchedulerPolicy",
    "HotValuePolicy",
    "PolicyError",
    "PredicatePolicy",
    "PriorityPolicy",
    "SyncPolicy",
    "default_policy",
    "dump_policy",
    "load_policy",
    "parse_policy",
]

API_VERSION = "scheduler.policy.crane.io/v1alpha1"
KIND = "DynamicSchedulerPolicy"

_THRESHOLD = "maxLimitPecent"  # sic: upstream's field name
_THRESHOLD_ALIAS = "maxLimitPercent"
_TOP_KEYS = ("apiVersion", "kind", "spec")
_SPEC_KEYS = ("syncPolicy", "predicate", "priority", "hotValue", "reclaim", "scoring", "loadTaint", "newNodes")
_SECTION = re.compile(r"spec\.(\w+)(?:\[(\d+)\])?")


@dataclass(frozen=True)
class SyncPolicy:
    """Metric ``name`` is fetched from Prometheus and annotated on nodes every ``period``."""

    name: str
    period: timedelta


@dataclass(frozen=True)
class PredicatePolicy:
    """Filter out nodes whose ``name`` usage is strictly above ``max_limit_percent``; 0 disables it."""

    name: str
    max_limit_percent: float


@dataclass(frozen=True)
class PriorityPolicy:
    name: str
    weight: float


@dataclass(frozen=True)
class HotValuePolicy:
    """Every ``count`` bindings to a node within ``time_range`` add 1 to its hot value."""

    time_range: timedelta
    count: int


@dataclass(frozen=True)
class DynamicSchedulerPolicy:
    sync_policy: tuple[SyncPolicy, ...] = ()
    predicate: tuple[PredicatePolicy, ...] = ()
    priority: tuple[PriorityPolicy, ...] = ()
    hot_value: tuple[HotValuePolicy, ...] = ()
    reclaim: ReclaimPolicy | None = None
    """capacity reclaimed for batch pods (the annotator's, ``crane_shared.reclaimpolicy``); None: off"""
    scoring: ScoringPolicy = field(default_factory=ScoringPolicy)
    """the Dynamic score's strategy: spread (upstream) or pack (``crane_shared.loadtaintpolicy``)"""
    load_taint: LoadTaintPolicy | None = None
    """the annotator's ``crane.io/load-hot`` taint on hot nodes (``crane_shared.loadtaintpolicy``); None: off"""
    new_nodes: NewNodesPolicy = field(default_factory=NewNodesPolicy)
    """how Dynamic judges a node without any metric annotation: fail-open (upstream) or by its bindings' estimates"""

    def taint_thresholds(self) -> dict[str, float]:
        """metric -> ratio a node is tainted above: ``loadTaint.thresholds``, else the enabled predicates'."""
        if self.load_taint is not None and self.load_taint.thresholds:
            return dict(self.load_taint.thresholds)
        return {p.name: p.max_limit_percent for p in self.predicate if p.max_limit_percent > 0}

    def period_of(self, metric: str) -> timedelta:
        """Sync period of ``metric``; its annotation stays fresh for this period plus a grace."""
        for sync in self.sync_policy:
            if sync.name == metric:
                return sync.period
        raise KeyError(f"metric {metric!r} has no syncPolicy entry")

    def metrics(self) -> tuple[str, ...]:
        """Synced metric names, in policy order."""
        return tuple(sync.name for sync in self.sync_policy)

    def longest_hot_value_window(self) -> timedelta:
        """How far back binding records are needed; zero when there are no hot-value rules."""
        return max((rule.time_range for rule in self.hot_value), default=timedelta(0))

    def metrics_by_period(self) -> dict[timedelta, tuple[str, ...]]:
        """Metrics grouped by sync period, so one timer can sync each group."""
        groups: dict[timedelta, list[str]] = {}
        for sync in self.sync_policy:
            groups.setdefault(sync.period, []).append(sync.name)
        return {period: tuple(names) for period, names in groups.items()}


def parse_policy(text: str, source: str = "<policy>") -> DynamicSchedulerPolicy:
    """Parse and validate policy YAML; ``source`` names it in errors (usually the file path)."""
    document = read_yaml(text, source)
    problems: list[str] = []
    policy = _read_document(document, problems)
    if problems or policy is None:
        raise PolicyError(source, sorted(problems, key=_file_order))
    return policy


def load_policy(path: str | os.PathLike[str]) -> DynamicSchedulerPolicy:
    """Read and validate a policy file; unreadable files are reported as a ``PolicyError`` too."""
    source = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(source, [f"cannot read policy file: {exc}"]) from None
    return parse_policy(text, source)


def policy_or_default(path: str | os.PathLike[str] | None) -> DynamicSchedulerPolicy:
    """The policy in ``path``, or upstream's default policy when no file is given."""
    return load_policy(path) if path else default_policy()


@functools.cache
def default_policy() -> DynamicSchedulerPolicy:
    """Upstream's default policy, shipped as ``crane_shared/default-policy.yaml``."""
    text = resources.files("crane_shared").joinpath("default-policy.yaml").read_text(encoding="utf-8")
    return parse_policy(text, "crane_shared/default-policy.yaml")


def dump_policy(policy: DynamicSchedulerPolicy) -> str:
    """Policy YAML in upstream's format (``maxLimitPecent`` spelling, Go durations) that parses back equal."""
    document: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "spec": {
            "syncPolicy": [{"name": s.name, "period": format_duration(s.period)} for s in policy.sync_policy],
            "predicate": [{"name": p.name, _THRESHOLD: p.max_limit_percent} for p in policy.predicate],
            "priority": [{"name": p.name, "weight": p.weight} for p in policy.priority],
            "hotValue": [{"timeRange": format_duration(h.time_range), "count": h.count} for h in policy.hot_value],
        },
    }
    if policy.reclaim is not None:
        document["spec"]["reclaim"] = dump_reclaim(policy.reclaim)
    if policy.scoring != ScoringPolicy():
        document["spec"]["scoring"] = dump_scoring(policy.scoring)
    if policy.load_taint is not None:
        document["spec"]["loadTaint"] = dump_load_taint(policy.load_taint)
    if policy.new_nodes != NewNodesPolicy():
        document["spec"]["newNodes"] = dump_new_nodes(policy.new_nodes)
    return yaml.safe_dump(document, sort_keys=False)


# --- structure --------------------------------------------------------------------------------------------


def _read_document(document: object, problems: list[str]) -> DynamicSchedulerPolicy | None:
    if not isinstance(document, dict):
        problems.append(f"document: must be a mapping with {', '.join(_TOP_KEYS)}, got {describe(document)}")
        return None
    check_keys(document, "", _TOP_KEYS, problems)
    for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
        if key not in document:
            problems.append(f'{key}: required, must be "{expected}"')
        elif document[key] != expected:
            problems.append(f'{key}: must be "{expected}", got {describe(document[key])}')
    spec = document.get("spec")
    if "spec" not in document:
        problems.append("spec: required")
        return None
    if not isinstance(spec, dict):
        problems.append(f"spec: must be a mapping, got {describe(spec)}")
        return None
    check_keys(spec, "spec", _SPEC_KEYS, problems)
    sync = _read_list(spec, "syncPolicy", _read_sync, problems)
    predicate = _read_list(spec, "predicate", _read_predicate, problems)
    priority = _read_list(spec, "priority", _read_priority, problems)
    hot_value = _read_list(spec, "hotValue", _read_hot_value, problems)
    _check_metrics(sync, predicate, priority, problems)
    _check_hot_value(hot_value, problems)
    synced = {name for _, name, _ in sync if name is not None}
    reclaim = read_reclaim(spec.get("reclaim"), synced, problems)
    scoring = read_scoring(spec.get("scoring"), problems)
    load_taint = read_load_taint(spec.get("loadTaint"), synced, problems)
    new_nodes = read_new_nodes(spec.get("newNodes"), problems)
    if load_taint is not None and not load_taint.thresholds and not any(limit for _, _, limit in _complete(predicate)):
        problems.append("spec.loadTaint.thresholds: required when no predicate threshold is enabled")
    if problems:
        return None
    return DynamicSchedulerPolicy(
        sync_policy=tuple(SyncPolicy(name, period) for _, name, period in _complete(sync)),
        predicate=tuple(PredicatePolicy(name, limit) for _, name, limit in _complete(predicate)),
        priority=tuple(PriorityPolicy(name, weight) for _, name, weight in _complete(priority)),
        hot_value=tuple(HotValuePolicy(time_range, count) for _, time_range, count in _complete(hot_value)),
        reclaim=reclaim,
        scoring=scoring,
        load_taint=load_taint,
        new_nodes=new_nodes,
    )


# An entry as read: (path, key field, value field), a field being None when it was invalid.
_Entry = tuple[str, Any, Any]
_ItemReader = Callable[[dict[Any, Any], str, list[str]], tuple[Any, Any]]


def _read_list(spec: dict[Any, Any], key: str, read_item: _ItemReader, problems: list[str]) -> list[_Entry]:
    raw = spec.get(key)
    if raw is None:  # absent or written as an empty "key:"
        return []
    if not isinstance(raw, list):
        problems.append(f"spec.{key}: must be a list, got {describe(raw)}")
        return []
    entries = []
    for index, item in enumerate(raw):
        path = f"spec.{key}[{index}]"
        if not isinstance(item, dict):
            problems.append(f"{path}: must be a mapping, got {describe(item)}")
            continue
        first, second = read_item(item, path, problems)
        entries.append((path, first, second))
    return entries


def _complete(entries: list[_Entry]) -> list[_Entry]:
    return [entry for entry in entries if entry[1] is not None and entry[2] is not None]


def _read_sync(item: dict[Any, Any], path: str, problems: list[str]) -> tuple[str | None, timedelta | None]:
    check_keys(item, path, ("name", "period"), problems)
    return _name(item, path, problems), duration(item, path, "period", problems)


def _read_predicate(item: dict[Any, Any], path: str, problems: list[str]) -> tuple[str | None, float | None]:
    check_keys(item, path, ("name", _THRESHOLD, _THRESHOLD_ALIAS), problems, shown=("name", _THRESHOLD))
    name = _name(item, path, problems)
    if _THRESHOLD in item and _THRESHOLD_ALIAS in item:
        problems.append(f"{path}.{_THRESHOLD_ALIAS}: is an alias of {_THRESHOLD}; give only one of them")
        return name, None
    key = _THRESHOLD_ALIAS if _THRESHOLD_ALIAS in item else _THRESHOLD
    limit = number(item, path, key, problems)
    if limit is not None and not 0 <= limit <= 1:
        problems.append(f"{path}.{key}: must be within [0, 1], got {limit:g}")
        return name, None
    return name, limit


def _read_priority(item: dict[Any, Any], path: str, problems: list[str]) -> tuple[str | None, float | None]:
    check_keys(item, path, ("name", "weight"), problems)
    name = _name(item, path, problems)
    weight = number(item, path, "weight", problems)
    if weight is not None and weight < 0:
        problems.append(f"{path}.weight: must be >= 0, got {weight:g}")
        return name, None
    return name, weight


def _read_hot_value(item: dict[Any, Any], path: str, problems: list[str]) -> tuple[timedelta | None, int | None]:
    check_keys(item, path, ("timeRange", "count"), problems)
    time_range = duration(item, path, "timeRange", problems)
    raw = item.get("count")
    if "count" not in item:
        problems.append(f"{path}.count: required")
        return time_range, None
    if not isinstance(raw, int) or isinstance(raw, bool):
        problems.append(f"{path}.count: must be an integer, got {describe(raw)}")
        return time_range, None
    if raw <= 0:
        problems.append(f"{path}.count: must be > 0, got {raw}")
        return time_range, None
    return time_range, raw


# --- fields -----------------------------------------------------------------------------------------------


def _name(item: Mapping[Any, Any], path: str, problems: list[str]) -> str | None:
    if "name" not in item:
        problems.append(f"{path}.name: required")
        return None
    name = item["name"]
    if not isinstance(name, str):
        problems.append(f"{path}.name: must be a metric name string, got {describe(name)}")
        return None
    if not name.strip():
        problems.append(f"{path}.name: must not be empty")
        return None
    return name


def _file_order(problem: str) -> tuple[int, int]:
    """Sort problems roughly as their fields appear in the file (sections, then items), stably."""
    match = _SECTION.match(problem)
    if match is None:
        return (0, 0)
    return (1 + _SPEC_KEYS.index(match[1]) if match[1] in _SPEC_KEYS else 0, int(match[2] or -1))


# --- cross-field rules ------------------------------------------------------------------------------------


def _check_metrics(
    sync: list[_Entry],
    predicate: list[_Entry],
    priority: list[_Entry],
    problems: list[str],
) -> None:
    for entries in (sync, predicate, priority):
        _check_unique(((path, name) for path, name, _ in entries), "metric", problems)
    synced = {name for _, name, _ in sync if name is not None}
    for path, name, _ in predicate + priority:
        if name is not None and name not in synced:
            problems.append(f'{path}.name: metric "{name}" has no syncPolicy entry')
    _check_annotation_keys(sync, problems)
    weights = [weight for _, _, weight in priority]
    if priority and None not in weights and sum(weights) <= 0:
        problems.append("spec.priority: weights must sum to > 0")


def _check_annotation_keys(sync: list[_Entry], problems: list[str]) -> None:
    """Distinct metrics must land on distinct node annotations, and none on the hot value's."""
    owners: dict[str, str] = {HOT_VALUE_KEY: "the hot value"}
    names: set[str] = set()
    for path, name, _ in sync:
        if name is None or name in names:  # duplicates are reported as such
            continue
        names.add(name)
        try:
            key = annotation_key(name)
        except AnnotationKeyError as exc:
            problems.append(f"{path}.name: {exc}")
            continue
        if key in owners:
            problems.append(
                f'{path}.name: metric "{name}" maps to annotation key "{key}", already used by {owners[key]}'
            )
        else:
            owners[key] = path


def _check_hot_value(hot_value: list[_Entry], problems: list[str]) -> None:
    ranges = ((path, time_range) for path, time_range, _ in hot_value)
    _check_unique(ranges, "time range", problems, key_suffix="timeRange", render=format_duration)


def _check_unique(
    entries: Iterable[tuple[str, Any]],
    what: str,
    problems: list[str],
    key_suffix: str = "name",
    render: Callable[[Any], str] = str,
) -> None:
    first: dict[Any, str] = {}
    for path, key in entries:
        if key is None:
            continue
        if key in first:
            problems.append(f'{path}.{key_suffix}: duplicate {what} "{render(key)}" (first at {first[key]})')
        else:
            first[key] = path
