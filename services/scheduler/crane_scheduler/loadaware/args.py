"""The Dynamic plugin's ``pluginConfig`` args, validated like the rest of the configuration.

``policyConfigPath`` keeps upstream's name, so an upstream scheduler configuration carries over unchanged::

    pluginConfig:
      - name: Dynamic
        args:
          policyConfigPath: /etc/kubernetes/policy.yaml   # upstream's DynamicSchedulerPolicy file
          staleData: failOpen            # failOpen (upstream) | failClosed
          legacyTimeZone: Asia/Shanghai  # zone of upstream's bare-"Z" timestamps
          ownBindingsInHotValue: true
          estimate:
            enabled: true
            incomingPod: true
            cpuFactor: 0.6
            memoryFactor: 0.6
            window: 5m
            learned:                     # the workload's measured usage instead of factor x request
              enabled: true
              minPods: 3                 # measured running pods of the same owner and template needed
              percentile: 90             # of their usage, per resource
              maxAge: 10m                # pod-usage annotations older than this are not used
          gangHotValue: spread           # spread | together (a gang's own members leave its hot value alone)

``gangHotValue``: the hot value counts this scheduler's recent bindings, so each member of a gang placed in one
gang cycle makes its node look hotter to the next member, which spreads a gang over the nodes (``spread``, the
default: the same as any burst of pods). ``together`` leaves a gang's own members out of the hot value its other
members see, so a gang that should share few nodes (fast interconnect, shared data) is not pushed apart by itself;
other pods' bindings still count, and the estimate still counts every member (the threshold keeps a gang off nodes
its own members would overload).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from crane_scheduler.framework import ArgsError
from crane_shared.annotations import DEFAULT_LEGACY_ZONE
from crane_shared.durations import DurationError, parse_duration
from crane_shared.loadaware.dynamic import EstimateArgs, StalePolicy
from crane_shared.loadaware.learned import LearnArgs

_KNOWN = {"policyConfigPath", "staleData", "legacyTimeZone", "ownBindingsInHotValue", "gangHotValue", "estimate"}
GangHotValue = Literal["spread", "together"]
_ESTIMATE_KNOWN = {"enabled", "incomingPod", "cpuFactor", "memoryFactor", "window", "learned"}
_LEARNED_KNOWN = {"enabled", "minPods", "percentile", "maxAge"}


@dataclass(frozen=True)
class PluginArgs:
    policy_path: str | None = None
    stale: StalePolicy = "fail-open"
    legacy_zone: ZoneInfo = DEFAULT_LEGACY_ZONE
    own_bindings_in_hot_value: bool = True
    estimate: EstimateArgs = field(default_factory=EstimateArgs)
    gang_hot_value: GangHotValue = "spread"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_args(raw: Mapping[str, Any]) -> PluginArgs:
    """Validate every field; all problems are raised at once with their paths."""
    problems: list[tuple[str, str]] = [(k, "unknown field") for k in raw if k not in _KNOWN]
    path = raw.get("policyConfigPath")
    if path is not None and (not isinstance(path, str) or not path):
        problems.append(("policyConfigPath", "must be a non-empty file path"))
    stale_raw = raw.get("staleData", "failOpen")
    stale: StalePolicy = "fail-open"
    if stale_raw == "failClosed":
        stale = "fail-closed"
    elif stale_raw != "failOpen":
        problems.append(("staleData", f"must be failOpen or failClosed, got {stale_raw!r}"))
    zone = DEFAULT_LEGACY_ZONE
    try:
        zone = ZoneInfo(str(raw.get("legacyTimeZone", DEFAULT_LEGACY_ZONE.key)))
    except (ZoneInfoNotFoundError, ValueError):
        problems.append(("legacyTimeZone", f"unknown time zone {raw.get('legacyTimeZone')!r}"))
    own = raw.get("ownBindingsInHotValue", True)
    if not isinstance(own, bool):
        problems.append(("ownBindingsInHotValue", "must be true or false"))
    gang_raw = raw.get("gangHotValue", "spread")
    gang: GangHotValue = "spread"
    if gang_raw == "together":
        gang = "together"
    elif gang_raw != "spread":
        problems.append(("gangHotValue", f"must be spread or together, got {gang_raw!r}"))
    est_raw = raw.get("estimate", {})
    estimate = EstimateArgs()
    if not isinstance(est_raw, Mapping):
        problems.append(("estimate", "must be a mapping"))
    else:
        problems += [(f"estimate.{k}", "unknown field") for k in est_raw if k not in _ESTIMATE_KNOWN]
        enabled = est_raw.get("enabled", True)
        incoming = est_raw.get("incomingPod", True)
        for key, flag in (("enabled", enabled), ("incomingPod", incoming)):
            if not isinstance(flag, bool):
                problems.append((f"estimate.{key}", "must be true or false"))
        factors = {}
        for key in ("cpuFactor", "memoryFactor"):
            value = est_raw.get(key, 0.6)
            if not _number(value) or not 0 <= value <= 10:
                problems.append((f"estimate.{key}", f"must be a number within [0, 10], got {value!r}"))
                value = 0.6
            factors[key] = float(value)
        window = timedelta(minutes=5)
        try:
            window = parse_duration(str(est_raw.get("window", "5m")))
            if window <= timedelta(0):
                problems.append(("estimate.window", "must be > 0"))
        except DurationError as err:
            problems.append(("estimate.window", str(err)))
        learned = _learned(est_raw.get("learned", {}), problems)
        estimate = EstimateArgs(
            bool(enabled), bool(incoming), factors["cpuFactor"], factors["memoryFactor"], window, learned=learned
        )
    if problems:
        raise ArgsError(problems)
    return PluginArgs(path, stale, zone, bool(own), estimate, gang)


def _learned(raw: Any, problems: list[tuple[str, str]]) -> LearnArgs:
    """``estimate.learned``; problems are appended with their paths."""
    if not isinstance(raw, Mapping):
        problems.append(("estimate.learned", "must be a mapping"))
        return LearnArgs()
    path = "estimate.learned"
    problems += [(f"{path}.{k}", "unknown field") for k in raw if k not in _LEARNED_KNOWN]
    default = LearnArgs()
    enabled = raw.get("enabled", default.enabled)
    if not isinstance(enabled, bool):
        problems.append((f"{path}.enabled", "must be true or false"))
        enabled = default.enabled
    min_pods = raw.get("minPods", default.min_pods)
    if not isinstance(min_pods, int) or isinstance(min_pods, bool) or min_pods < 1:
        problems.append((f"{path}.minPods", f"must be an integer >= 1, got {min_pods!r}"))
        min_pods = default.min_pods
    percentile = raw.get("percentile", default.percentile)
    if not _number(percentile) or not 0 <= percentile <= 100:
        problems.append((f"{path}.percentile", f"must be a number within [0, 100], got {percentile!r}"))
        percentile = default.percentile
    max_age = default.max_age
    try:
        max_age = parse_duration(str(raw.get("maxAge", "10m")))
        if max_age <= timedelta(0):
            problems.append((f"{path}.maxAge", "must be > 0"))
    except DurationError as err:
        problems.append((f"{path}.maxAge", str(err)))
    return LearnArgs(enabled, min_pods, float(percentile), max_age)
