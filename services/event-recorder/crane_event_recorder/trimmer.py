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
from crane_event_recorder.retry import sleep_unless
from crane_shared.logs import LogOnce, get_logger

__all__ = ["Trimmable", "trim_forever"]

log = get_logger("crane.event_recorder.trimmer")


class Trimmable(Protocol):
    async def trim(self, before: float) -> int: ...


async def trim_forever(
    store: Trimmable,
    *,
    retention: float,
    interval: float,
    metrics: RecorderMetrics,
    stopping: asyncio.Event,
    clock: Callable[[], float] = time.time,
) -> None:
    log_once = LogOnce(log)
    while not await sleep_unless(stopping, interval):
        try:
            removed = await store.trim(clock() - retention)
        except Exception as exc:  # Redis down: the writer reports it; try again next interval
            metrics.redis_errors.inc()
            log_once.warning(type(exc).__name__, "trim failed", error=repr(exc))
            continue
        metrics.trimmed.inc(removed)
