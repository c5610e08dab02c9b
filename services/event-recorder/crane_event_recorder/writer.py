"""Drain the buffer into Redis in batches, in order; survive Redis outages and notice Redis restarts.

A failed batch goes back to the front of the buffer and is retried with backoff, so order is kept and the loop
never dies. A Redis restart without persistence (or a failover to a lagging replica) silently loses records that
were already written; the writer notices by the server's ``run_id`` changing, and asks for a re-list, which
restores them from the API server. The same happens after the buffer had to drop records.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from crane_event_recorder.buffer import RecordBuffer
from crane_event_recorder.metrics import RecorderMetrics
from crane_shared.bindings import BindingRecord
from crane_shared.logs import LogOnce, get_logger
from crane_shared.retry import Backoff, sleep_unless

__all__ = ["BindingSink", "Writer"]

log = get_logger("crane.event_recorder.writer")


class BindingSink(Protocol):
    """The part of ``crane_shared.binding_store.BindingStore`` the writer uses."""

    async def record(self, records: Sequence[BindingRecord], stream_maxlen: int) -> list[bool]: ...


class Writer:
    def __init__(
        self,
        sink: BindingSink,
        buffer: RecordBuffer,
        metrics: RecorderMetrics,
        *,
        batch_size: int,
        stream_maxlen: int,
        backoff: Backoff,
        server_id: Callable[[], Awaitable[str]] | None = None,
        server_check_interval: float = 5.0,
        on_records_lost: Callable[[str], None] = lambda reason: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._sink = sink
        self._buffer = buffer
        self._metrics = metrics
        self._batch_size = batch_size
        self._stream_maxlen = stream_maxlen
        self._backoff = backoff
        self._server_id = server_id
        self._check_interval = server_check_interval
        self._on_records_lost = on_records_lost
        self._clock = clock
        self._known_server: str | None = None
        self._unchecked_writes = False  # writes landed while no identity was known
        self._log = LogOnce(log)
        self._last_check = float("-inf")
        self._outage_since: float | None = None
        self._dropped_before_outage = 0

    async def run(self, stopping: asyncio.Event) -> None:
        """Write until ``stopping`` is set and the buffer is empty (the runtime cancels after its grace)."""
        buffer = self._buffer
        while True:
            if not len(buffer):
                if stopping.is_set():
                    return
                await self._idle(stopping)
                continue
            if self._known_server is None:
                await self._check_server()  # which server the writes land on (a restart is told by it)
            batch = buffer.take(self._batch_size)
            try:
                added = await self._sink.record(batch, self._stream_maxlen)
            except Exception as exc:  # any failure: keep the records, back off, never die
                self._failed(batch, exc)
                await asyncio.sleep(self._backoff.next_delay())
                continue
            buffer.done(batch)
            if self._known_server is None and self._server_id is not None:
                self._unchecked_writes = True
            self._account(batch, added)
            if self._outage_since is not None:
                await self._recovered()
            elif time.monotonic() - self._last_check >= self._check_interval:
                await self._check_server()

    async def _idle(self, stopping: asyncio.Event) -> None:
        await sleep_unless(stopping, self._check_interval, until=self._buffer.not_empty.wait())
        if not len(self._buffer) and time.monotonic() - self._last_check >= self._check_interval:
            await self._check_server()

    def _account(self, batch: list[BindingRecord], added: list[bool]) -> None:
        now = self._clock()
        new = 0
        for record, is_new in zip(batch, added, strict=True):
            if is_new:
                new += 1
                self._metrics.lag.observe(max(0.0, now - record.bound_at))
        self._metrics.bindings_recorded.inc(new)
        self._metrics.duplicates.inc(len(batch) - new)

    def _failed(self, batch: list[BindingRecord], exc: Exception) -> None:
        self._metrics.redis_errors.inc()
        dropped = self._buffer.give_back(batch)
        if dropped:
            self._metrics.buffer_dropped.inc(dropped)
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            self._dropped_before_outage = self._buffer.dropped - dropped
            log.warning("redis write failed; buffering and retrying", error=repr(exc), buffered=self._buffer.depth)

    async def _recovered(self) -> None:
        assert self._outage_since is not None
        lost = self._buffer.dropped - self._dropped_before_outage
        log.info(
            "redis writes recovered",
            outage_seconds=round(time.monotonic() - self._outage_since, 3),
            dropped=lost,
            buffered=self._buffer.depth,
        )
        self._outage_since = None
        self._backoff.reset()
        if lost:
            self._on_records_lost("redis-dropped")
        await self._check_server()

    async def _check_server(self) -> None:
        """Ask for a re-list when Redis is a different server than before (restarted, failed over)."""
        self._last_check = time.monotonic()
        if self._server_id is None:
            return
        try:
            current = await self._server_id()
        except Exception as err:  # Redis down: the next write will fail and be retried; check again after it
            self._metrics.redis_errors.inc()
            self._log.warning(
                "server-id",
                "cannot read the Redis server's identity (INFO server: the user needs +info); a restart or failover "
                "is not detected until it can",
                error=repr(err),
            )
            return
        previous, self._known_server = self._known_server, current
        unchecked, self._unchecked_writes = self._unchecked_writes, False
        if previous is None and unchecked:  # writes landed before the identity could be read: on which server?
            log.warning("redis server identity known only after writes; re-listing in case it changed meanwhile")
            self._on_records_lost("redis-unverified")
        elif previous is not None and previous != current:
            log.warning(
                "redis server changed (restart or failover); re-listing to restore records",
                previous=previous,
                current=current,
            )
            self._on_records_lost("redis-reset")
