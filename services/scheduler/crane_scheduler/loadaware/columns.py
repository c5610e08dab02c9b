"""The Dynamic policy for many nodes at once: load annotations decoded into numpy columns.

``dynamic.py`` is the reference: one node, readable, shared with the extender and ``explain``. A scheduler
with thousands of nodes cannot afford a Python call per node per pod, so this module keeps every node's
decoded annotations as arrays (decoded once per node update, not once per decision) and evaluates freshness,
the predicates and the score with array operations. It must agree with ``dynamic.py`` for every input; a
property test holds the two together. Nodes with recent bindings of this scheduler (a handful) are evaluated
by the reference instead, since their estimate and own hot value are per pod.
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
from crane_shared.loadaware.dynamic import (
    HOT_VALUE_PENALTY,
    MAX_SCORE,
    NEUTRAL_SCORE,
    DynamicArgs,
    resource_of,
)

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

    def __post_init__(self) -> None:
        for name in [*self.metrics, HOT_VALUE_KEY]:
            self.values[name] = np.full(self.capacity, np.nan)
            self.stamps[name] = np.full(self.capacity, np.nan)
            self.malformed[name] = np.zeros(self.capacity, dtype=bool)

    @property
    def metrics(self) -> list[str]:
        return [s.name for s in self.args.policy.sync_policy]

    def _grow(self, rows: int) -> None:
        cap = max(rows, 2 * self.capacity)
        for table, fill in ((self.values, np.nan), (self.stamps, np.nan), (self.malformed, False)):
            for name, arr in table.items():
                grown = np.full(cap, fill, dtype=arr.dtype)
                grown[: len(arr)] = arr
                table[name] = grown  # type: ignore[assignment]
        self.capacity = cap

    def set_row(self, row: int, annotations: Mapping[str, str] | None) -> list[str]:
        """Decode one node's annotations into ``row``; returns the malformed metric names (to count)."""
        if row >= self.capacity:
            self._grow(row + 1)
        annotations = annotations or {}
        bad = []
        for name in [*self.metrics, HOT_VALUE_KEY]:
            key = name if name == HOT_VALUE_KEY else annotation_key(name)
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
        return bad

    def usage(
        self, metric: str, rows: npt.NDArray[np.intp], now: float, extra: Mapping[str, FloatArray] | None = None
    ) -> FloatArray:
        """Annotated usage (plus ``extra[metric]``, the estimate) where fresh, else NaN (the window strict,
        future stamps beyond the skew rejected)."""
        period = self.args.policy.period_of(metric)
        window = metric_freshness_window(period).total_seconds()
        usage = _fresh(self.values[metric][rows], self.stamps[metric][rows], now, window, self.args)
        if extra is not None and metric in extra:
            usage = usage + extra[metric][rows]
        return usage

    def hot(self, rows: npt.NDArray[np.intp], now: float) -> FloatArray:
        """Annotated hot value where fresh, else 0."""
        hot = _fresh(
            self.values[HOT_VALUE_KEY][rows],
            self.stamps[HOT_VALUE_KEY][rows],
            now,
            HOT_VALUE_FRESHNESS.total_seconds(),
            self.args,
        )
        return np.where(np.isnan(hot), 0.0, np.trunc(hot))

    def filter(
        self,
        rows: npt.NDArray[np.intp],
        now: float,
        incoming: Mapping[str, FloatArray] | None = None,
        extra: Mapping[str, FloatArray] | None = None,
    ) -> list[tuple[str, Mask]]:
        """(reason, rejected mask over ``rows``) per predicate, in policy order; a node takes the first reason.

        ``incoming`` holds, per resource, the pod's estimated usage as a fraction of each row's allocatable."""
        out: list[tuple[str, Mask]] = []
        taken = np.zeros(len(rows), dtype=bool)
        for predicate in self.args.policy.predicate:
            if predicate.max_limit_percent == 0:
                continue
            usage = self.usage(predicate.name, rows, now, extra)
            missing = np.isnan(usage)
            if self.args.stale == "fail-closed":
                closed = missing & ~taken
                if closed.any():
                    out.append((f"node(s) had no fresh {predicate.name}", closed))
                taken |= closed
            over = ~missing & (usage > predicate.max_limit_percent) & ~taken
            if over.any():
                out.append((f"node(s) had {predicate.name} above {predicate.max_limit_percent:g}", over))
            taken |= over
            pod = incoming.get(resource_of(predicate.name) or "") if incoming else None
            if pod is not None:
                pushed = ~missing & (usage + pod[rows] > predicate.max_limit_percent) & ~taken
                if pushed.any():
                    out.append((f"node(s) would have {predicate.name} above {predicate.max_limit_percent:g}", pushed))
                taken |= pushed
        return out

    def scores(
        self,
        rows: npt.NDArray[np.intp],
        now: float,
        extra: Mapping[str, FloatArray] | None = None,
        own_hot: FloatArray | None = None,
    ) -> npt.NDArray[np.int64]:
        """Dynamic scores 0..100 for ``rows`` (renormalised over valid metrics, rounded, minus 10 x hot)."""
        weighted = np.zeros(len(rows))
        weights = np.zeros(len(rows))
        for priority in self.args.policy.priority:
            if priority.weight == 0:
                continue
            usage = self.usage(priority.name, rows, now, extra)
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


