"""List-then-watch: resume points, re-lists on 410, broken watches and requests, prompt stop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

from crane_event_recorder.buffer import RecordBuffer
from crane_event_recorder.follower import Follower
from crane_event_recorder.ingest import Ingest
from crane_event_recorder.retry import Backoff
from crane_event_recorder.source import Gone, WatchBroken

from .conftest import FakeSource, Metrics, scheduled, wait_until


class Harness:
    def __init__(self, metrics: Metrics) -> None:
        self.source = FakeSource()
        self.buffer = RecordBuffer(1000)
        self.metrics = metrics
        self.follower = Follower(self.source, Ingest(self.buffer, metrics), metrics, Backoff(0.001, 0.005))
        self.stopping = asyncio.Event()

    def uids(self) -> list[str]:
        return [r.uid for r in self.buffer.take(10_000)]


@pytest.fixture
async def harness(metrics: Metrics) -> AsyncIterator[Harness]:
    h = Harness(metrics)
    h.source.events = [scheduled(1), scheduled(2), scheduled(3)]
    task = asyncio.create_task(h.follower.run(h.stopping))
    yield h
    h.stopping.set()
    await asyncio.wait_for(task, 5)  # stops promptly even while a watch is waiting


async def test_lists_then_watches_from_the_list_resource_version(harness: Harness) -> None:
    await wait_until(lambda: harness.source.watch_versions == ["100"])
    assert harness.follower.first_list_position == 3
    harness.source.send("ADDED", scheduled(4, rv=101))
    harness.source.send("MODIFIED", scheduled(4, rv=102))  # an update: the store dedups by UID
    harness.source.send("DELETED", scheduled(5, rv=103))  # an expired event: the binding stays
    harness.source.send("BOOKMARK", {"metadata": {"resourceVersion": "110"}})
    await wait_until(lambda: harness.metrics.value("events_seen_total") == 5)  # DELETED, BOOKMARK: not read
    assert harness.uids() == ["u1", "u2", "u3", "u4", "u4"]
    harness.source.feed.put_nowait(None)  # the server ends the watch: resume, no re-list
    await wait_until(lambda: len(harness.source.watch_versions) == 2)
    assert harness.source.watch_versions == ["100", "110"]
    assert harness.source.lists == 1


async def test_gone_relists_and_records_the_list_again(harness: Harness) -> None:
    await wait_until(lambda: harness.source.lists == 1 and bool(harness.source.watch_versions))
    harness.source.events.append(scheduled(4))
    harness.source.resource_version = "200"
    harness.source.feed.put_nowait(Gone("too old resource version"))
    await wait_until(lambda: harness.source.watch_versions == ["100", "200"])
    assert harness.source.lists == 2
    assert harness.metrics.value("watch_restarts_total", reason="gone") == 1
    assert harness.uids() == ["u1", "u2", "u3", "u1", "u2", "u3", "u4"]
    assert harness.follower.first_list_position == 3  # readiness is about the first list


async def test_broken_watch_relists_after_backoff(harness: Harness) -> None:
    await wait_until(lambda: bool(harness.source.watch_versions))
    harness.source.feed.put_nowait(WatchBroken("connection reset"))
    await wait_until(lambda: harness.source.lists == 2 and len(harness.source.watch_versions) == 2)
    assert harness.metrics.value("watch_restarts_total", reason="error") == 1


async def test_failing_list_is_retried_and_nothing_crashes(metrics: Metrics) -> None:
    h = Harness(metrics)
    h.source.events = [scheduled(1)]
    h.source.list_error = WatchBroken("HTTP 503")
    task = asyncio.create_task(h.follower.run(h.stopping))
    try:
        await wait_until(lambda: h.source.lists >= 3)
        assert h.follower.first_list_position is None
        h.source.list_error = None
        await wait_until(lambda: h.follower.first_list_position == 1)
    finally:
        h.stopping.set()
        await asyncio.wait_for(task, 5)


async def test_requested_relist_drops_the_watch_and_lists_again(harness: Harness) -> None:
    await wait_until(lambda: bool(harness.source.watch_versions))
    harness.follower.request_relist("redis-reset")
    await wait_until(lambda: harness.source.lists == 2 and len(harness.source.watch_versions) == 2)
    assert harness.metrics.value("watch_restarts_total", reason="redis-reset") == 1


async def test_malformed_events_are_skipped_counted_and_logged_once(harness: Harness) -> None:
    await wait_until(lambda: bool(harness.source.watch_versions))
    for i in range(10, 13):
        bad = scheduled(i, rv=100 + i)
        bad["regarding"].pop("uid")
        harness.source.send("ADDED", bad)
    harness.source.send("ADDED", scheduled(20, rv=120))
    with capture_logs() as logs:
        await wait_until(lambda: harness.metrics.value("events_seen_total") == 7)
    assert harness.metrics.value("malformed_events_total", reason="missing_uid") == 3
    assert harness.uids() == ["u1", "u2", "u3", "u20"]
    assert [entry["kind"] for entry in logs if entry["event"] == "skipping malformed Scheduled event"] == [
        "missing_uid"
    ]
