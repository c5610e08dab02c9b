"""The writer: batches in order, survives Redis outages, notices a restarted Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from crane_event_recorder.buffer import RecordBuffer
from crane_event_recorder.writer import Writer
from crane_shared.retry import Backoff
from tests.support.event_recorder import FakeStore, Metrics, rec, wait_until


class Harness:
    def __init__(self, metrics: Metrics, capacity: int = 100) -> None:
        self.store = FakeStore()
        self.buffer = RecordBuffer(capacity)
        self.lost: list[str] = []
        self.metrics = metrics
        self.writer = Writer(
            self.store,
            self.buffer,
            metrics,
            batch_size=3,
            stream_maxlen=100,
            backoff=Backoff(initial=0.001, maximum=0.005),
            server_id=self.store.server_id,
            server_check_interval=0.01,
            on_records_lost=self.lost.append,
            clock=lambda: 1010.0,
        )
        self.stopping = asyncio.Event()

    def push(self, *indexes: int) -> None:
        for i in indexes:
            self.buffer.push(rec(i))


@pytest.fixture
async def harness(metrics: Metrics) -> AsyncIterator[Harness]:
    h = Harness(metrics)
    task = asyncio.create_task(h.writer.run(h.stopping))
    yield h
    h.stopping.set()
    h.store.fail = None
    await asyncio.wait_for(task, 5)


async def test_records_reach_the_store_in_order_and_duplicates_are_counted(harness: Harness) -> None:
    harness.push(0, 1, 2, 3, 4, 1, 2)
    await wait_until(lambda: harness.buffer.settled == 7)
    assert harness.store.order == ["u0", "u1", "u2", "u3", "u4"]
    assert harness.metrics.value("bindings_recorded_total") == 5
    assert harness.metrics.value("duplicates_total") == 2
    assert harness.metrics.value("record_lag_seconds_count") == 5
    assert harness.metrics.value("record_lag_seconds_sum") == sum(1010.0 - (1000 + i) for i in range(5))


async def test_outage_keeps_records_and_flushes_them_in_order_when_redis_returns(harness: Harness) -> None:
    harness.push(9)  # before the outage: the writer knows which server it writes to
    await wait_until(lambda: harness.store.order == ["u9"])
    harness.store.order.clear()
    harness.store.fail = RedisConnectionError("refused")
    harness.push(0, 1, 2, 3)
    await wait_until(lambda: harness.metrics.value("redis_errors_total") >= 3)
    harness.push(4, 5)
    assert harness.store.order == []
    assert harness.buffer.depth == 6
    harness.store.fail = None
    await wait_until(lambda: harness.buffer.depth == 0)
    assert harness.store.order == [f"u{i}" for i in range(6)]
    assert harness.lost == []  # nothing dropped, same server: no re-list needed


async def test_unexpected_errors_do_not_kill_the_writer(harness: Harness) -> None:
    harness.store.fail = RuntimeError("something odd")
    harness.push(0)
    await wait_until(lambda: harness.store.attempts >= 2)
    harness.store.fail = None
    await wait_until(lambda: harness.store.order == ["u0"])


async def test_records_dropped_during_an_outage_trigger_a_relist_after_it(metrics: Metrics) -> None:
    h = Harness(metrics, capacity=2)
    task = asyncio.create_task(h.writer.run(h.stopping))
    try:
        h.push(9)  # before the outage: the writer knows which server it writes to
        await wait_until(lambda: h.store.order == ["u9"])
        h.store.fail = RedisConnectionError("refused")
        h.push(0, 1)
        await wait_until(lambda: metrics.value("redis_errors_total") >= 1)
        h.push(2, 3, 4)  # over capacity: the oldest go (u0, u1 may still be in a write that succeeds)
        h.store.fail = None
        await wait_until(lambda: h.lost == ["redis-dropped"])
        assert h.store.order[-2:] == ["u3", "u4"]  # the newest survive, in order
        assert "u2" not in h.store.order and h.buffer.dropped >= 1
    finally:
        h.stopping.set()
        await asyncio.wait_for(task, 5)


async def test_a_restarted_redis_is_noticed_while_idle_and_triggers_a_relist(harness: Harness) -> None:
    harness.push(0)
    await wait_until(lambda: harness.store.order == ["u0"])
    checks = harness.store.id_checks
    await wait_until(lambda: harness.store.id_checks > checks)
    harness.store.server = "run-2"  # restarted without persistence: its data is gone
    await wait_until(lambda: harness.lost == ["redis-reset"])


async def test_the_first_writes_wait_for_the_servers_identity_or_are_listed_again_once_it_is_known(
    harness: Harness,
) -> None:
    """A restart is told by the server's identity (INFO's run_id), so it is read before the first write; when it
    could not be (a failing INFO, a user without +info), the writes that landed meanwhile are listed again once it
    is known: they may have gone to a server that is gone (a failover at start), and a later restart is then told."""
    failures = [RedisConnectionError("LOADING")]
    read_id = harness.store.server_id

    async def server_id() -> str:
        if failures:
            raise failures.pop()
        return await read_id()

    harness.writer._server_id = server_id
    harness.push(0)
    await wait_until(lambda: harness.store.order == ["u0"])  # written though the identity was unknown
    await wait_until(lambda: harness.lost == ["redis-unverified"])
    harness.store.server = "run-2"
    await wait_until(lambda: harness.lost == ["redis-unverified", "redis-reset"])


async def test_stop_drains_what_is_buffered(metrics: Metrics) -> None:
    h = Harness(metrics)
    h.push(*range(10))
    h.stopping.set()
    await asyncio.wait_for(h.writer.run(h.stopping), 5)
    assert len(h.store.order) == 10


async def test_stop_during_an_outage_keeps_retrying_until_cancelled(metrics: Metrics) -> None:
    h = Harness(metrics)
    h.store.fail = RedisConnectionError("refused")
    h.push(0)
    h.stopping.set()
    task = asyncio.create_task(h.writer.run(h.stopping))
    await wait_until(lambda: h.store.attempts >= 3)
    assert not task.done()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert h.buffer.depth == 1
