"""Keeping hot values current: event-driven recounts, plus a periodic pass over every node as a safety net.

A node is recounted when its value can change:
- rise: the event-recorder announces a binding on the stream; the node is debounced (``debounce``) so a burst
  costs one recount, then recounted and, if changed, patched ahead of routine patches;
- fall: a binding leaves a policy window; the time is known from the binding times (``hot.next_fall``), and
  the follower wakes up then, so the written value falls within a second of the truth (a recount, a patch).
The periodic pass (``--hot-value-interval``, 15 s) recounts every node (catching anything missed: a Redis
restart, a trimmed stream) and refreshes unchanged non-zero values that reach ``max_age``.

Which node gets a patch is ``hot.hot_action``: only a value the scheduler would read differently, or one about
to go stale. A patch for a node that has a metric patch queued joins it (``writer``). Until the first metric
round of a leadership term has finished, hot-value patches only join queued round patches and are otherwise
held: the round writes every node's hot value anyway, and the pass that follows it writes what was held.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from crane_annotator.debounce import Debouncer
from crane_annotator.hot import FRESH_FOR, Hot, HotValues, hot_actions
from crane_annotator.metrics import AnnotatorMetrics
from crane_annotator.writer import Patcher
from crane_shared.binding_store import BindingStore
from crane_shared.logs import LogOnce, get_logger
from crane_shared.retry import Backoff, sleep_unless

log = get_logger("crane.annotator.hot")

STREAM_BLOCK_MS = 1000
STREAM_BATCH = 1000


class HotValueLoops:
    def __init__(
        self,
        hot: HotValues,
        store: BindingStore,
        redis: aioredis.Redis,
        nodes: Callable[[], Collection[str]],
        patcher: Patcher,
        metrics: AnnotatorMetrics,
        *,
        settled: asyncio.Event | None = None,
        interval: float = 15.0,
        debounce: float = 0.25,
        max_age: float = 240.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0 < max_age < FRESH_FOR:
            raise ValueError(
                f"--hot-value-max-age must be positive and below {FRESH_FOR:g}s (when schedulers stop reading a "
                f"hot value), got {max_age:g}s"
            )
        self._hot = hot
        self._settled = settled
        self._store = store
        self._redis = redis
        self._nodes = nodes
        self._patcher = patcher
        self._metrics = metrics
        self._interval = interval
        self._debouncer = Debouncer(debounce)
        self._max_age = max_age
        self._clock = clock
        self._wall_clock = wall_clock
        self._log_once = LogOnce(log)
        self._flushes: set[asyncio.Task[None]] = set()

    async def run(self, stopping: asyncio.Event) -> None:
        """The periodic pass and both followers until ``stopping`` (the worker contract); if one fails, the
        others are cancelled and the error raised."""
        async with asyncio.TaskGroup() as group:
            for loop in (self.periodic, self.follow_stream, self.follow_falls):
                group.create_task(loop(stopping))

    async def periodic(self, stopping: asyncio.Event) -> None:
        """Every ``interval`` until ``stopping``: recount all nodes and patch those that need it. The first pass
        waits for the first metric round (``settled``), however long it takes: its patches carry every node's
        hot value."""
        if self._settled is not None and await sleep_unless(stopping, None, until=self._settled.wait()):
            return
        while not stopping.is_set():
            started = self._clock()
            await self.refresh_all()
            await sleep_unless(stopping, started + self._interval - self._clock())

    async def refresh_all(self) -> None:
        nodes = sorted(self._nodes())
        fresh = await self._refresh(nodes, "interval")
        if fresh is None:
            return
        self._hot.forget(nodes)
        self._metrics.hot_last_success.set(self._wall_clock())
        await self._write(fresh)

    async def follow_stream(self, stopping: asyncio.Event) -> None:
        """Read new bindings from the stream until ``stopping``; recount a node ``debounce`` after its first new
        binding."""
        try:
            await self._follow_stream(stopping)
        finally:  # leadership lost or shutting down: no patch may leave after this
            for task in list(self._flushes):
                task.cancel()

    async def _follow_stream(self, stopping: asyncio.Event) -> None:
        last_id: str | None = None
        backoff = Backoff(initial=0.5, maximum=10.0)
        while not stopping.is_set():
            try:
                if last_id is None:
                    last_id = await self._stream_tail()
                deadline = self._debouncer.next_deadline()
                wait_ms = STREAM_BLOCK_MS
                if deadline is not None:
                    wait_ms = min(STREAM_BLOCK_MS, max(1, int((deadline - self._clock()) * 1000) + 1))
                batch = await self._store.read_stream(last_id, block_ms=wait_ms, count=STREAM_BATCH)
                backoff.reset()
            except (RedisError, OSError) as err:
                self._log_once.warning("stream", "reading the binding stream failed; retrying", error=str(err))
                await sleep_unless(stopping, backoff.next_delay())
                continue
            last_id = batch.last_id
            if batch.skipped:
                self._log_once.warning("skipped", "undecodable binding records skipped", first=batch.skipped[0].reason)
            if batch.records:
                self._metrics.bindings_seen.inc(len(batch.records))
                self._debouncer.add((r.node for r in batch.records), self._clock())
            self._start_flush(self._debouncer.take_due(self._clock()), "binding")

    async def follow_falls(self, stopping: asyncio.Event) -> None:
        """Until ``stopping``: recount each node when a binding leaves a window and its value falls (times from
        ``hot.next_fall``); a refresh that schedules an earlier fall wakes this loop up (``hot.falls_changed``)."""
        try:
            while not stopping.is_set():
                self._hot.falls_changed.clear()
                self._start_flush(self._hot.take_falls(self._wall_clock()), "expiry")
                fall = self._hot.next_fall_at()
                timeout = None if fall is None else fall - self._wall_clock()
                await sleep_unless(stopping, timeout, until=self._hot.falls_changed.wait())
        finally:
            for task in list(self._flushes):
                task.cancel()

    def _start_flush(self, nodes: Sequence[str], trigger: str) -> None:
        if not nodes:
            return
        task = asyncio.create_task(self._flush(nodes, trigger))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _stream_tail(self) -> str:
        """The id of the newest entry (``0-0`` when empty), so nothing added while we are not blocked is missed
        (``$`` would mean "after whatever is newest at each call")."""
        newest = await self._redis.xrevrange(self._store.schema.stream_key, count=1)
        if not newest:
            return "0-0"
        raw = newest[0][0]
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    async def _flush(self, nodes: Sequence[str], trigger: str) -> None:
        known = self._nodes()
        nodes = [n for n in nodes if n in known]
        if not nodes:
            return
        fresh = await self._refresh(nodes, trigger)
        if fresh:
            await self._write(fresh)

    async def _refresh(self, nodes: Sequence[str], trigger: str) -> dict[str, Hot] | None:
        started = self._clock()
        try:
            fresh = await self._hot.refresh(nodes)
        except (RedisError, OSError) as err:
            self._metrics.hot_refreshes.labels(trigger, "error").inc()
            self._log_once.warning(f"refresh-{trigger}", "counting bindings in Redis failed", error=str(err))
            return None
        self._metrics.hot_refreshes.labels(trigger, "ok").inc()
        self._metrics.hot_refresh_duration.labels(trigger).observe(self._clock() - started)
        return fresh

    async def _write(self, fresh: dict[str, Hot]) -> None:
        actions = hot_actions(fresh, self._hot.written, self._wall_clock(), self._max_age)
        changed = [n for n, action in actions.items() if action == "change"]
        aged = [n for n, action in actions.items() if action == "refresh"]
        merge_only = self._settled is not None and not self._settled.is_set()
        reports = await asyncio.gather(
            self._patcher.patch_many(
                {n: {} for n in changed}, hot=self._hot.annotation, urgent=True, merge_only=merge_only
            ),
            self._patcher.patch_many({n: {} for n in aged}, hot=self._hot.annotation, merge_only=merge_only),
        )
        for report in reports:
            joined = set(report.merged)
            self._metrics.patches.labels("hot_value", "ok").inc(len(set(report.ok) - joined))
            self._metrics.patches.labels("hot_value", "missing").inc(len(set(report.missing) - joined))
            self._metrics.patches.labels("hot_value", "error").inc(len(set(report.failed) - joined))
