"""Bounded FIFO of bindings waiting for Redis.

The watch must never stall because Redis is slow or down, so records queue here; when full the oldest is dropped
(and counted) because the newest bindings matter most to a hot value. ``settled`` counts records that left the
queue for good (written or dropped); records leave oldest first, so ``settled >= N`` says the first N pushed are
in Redis (or were dropped, only possible while Redis is down). Readiness uses it for the first list.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable

from crane_shared.bindings import BindingRecord

__all__ = ["RecordBuffer"]


class RecordBuffer:
    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"buffer capacity must be > 0, got {capacity}")
        self.capacity = capacity
        self._queue: deque[BindingRecord] = deque()
        self._in_flight = 0
        self.pushed = 0  # records ever accepted
        self.settled = 0  # records that left for good: written or dropped
        self.dropped = 0
        self.not_empty = asyncio.Event()

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def depth(self) -> int:
        """Queued plus being written: what would be lost if the process died now."""
        return len(self._queue) + self._in_flight

    def push(self, record: BindingRecord) -> int:
        """Append; returns how many old records were dropped to make room (0 or 1)."""
        self._queue.append(record)
        self.pushed += 1
        self.not_empty.set()
        return self._enforce_capacity()

    def take(self, limit: int) -> list[BindingRecord]:
        """Remove up to ``limit`` oldest records for a write; finish with ``done`` or ``give_back``."""
        count = min(limit, len(self._queue))
        batch = [self._queue.popleft() for _ in range(count)]
        self._in_flight += count
        if not self._queue:
            self.not_empty.clear()
        return batch

    def done(self, batch: Iterable[BindingRecord]) -> None:
        """The batch from ``take`` is in Redis."""
        count = sum(1 for _ in batch)
        self._in_flight -= count
        self.settled += count

    def give_back(self, batch: list[BindingRecord]) -> int:
        """The write failed: put the batch back at the front, in order; returns how many were dropped."""
        self._in_flight -= len(batch)
        self._queue.extendleft(reversed(batch))
        if self._queue:
            self.not_empty.set()
        return self._enforce_capacity()

    def _enforce_capacity(self) -> int:
        dropped = 0
        while len(self._queue) > self.capacity:
            self._queue.popleft()
            dropped += 1
        self.dropped += dropped
        self.settled += dropped
        return dropped
