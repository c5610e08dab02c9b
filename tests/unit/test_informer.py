"""The one informer against a real HTTP server answering as kube-apiserver does, errors included."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from kubernetes_asyncio import client

from crane_shared.informer import Informer
from crane_shared.retry import Backoff
from tests.support.fakeapi import Events, FakeApiServer, Page, Status, fake_api, item

# Every retry waits between 0.15 and 0.3 s: long enough to tell from an immediate retry, short for a test.
BACKOFF = 0.3


class Seen:
    """Handler and restart hook: what the informer reported."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.restarts: list[str] = []
        self.cache_at_restart: list[set[str]] = []

    def __call__(self, kind: str, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        self.events.append((kind, new["metadata"]["name"]))


@asynccontextmanager
async def running(server: FakeApiServer, **kwargs: Any) -> AsyncIterator[tuple[Informer, Seen]]:
    seen = Seen()
    async with fake_api(server) as api:
        informer = Informer(
            "nodes",
            client.CoreV1Api(api).list_node,
            seen,
            page_size=2,
            backoff=Backoff(initial=BACKOFF, maximum=BACKOFF),
            max_backoff=5.0,
            **kwargs,
        )

        def restarted(reason: str) -> None:
            seen.restarts.append(reason)
            seen.cache_at_restart.append(set(informer.cache))

        informer.on_restart = restarted
        stopping = asyncio.Event()
        task = asyncio.create_task(informer.run(stopping))
        try:
            yield informer, seen
        finally:
            stopping.set()
            await asyncio.wait_for(task, 5)


def waited_before(server: FakeApiServer, n: int) -> float:
    """Seconds between the answer before request ``n`` (0-based, any kind) and that request."""
    request = server.requests[n]
    before = [at for at, _, _ in server.answered if at <= request.at]
    return request.at - before[-1]


def two_pages(*names_rv: tuple[str, str], rv: str) -> list[Page | Status]:
    items = [item(name, r) for name, r in names_rv]
    return [Page(items[:2], rv, cont="next"), Page(items[2:], rv)]


@pytest.mark.parametrize("code", [429, 403, 500])
@pytest.mark.parametrize("failing_page", [0, 1])
async def test_an_error_on_any_list_page_keeps_the_cache_and_backs_off(code: int, failing_page: int) -> None:
    server = FakeApiServer()
    server.lists = two_pages(("a", "1"), ("b", "2"), ("c", "3"), rv="3")
    relist = two_pages(("a", "1"), ("b", "2"), ("d", "4"), rv="4")
    failure = Status(code, "TooManyRequests" if code == 429 else "Forbidden")
    server.lists += [*relist[:failing_page], failure, *two_pages(("a", "1"), ("d", "4"), rv="5")]
    server.watches = [Events([{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}])]
    async with running(server) as (informer, seen):
        await server.wait_for(lists=2 + failing_page + 1 + 2, watches=2)
        assert set(informer.cache) == {"a", "d"}
    # When the failed list was given up, the cache was still the first list's and the informer still synced;
    # nothing was reported until the next complete list.
    assert seen.cache_at_restart[1] == {"a", "b", "c"}
    assert seen.events[3:] == [("ADDED", "d"), ("DELETED", "b"), ("DELETED", "c")]
    failed_at = 2 + 1 + failing_page  # index of the failing request among all requests
    retry = server.requests[failed_at + 1]
    assert not retry.watch and "continue" not in retry.query  # the whole list again, from its first page
    assert waited_before(server, failed_at + 1) >= BACKOFF / 2
    assert seen.restarts == ["gone", "error"]


async def test_retry_after_of_a_429_is_honoured() -> None:
    server = FakeApiServer(lists=[Status(429, "TooManyRequests", retry_after=1), Page([item("a", "1")], "1")])
    async with running(server) as (informer, _):
        await informer.synced.wait()
        assert set(informer.cache) == {"a"}
    assert waited_before(server, 1) >= 1.0


async def test_a_failing_first_list_leaves_the_informer_unsynced_and_retrying() -> None:
    server = FakeApiServer(lists=[Status(500), Status(503, "ServiceUnavailable"), Page([item("a", "1")], "1")])
    async with running(server) as (informer, seen):
        await server.wait_for(lists=2)
        assert not informer.synced.is_set() and informer.cache == {}
        await informer.synced.wait()
    assert seen.restarts[:2] == ["error", "error"]
    assert all(waited_before(server, n) >= BACKOFF / 2 for n in (1, 2))


@pytest.mark.parametrize("code", [500, 403, 429])
async def test_a_non_2xx_watch_backs_off_and_resumes_without_relisting(code: int) -> None:
    server = FakeApiServer(lists=[Page([item("a", "1")], "7")])
    server.watches = [Status(code), Status(code), Events([{"type": "ADDED", "object": item("b", "8")}])]
    async with running(server) as (informer, seen):
        await server.wait_for(watches=4)
        assert set(informer.cache) == {"a", "b"}
    watches = server.watch_requests()
    assert [w.query["resourceVersion"] for w in watches[:4]] == ["7", "7", "7", "8"]
    assert len(server.list_requests()) == 1
    assert waited_before(server, 2) >= BACKOFF / 2 and waited_before(server, 3) >= BACKOFF / 2
    assert seen.restarts[:2] == ["error", "error"]


@pytest.mark.parametrize(
    "gone",
    [
        Status(410, "Expired"),
        Events([{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "old"}}]),
    ],
    ids=["http-410", "error-event-410"],
)
async def test_a_410_on_the_watch_relists_and_reports_what_vanished(gone: Status | Events) -> None:
    server = FakeApiServer(lists=[Page([item("a", "1"), item("b", "2")], "2"), Page([item("b", "5")], "5")])
    server.watches = [gone]
    async with running(server) as (informer, seen):
        await server.wait_for(lists=2, watches=2)
        assert set(informer.cache) == {"b"} and informer.cache["b"]["metadata"]["resourceVersion"] == "5"
    assert ("DELETED", "a") in seen.events and ("MODIFIED", "b") in seen.events
    assert server.watch_requests()[1].query["resourceVersion"] == "5"
    assert seen.restarts == ["gone"]


