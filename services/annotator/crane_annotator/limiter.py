"""Client-side rate limit for node patches, with priority for hot-value patches.

The annotator's API client is built without the shared FIFO token bucket: behind a metric round's thousands of
patches (100 s of tokens at 50 QPS and 5000 nodes) a Lease renewal would miss its deadline and the hot value of
a node that just got a burst of pods would wait minutes. Instead, ``--kube-api-qps`` and ``--kube-api-burst``
apply here, to patches only (the watch and the Lease are a few requests a minute), and an urgent patch takes
the next token before any routine one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class PriorityLimiter:
    """Token bucket (``burst`` tokens refilled at ``qps`` per second; qps <= 0: unlimited) where waiting urgent
    callers are served before routine ones."""

    def __init__(self, qps: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._clock = clock
        self._tokens = float(self.burst)
        self._last = clock()
        self._urgent_waiting = 0

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
        self._last = now

    def try_take(self, urgent: bool = False) -> float:
        """Take a token now and return 0, or return how long to wait before trying again."""
        if self.qps <= 0:
            return 0.0
        self._refill()
        if self._tokens >= 1 and (urgent or self._urgent_waiting == 0):
            self._tokens -= 1
            return 0.0
        if self._tokens >= 1:  # a routine caller yields to the waiting urgent ones for one token interval
            return 1 / self.qps
        return (1 - self._tokens) / self.qps

    async def acquire(self, urgent: bool = False) -> None:
        wait = self.try_take(urgent)
        if wait == 0:
            return
        if urgent:
            self._urgent_waiting += 1
        try:
            while wait > 0:
                await asyncio.sleep(wait)
                wait = self.try_take(urgent)
        finally:
            if urgent:
                self._urgent_waiting -= 1
