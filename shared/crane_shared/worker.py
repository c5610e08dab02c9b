"""The one worker contract: a long-lived loop is an object with ``async run(stopping)``.

``run`` returns soon after ``stopping`` is set (finishing in-flight work first) and never returns before it
except by raising; the service runtime sets ``stopping`` on SIGTERM and cancels what is still running after its
grace period. Loops wait with ``crane_shared.retry.sleep_unless`` so a stop cuts every sleep short.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["Worker", "cancel_and_wait"]


@runtime_checkable
class Worker(Protocol):
    async def run(self, stopping: asyncio.Event) -> None: ...


async def cancel_and_wait(tasks: Sequence[asyncio.Task[Any]]) -> None:
    """Stop a worker's child tasks: cancel them all, then wait for each to finish. A task that ends with an
    error other than its cancellation raises it here."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
