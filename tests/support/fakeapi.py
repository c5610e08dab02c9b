"""A loopback HTTP server that answers list and watch requests the way kube-apiserver does, following a script.

Real HTTP, real kubernetes-asyncio client: the informer under test sees the same status codes, Status bodies,
Retry-After headers and chunked watch streams as against the API server. Each list or watch request takes the
next scripted reply; with none left, a list answers ``objects`` at ``rv`` (paged by the request's ``limit``) and a
watch streams what is put in ``feed`` (``None`` ends it), silent in between as a quiet resource's watch is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client

from crane_shared.kube import api_client_from_dict

__all__ = ["Events", "FakeApiServer", "Page", "Request", "Status", "fake_api", "item"]


def item(name: str, rv: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "resourceVersion": rv, **extra}}


@dataclass(frozen=True)
class Page:
    """One 200 list page; ``cont`` is its continue token (more pages follow)."""

    items: list[dict[str, Any]]
    rv: str
    cont: str | None = None


@dataclass(frozen=True)
class Status:
    """A non-2xx answer with a metav1.Status body, as the API server sends it."""

    code: int
    reason: str = "InternalError"
    retry_after: int | None = None


@dataclass(frozen=True)
class Events:
    """A 200 watch stream: these events (dicts, or raw bytes for a line written as is), then the end of the
    stream, or silence with the connection held open (``hang``)."""

    events: list[dict[str, Any] | bytes]
    hang: bool = False


@dataclass(frozen=True)
class Request:
    at: float
    watch: bool
    query: dict[str, str]


@dataclass
class FakeApiServer:
    path: str = "/api/v1/nodes"
    lists: list[Page | Status] = field(default_factory=list)
    watches: list[Events | Status] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)
    rv: str = "1"
    feed: asyncio.Queue[dict[str, Any] | bytes | None] = field(default_factory=asyncio.Queue)
    requests: list[Request] = field(default_factory=list)
    answered: list[tuple[float, bool, int]] = field(default_factory=list)
    """(when, watch, status) of every answer, for measuring the wait before the next request"""
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _closing: asyncio.Event = field(default_factory=asyncio.Event)
    kubeconfig: dict[str, Any] = field(default_factory=dict)
    """set while served: a kubeconfig pointing at this server (for child processes)"""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(self.path, self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") in ("true", "True", "1")
        await self._note(Request(time.monotonic(), watch, dict(request.query)))
        script: list[Any] = self.watches if watch else self.lists
        reply = script.pop(0) if script else None
        if isinstance(reply, Status):
            return await self._answered(watch, _status(reply))
        if not watch:
            page = reply if isinstance(reply, Page) else self._page(request.query)
            metadata: dict[str, Any] = {"resourceVersion": page.rv}
            if page.cont:
                metadata["continue"] = page.cont
            body = {"kind": "NodeList", "apiVersion": "v1", "metadata": metadata, "items": page.items}
            return await self._answered(False, web.json_response(body))
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await self._answered(True, resp)
        if isinstance(reply, Events):
            for event in reply.events:
                await resp.write(_line(event))
        while (reply is None or reply.hang) and not self._closing.is_set():
            # Silent until fed, or until the client goes away (aiohttp does not cancel handlers on disconnect).
            transport = request.transport
            if transport is None or transport.is_closing():
                break
            if reply is None and not self.feed.empty():
                fed = self.feed.get_nowait()
                if fed is None:
                    break
                await resp.write(_line(fed))
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), 0.01)
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp

    def _page(self, query: Mapping[str, str]) -> Page:
        start = int(query.get("continue") or 0)
        end = start + int(query.get("limit") or len(self.objects) or 1)
        return Page(self.objects[start:end], self.rv, cont=str(end) if end < len(self.objects) else None)

    def send(self, kind: str, obj: dict[str, Any]) -> None:
        """An event on the current (unscripted) watch."""
        self.feed.put_nowait({"type": kind, "object": obj})

    async def _note(self, request: Request) -> None:
        async with self._changed:
            self.requests.append(request)
            self._changed.notify_all()

    async def _answered(self, watch: bool, resp: web.StreamResponse) -> web.StreamResponse:
        async with self._changed:
            self.answered.append((time.monotonic(), watch, resp.status))
            self._changed.notify_all()
        return resp

    def list_requests(self) -> list[Request]:
        return [r for r in self.requests if not r.watch]

    def lists_started(self) -> int:
        """Complete lists asked for: first-page requests (no continue token)."""
        return sum(1 for r in self.list_requests() if "continue" not in r.query)

    def watch_requests(self) -> list[Request]:
        return [r for r in self.requests if r.watch]

    async def wait_for(self, *, lists: int = 0, watches: int = 0, timeout: float = 10.0) -> None:
        """Until at least this many list and watch requests arrived."""

        def reached() -> bool:
            return len(self.list_requests()) >= lists and len(self.watch_requests()) >= watches

        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(reached)


def _line(event: dict[str, Any] | bytes) -> bytes:
    return event if isinstance(event, bytes) else json.dumps(event).encode() + b"\n"


def _status(reply: Status) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"scripted {reply.code}",
        "reason": reply.reason,
        "code": reply.code,
    }
    headers = {"Retry-After": str(reply.retry_after)} if reply.retry_after is not None else None
    return web.json_response(body, status=reply.code, headers=headers)


def kubeconfig_for(url: str) -> dict[str, Any]:
    """A kubeconfig dict for a plain-HTTP test server at ``url`` (token auth)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url.rstrip("/")}}],
        "users": [{"name": "fake", "user": {"token": "fake"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }


@asynccontextmanager
async def fake_api(server: FakeApiServer) -> AsyncIterator[client.ApiClient]:
    """Serve ``server`` on a free loopback port; yields a real ApiClient pointed at it."""
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    kubeconfig = kubeconfig_for(f"http://127.0.0.1:{port}")
    server.kubeconfig = kubeconfig
    api = await api_client_from_dict(kubeconfig)
    try:
        yield api
    finally:
        server._closing.set()
        await api.close()
        await runner.cleanup()
