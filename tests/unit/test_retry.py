"""The one retry helper: backoff growth and jitter, bounded retries, and the stoppable sleep."""

from __future__ import annotations

import asyncio
import random

import pytest

from crane_shared.retry import Backoff, retry, sleep_unless


def test_backoff_grows_with_jitter_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(initial=1.0, maximum=8.0, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(6)]
    caps = [1, 2, 4, 8, 8, 8]
    assert all(cap / 2 <= d <= cap for d, cap in zip(delays, caps, strict=True))
    backoff.reset()
    assert backoff.next_delay() <= 1.0


def test_a_backoff_that_cannot_work_is_refused() -> None:
    with pytest.raises(ValueError, match="initial"):
        Backoff(initial=2.0, maximum=1.0)


async def test_retry_gives_up_after_its_attempts_and_skips_what_is_not_retryable() -> None:
    calls: list[int] = []

    async def failing() -> int:
        calls.append(1)
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        await retry(failing, attempts=3, backoff=Backoff(0.001, 0.002))
    assert len(calls) == 3
    with pytest.raises(ConnectionError):
        await retry(failing, attempts=3, backoff=Backoff(0.001, 0.002), retryable=lambda e: False)
    assert len(calls) == 4


async def test_sleep_unless_returns_at_the_stop_and_never_swallows_a_cancellation() -> None:
    stopping = asyncio.Event()
    sleeper = asyncio.create_task(sleep_unless(stopping, 60))
    await asyncio.sleep(0)
    stopping.set()
    assert await asyncio.wait_for(sleeper, 5) is True

    outer = asyncio.create_task(sleep_unless(asyncio.Event(), 60))
    await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer


async def test_sleep_unless_wakes_when_the_watched_task_ends() -> None:
    done = asyncio.create_task(asyncio.sleep(0))
    assert await asyncio.wait_for(sleep_unless(asyncio.Event(), 60, until=done), 5) is False


async def test_sleep_unless_without_a_limit_waits_for_an_event_and_cleans_up_its_waiter() -> None:
    """``seconds=None`` waits only for ``stopping`` or ``until``; a coroutine given as ``until`` was started by
    ``sleep_unless`` and is cancelled by it (no task left pending), a task given is left alone."""
    stopping, woken = asyncio.Event(), asyncio.Event()
    before = asyncio.all_tasks()
    sleeper = asyncio.create_task(sleep_unless(stopping, None, until=woken.wait()))
    await asyncio.sleep(0.01)
    assert not sleeper.done()
    stopping.set()
    assert await asyncio.wait_for(sleeper, 5) is True
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == before  # the waiter on ``woken`` is gone
    supervised = asyncio.create_task(woken.wait())
    assert await sleep_unless(asyncio.Event(), 0.01, until=supervised) is False
    assert not supervised.done()  # not ours to cancel
    woken.set()
    await asyncio.wait_for(supervised, 5)
