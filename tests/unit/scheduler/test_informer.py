"""The informer survives a 410 Gone (re-lists, and drops what vanished meanwhile) and API errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from crane_scheduler.informers import Informer


class FakeResponse:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.content = self

    async def read(self) -> bytes:
        return self.body

    async def iter_any(self) -> AsyncIterator[bytes]:
        # Split mid-line on purpose: the informer must reassemble lines.
        for i in range(0, len(self.body), 7):
            yield self.body[i : i + 7]

    def release(self) -> None:
        pass


def obj(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}}


class Recorder:
    def __init__(self) -> None:
        self.state: dict[str, dict[str, Any]] = {}
        self.replaced = 0

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.replaced += 1
        self.state = {i["metadata"]["name"]: i for i in items}

    def upsert(self, o: dict[str, Any]) -> None:
        self.state[o["metadata"]["name"]] = o

    def delete(self, o: dict[str, Any]) -> None:
        self.state.pop(o["metadata"]["name"], None)


async def test_gone_relists_and_errors_are_retried() -> None:
    stopping = asyncio.Event()
    calls: list[str] = []
    lists = [[obj("a", "1")], [obj("b", "5")]]
    watches: list[Any] = [
        [{"type": "ADDED", "object": obj("b", "2")}, {"type": "ERROR", "object": {"code": 410}}],
        ApiException(status=500, reason="boom"),
        [{"type": "BOOKMARK", "object": obj("", "9")}],
    ]

    async def list_fn(**kw: Any) -> FakeResponse:
        if kw.get("watch"):
            calls.append(f"watch@{kw['resource_version']}")
            step = watches.pop(0)
            if not watches:
                stopping.set()
            if isinstance(step, Exception):
                raise step
            return FakeResponse(b"".join(json.dumps(e).encode() + b"\n" for e in step))
        calls.append("list")
        items = lists.pop(0)
        return FakeResponse(
            json.dumps(
                {"metadata": {"resourceVersion": items[-1]["metadata"]["resourceVersion"]}, "items": items}
            ).encode()
        )

    handler = Recorder()
    informer = Informer("things", list_fn, handler)
    await asyncio.wait_for(informer.run(stopping), 10)
    assert calls == ["list", "watch@1", "list", "watch@5", "watch@5"]
    assert handler.replaced == 2 and set(handler.state) == {"b"}  # "a" vanished while the watch was gone
    assert informer.rv == "9" and informer.synced.is_set()
