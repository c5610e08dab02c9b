"""Retry timing shared by every loop: exponential backoff with jitter, and a sleep that a stop cuts short.

Jitter (a random delay between half the exponential cap and the cap) keeps several replicas from retrying in
lockstep against a Redis or API server that has just come back, while delays still grow.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field

__all__ = ["Backoff", "sleep_unless"]


@dataclass
class Backoff:
    initial: float = 0.05
    maximum: float = 5.0
    factor: float = 2.0
    rng: random.Random = field(default_factory=random.Random)
    _attempt: int = 0

    def next_delay(self) -> float:
        """Delay before the next attempt; grows with each call until ``reset``."""
        cap = min(self.maximum, self.initial * self.factor**self._attempt)
        self._attempt = min(self._attempt + 1, 64)
        return self.rng.uniform(cap / 2, cap)

    def reset(self) -> None:
        self._attempt = 0


async def sleep_unless(event: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` or until ``event`` is set, whichever is first; True when the event is set."""
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()