async def test_an_expired_continue_token_relists_from_the_first_page() -> None:
    server = FakeApiServer()
    server.lists = [Page([item("a", "1"), item("b", "2")], "2", cont="tok"), Status(410, "Expired")]
    server.lists += [Page([item("a", "1"), item("b", "2")], "3", cont="tok2"), Page([item("c", "3")], "3")]
    async with running(server) as (informer, seen):
        await informer.synced.wait()
        assert set(informer.cache) == {"a", "b", "c"}
    lists = server.list_requests()
    assert [r.query.get("continue") for r in lists[:4]] == [None, "tok", None, "tok2"]
    assert seen.restarts[:1] == ["gone"]


async def test_a_watch_silent_past_its_liveness_deadline_is_replaced() -> None:
    server = FakeApiServer(lists=[Page([item("a", "1")], "1")])
    server.watches = [
        Events([{"type": "ADDED", "object": item("b", "2")}], hang=True),
        Events([{"type": "ADDED", "object": item("c", "3")}]),
    ]
    async with running(server, liveness=0.5) as (informer, seen):
        await server.wait_for(watches=2)
        second = server.watch_requests()[1]
        assert second.query["resourceVersion"] == "2"  # resumed where the stalled watch left off, no re-list
        assert second.at - server.watch_requests()[0].at >= 0.5
        assert seen.restarts[0] == "stalled"
        await server.wait_for(watches=3)
    assert {"a", "b", "c"} <= set(informer.cache) and len(server.list_requests()) == 1


