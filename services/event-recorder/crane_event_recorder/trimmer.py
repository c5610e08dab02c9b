"""Delete binding records older than the retention, on an interval.

Every replica may trim: deleting what is already deleted is a no-op. Retention defaults to the policy's longest
hot-value window plus a margin, so no window ever counts a trimmed record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from crane_event_recorder.metrics import RecorderMetrics
from crane_shared.logs import LogOnce, get_logger
from crane_shared.retry import sleep_unless

__all__ = ["Trimmable", "Trimmer"]

log = get_logger("crane.event_recorder.trimmer")


class Trimmable(Protocol):
    async def trim(self, before: float) -> int: ...


class Trimmer:
    """A worker: every ``interval``, delete records bound more than ``retention`` seconds ago."""

    def __init__(
        self,
        store: Trimmable,
        *,
        retention: float,
        interval: float,
        metrics: RecorderMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._retention = retention
        self._interval = interval
        self._metrics = metrics
        self._clock = clock
        self._log_once = LogOnce(log)

    async def run(self, stopping: asyncio.Event) -> None:
        while not await sleep_unless(stopping, self._interval):
            try:
                removed = await self._store.trim(self._clock() - self._retention)
            except Exception as exc:  # Redis down: the writer reports it; try again next interval
                self._metrics.redis_errors.inc()
                self._log_once.warning(type(exc).__name__, "trim failed", error=repr(exc))
                continue
            self._metrics.trimmed.inc(removed)
