"""Hot values: recent bindings per node, read from Redis, kept here between refreshes.

Independent of Prometheus on purpose (upstream recomputed them only after a successful metric sync). The latest
computed value per node is what every patch carries (see ``writer``).

When a hot-value-only patch is needed (``hot_action``) follows from what the Dynamic plugin reads: the annotated
value while its timestamp is less than ``HOT_VALUE_FRESHNESS`` (5 m) old, else nothing, which scores like 0.
So a node needs a patch of its own only when

- ``change``: the value the plugin reads now differs from the one computed from the bindings (a burst raised
  it, bindings left a window, or a non-zero annotation went stale), or
- ``refresh``: the value is unchanged and non-zero, and its annotation is ``max_age`` old (default 4 m, below
  the 5 m the plugin allows, leaving a margin for clock skew and delivery). Metric patches carry the hot value
  too, so with a sync period under ``max_age`` a healthy round always refreshes it first and this never fires.

An unchanged 0 never needs rewriting: missing, stale and 0 all read as 0. With no bindings, the only patches a
node gets are its metric patches, one per period.

The value only falls when a binding leaves a window, and when that happens is known from the binding times:
``next_fall`` gives it, and the follower recounts the node then (not on the next periodic tick).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

import redis.asyncio as aioredis

from crane_annotator.patches import DEFAULT_STAMP, Stamp, hot_value_annotation
from crane_shared.annotations import HOT_VALUE_FRESHNESS, HOT_VALUE_KEY, AnnotationError, decode
from crane_shared.bindings import BindingSchema
from crane_shared.hotvalue import hot_value, windows
from crane_shared.policy import HotValuePolicy

Action = Literal["change", "refresh"]
FRESH_FOR = HOT_VALUE_FRESHNESS.total_seconds()
FALL_LAG = 0.001
"""Recount this long after a binding's computed exit time, so float rounding cannot leave it in the window."""


@dataclass(frozen=True)
class Hot:
    value: int
    at: float
    """unix seconds of the count it was computed from"""
    counts: Mapping[timedelta, int]
    next_fall: float | None = None
    """unix seconds at which the value falls if no binding arrives meanwhile (None: it is 0, or cannot fall)"""


def counts_in_windows(times: Sequence[float], spans: Iterable[timedelta], now: float) -> dict[timedelta, int]:
    """Bindings (sorted times) strictly after ``now - span`` per span, later times included, as upstream."""
    return {span: len(times) - bisect_right(times, now - span.total_seconds()) for span in spans}


def next_fall(times: Sequence[float], rules: Iterable[HotValuePolicy], now: float) -> float | None:
    """When the hot value first falls if no binding arrives: a rule's ``floor(n / count)`` drops once the
    ``n mod count + 1`` oldest bindings in its window have left it, the last of them at its time + the range."""
    earliest: float | None = None
    for rule in rules:
        span = rule.time_range.total_seconds()
        first = bisect_right(times, now - span)
        n = len(times) - first
        if n < rule.count:
            continue
        at = times[first + n % rule.count] + span
        earliest = at if earliest is None else min(earliest, at)
    return earliest


def read_value(written: tuple[int, float] | None, now: float, fresh_for: float = FRESH_FOR) -> int:
    """What the Dynamic plugin reads from a node whose hot annotation is ``written`` = (value, unix time):
    the value while fresh (``now < at + 5m``), else 0 (missing and stale annotations add no penalty)."""
    if written is None or not now < written[1] + fresh_for:
        return 0
    return written[0]


def hot_action(
    value: int, written: tuple[int, float] | None, now: float, max_age: float, fresh_for: float = FRESH_FOR
) -> Action | None:
    """Whether a node whose computed hot value is ``value`` needs a hot-value patch now (see the module doc)."""
    if read_value(written, now, fresh_for) != value:
        return "change"
    if value != 0 and written is not None and now - written[1] >= max_age:
        return "refresh"
    return None


def hot_actions(
    computed: Mapping[str, Hot], written: Mapping[str, tuple[int, float]], now: float, max_age: float
) -> dict[str, Action]:
    """``hot_action`` for every computed node; only those that need a patch, in name order."""
    actions = {}
    for node in sorted(computed):
        action = hot_action(computed[node].value, written.get(node), now, max_age)
        if action is not None:
            actions[node] = action
    return actions


class BindingTimes(Protocol):
    async def recent(self, nodes: Sequence[str], since: float) -> dict[str, list[float]]:
        """Per node, the sorted times of its bindings strictly after ``since`` (all nodes present)."""
        ...


class RedisBindingTimes:
    """Binding times from the per-node sorted sets (score = bind time): one pipelined round trip per refresh."""

    def __init__(self, redis: aioredis.Redis, schema: BindingSchema) -> None:
        self._redis = redis
        self._schema = schema

    async def recent(self, nodes: Sequence[str], since: float) -> dict[str, list[float]]:
        names = list(dict.fromkeys(nodes))
        if not names:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for node in names:
                pipe.zrangebyscore(self._schema.node_key(node), f"({since!r}", "+inf", withscores=True)
            results = await pipe.execute()
        return {node: [float(score) for _, score in pairs] for node, pairs in zip(names, results, strict=True)}


