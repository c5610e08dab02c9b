"""The hot value: how many recent bindings a node has had, scaled by the policy's rules.

Upstream: ``hot = Σ over hotValue rules of floor(bindings to the node within timeRange / count)``, where a
binding is within the range when its time is strictly after ``now - timeRange`` (later times, i.e. clock skew
ahead, count too). The score subtracts ``10 * hot``, steering bursts away from one node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta

from crane_shared.policy import HotValuePolicy

__all__ = ["hot_value", "window_starts", "windows"]


def windows(rules: Iterable[HotValuePolicy]) -> tuple[timedelta, ...]:
    """The distinct time ranges to count bindings over, in rule order."""
    return tuple(dict.fromkeys(rule.time_range for rule in rules))


def window_starts(now: float, rules: Iterable[HotValuePolicy]) -> dict[timedelta, float]:
    """Exclusive lower bound (unix seconds) of each rule's window: bindings strictly after it count."""
    return {time_range: now - time_range.total_seconds() for time_range in windows(rules)}


def hot_value(counts: Mapping[timedelta, int], rules: Iterable[HotValuePolicy]) -> int:
    """Sum of ``floor(count within rule.time_range / rule.count)``; ``counts`` must cover every rule."""
    total = 0
    for rule in rules:
        if rule.time_range not in counts:
            raise KeyError(f"no binding count for time range {rule.time_range}")
        count = counts[rule.time_range]
        if count < 0:
            raise ValueError(f"binding count for time range {rule.time_range} is negative: {count}")
        total += count // rule.count
    return total
