"""The assembled recorder on fakes: readiness, records restored after Redis loses them, trimming."""

from __future__ import annotations

import asyncio
import contextlib

from kubernetes_asyncio import client

from crane_event_recorder.recorder import Recorder
from crane_event_recorder.settings import RecorderSettings
from crane_event_recorder.trimmer import Trimmer
from crane_shared.informer import ListFn
from tests.support.event_recorder import EVENTS_PATH, FakeStore, Metrics, rec, scheduled, wait_until
from tests.support.fakeapi import FakeApiServer, fake_api


async def test_ready_only_once_the_first_list_is_in_redis_and_redis_wipes_are_refilled(metrics: Metrics) -> None:
    store, server = FakeStore(), FakeApiServer(EVENTS_PATH, objects=[scheduled(i) for i in range(5)])
    store.fail = ConnectionError("redis down at start")
    async with fake_api(server) as api:
        await _ready_and_refilled(metrics, store, server, client.EventsV1Api(api).list_event_for_all_namespaces)


async def _ready_and_refilled(metrics: Metrics, store: FakeStore, server: FakeApiServer, list_fn: ListFn) -> None:
    recorder = Recorder(
        store,
        {"all": list_fn},
        metrics,
        RecorderSettings(redis_check_interval=0.01, trim_interval=3600),
        redis_server_id=store.server_id,
    )
    stopping = asyncio.Event()
    tasks = [asyncio.create_task(w) for w in recorder.workers(stopping)]
    try:
        await wait_until(lambda: server.lists_started() == 1 and metrics.value("redis_errors_total") >= 2)
        assert not recorder.ready()  # listed, but nothing is in Redis yet
        assert metrics.value("buffer_depth") == 5
        store.fail = None
        await wait_until(recorder.ready)
        assert sorted(store.records) == [f"u{i}" for i in range(5)]

        store.records.clear()  # Redis restarted without persistence...
        store.server = "run-2"  # ...so it is a new server
        await wait_until(lambda: len(store.records) == 5)
        assert server.lists_started() == 2
        assert metrics.value("watch_restarts_total", reason="redis-reset") == 1
    finally:
        stopping.set()
        done, pending = await asyncio.wait(tasks, timeout=5)
        assert not pending
        for task in done:
            with contextlib.suppress(asyncio.CancelledError):
                task.result()


async def test_trimmer_deletes_records_older_than_the_retention(metrics: Metrics) -> None:
    store = FakeStore()
    await store.record([rec(i) for i in range(10)], 100)  # bound at 1000..1009
    stopping = asyncio.Event()
    trimmer = Trimmer(store, retention=5.0, interval=0.001, metrics=metrics, clock=lambda: 1010.0)
    task = asyncio.create_task(trimmer.run(stopping))
    await wait_until(lambda: metrics.value("trimmed_total") == 5)
    stopping.set()
    await asyncio.wait_for(task, 5)
    assert sorted(store.records) == ["u5", "u6", "u7", "u8", "u9"]