class HotValues:
    def __init__(
        self,
        source: BindingTimes,
        rules: Sequence[HotValuePolicy],
        stamp: Stamp = DEFAULT_STAMP,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._rules = tuple(rules)
        self._windows = windows(self._rules)
        self._longest = max((w.total_seconds() for w in self._windows), default=0.0)
        self._stamp = stamp
        self._clock = clock
        self._falls: list[tuple[float, str]] = []
        """heap of (recount time, node); an entry counts only while it matches ``_fall_at``"""
        self._fall_at: dict[str, float] = {}
        self.falls_changed = asyncio.Event()
        """set when a refresh schedules a fall earlier than every other (the loop waiting for falls re-plans)"""
        self.latest: dict[str, Hot] = {}
        self._last_stamp: tuple[float, str, float] = (-1.0, "", 0.0)
        """(count time, its ",<timestamp>" text, the whole second it holds) of the last text encoded"""
        self._texts: dict[str, tuple[Hot, str, float]] = {}
        """node -> (the count, its annotation text, the time that text holds): encoded once per count, not once
        per patch, and not parsed back when the patch carrying it succeeds"""
        self.written: dict[str, tuple[int, float]] = {}
        """node -> (value, at) of the hot value last written to it (by us, or seen on the node at start)"""

    async def refresh(self, nodes: Iterable[str]) -> dict[str, Hot]:
        """Read each node's recent binding times (one pipelined round trip) and apply upstream's formula. Several
        refreshes run at once (the periodic pass, a binding's flush, a round's stale ones): a node another refresh
        counted later than this one read is left to that count (neither stored nor returned, its fall kept)."""
        names = list(nodes)
        now = self._clock()
        if not self._rules:
            fresh = {node: Hot(0, now, {}) for node in names}
        else:
            times = await self._source.recent(names, now - self._longest)
            fresh = {}
            for node in names:
                newer = self.latest.get(node)
                if newer is not None and newer.at > now:
                    continue
                ts = times.get(node, [])
                counts = counts_in_windows(ts, self._windows, now)
                fresh[node] = Hot(hot_value(counts, self._rules), now, counts, next_fall(ts, self._rules, now))
        for node, hot in fresh.items():
            at = None if hot.next_fall is None else max(hot.next_fall, now) + FALL_LAG
            if at is None:
                self._fall_at.pop(node, None)
            elif self._fall_at.get(node) != at:
                self._fall_at[node] = at
                earliest = self.next_fall_at()
                heapq.heappush(self._falls, (at, node))
                if earliest is None or at < earliest:
                    self.falls_changed.set()
        self.latest.update(fresh)
        return fresh

    async def refresh_stale(self, nodes: Iterable[str], older_than: float) -> dict[str, Hot]:
        """Recount only the nodes whose latest count is missing or more than ``older_than`` seconds old: what a
        round needs before its patches, when the hot-value loops keep the others current."""
        cutoff = self._clock() - older_than
        stale = [n for n in nodes if (hot := self.latest.get(n)) is None or hot.at < cutoff]
        return await self.refresh(stale) if stale else {}

    def next_fall_at(self) -> float | None:
        """The earliest time (unix seconds) at which some node's hot value falls."""
        while self._falls and self._fall_at.get(self._falls[0][1]) != self._falls[0][0]:
            heapq.heappop(self._falls)
        return self._falls[0][0] if self._falls else None

    def take_falls(self, now: float) -> list[str]:
        """Nodes whose value has fallen by ``now`` and must be recounted, sorted; forgotten until recounted."""
        due = set()
        while self._falls and self._falls[0][0] <= now:
            at, node = heapq.heappop(self._falls)
            if self._fall_at.get(node) == at:
                del self._fall_at[node]
                due.add(node)
        return sorted(due)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop nodes that no longer exist."""
        kept = set(keep)
        for table in (self.latest, self.written, self._fall_at, self._texts):
            for node in [n for n in table if n not in kept]:
                del table[node]

    def annotation(self, node: str) -> dict[str, str]:
        """The hot-value annotation from the latest count, for a patch being sent now; empty when unknown."""
        hot = self.latest.get(node)
        if hot is None:
            return {}
        cached = self._texts.get(node)
        if cached is None or cached[0] is not hot:
            if self._last_stamp[0] != hot.at:  # a refresh counts many nodes at one time: one timestamp for all
                at = datetime.fromtimestamp(hot.at, UTC).replace(microsecond=0)  # annotations hold whole seconds
                suffix = hot_value_annotation(0, at, self._stamp)[HOT_VALUE_KEY].partition(",")[1:]
                self._last_stamp = (hot.at, "".join(suffix), at.timestamp())
            cached = self._texts[node] = (hot, f"{hot.value}{self._last_stamp[1]}", self._last_stamp[2])
        return {HOT_VALUE_KEY: cached[1]}

    def mark_written(self, node: str, annotation_value: str) -> None:
        """Remember a hot-value annotation that is now on the node (sent by us, or found there at start)."""
        cached = self._texts.get(node)
        if cached is not None and cached[1] == annotation_value:  # the text we encoded: no need to parse it back
            self.written[node] = (cached[0].value, cached[2])
            return
        try:
            sample = decode(annotation_value, self._stamp.legacy_zone)
        except AnnotationError:
            return
        self.written[node] = (int(sample.value), sample.timestamp.timestamp())
