"""List, then watch from the list's resourceVersion; re-list on 410 Gone, on a broken watch, or on request.

Every list re-records everything it returns; that is safe because writes are idempotent (a pod UID is recorded
once per node set), and it is what makes the recorder lose nothing: whatever a broken watch, a 410 or a Redis
restart may have missed is still in the API server (events live for an hour, far beyond any hot-value window).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from crane_event_recorder.ingest import Ingest
from crane_event_recorder.metrics import RecorderMetrics
from crane_event_recorder.retry import Backoff, sleep_unless
from crane_event_recorder.source import EventSource, Gone
from crane_shared.logs import get_logger

__all__ = ["Follower"]

log = get_logger("crane.event_recorder.follower")

# Yield to the event loop every this many watch events: a buffered stream's readline never suspends, and the
# writer must get its turn.
_YIELD_EVERY = 64
# A watch that ends (cleanly) faster than this, with nothing in it, is retried with backoff, not in a hot loop.
_MIN_WATCH_SECONDS = 1.0


class Follower:
    """Keeps one ``EventSource`` flowing into ``Ingest``; ``run`` returns only when ``stopping`` is set."""

    def __init__(self, source: EventSource, ingest: Ingest, metrics: RecorderMetrics, backoff: Backoff) -> None:
        self.source = source
        self._ingest = ingest
        self._metrics = metrics
        self._backoff = backoff
        self._relist = asyncio.Event()
        self._relist_reason = ""
        # Buffer position after the first complete list: ready once the buffer has settled up to here.
        self.first_list_position: int | None = None

    def request_relist(self, reason: str) -> None:
        """Re-list now (e.g. Redis came back empty): the watch is dropped and everything listed again."""
        self._relist_reason = reason
        self._relist.set()

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self._relist.clear()
            work = asyncio.create_task(self._list_and_watch(), name=f"follow {self.source.name}")
            stop = asyncio.create_task(stopping.wait())
            relist = asyncio.create_task(self._relist.wait())
            try:
                await asyncio.wait({work, stop, relist}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (work, stop, relist):
                    task.cancel()
                for task in (stop, relist):
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if not work.done() or work.cancelled():
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                if self._relist.is_set() and not stopping.is_set():
                    self._restart(self._relist_reason)
                continue
            error = work.exception()
            if isinstance(error, Gone):
                self._restart("gone", detail=str(error))
            else:
                self._restart("error", detail=repr(error))
                await sleep_unless(stopping, self._backoff.next_delay())

    def _restart(self, reason: str, detail: str = "") -> None:
        self._metrics.watch_restarts.labels(reason).inc()
        level = log.info if reason in ("gone", "redis-reset", "redis-dropped") else log.warning
        level("re-listing", source=self.source.name, reason=reason, detail=detail[:300])

    async def _list_and_watch(self) -> None:
        accept = self._ingest.accept
        resource_version = ""
        listed = 0
        async for page in self.source.list():
            for item in page.items:
                accept(item)
            listed += len(page.items)
            resource_version = page.resource_version
            await asyncio.sleep(0)
        self._metrics.lists.inc()
        if self.first_list_position is None:
            self.first_list_position = self._ingest.buffer.pushed
        log.info("listed", source=self.source.name, events=listed, resource_version=resource_version)
        self._backoff.reset()
        while True:
            started = time.monotonic()
            seen = 0
            async for event in self.source.watch(resource_version):
                if event.resource_version:
                    resource_version = event.resource_version
                if event.type in ("ADDED", "MODIFIED"):
                    accept(event.object)
                seen += 1
                if seen % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            if seen == 0 and time.monotonic() - started < _MIN_WATCH_SECONDS:
                await asyncio.sleep(self._backoff.next_delay())
            elif seen:
                self._backoff.reset()