async def test_bookmarks_move_the_resource_version_without_events() -> None:
    server = FakeApiServer(lists=[Page([item("a", "1")], "1")])
    server.watches = [Events([{"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "99"}}}])]
    async with running(server) as (_, seen):
        await server.wait_for(watches=2)
    assert server.watch_requests()[1].query["resourceVersion"] == "99"
    assert seen.events == [("ADDED", "a")]


async def test_an_object_larger_than_the_stream_line_limit_arrives_whole() -> None:
    big = "x" * (3 << 20)  # 3 MiB in one line: aiohttp's readline stops at 64 KiB
    line = json.dumps({"type": "ADDED", "object": item("big", "2", annotations={"blob": big})}).encode() + b"\n"
    server = FakeApiServer(lists=[Page([], "1")], watches=[Events([line[:1000], line[1000:]])])
    async with running(server) as (informer, seen):
        await server.wait_for(watches=2)
    assert informer.cache["big"]["metadata"]["annotations"]["blob"] == big
    assert seen.events == [("ADDED", "big")] and seen.restarts == []


async def test_a_line_beyond_the_configured_maximum_is_an_error_not_unbounded_memory() -> None:
    line = json.dumps({"type": "ADDED", "object": item("big", "2", annotations={"blob": "x" * 5000})}).encode()
    server = FakeApiServer(lists=[Page([], "1")], watches=[Events([line + b"\n"])])
    async with running(server, max_line_bytes=1000) as (informer, seen):
        await server.wait_for(watches=2)
    assert "big" not in informer.cache and seen.restarts[0] == "error"
    assert server.watch_requests()[1].query["resourceVersion"] == "1"


async def test_a_malformed_watch_line_backs_off_and_resumes() -> None:
    server = FakeApiServer(lists=[Page([], "1")], watches=[Events([b"{not json\n"])])
    async with running(server) as (_, seen):
        await server.wait_for(watches=2)
    assert seen.restarts == ["error"] and waited_before(server, 2) >= BACKOFF / 2


async def test_a_requested_relist_drops_the_watch_and_lists_again() -> None:
    server = FakeApiServer(lists=[Page([item("a", "1")], "1"), Page([item("a", "1")], "1")])
    async with running(server) as (informer, seen):
        await server.wait_for(watches=1)
        informer.request_relist("downstream lost its copy")
        await server.wait_for(lists=2, watches=2)
    assert seen.restarts == ["requested"]


async def test_a_relist_requested_while_the_informer_backs_off_is_not_lost() -> None:
    """Downstream (the event recorder's Redis, restarted empty) asks for a re-list while the watch is failing and
    the informer waits out its backoff: the next cycle lists, it does not resume the watch from where it was."""
    server = FakeApiServer(lists=[Page([item("a", "1")], "1"), Page([item("a", "1")], "2")])
    server.watches = [Events([b"{not json\n"])]  # the first watch fails: a backoff of 2 s follows
    seen = Seen()
    async with fake_api(server) as api:
        informer = Informer(
            "nodes", client.CoreV1Api(api).list_node, seen, backoff=Backoff(initial=2.0, maximum=2.0), max_backoff=5
        )
        failed = asyncio.Event()

        def restarted(reason: str) -> None:
            seen.restarts.append(reason)
            failed.set()

        informer.on_restart = restarted
        stopping = asyncio.Event()
        task = asyncio.create_task(informer.run(stopping))
        try:
            await asyncio.wait_for(failed.wait(), 10)  # the failed watch handled: the informer sleeps now
            assert seen.restarts == ["error"]
            informer.request_relist("redis-reset")
            await server.wait_for(watches=2)
        finally:
            stopping.set()
            await asyncio.wait_for(task, 5)
    assert len(server.list_requests()) == 2
    assert server.watch_requests()[1].query["resourceVersion"] == "2"  # from the new list, not resumed at "1"


async def test_bulk_replace_hands_over_the_whole_list() -> None:
    server = FakeApiServer(lists=[Page([item("a", "1"), item("b", "2")], "2", cont="t"), Page([item("c", "3")], "3")])
    replaced: list[list[str]] = []
    async with running(server, on_replace=lambda items: replaced.append([i["metadata"]["name"] for i in items])) as (
        informer,
        seen,
    ):
        await informer.synced.wait()
    assert replaced == [["a", "b", "c"]] and seen.events == [] and set(informer.cache) == {"a", "b", "c"}


async def test_a_consumer_without_a_cache_takes_a_list_page_by_page_as_it_arrives() -> None:
    """The event recorder's list returns an hour of events: each page is handed over before the next is asked for
    (never the whole list in memory), and the completed list is announced with no items."""
    server = FakeApiServer(lists=[Page([item("a", "1"), item("b", "2")], "2", cont="t"), Page([item("c", "3")], "3")])
    pages: list[tuple[list[str], int]] = []
    replaced: list[int] = []

    def page(items: list[dict[str, Any]]) -> None:
        pages.append(([i["metadata"]["name"] for i in items], len(server.list_requests())))

    async with running(
        server, keep_cache=False, on_page=page, on_replace=lambda items: replaced.append(len(items))
    ) as (
        informer,
        seen,
    ):
        await informer.synced.wait()
    assert pages == [(["a", "b"], 1), (["c"], 2)]  # the first page handed over before the second was asked for
    assert replaced == [0] and seen.events == [] and informer.cache == {}
    with pytest.raises(ValueError, match="on_page"):
        Informer("pods", _never_listed, on_page=page, on_replace=print)  # it keeps a cache


async def test_stopping_ends_run_during_a_silent_watch() -> None:
    server = FakeApiServer(lists=[Page([], "1")])
    async with running(server) as (informer, _):
        await server.wait_for(watches=1)
    assert informer.synced.is_set()  # the context manager's wait_for(task, 5) returned: run ended on stop


async def test_cancelling_run_ends_it_even_mid_watch() -> None:
    server = FakeApiServer(lists=[Page([], "1")])
    async with fake_api(server) as api:
        informer = Informer("nodes", client.CoreV1Api(api).list_node)
        task = asyncio.create_task(informer.run(asyncio.Event()))
        await server.wait_for(watches=1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)


async def _never_listed(**kwargs: Any) -> Any:
    raise AssertionError("not listed")
