"""The patch rate limit: it holds the rate, and an urgent hot-value patch overtakes queued routine ones."""

from __future__ import annotations

import asyncio
import time

from crane_annotator.limiter import PriorityLimiter


async def test_rate_is_held_after_the_burst() -> None:
    limiter = PriorityLimiter(qps=100, burst=5)
    started = time.monotonic()
    await asyncio.gather(*(limiter.acquire() for _ in range(25)))
    elapsed = time.monotonic() - started
    assert 0.18 <= elapsed < 1.5  # 5 at once, then 20 at 100/s (the upper bound only catches a stall)


async def test_urgent_caller_overtakes_routine_callers_already_waiting() -> None:
    limiter = PriorityLimiter(qps=50, burst=1)
    await limiter.acquire()  # bucket empty
    order: list[str] = []

    async def take(name: str, urgent: bool) -> None:
        await limiter.acquire(urgent)
        order.append(name)

    routine = [asyncio.create_task(take(f"r{i}", False)) for i in range(5)]
    await asyncio.sleep(0.005)  # the routine callers are queued first
    await take("urgent", True)
    await asyncio.gather(*routine)
    assert order.index("urgent") <= 1


async def test_zero_qps_means_unlimited() -> None:
    limiter = PriorityLimiter(qps=0, burst=1)
    started = time.monotonic()
    for _ in range(1000):
        await limiter.acquire()
    assert time.monotonic() - started < 0.1
