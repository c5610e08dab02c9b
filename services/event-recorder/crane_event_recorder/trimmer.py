"""Delete binding records older than the retention, on an interval.

Every replica may trim: deleting what is already deleted is a no-op. Retention defaults to the policy's longest
hot-value window plus a margin, so no window ever counts a trimmed record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from crane_event_recorder.metrics import RecorderMetrics
from crane_shared.logs import LogOnce, get_logger
from crane_shared.retry import sleep_unless

__all__ = ["Trimmable", "Trimmer"]

log = get_logger("crane.event_recorder.trimmer")


class Trimmable(Protocol):
    async def trim(self, before: float) -> int: ...


@dataclass
class Trimmer:
    """A worker: every ``interval``, delete records bound more than ``retention`` seconds ago."""

    store: Trimmable
    retention: float
    interval: float
    metrics: RecorderMetrics
    clock: Callable[[], float] = time.time
    _log_once: LogOnce = field(init=False, default_factory=lambda: LogOnce(log))

    async def run(self, stopping: asyncio.Event) -> None:
        while not await sleep_unless(stopping, self.interval):
            try:
                removed = await self.store.trim(self.clock() - self.retention)
            except Exception as exc:  # Redis down: the writer reports it; try again next interval
                self.metrics.redis_errors.inc()
                self._log_once.warning(type(exc).__name__, "trim failed", error=repr(exc))
                continue
            self.metrics.trimmed.inc(removed)
