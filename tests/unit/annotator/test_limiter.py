"""The patch rate limit: it holds the rate, and an urgent hot-value patch overtakes queued routine ones."""

from __future__ import annotations

import asyncio
import time

import pytest

from crane_annotator.limiter import PriorityLimiter


def test_rate_is_held_after_the_burst() -> None:
    """On the limiter's own clock: ``burst`` tokens at once, then one per 1/qps, whatever the machine's load."""
    now = [0.0]
    limiter = PriorityLimiter(qps=100, burst=5, clock=lambda: now[0])
    assert [limiter.try_take() for _ in range(5)] == [0.0] * 5
    assert limiter.try_take() == pytest.approx(0.01)  # empty: the next token in 10 ms
    now[0] += 0.035
    assert sum(limiter.try_take() == 0.0 for _ in range(25)) == 3  # 3.5 tokens earned in 35 ms
    now[0] += 1.0
    assert sum(limiter.try_take() == 0.0 for _ in range(25)) == 5  # 100.5 earned, capped at the burst


async def test_waiting_callers_go_at_the_rate() -> None:
    limiter = PriorityLimiter(qps=100, burst=5)
    started = time.monotonic()
    await asyncio.gather(*(limiter.acquire() for _ in range(25)))
    # 5 at once, then 20 at 100/s; no upper bound: load only makes it slower, a stall is caught by the test run
    assert time.monotonic() - started >= 0.18


async def test_urgent_caller_overtakes_routine_callers_already_waiting() -> None:
    limiter = PriorityLimiter(qps=50, burst=1)
    await limiter.acquire()  # bucket empty
    order: list[str] = []

    async def take(name: str, urgent: bool) -> None:
        await limiter.acquire(urgent)
        order.append(name)

    routine = [asyncio.create_task(take(f"r{i}", False)) for i in range(5)]
    await asyncio.sleep(0)  # the routine callers start (and wait) first
    await take("urgent", True)
    await asyncio.gather(*routine)
    assert order.index("urgent") <= 1


def test_zero_qps_means_unlimited() -> None:
    limiter = PriorityLimiter(qps=0, burst=1)
    for _ in range(1000):
        acquiring = limiter.acquire()
        with pytest.raises(StopIteration):
            acquiring.send(None)  # done at its first step: it never waited
