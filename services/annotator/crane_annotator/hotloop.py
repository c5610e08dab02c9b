"""Keeping hot values current: a periodic refresh of every node, and a fast path driven by the binding stream.

The periodic refresh (``--hot-value-interval``, 15 s) makes values decay as bindings leave the policy windows,
and rewrites values whose annotation is getting old. The stream path reacts to each new binding the
event-recorder announces: the node is debounced (``debounce``), recounted, and patched ahead of routine patches,
so a burst of pods onto one node shows in its hot value within a second. Both run without Prometheus.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from crane_annotator.debounce import Debouncer
from crane_annotator.hot import Hot, HotValues, to_write
from crane_annotator.metrics import AnnotatorMetrics
from crane_annotator.writer import Patcher
from crane_shared.binding_store import BindingStore
from crane_shared.logs import LogOnce, get_logger

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
        interval: float = 15.0,
        debounce: float = 0.25,
        max_age: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._hot = hot
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

    async def periodic(self, after: asyncio.Event | None = None) -> None:
        """Every ``interval``: recount all nodes, patch those changed (urgent) or old (routine). The first pass
        waits for ``after`` (the first metric round, whose patches carry hot values too) or one interval, so a
        fresh leader does not patch every node twice."""
        if after is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(after.wait(), self._interval)
        while True:
            started = self._clock()
            await self.refresh_all()
            await asyncio.sleep(max(0.0, started + self._interval - self._clock()))

    async def refresh_all(self) -> None:
        nodes = sorted(self._nodes())
        fresh = await self._refresh(nodes, "interval")
        if fresh is None:
            return
        self._hot.forget(nodes)
        self._metrics.hot_last_success.set(self._wall_clock())
        await self._write(fresh)

    async def follow_stream(self) -> None:
        """Read new bindings from the stream; recount a node ``debounce`` after its first new binding."""
        try:
            await self._follow_stream()
        finally:  # leadership lost or shutting down: no patch may leave after this
            for task in list(self._flushes):
                task.cancel()

    async def _follow_stream(self) -> None:
        last_id: str | None = None
        backoff = 0.5
        while True:
            try:
                if last_id is None:
                    last_id = await self._stream_tail()
                deadline = self._debouncer.next_deadline()
                wait_ms = STREAM_BLOCK_MS
                if deadline is not None:
                    wait_ms = min(STREAM_BLOCK_MS, max(1, int((deadline - self._clock()) * 1000) + 1))
                batch = await self._store.read_stream(last_id, block_ms=wait_ms, count=STREAM_BATCH)
                backoff = 0.5
            except (RedisError, OSError) as err:
                self._log_once.warning("stream", "reading the binding stream failed; retrying", error=str(err))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            last_id = batch.last_id
            if batch.skipped:
                self._log_once.warning("skipped", "undecodable binding records skipped", first=batch.skipped[0].reason)
            if batch.records:
                self._metrics.bindings_seen.inc(len(batch.records))
                self._debouncer.add((r.node for r in batch.records), self._clock())
            due = self._debouncer.take_due(self._clock())
            if due:
                task = asyncio.create_task(self._flush(due))
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

    async def _flush(self, nodes: Sequence[str]) -> None:
        known = self._nodes()
        nodes = [n for n in nodes if n in known]
        fresh = await self._refresh(nodes, "binding")
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
        written = self._hot.written
        due = to_write(fresh, written, self._wall_clock(), self._max_age)
        changed = [n for n in due if n not in written or written[n][0] != fresh[n].value]
        aged = sorted(set(due) - set(changed))
        reports = await asyncio.gather(
            self._patcher.patch_many({n: {} for n in changed}, hot=self._hot.annotation, urgent=True),
            self._patcher.patch_many({n: {} for n in aged}, hot=self._hot.annotation),
        )
        for report in reports:
            self._metrics.patches.labels("hot_value", "ok").inc(len(report.ok))
            self._metrics.patches.labels("hot_value", "missing").inc(len(report.missing))
            self._metrics.patches.labels("hot_value", "error").inc(len(report.failed))
