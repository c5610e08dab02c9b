"""The one worker contract: a long-lived loop is an object with ``async run(stopping)``.

``run`` returns soon after ``stopping`` is set (finishing in-flight work first) and never returns before it
except by raising; the service runtime sets ``stopping`` on SIGTERM and cancels what is still running after its
grace period. Loops wait with ``crane_shared.retry.sleep_unless`` so a stop cuts every sleep short.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

__all__ = ["Worker"]


@runtime_checkable
class Worker(Protocol):
    async def run(self, stopping: asyncio.Event) -> None: ...
