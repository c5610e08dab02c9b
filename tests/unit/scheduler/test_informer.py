"""The scheduler's cache on the shared informer: a 410 Gone re-lists and drops what vanished meanwhile, API
errors are retried, and a list that fails keeps the node table and the pending pods (never wiped)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from crane_scheduler.internal.cache import Cache
from crane_scheduler.internal.queue import SchedulingQueue
from crane_scheduler.nodetable import NodeTable
from tests.support.scheduler import node, pod


class FakeResponse:
    """An aiohttp-like raw response: status, reason, headers, and a body readable whole, by line or by chunk."""

    def __init__(self, body: bytes, status: int = 200) -> None:
        self.body = body
        self.status = status
        self.reason = "OK" if status == 200 else "Internal Server Error"
        self.headers: dict[str, str] = {"Content-Type": "application/json"}
        self.content = self

    async def read(self) -> bytes:
        return self.body

    def _lines(self) -> list[bytes]:
        return [line + b"\n" for line in self.body.split(b"\n") if line]

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for line in self._lines():
            yield line

    async def iter_any(self) -> AsyncIterator[bytes]:
        # Split mid-line on purpose: a reader must reassemble lines.
        for i in range(0, len(self.body), 7):
            yield self.body[i : i + 7]

    async def iter_chunked(self, n: int) -> AsyncIterator[bytes]:
        for i in range(0, len(self.body), 7):
            yield self.body[i : i + 7]

    async def readline(self) -> bytes:
        lines = self._lines()
        if not lines:
            return b""
        self.body = b"".join(lines[1:])
        return lines[0]

    async def readany(self) -> bytes:
        # Split mid-line on purpose: a reader must reassemble lines. b"" is the end of the stream.
        chunk, self.body = self.body[:7], self.body[7:]
        return chunk

    def release(self) -> None:
        pass

    def close(self) -> None:
        pass


def with_rv(obj: dict[str, Any], rv: str) -> dict[str, Any]:
    obj["metadata"]["resourceVersion"] = rv
    return obj


def list_body(items: list[dict[str, Any]], rv: str) -> FakeResponse:
    return FakeResponse(json.dumps({"metadata": {"resourceVersion": rv}, "items": items}).encode())


def events(*evs: dict[str, Any]) -> FakeResponse:
    return FakeResponse(b"".join(json.dumps(e).encode() + b"\n" for e in evs))


def make_cache() -> Cache:
    table = NodeTable()
    queue = SchedulingQueue(lambda qp: (qp.timestamp,))
    return Cache(table, queue, {"crane-scheduler"}, clock=lambda: 0.0)


class Script:
    """Answers list and watch calls in order; sets ``stopping`` when the last watch answer is handed out."""

    def __init__(self, lists: list[FakeResponse], watches: list[FakeResponse | Exception]) -> None:
        self.lists, self.watches = lists, watches
        self.calls: list[str] = []
        self.stopping = asyncio.Event()

    async def __call__(self, **kw: Any) -> FakeResponse:
        if kw.get("watch"):
            self.calls.append(f"watch@{kw['resource_version']}")
            step = self.watches.pop(0)
            if not self.watches:
                self.stopping.set()
            if isinstance(step, Exception):
                raise step
            return step
        self.calls.append("list")
        return self.lists.pop(0)


async def test_gone_relists_drops_what_vanished_and_errors_are_retried() -> None:
    cache = make_cache()
    script = Script(
        [list_body([with_rv(node("a"), "1")], "1"), list_body([with_rv(node("b"), "5")], "5")],
        [
            events({"type": "ADDED", "object": with_rv(node("b"), "2")}, {"type": "ERROR", "object": {"code": 410}}),
            ConnectionResetError("boom"),
            events({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}),
            events(),
        ],
    )
    informer = cache.node_informer(script)
    await asyncio.wait_for(informer.run(script.stopping), 10)
    assert script.calls == ["list", "watch@1", "list", "watch@5", "watch@5", "watch@9"]
    assert cache.table.node_names() == {"b"}  # "a" vanished while the watch was gone
    assert informer.synced.is_set()


async def test_a_failed_list_keeps_the_node_table_and_the_pending_pods() -> None:
    cache = make_cache()
    pending = with_rv(pod("waiting"), "2")
    nodes = Script(
        [
            list_body([with_rv(node("a"), "1"), with_rv(node("b"), "1")], "1"),
            FakeResponse(b'{"kind":"Status","code":500}', status=500),
            FakeResponse(b'{"kind":"Status","code":429}', status=429),
            list_body([with_rv(node("a"), "1"), with_rv(node("b"), "1")], "7"),
        ],
        [events({"type": "ERROR", "object": {"code": 410}}), events()],
    )
    pods = Script(
        [
            list_body([pending], "2"),
            FakeResponse(b'{"kind":"Status","code":403}', status=403),
            list_body([pending], "8"),
        ],
        [events({"type": "ERROR", "object": {"code": 410}}), events()],
    )
    seen: list[tuple[int, set[str], set[str]]] = []

    async def watch_table() -> None:
        while not (nodes.stopping.is_set() and pods.stopping.is_set()):
            seen.append((len(nodes.calls) + len(pods.calls), cache.table.node_names(), set(cache.pending)))
            await asyncio.sleep(0.01)

    node_informer = cache.node_informer(nodes)
    pod_informer = cache.pod_informer(pods)
    await asyncio.wait_for(
        asyncio.gather(node_informer.run(nodes.stopping), pod_informer.run(pods.stopping), watch_table()), 30
    )
    assert nodes.calls.count("list") == 4 and pods.calls.count("list") == 3  # the failed lists were retried
    synced = [i for i, (_, names, uids) in enumerate(seen) if names and uids]
    assert synced, "the cache was never filled"
    # From the first sync on, the table always held both nodes and the pod stayed pending, failures or not.
    assert all(names == {"a", "b"} for _, names, _ in seen[synced[0] :])
    assert all(uids == {pending["metadata"]["uid"]} for _, _, uids in seen[synced[0] :])
    assert cache.table.node_names() == {"a", "b"} and set(cache.pending) == {pending["metadata"]["uid"]}
