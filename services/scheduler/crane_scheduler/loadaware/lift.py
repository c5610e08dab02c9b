"""When a Dynamic refusal could lift with no cluster event: the time of its queueing hint.

Dynamic's Filter inputs change on events (a node's annotations or allocatable, a victim leaving) and, with no event
at all, at two kinds of instants: a metric annotation turns stale at ``stamp + freshness window`` (the predicate
then fails open, or refuses with "no fresh" under fail-closed) or, stamped ahead of the clock, fresh at ``stamp -
max skew``; and a recent binding of this scheduler leaves the estimate when it is pruned, ``bound_at + horizon``
(the longest estimate window or hot-value range). Nothing else in Filter moves with the clock: the estimate's decay
is measured against the annotation's stamp (an annotation update, an event), and the hot value counts in Score
only. So the earliest of those instants over the refused rows is the soonest the refusal could lift; the pod is
retried then (``Rejection.retry_after``), not at the 5-minute flush. It may still be refused then (the instant
is when an input changes, not a promise that it passes): the next refusal names the next instant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from crane_scheduler.loadaware.columns import FloatArray


def next_change(
    stamps: Mapping[str, FloatArray],
    windows: Mapping[str, float],
    skew: float,
    oldest_bindings: FloatArray,
    horizon: float,
    now: float,
) -> float:
    """The earliest instant after ``now`` at which the Filter inputs of some refused row change with no event
    (inf: none). ``stamps`` per metric and ``oldest_bindings`` (the row's oldest recent binding, NaN: none) are
    over the refused rows; ``windows`` are the metrics' freshness windows in seconds."""
    soonest = math.inf
    for metric, window in windows.items():
        column = stamps.get(metric)
        if column is None or not len(column):
            continue
        edges = np.concatenate((column - skew, column + window))
        upcoming = edges[edges > now]  # NaN stamps compare False: no edge
        if len(upcoming):
            soonest = min(soonest, float(upcoming.min()))
    if len(oldest_bindings):
        pruned = oldest_bindings + horizon
        upcoming = pruned[pruned > now]
        if len(upcoming):
            soonest = min(soonest, float(upcoming.min()))
    return soonest


def retry_after(soonest: float, now: float) -> float | None:
    """``next_change``'s instant as a delay (None: no timed retry)."""
    return None if math.isinf(soonest) else max(0.0, soonest - now)
