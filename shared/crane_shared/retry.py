"""The one retry timing and the one stoppable sleep every loop uses.

``Backoff`` is exponential with full-range jitter between half the cap and the cap: several replicas retrying
against a Redis or API server that has just come back do not hit it in lockstep, while delays still grow. A loop
calls ``next_delay`` after each failure and ``reset`` after a success. ``sleep_unless`` is how every worker
waits: a stop request cuts the sleep short, so SIGTERM never waits out a backoff.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Backoff", "retry", "sleep_unless"]

T = TypeVar("T")


@dataclass
class Backoff:
    initial: float = 0.05
    maximum: float = 5.0
    factor: float = 2.0
    rng: random.Random = field(default_factory=random.Random)
    _attempt: int = 0

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial or self.factor < 1:
            raise ValueError(
                f"backoff needs 0 < initial <= maximum and factor >= 1, got {self.initial}, {self.maximum}, "
                f"{self.factor}"
            )

    @property
    def attempts(self) -> int:
        """Failures since the last ``reset``."""
        return self._attempt

    def next_delay(self) -> float:
        """Delay before the next attempt; grows with each call until ``reset``."""
        cap = min(self.maximum, self.initial * self.factor**self._attempt)
        self._attempt = min(self._attempt + 1, 64)
        return self.rng.uniform(cap / 2, cap)

    def reset(self) -> None:
        self._attempt = 0


async def sleep_unless(
    stopping: asyncio.Event, seconds: float | None, *, until: Awaitable[object] | None = None
) -> bool:
    """Sleep ``seconds`` (``None``: no limit) or until ``stopping`` is set (or ``until`` finishes), whichever
    is first.

    Returns True when ``stopping`` is set. A task given as ``until`` (e.g. one being supervised) is never
    cancelled here; a coroutine (e.g. ``event.wait()``) is started here and cancelled here."""
    if stopping.is_set():
        return True
    waiters: list[asyncio.Future[object]] = [asyncio.ensure_future(stopping.wait())]
    owned = waiters[:]
    if until is not None:
        waiters.append(asyncio.ensure_future(until))
        if waiters[-1] is not until:
            owned.append(waiters[-1])
    try:
        timeout = None if seconds is None else max(0.0, seconds)
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Cancelled, not awaited: awaiting them here could swallow a cancellation of the caller.
        for waiter in owned:
            waiter.cancel()
    return stopping.is_set()


async def retry(
    call: Callable[[], Awaitable[T]],
    *,
    attempts: int,
    backoff: Backoff,
    retryable: Callable[[Exception], bool] = lambda err: True,
    on_retry: Callable[[Exception, float], None] = lambda err, delay: None,
) -> T:
    """``call()`` up to ``attempts`` times, sleeping ``backoff.next_delay()`` between tries.

    The last error, or one ``retryable`` refuses, is raised as is."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    backoff.reset()
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except Exception as err:
            if attempt == attempts or not retryable(err):
                raise
            delay = backoff.next_delay()
            on_retry(err, delay)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")
