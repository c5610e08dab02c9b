"""The client-side rate limiter (``crane_shared.kube.TokenBucket``) on a fake clock."""

from __future__ import annotations

import asyncio

from crane_shared.kube import TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_refunded_token_serves_the_next_request_without_waiting_for_the_refill() -> None:
    clock = Clock()
    bucket = TokenBucket(qps=0.001, burst=2, clock=clock)  # two tokens, then one per 1000 s
    await bucket.acquire()
    await bucket.acquire()
    bucket.refund()  # the second request was not sent after all
    await asyncio.wait_for(bucket.acquire(), 1)  # its token, at once
    bucket.refund()
    bucket.refund()
    bucket.refund()  # never above the burst
    await asyncio.wait_for(bucket.acquire(), 1)
    await asyncio.wait_for(bucket.acquire(), 1)
    waiting = asyncio.create_task(bucket.acquire())
    await asyncio.sleep(0.05)
    assert not waiting.done(), "more tokens than the burst"
    waiting.cancel()
