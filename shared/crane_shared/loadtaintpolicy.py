"""The ``spec.loadTaint``, ``spec.scoring`` and ``spec.newNodes`` sections of the ``DynamicSchedulerPolicy``: real
load made visible to every scheduler and autoscaler, the packing mode of the Dynamic score, and how a node an
autoscaler just added is judged.

``loadTaint`` (the annotator's, opt-in: absent, no node is tainted and any ``crane.io/load-hot`` taint the
annotator finds is lifted)::

    loadTaint:
      effect: NoSchedule          # NoSchedule (autoscalers' simulations see the node as full) | PreferNoSchedule
      hotRounds: 2                # tainted after this many consecutive new samples read hot
      coolRounds: 2               # lifted after this many consecutive new samples that are not hot
      thresholds: {}              # metric -> ratio; default: the enabled predicate thresholds (the Filter's)
      maxDataAge: 10m             # lifted when a metric's sample is older (default and cap: the metric's freshness
                                  # window, sync period + 5m, as the scheduler reads it)
      minUntaintedNodes: 0        # the floor: never taint the last N untainted nodes

A node is hot when one of those metrics, read as the scheduler reads a regular pod's load (the batch pods' share
taken out, ``dynamic.node_load(regular=True)``), is strictly above its threshold, as the Dynamic filter compares;
it is judged only when every one of them is fresh (else its taint is lifted at once and its debounce starts over).
A node opts out with the annotation ``crane.io/load-taint: "off"``.

``scoring`` (the Dynamic score's strategy, read by the scheduler, the extender, the descheduler and ``cranectl``)::

    scoring:
      strategy: spread            # spread (upstream: the least used node first) | pack
      targetUtilization: 0.6      # pack: fill nodes toward this usage (Trimaran's TargetLoadPacking per metric)

``newNodes`` (read by the scheduler, the extender and ``cranectl``; opt-in)::

    newNodes:
      estimate: false             # true: a node that carries none of the policy's metric annotations yet (an
                                  # autoscaler's node before the annotator's first round) is judged by the
                                  # estimates of the pods this scheduler bound there in the estimate window,
                                  # none absorbed; false (upstream): such a node passes the Filter (fail-open)
      window: 2m                  # with estimate: how long a binding counts on such a node (default: the
                                  # estimate's window of the metric). Set it to how long a new node waits for
                                  # its first reading (the exporter scraped, the average, the annotator's round):
                                  # a shorter window lets the node take pods on requests alone in between

Pure: no I/O. Problems are appended to the caller's list, each naming its field path, as every policy reader does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, get_args

from crane_shared.durations import format_duration
from crane_shared.policyyaml import check_keys, count, describe, duration, number

__all__ = [
    "OPT_OUT_KEY",
    "TAINT_KEY",
    "LoadTaintPolicy",
    "NewNodesPolicy",
    "ScoringPolicy",
    "dump_load_taint",
    "dump_new_nodes",
    "dump_scoring",
    "is_ours",
    "read_load_taint",
    "read_new_nodes",
    "read_scoring",
    "taint_value",
    "with_taint",
    "without_taint",
]

TAINT_KEY = "crane.io/load-hot"
"""the taint's key; its value is the metric that made the node hot"""
OPT_OUT_KEY = "crane.io/load-taint"
"""node annotation: ``off`` keeps the node untainted whatever its load"""

