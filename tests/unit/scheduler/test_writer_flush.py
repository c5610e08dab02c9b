"""The writer pipe's flush timing (``protocol.flush_after``): writes in a burst share a pipe write per delay, and a
write after a pause is not held back (a pod's claim writes and bind, one after the other, each waited 2 ms each way).
On the loop's own clock: the timer's due time is read, nothing sleeps."""

from __future__ import annotations

import asyncio

from crane_scheduler.writer.protocol import flush_after


def _noop() -> None:
    return None


async def test_a_write_after_a_pause_is_flushed_on_the_next_loop_turn() -> None:
    loop = asyncio.get_running_loop()
    now = loop.time()
    timer = flush_after(0.002, now - 1.0, _noop)  # the last pipe write a second ago
    try:
        assert timer.when() <= loop.time()
    finally:
        timer.cancel()


async def test_writes_right_after_a_flush_wait_out_the_delay_from_that_flush() -> None:
    loop = asyncio.get_running_loop()
    flushed_at = loop.time()
    timer = flush_after(0.002, flushed_at, _noop)
    try:
        assert timer.when() == flushed_at + 0.002  # one pipe write per delay in a burst, counted from the last
    finally:
        timer.cancel()


async def test_the_flush_runs() -> None:
    done = asyncio.Event()
    flush_after(0.002, 0.0, done.set)
    await asyncio.wait_for(done.wait(), 5)
