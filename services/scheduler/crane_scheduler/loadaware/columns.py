"""The Dynamic policy for many nodes at once: load annotations decoded into numpy columns.

``dynamic.py`` is the reference: one node, readable, shared with the extender and ``explain``. A scheduler
with thousands of nodes cannot afford a Python call per node per pod, so this module keeps every node's
decoded annotations as arrays (decoded once per node update, not once per decision) and evaluates freshness,
the predicates and the score with array operations. It must agree with ``dynamic.py`` for every input; a
property test holds the two together. A regular pod is judged by ``regular_values``: per CPU or memory metric,
the fresh value less the batch pods' share of it (``dynamic.batch_share``: the metric's own share written in the
same round, else the per-resource batch usage while fresh), clamped at 0, kept next to
``fresh_values`` and refreshed with them, so choosing the class costs nothing per decision. The effects of this
scheduler's recent bindings come in as per-row arrays (``extra``, ``own_hot``) that ``recent.RecentEffects`` keeps
up to date, with ``judged``: per metric, the rows of nodes not annotated with any metric yet (a new node) that
recent bindings judge when the policy opts in (``newNodes.estimate``), read as ``0 + extra`` instead of no data
(``dynamic.MetricReading.usage``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from crane_shared.annotations import (
    HOT_VALUE_FRESHNESS,
    HOT_VALUE_KEY,
    AnnotationError,
    annotation_key,
    decode,
    metric_freshness_window,
)
from crane_shared.batch import BATCH_METRIC_PREFIX, batch_metric_key
from crane_shared.loadaware.dynamic import (
    BATCH_USAGE_KEYS,
    HOT_VALUE_PENALTY,
    MAX_SCORE,
    NEUTRAL_SCORE,
    DynamicArgs,
    batch_window,
    resource_of,
    target_load,
)
from crane_shared.policy import PredicatePolicy

_RAW_KEYS = frozenset((HOT_VALUE_KEY, *BATCH_USAGE_KEYS.values()))
"""decoded columns named by their annotation key (the metrics' keys are derived from their names; the metrics'
batch shares, ``batch.crane.io/...``, are named by their key too)"""

FloatArray = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]


@dataclass
class LoadColumns:
    """Decoded annotations of every node row: value and timestamp per metric (NaN when missing/malformed)."""

    args: DynamicArgs
    capacity: int = 64
    values: dict[str, FloatArray] = field(default_factory=dict)
    stamps: dict[str, FloatArray] = field(default_factory=dict)
    malformed: dict[str, Mask] = field(default_factory=dict)
    fresh_values: dict[str, FloatArray] = field(default_factory=dict)
    """per metric (and the hot value): the value where fresh at the last evaluation, else NaN (see ``_fresh_at``)"""
    regular_values: dict[str, FloatArray] = field(default_factory=dict)
    """per metric: ``fresh_values`` less the batch pods' share of it, clamped at 0 (a regular pod's)"""
    batch_ignored: int = 0
    """batch-usage annotations found stale (present, decodable, not fresh) since the start: they subtract nothing"""

    def __post_init__(self) -> None:
        self._share_of = {m: batch_metric_key(m) for m in self.metrics if resource_of(m) is not None}
        for name in self._decoded:
            self.values[name] = np.full(self.capacity, np.nan)
            self.stamps[name] = np.full(self.capacity, np.nan)
            self.malformed[name] = np.zeros(self.capacity, dtype=bool)
            self.fresh_values[name] = np.full(self.capacity, np.nan)
        self._windows = {
            s.name: metric_freshness_window(s.period).total_seconds() for s in self.args.policy.sync_policy
        }
        self._windows[HOT_VALUE_KEY] = HOT_VALUE_FRESHNESS.total_seconds()
        for key in BATCH_USAGE_KEYS.values():
            self._windows[key] = batch_window(self.args).total_seconds()
        for metric, key in self._share_of.items():  # fresh exactly when its metric is (same stamp, same window)
            self._windows[key] = self._windows[metric]
        self._batch_of = {m: BATCH_USAGE_KEYS[r] for m in self.metrics if (r := resource_of(m)) is not None}
        self._batch_stale = {key: np.zeros(self.capacity, dtype=bool) for key in BATCH_USAGE_KEYS.values()}
        self._regular(None)
        # Freshness is piecewise constant in time: ``fresh_values`` evaluated at ``_evaluated`` hold until the
        # first stamp crosses an edge (``stamp - max_skew``, ``stamp + window``), ``_next``. A changed row is
        # re-evaluated alone at the next decision (``_dirty``), adding its own edges to ``_next``.
        self._evaluated = math.inf  # no evaluation yet: the first decision evaluates every row
        self._next = -math.inf
        self._dirty: set[int] = set()
        self.changed: set[int] = set()
        """rows whose ``fresh_values`` changed since the consumer last cleared this (the plugin's per-row caches)"""

    @property
    def metrics(self) -> list[str]:
        return [s.name for s in self.args.policy.sync_policy]

    @property
    def _decoded(self) -> list[str]:
        """every annotation decoded into a column: the metrics, the hot value, the batch usage per resource, the
        metrics' batch shares"""
        return [*self.metrics, HOT_VALUE_KEY, *BATCH_USAGE_KEYS.values(), *self._share_of.values()]

    def judged_as_new(self, row: int) -> bool:
        """The policy judges new nodes by their bindings' estimates (``newNodes.estimate``, opt-in) and the row's
        node carries none of the policy's metric annotations (not even a malformed one): a new node, never
        measured (``dynamic.node_load``'s ``never``)."""
        if not self.args.policy.new_nodes.estimate:
            return False
        if row >= self.capacity:
            return True
        return all(math.isnan(self.stamps[m][row]) and not self.malformed[m][row] for m in self.metrics)

    def _taken(self, metric: str, rows: npt.NDArray[np.intp] | None) -> FloatArray:
        """What a regular pod's reading of ``metric`` takes out (NaN: nothing), ``dynamic.batch_share``: the
        metric's own share where the node carries one (only when stamped as the metric is, fresh with it), else
        the fresh per-resource batch usage."""
        at = slice(None) if rows is None else rows
        key = self._share_of[metric]
        stamps = self.stamps[key][at]
        present = ~np.isnan(stamps) | self.malformed[key][at]
        own = np.where(stamps == self.stamps[metric][at], self.fresh_values[key][at], np.nan)
        legacy: FloatArray = self.fresh_values[self._batch_of[metric]][at]
        return np.where(present, own, legacy)

    def _regular(self, rows: npt.NDArray[np.intp] | None) -> None:
        """Refresh ``regular_values`` from ``fresh_values`` (all rows, or ``rows``): the reference's
        ``max(0, annotated - batch) if batch else annotated``."""
        for metric in self.metrics:
            key = self._batch_of.get(metric)
            if key is None:
                self.regular_values[metric] = self.fresh_values[metric]
                continue
            fresh = self.fresh_values[metric]
            if rows is None:
                self.regular_values[metric] = _without_batch(fresh, self._taken(metric, None))
            else:
                self.regular_values[metric][rows] = _without_batch(fresh[rows], self._taken(metric, rows))

    def _count_stale(self, key: str, rows: npt.NDArray[np.intp] | None) -> None:
        """Count the batch annotations that turned stale (present and decodable, not fresh) at these rows."""
        stamps = self.stamps[key] if rows is None else self.stamps[key][rows]
        fresh = self.fresh_values[key] if rows is None else self.fresh_values[key][rows]
        stale = ~np.isnan(stamps) & np.isnan(fresh)
        seen = self._batch_stale[key]
        if len(seen) < len(self.stamps[key]):
            seen = self._batch_stale[key] = _grown_bool(seen, len(self.stamps[key]))
        before = seen[: len(stale)] if rows is None else seen[rows]
        self.batch_ignored += int((stale & ~before).sum())
        if rows is None:
            seen[: len(stale)] = stale
        else:
            seen[rows] = stale

    def _grow(self, rows: int) -> None:
        cap = max(rows, 2 * self.capacity)
        for table, fill in ((self.values, np.nan), (self.stamps, np.nan), (self.malformed, False)):
            for name, arr in table.items():
                grown = np.full(cap, fill, dtype=arr.dtype)
                grown[: len(arr)] = arr
                table[name] = grown  # type: ignore[assignment]
        for name, arr in self.fresh_values.items():
            fresh: FloatArray = np.full(cap, np.nan)
            fresh[: len(arr)] = arr
            self.fresh_values[name] = fresh
        self.capacity = cap
        self._regular(None)

    def set_row(self, row: int, annotations: Mapping[str, str] | None) -> list[str]:
        """Decode one node's annotations into ``row``; returns the malformed metric names (to count)."""
        if row >= self.capacity:
            self._grow(row + 1)
        annotations = annotations or {}
        bad = []
        for name in self._decoded:
            key = name if name in _RAW_KEYS or name.startswith(BATCH_METRIC_PREFIX) else annotation_key(name)
            text = annotations.get(key)
            value = stamp = math.nan
            broken = False
            if text is not None:
                try:
                    sample = decode(text, self.args.legacy_zone)
                    value, stamp = sample.value, sample.timestamp.timestamp()
                except AnnotationError:
                    broken = True
                    bad.append(name)
            self.values[name][row] = value
            self.stamps[name][row] = stamp
            self.malformed[name][row] = broken
        self._dirty.add(row)
        return bad

    def evaluate(self, now: float) -> None:
        """Bring ``fresh_values`` to ``now``: nothing when no edge passed and no row changed (the common case),
        the changed rows alone, or every row once an edge passed or the clock went back."""
        if now < self._evaluated or now >= self._next:
            self._dirty.clear()
            self._evaluated = now
            self._next = math.inf
            for name, window in self._windows.items():
                old, new = self.fresh_values[name], _fresh(self.values[name], self.stamps[name], now, window, self.args)
                moved = (old != new) & ~(np.isnan(old) & np.isnan(new)) if len(old) == len(new) else None
                self.changed.update(range(len(new)) if moved is None else np.flatnonzero(moved).tolist())
                self.fresh_values[name] = new
                self._next = min(self._next, _next_edge(self.stamps[name], now, window, self.args))
            for key in BATCH_USAGE_KEYS.values():
                self._count_stale(key, None)
            self._regular(None)
            return
        self._evaluated = now
        if self._dirty:
            rows = np.fromiter(self._dirty, dtype=np.intp, count=len(self._dirty))
            self.changed.update(self._dirty)
            self._dirty.clear()
            for name, window in self._windows.items():
                stamps = self.stamps[name][rows]
                self.fresh_values[name][rows] = _fresh(self.values[name][rows], stamps, now, window, self.args)
                self._next = min(self._next, _next_edge(stamps, now, window, self.args))
            for key in BATCH_USAGE_KEYS.values():
                self._count_stale(key, rows)
            self._regular(rows)

    def usage(
        self,
        metric: str,
        rows: npt.NDArray[np.intp],
        now: float,
        extra: Mapping[str, FloatArray] | None = None,
        regular: bool = False,
        judged: Mapping[str, Mask] | None = None,
    ) -> FloatArray:
        """Annotated usage (plus ``extra[metric]``, the estimate) where fresh, else NaN (the window strict,
        future stamps beyond the skew rejected); ``regular``: less the batch pods' usage; ``judged[metric]``: rows
        of new nodes (no metric annotated) that recent bindings judge, their usage 0 plus the estimate."""
        self.evaluate(now)
        usage = (self.regular_values if regular else self.fresh_values)[metric][rows]
        if judged is not None and metric in judged:
            usage = np.where(judged[metric][rows], 0.0, usage)
        if extra is not None and metric in extra:
            usage = usage + extra[metric][rows]
        return usage

    def hot(self, rows: npt.NDArray[np.intp], now: float) -> FloatArray:
        """Annotated hot value where fresh, else 0."""
        self.evaluate(now)
        hot = self.fresh_values[HOT_VALUE_KEY][rows]
        return np.where(np.isnan(hot), 0.0, np.trunc(hot))

    def reasons(self, predicate: PredicatePolicy) -> tuple[str | None, str, str]:
        """The predicate's three reasons, in the order ``filter`` applies them: no fresh value (fail-closed
        only, else None), above the limit, pushed above the limit by the incoming pod."""
        limit = predicate.max_limit_percent
        return (
            f"node(s) had no fresh {predicate.name}" if self.args.stale == "fail-closed" else None,
            f"node(s) had {predicate.name} above {limit:g}",
            f"node(s) would have {predicate.name} above {limit:g}",
        )

    def all_reasons(self) -> list[str]:
        """Every reason ``filter`` can give, in its order."""
        return [r for p in self.args.policy.predicate if p.max_limit_percent != 0 for r in self.reasons(p) if r]

    def filter(
        self,
        rows: npt.NDArray[np.intp],
        now: float,
        incoming: Mapping[str, FloatArray] | None = None,
        extra: Mapping[str, FloatArray] | None = None,
        regular: bool = False,
        judged: Mapping[str, Mask] | None = None,
    ) -> list[tuple[str, Mask]]:
        """(reason, rejected mask over ``rows``) per predicate, in policy order; a node takes the first reason.

        ``incoming`` holds, per resource, the pod's estimated usage as a fraction of each row's allocatable."""
        out: list[tuple[str, Mask]] = []
        taken = np.zeros(len(rows), dtype=bool)
        for predicate in self.args.policy.predicate:
            if predicate.max_limit_percent == 0:
                continue
            no_fresh, above, pushed_above = self.reasons(predicate)
            usage = self.usage(predicate.name, rows, now, extra, regular, judged)
            missing = np.isnan(usage)
            if no_fresh is not None:
                closed = missing & ~taken
                if closed.any():
                    out.append((no_fresh, closed))
                taken |= closed
            over = ~missing & (usage > predicate.max_limit_percent) & ~taken
            if over.any():
                out.append((above, over))
            taken |= over
            pod = incoming.get(resource_of(predicate.name) or "") if incoming else None
            if pod is not None:
                pushed = ~missing & (usage + pod[rows] > predicate.max_limit_percent) & ~taken
                if pushed.any():
                    out.append((pushed_above, pushed))
                taken |= pushed
        return out

    def scores(
        self,
        rows: npt.NDArray[np.intp],
        now: float,
        extra: Mapping[str, FloatArray] | None = None,
        own_hot: FloatArray | None = None,
        regular: bool = False,
        incoming: Mapping[str, FloatArray] | None = None,
        judged: Mapping[str, Mask] | None = None,
    ) -> npt.NDArray[np.int64]:
        """Dynamic scores 0..100 for ``rows`` (renormalised over valid metrics, rounded, minus 10 x hot); with the
        ``pack`` strategy ``dynamic.pack_score``'s (``incoming``: the pod's share per resource, per row)."""
        if self.args.policy.scoring.strategy == "pack":
            return self._pack_scores(rows, now, extra, regular, incoming, judged)
        weighted = np.zeros(len(rows))
        weights = np.zeros(len(rows))
        for priority in self.args.policy.priority:
            if priority.weight == 0:
                continue
            usage = self.usage(priority.name, rows, now, extra, regular, judged)
            valid = ~np.isnan(usage)
            idle = 1.0 - np.clip(np.where(valid, usage, 0.0), 0.0, 1.0)
            weighted += np.where(valid, idle * priority.weight, 0.0)
            weights += np.where(valid, priority.weight, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            raw = np.where(weights > 0, weighted * MAX_SCORE / np.where(weights > 0, weights, 1.0), NEUTRAL_SCORE)
        hot = self.hot(rows, now) + (own_hot[rows] if own_hot is not None else 0.0)
        value = raw - HOT_VALUE_PENALTY * hot
        # Python's round() is round-half-even, as is numpy's: both paths agree on .5 cases.
        return np.clip(np.round(value), 0, MAX_SCORE).astype(np.int64)

    def _pack_scores(
        self,
        rows: npt.NDArray[np.intp],
        now: float,
        extra: Mapping[str, FloatArray] | None,
        regular: bool,
        incoming: Mapping[str, FloatArray] | None,
        judged: Mapping[str, Mask] | None,
    ) -> npt.NDArray[np.int64]:
        """``dynamic.pack_score`` for ``rows``: the same operations in the same order (``target_load`` per metric)."""
        target = self.args.policy.scoring.target_utilization
        weighted = np.zeros(len(rows))
        weights = np.zeros(len(rows))
        for priority in self.args.policy.priority:
            if priority.weight == 0:
                continue
            usage = self.usage(priority.name, rows, now, extra, regular, judged)
            valid = ~np.isnan(usage)
            pod = incoming.get(resource_of(priority.name) or "") if incoming else None
            if pod is not None:
                usage = usage + pod[rows]
            u = np.maximum(np.where(valid, usage, 0.0), 0.0)
            with np.errstate(invalid="ignore"):
                below = (1.0 - target) * u / target + target
                part = np.where(u > 1.0, 0.0, np.where(u > target, target * (1.0 - u) / (1.0 - target), below))
            weighted += np.where(valid, part * priority.weight, 0.0)
            weights += np.where(valid, priority.weight, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            raw = np.where(weights > 0, weighted * MAX_SCORE / np.where(weights > 0, weights, 1.0), NEUTRAL_SCORE)
        return np.clip(np.round(raw), 0, MAX_SCORE).astype(np.int64)

    # -- one row at a time: the same arithmetic as ``filter`` and ``scores``, in Python floats (IEEE doubles, the
    # same operations in the same order, so bit-identical), for the few rows a decision refreshes: a numpy call
    # per operation costs more than the operation on one row.

    def reason_of(
        self,
        row: int,
        incoming: Mapping[str, FloatArray] | None = None,
        extra: Mapping[str, FloatArray] | None = None,
        regular: bool = False,
        judged: Mapping[str, Mask] | None = None,
    ) -> str | None:
        """``filter``'s reason for one row (None: passes). ``evaluate`` must have run for the decision's time."""
        for predicate in self.args.policy.predicate:
            limit = predicate.max_limit_percent
            if limit == 0:
                continue
            no_fresh, above, pushed_above = self.reasons(predicate)
            usage = _base(self.regular_values if regular else self.fresh_values, predicate.name, row, judged)
            if extra is not None and predicate.name in extra:
                usage = usage + float(extra[predicate.name][row])
            if math.isnan(usage):
                if no_fresh is not None:
                    return no_fresh
                continue
            if usage > limit:
                return above
            pod = incoming.get(resource_of(predicate.name) or "") if incoming else None
            if pod is not None and usage + float(pod[row]) > limit:
                return pushed_above
        return None

    def score_of(
        self,
        row: int,
        extra: Mapping[str, FloatArray] | None = None,
        own_hot: FloatArray | None = None,
        regular: bool = False,
        incoming: Mapping[str, FloatArray] | None = None,
        judged: Mapping[str, Mask] | None = None,
    ) -> int:
        """``scores`` for one row. ``evaluate`` must have run for the decision's time."""
        if self.args.policy.scoring.strategy == "pack":
            return self._pack_score_of(row, extra, regular, incoming, judged)
        weighted = weights = 0.0
        for priority in self.args.policy.priority:
            if priority.weight == 0:
                continue
            usage = self._row_usage(priority.name, row, extra, regular, judged)
            if math.isnan(usage):
                continue
            idle = 1.0 - min(max(usage, 0.0), 1.0)
            weighted += idle * priority.weight
            weights += priority.weight
        raw = weighted * MAX_SCORE / weights if weights > 0 else NEUTRAL_SCORE
        annotated = float(self.fresh_values[HOT_VALUE_KEY][row])
        hot = (0.0 if math.isnan(annotated) else float(math.trunc(annotated))) + (
            float(own_hot[row]) if own_hot is not None else 0.0
        )
        value = raw - HOT_VALUE_PENALTY * hot
        return min(max(round(value), 0), MAX_SCORE)

    def _row_usage(
        self,
        metric: str,
        row: int,
        extra: Mapping[str, FloatArray] | None,
        regular: bool,
        judged: Mapping[str, Mask] | None,
    ) -> float:
        """One row's usage of ``metric`` as the pod's class reads it, with ``extra`` added (NaN: no valid reading;
        0 before ``extra`` where ``judged`` marks a new node's metric, ``_base``)."""
        usage = _base(self.regular_values if regular else self.fresh_values, metric, row, judged)
        if extra is not None and metric in extra:
            usage += float(extra[metric][row])
        return usage

    def _pack_score_of(
        self,
        row: int,
        extra: Mapping[str, FloatArray] | None,
        regular: bool,
        incoming: Mapping[str, FloatArray] | None,
        judged: Mapping[str, Mask] | None,
    ) -> int:
        target = self.args.policy.scoring.target_utilization
        weighted = weights = 0.0
        for priority in self.args.policy.priority:
            if priority.weight == 0:
                continue
            usage = self._row_usage(priority.name, row, extra, regular, judged)
            if math.isnan(usage):
                continue
            pod = incoming.get(resource_of(priority.name) or "") if incoming else None
            if pod is not None:
                usage = usage + float(pod[row])
            weighted += target_load(usage, target) * priority.weight
            weights += priority.weight
        raw = weighted * MAX_SCORE / weights if weights > 0 else NEUTRAL_SCORE
        return min(max(round(raw), 0), MAX_SCORE)


EARLY = 1e-3
"""Seconds by which a freshness edge is brought forward (float-rounding margin; costs a re-evaluation)."""


def _next_edge(stamps: FloatArray, now: float, window: float, args: DynamicArgs) -> float:
    """The first instant after ``now`` (less ``EARLY``) at which ``_fresh`` of any of ``stamps`` may flip."""
    skew = args.max_skew.total_seconds()
    edges = np.concatenate((stamps - skew, stamps + window))
    upcoming = edges[edges > now - EARLY]  # NaN stamps compare False: no edge
    return float(upcoming.min()) - EARLY if len(upcoming) else math.inf


def _fresh(values: FloatArray, stamps: FloatArray, now: float, window: float, args: DynamicArgs) -> FloatArray:
    skew = args.max_skew.total_seconds()
    ok = ~np.isnan(stamps) & (stamps <= now + skew) & (now < stamps + window)
    return np.where(ok, values, np.nan)


def _base(values: Mapping[str, FloatArray], metric: str, row: int, judged: Mapping[str, Mask] | None) -> float:
    """One row's usage before the estimate: 0.0 where recent bindings judge a new node's metric, else the
    (fresh or regular) value, NaN without one (``usage``'s ``np.where``)."""
    if judged is not None and metric in judged and judged[metric][row]:
        return 0.0
    return float(values[metric][row])


def _without_batch(fresh: FloatArray, batch: FloatArray) -> FloatArray:
    """``max(0, fresh - batch)`` where a fresh, non-zero batch usage is known, else ``fresh`` (NaN stays NaN)."""
    taken = ~np.isnan(batch) & (batch != 0)
    return np.where(taken, np.maximum(fresh - np.where(taken, batch, 0.0), 0.0), fresh)


def _grown_bool(arr: Mask, cap: int) -> Mask:
    out = np.zeros(cap, dtype=bool)
    out[: len(arr)] = arr
    return out