Effect = Literal["NoSchedule", "PreferNoSchedule"]
EFFECTS: tuple[str, ...] = get_args(Effect)
Strategy = Literal["spread", "pack"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


@dataclass(frozen=True)
class LoadTaintPolicy:
    effect: Effect = "NoSchedule"
    hot_rounds: int = 2
    cool_rounds: int = 2
    thresholds: tuple[tuple[str, float], ...] = ()
    """(metric, ratio) sorted by metric; empty: the policy's enabled predicate thresholds"""
    max_data_age: timedelta | None = None
    """None: each metric's freshness window"""
    min_untainted_nodes: int = 0


@dataclass(frozen=True)
class ScoringPolicy:
    strategy: Strategy = "spread"
    target_utilization: float = 0.6


@dataclass(frozen=True)
class NewNodesPolicy:
    estimate: bool = False
    """judge a node without any metric annotation by its recent bindings' estimates (off: upstream's fail-open)"""
    window: timedelta | None = None
    """how long a binding counts on such a node; None: the estimate's window of each metric"""


_TAINT_KEYS = ("effect", "hotRounds", "coolRounds", "thresholds", "maxDataAge", "minUntaintedNodes")
_SCORING_KEYS = ("strategy", "targetUtilization")
_NEW_NODES_KEYS = ("estimate", "window")


def read_load_taint(raw: object, synced: set[str], problems: list[str]) -> LoadTaintPolicy | None:
    """``spec.loadTaint`` as written (None when absent); ``synced``: the metric names of ``spec.syncPolicy``."""
    if raw is None:
        return None
    path = "spec.loadTaint"
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping, got {describe(raw)}")
        return None
    check_keys(raw, path, _TAINT_KEYS, problems)
    before = len(problems)
    default = LoadTaintPolicy()
    effect = raw.get("effect", default.effect)
    if effect not in EFFECTS:
        problems.append(f"{path}.effect: must be one of {', '.join(EFFECTS)}, got {describe(effect)}")
    hot = count(raw, path, "hotRounds", default.hot_rounds, 1, problems)
    cool = count(raw, path, "coolRounds", default.cool_rounds, 1, problems)
    floor = count(raw, path, "minUntaintedNodes", default.min_untainted_nodes, 0, problems)
    age = duration(raw, path, "maxDataAge", problems) if "maxDataAge" in raw else None
    thresholds = _thresholds(raw.get("thresholds"), f"{path}.thresholds", synced, problems)
    if len(problems) > before:
        return None
    return LoadTaintPolicy(effect, hot, cool, thresholds, age, floor)


def dump_load_taint(policy: LoadTaintPolicy) -> dict[str, Any]:
    """The section as YAML data that reads back equal."""
    out: dict[str, Any] = {
        "effect": policy.effect,
        "hotRounds": policy.hot_rounds,
        "coolRounds": policy.cool_rounds,
        "minUntaintedNodes": policy.min_untainted_nodes,
    }
    if policy.thresholds:
        out["thresholds"] = dict(policy.thresholds)
    if policy.max_data_age is not None:
        out["maxDataAge"] = format_duration(policy.max_data_age)
    return out


def read_scoring(raw: object, problems: list[str]) -> ScoringPolicy:
    """``spec.scoring`` (absent: spread, upstream's score)."""
    default = ScoringPolicy()
    if raw is None:
        return default
    path = "spec.scoring"
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping, got {describe(raw)}")
        return default
    check_keys(raw, path, _SCORING_KEYS, problems)
    strategy = raw.get("strategy", default.strategy)
    if strategy not in STRATEGIES:
        problems.append(f"{path}.strategy: must be one of {', '.join(STRATEGIES)}, got {describe(strategy)}")
        strategy = default.strategy
    target = default.target_utilization
    if "targetUtilization" in raw:
        value = number(raw, path, "targetUtilization", problems)
        if value is not None and not 0 < value < 1:
            problems.append(f"{path}.targetUtilization: must be within (0, 1), got {value:g}")
        elif value is not None:
            target = value
    return ScoringPolicy(strategy, target)


def dump_scoring(policy: ScoringPolicy) -> dict[str, Any]:
    return {"strategy": policy.strategy, "targetUtilization": policy.target_utilization}


def read_new_nodes(raw: object, problems: list[str]) -> NewNodesPolicy:
    """``spec.newNodes`` (absent: upstream's fail-open for a node without data)."""
    default = NewNodesPolicy()
    if raw is None:
        return default
    path = "spec.newNodes"
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping, got {describe(raw)}")
        return default
    check_keys(raw, path, _NEW_NODES_KEYS, problems)
    estimate = raw.get("estimate", default.estimate)
    if not isinstance(estimate, bool):  # YAML's true/false only: "yes" or 1 is a typo, not a switch
        problems.append(f"{path}.estimate: must be true or false, got {describe(estimate)}")
        return default
    window = None
    if "window" in raw:
        window = duration(raw, path, "window", problems)
        if window is not None and not estimate:  # it would change nothing: refused, not ignored
            problems.append(f"{path}.window: only with {path}.estimate: true (nothing is estimated without it)")
            window = None
    return NewNodesPolicy(estimate, window)


def dump_new_nodes(policy: NewNodesPolicy) -> dict[str, Any]:
    out: dict[str, Any] = {"estimate": policy.estimate}
    if policy.window is not None:
        out["window"] = format_duration(policy.window)
    return out


def _thresholds(raw: object, path: str, synced: set[str], problems: list[str]) -> tuple[tuple[str, float], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping of metric name to ratio, got {describe(raw)}")
        return ()
    out = []
    for metric, _ in raw.items():
        if metric not in synced:
            problems.append(f'{path}.{metric}: metric "{metric}" has no syncPolicy entry')
            continue
        value = number(raw, path, metric, problems)
        if value is not None and not 0 < value <= 1:
            problems.append(f"{path}.{metric}: must be within (0, 1], got {value:g}")
        elif value is not None:
            out.append((str(metric), value))
    return tuple(sorted(out))


# --- the taint on a node ---------------------------------------------------------------------------------------


def is_ours(taint: Mapping[str, object]) -> bool:
    return taint.get("key") == TAINT_KEY


_INVALID = re.compile(r"[^A-Za-z0-9_.-]")


def taint_value(metric: str) -> str:
    """The metric as a taint value (a label value: at most 63 of ``[A-Za-z0-9_.-]``, alphanumeric at both ends)."""
    return _INVALID.sub("_", metric)[:63].strip("_.-")


def with_taint(taints: Iterable[Mapping[str, object]], effect: str, metric: str) -> list[dict[str, object]]:
    """The node's taints with ours set (any earlier one of ours replaced)."""
    return [dict(t) for t in taints if not is_ours(t)] + [
        {"key": TAINT_KEY, "value": taint_value(metric), "effect": effect}
    ]


def without_taint(taints: Iterable[Mapping[str, object]]) -> list[dict[str, object]]:
    return [dict(t) for t in taints if not is_ours(t)]
