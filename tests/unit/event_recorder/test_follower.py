"""List-then-watch of one scope of Events: resume points, re-lists on 410 and on request, prompt stop.

Against a real HTTP server speaking the API server's list and watch protocol (``tests.support.fakeapi``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from crane_event_recorder.buffer import RecordBuffer
from crane_event_recorder.follower import Follower
from crane_event_recorder.ingest import Ingest
from crane_shared.retry import Backoff
from tests.support.event_recorder import EVENTS_PATH, Metrics, scheduled, wait_until
from tests.support.fakeapi import FakeApiServer, Status, fake_api


class Harness:
    def __init__(self, metrics: Metrics, server: FakeApiServer, api: client.ApiClient) -> None:
        self.server = server
        self.buffer = RecordBuffer(1000)
        self.metrics = metrics
        self.follower = Follower(
            "fake",
            client.EventsV1Api(api).list_event_for_all_namespaces,
            Ingest(self.buffer, metrics),
            metrics,
            page_size=2,  # the three listed events come in two pages
            backoff=Backoff(0.001, 0.005),
        )
        self.stopping = asyncio.Event()

    def uids(self) -> list[str]:
        return [r.uid for r in self.buffer.take(10_000)]

    def watch_versions(self) -> list[str]:
        return [r.query["resourceVersion"] for r in self.server.watch_requests()]


@asynccontextmanager
async def running(metrics: Metrics, server: FakeApiServer) -> AsyncIterator[Harness]:
    async with fake_api(server) as api:
        h = Harness(metrics, server, api)
        task = asyncio.create_task(h.follower.run(h.stopping))
        try:
            yield h
        finally:
            h.stopping.set()
            await asyncio.wait_for(task, 5)  # stops promptly even while a watch is waiting


@pytest.fixture
async def harness(metrics: Metrics) -> AsyncIterator[Harness]:
    server = FakeApiServer(EVENTS_PATH, objects=[scheduled(1), scheduled(2), scheduled(3)], rv="100")
    async with running(metrics, server) as h:
        yield h


async def test_lists_then_watches_from_the_list_resource_version(harness: Harness) -> None:
    await wait_until(lambda: harness.watch_versions() == ["100"])
    assert harness.follower.first_list_position == 3
    harness.server.send("ADDED", scheduled(4, rv=101))
    harness.server.send("MODIFIED", scheduled(4, rv=102))  # an update: the store dedups by UID
    harness.server.send("DELETED", scheduled(5, rv=103))  # an expired event: the binding stays
    harness.server.send("BOOKMARK", {"metadata": {"resourceVersion": "110"}})
    await wait_until(lambda: harness.metrics.value("events_seen_total") == 5)  # DELETED, BOOKMARK: not read
    assert harness.uids() == ["u1", "u2", "u3", "u4", "u4"]
    harness.server.feed.put_nowait(None)  # the server ends the watch: resume, no re-list
    await wait_until(lambda: len(harness.watch_versions()) == 2)
    assert harness.watch_versions() == ["100", "110"]
    assert harness.server.lists_started() == 1


async def test_gone_relists_and_records_the_list_again(harness: Harness) -> None:
    await wait_until(lambda: harness.server.lists_started() == 1 and bool(harness.watch_versions()))
    harness.server.objects.append(scheduled(4))
    harness.server.rv = "200"
    harness.server.send("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})
    await wait_until(lambda: harness.watch_versions() == ["100", "200"])
    assert harness.server.lists_started() == 2
    assert harness.metrics.value("watch_restarts_total", reason="gone") == 1
    assert harness.uids() == ["u1", "u2", "u3", "u1", "u2", "u3", "u4"]
    assert harness.follower.first_list_position == 3  # readiness is about the first list


@pytest.mark.parametrize(
    "breakage",
    [
        b'{"type":"ERROR","object":{"kind":"Status","code":500,"message":"etcd down"}}\n',
        b"not json\n",
        b'{"type":"ADDED"}\n',
        b"[1, 2]\n",
    ],
)
async def test_a_broken_watch_resumes_from_the_last_version_after_backoff(harness: Harness, breakage: bytes) -> None:
    await wait_until(lambda: bool(harness.watch_versions()))
    harness.server.send("ADDED", scheduled(4, rv=101))
    harness.server.feed.put_nowait(breakage)
    await wait_until(lambda: len(harness.watch_versions()) == 2)
    assert harness.watch_versions() == ["100", "101"]  # nothing after 101 is lost, so no re-list is needed
    assert harness.server.lists_started() == 1
    assert harness.metrics.value("watch_restarts_total", reason="error") == 1


async def test_failing_list_is_retried_and_nothing_crashes(metrics: Metrics) -> None:
    server = FakeApiServer(EVENTS_PATH, objects=[scheduled(1)], rv="100")
    server.lists = [Status(503, "ServiceUnavailable"), Status(500), Status(429, "TooManyRequests")]
    async with running(metrics, server) as h:
        await wait_until(lambda: server.lists_started() >= 3)
        assert h.follower.first_list_position is None
        await wait_until(lambda: h.follower.first_list_position == 1)
        assert metrics.value("watch_restarts_total", reason="error") == 3


async def test_requested_relist_drops_the_watch_and_lists_again(harness: Harness) -> None:
    await wait_until(lambda: bool(harness.watch_versions()))
    harness.follower.request_relist("redis-reset")
    await wait_until(lambda: harness.server.lists_started() == 2 and len(harness.watch_versions()) == 2)
    assert harness.metrics.value("watch_restarts_total", reason="redis-reset") == 1


async def test_malformed_events_are_skipped_counted_and_logged_once(harness: Harness) -> None:
    await wait_until(lambda: bool(harness.watch_versions()))
    for i in range(10, 13):
        bad = scheduled(i, rv=100 + i)
        bad["regarding"].pop("uid")
        harness.server.send("ADDED", bad)
    harness.server.send("ADDED", scheduled(20, rv=120))
    with capture_logs() as logs:
        await wait_until(lambda: harness.metrics.value("events_seen_total") == 7)
    assert harness.metrics.value("malformed_events_total", reason="missing_uid") == 3
    assert harness.uids() == ["u1", "u2", "u3", "u20"]
    assert [entry["kind"] for entry in logs if entry["event"] == "skipping malformed Scheduled event"] == [
        "missing_uid"
    ]
