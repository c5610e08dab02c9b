"""Round planning: which metrics are due, when to wake up next, and what a failed query changes.

One loop runs rounds one after another, so rounds never overlap. Every metric has its own next due time:

- at start (or on becoming leader) every metric is due;
- after a successful round a metric is due again one period after its previous due time; ticks missed while a
  round overran are skipped, never caught up in a burst;
- after a failed query the metric is retried sooner than its period (``retry_base`` doubling per consecutive
  failure, capped at the period), so annotations recover soon after Prometheus does, not a period later;
- metrics due within ``slack`` of each other share a round, so metrics of aligned periods (3m and 15m at minute
  15) travel in one patch per node.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Plan:
    periods: Mapping[str, float]
    """metric -> sync period in seconds"""
    next_due: Mapping[str, float]
    """metric -> when it is due next (monotonic seconds)"""
    failures: Mapping[str, int]
    """metric -> consecutive failed rounds"""


def start(periods: Mapping[str, float], now: float) -> Plan:
    """Every metric due at once."""
    for metric, period in periods.items():
        if not (period > 0 and math.isfinite(period)):
            raise ValueError(f"sync period of {metric} must be positive, got {period}")
    return Plan(dict(periods), dict.fromkeys(periods, now), dict.fromkeys(periods, 0))


def due(plan: Plan, now: float, slack: float = 1.0) -> tuple[str, ...]:
    """Metrics to sync in a round starting ``now``, in the plan's order."""
    return tuple(m for m, at in plan.next_due.items() if at <= now + slack)


def wake_at(plan: Plan) -> float:
    """When the next metric becomes due."""
    return min(plan.next_due.values())


def after_round(
    plan: Plan,
    started: float,
    finished: float,
    succeeded: Iterable[str],
    failed: Iterable[str],
    *,
    retry_base: float = 5.0,
) -> Plan:
    """The plan after a round (``started`` .. ``finished``) synced ``succeeded`` and could not sync ``failed``;
    retries count from the end of the round, so a round slowed by timeouts is not followed by an instant retry."""
    next_due = dict(plan.next_due)
    failures = dict(plan.failures)
    for metric in succeeded:
        period = plan.periods[metric]
        previous = plan.next_due[metric]
        missed = max(0, math.floor((started - previous) / period))
        next_due[metric] = previous + (missed + 1) * period
        failures[metric] = 0
    for metric in failed:
        failures[metric] = plan.failures[metric] + 1
        backoff = min(plan.periods[metric], retry_base * 2 ** (failures[metric] - 1))
        next_due[metric] = finished + backoff
    return replace(plan, next_due=next_due, failures=failures)