def _fresh(values: FloatArray, stamps: FloatArray, now: float, window: float, args: DynamicArgs) -> FloatArray:
    skew = args.max_skew.total_seconds()
    ok = ~np.isnan(stamps) & (stamps <= now + skew) & (now < stamps + window)
    return np.where(ok, values, np.nan)


@dataclass
class RecentBindings:
    """This scheduler's recent bindings as parallel arrays, oldest first (appended in time order).

    A burst of thousands of pods leaves recent bindings on every node, so their effect (estimated usage not yet
    absorbed, own bindings in the hot value) is computed for all rows at once too: per decision, a few array
    operations over the bindings still inside the horizon.
    """

    capacity: int = 1024
    start: int = 0
    end: int = 0
    rows: npt.NDArray[np.intp] = field(init=False)
    bound_at: FloatArray = field(init=False)
    cpu: FloatArray = field(init=False)
    memory: FloatArray = field(init=False)
    index: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rows = np.full(self.capacity, -1, dtype=np.intp)
        self.bound_at = np.zeros(self.capacity)
        self.cpu = np.zeros(self.capacity)
        self.memory = np.zeros(self.capacity)

    def __len__(self) -> int:
        return self.end - self.start

    def add(self, uid: str, row: int, bound_at: float, cpu: float, memory: float) -> None:
        if self.end == self.capacity:
            self._compact()
        i = self.end
        self.rows[i], self.bound_at[i], self.cpu[i], self.memory[i] = row, bound_at, cpu, memory
        self.index[uid] = i
        self.end += 1

    def remove(self, uid: str) -> None:
        i = self.index.pop(uid, None)
        if i is not None and i >= self.start:
            self.rows[i] = -1

    def prune(self, before: float) -> None:
        """Forget bindings at or before ``before`` (they are outside every window)."""
        live = self.bound_at[self.start : self.end]
        self.start += int(np.searchsorted(live, before, side="right"))
        if self.start == self.end:
            self.start = self.end = 0
            self.index.clear()

    def _compact(self) -> None:
        n = self.end - self.start
        cap = max(1024, 2 * n) if n > self.capacity // 2 else self.capacity
        keep = slice(self.start, self.end)
        rows, at, cpu, mem = (
            self.rows[keep].copy(),
            self.bound_at[keep].copy(),
            self.cpu[keep].copy(),
            self.memory[keep].copy(),
        )
        self.capacity = cap
        self.__post_init__()
        self.rows[:n], self.bound_at[:n], self.cpu[:n], self.memory[:n] = rows, at, cpu, mem
        self.index = {uid: i - self.start for uid, i in self.index.items() if i >= self.start}
        self.start, self.end = 0, n

    def live(self) -> tuple[npt.NDArray[np.intp], FloatArray, FloatArray, FloatArray]:
        keep = slice(self.start, self.end)
        rows = self.rows[keep]
        ok = rows >= 0
        return rows[ok], self.bound_at[keep][ok], self.cpu[keep][ok], self.memory[keep][ok]


def recent_effects(
    cols: LoadColumns, recent: RecentBindings, n_rows: int, now: float, alloc_cpu: FloatArray, alloc_memory: FloatArray
) -> tuple[dict[str, FloatArray], FloatArray]:
    """(estimated usage to add per metric, own bindings' hot value) for every row, as ``dynamic.node_load`` does
    per node: the unabsorbed share of each recent pod, and bindings after the fresh hot-value annotation."""
    rows, bound_at, cpu, memory = recent.live()
    extra: dict[str, FloatArray] = {}
    est = cols.args.estimate
    if est.enabled and len(rows):
        for metric in cols.metrics:
            resource = resource_of(metric)
            if resource is None:
                continue
            window = est.window_of(metric).total_seconds()
            stamps = cols.stamps[metric][rows]
            fresh = ~np.isnan(stamps)
            if not fresh.any():
                continue  # no binding's node has this metric: nothing to add to
            absorbed = np.clip((stamps - bound_at) / window, 0.0, 1.0) if window > 0 else np.ones(len(rows))
            total = alloc_cpu if resource == "cpu" else alloc_memory
            factor = est.cpu_factor if resource == "cpu" else est.memory_factor
            amount = (cpu if resource == "cpu" else memory) * factor * (1.0 - absorbed)
            added = np.bincount(rows[fresh], weights=amount[fresh], minlength=n_rows)[:n_rows]
            with np.errstate(divide="ignore", invalid="ignore"):
                extra[metric] = np.where(
                    total[:n_rows] > 0, added / np.where(total[:n_rows] > 0, total[:n_rows], 1), 0.0
                )
    own = np.zeros(n_rows)
    if cols.args.own_bindings_in_hot_value and len(rows) and cols.args.policy.hot_value:
        all_rows = np.arange(n_rows, dtype=np.intp)
        hot = _fresh(
            cols.values[HOT_VALUE_KEY][all_rows],
            cols.stamps[HOT_VALUE_KEY][all_rows],
            now,
            HOT_VALUE_FRESHNESS.total_seconds(),
            cols.args,
        )
        after = np.where(np.isnan(hot), -np.inf, cols.stamps[HOT_VALUE_KEY][all_rows])[rows]
        for rule in cols.args.policy.hot_value:
            counted = (bound_at > after) & (bound_at > now - rule.time_range.total_seconds())
            own += np.floor(np.bincount(rows[counted], minlength=n_rows)[:n_rows] / rule.count)
    return extra, own
