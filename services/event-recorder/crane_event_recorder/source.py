"""Kubernetes adapter: list and watch Events as raw JSON dicts, with 410 Gone surfaced as ``Gone``.

kubernetes-asyncio's ``Watch`` deserialises every object into models (slower than the rest of the recorder put
together) and retries a 410 once on its own, hiding it. Here list pages and watch lines are read raw and parsed
with ``json``; the caller decides what a 410 means (re-list). One source covers one scope: all namespaces or one.

Either Event API is enough: events.k8s.io/v1 and core/v1 are two views of the same stored objects, so a single
watch sees events written through both (verified against a real API server in the integration tests). Watching
both would deliver every event twice.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client

__all__ = [
    "EventApi",
    "EventSource",
    "Gone",
    "KubeEventSource",
    "Page",
    "WatchBroken",
    "WatchEvent",
    "parse_watch_line",
]


class EventApi(StrEnum):
    EVENTS_V1 = "events.k8s.io/v1"
    CORE_V1 = "v1"


class Gone(Exception):
    """410: the resourceVersion (or continue token) is older than the server keeps; re-list."""


class WatchBroken(Exception):
    """The list or watch failed for another reason (HTTP error, bad line, connection lost)."""


@dataclass(frozen=True)
class Page:
    items: list[dict[str, Any]]
    resource_version: str


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: dict[str, Any]
    resource_version: str | None


class EventSource(Protocol):
    """What the follower needs; tests wrap the real one to inject failures."""

    name: str

    def list(self) -> AsyncIterator[Page]: ...

    def watch(self, resource_version: str) -> AsyncIterator[WatchEvent]: ...


class KubeEventSource:
    """Events of one scope (``namespace`` None = all) through one Event API."""

    def __init__(
        self,
        api: client.ApiClient,
        event_api: EventApi = EventApi.EVENTS_V1,
        namespace: str | None = None,
        *,
        field_selector: str | None = "reason=Scheduled",
        page_size: int = 500,
        watch_timeout: float = 300.0,
        rng: random.Random | None = None,
    ) -> None:
        self.name = f"{event_api.value} {namespace or '(all namespaces)'}"
        self._call = _list_function(api, event_api, namespace)
        self._selector = field_selector or None
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._rng = rng or random.Random()

    async def list(self) -> AsyncIterator[Page]:
        """Pages of one consistent list; every page carries the list's resourceVersion."""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self._page_size}
            if token:
                kwargs["_continue"] = token
            body = await self._get_json(**kwargs)
            metadata = body.get("metadata") or {}
            yield Page(body.get("items") or [], str(metadata.get("resourceVersion", "")))
            token = metadata.get("continue")
            if not token:
                return

    async def watch(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        """Events after ``resource_version`` until the server ends the watch (a normal, clean end)."""
        # Randomised like client-go, so many watchers do not all reconnect at once.
        timeout = self._rng.uniform(self._watch_timeout, 2 * self._watch_timeout)
        resp = await self._request(
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=int(timeout),
            # No total timeout (the stream is long); a silent connection is dropped after the server's own end.
            _request_timeout=aiohttp.ClientTimeout(sock_connect=10, sock_read=timeout + 30),
        )
        try:
            await _check_status(resp)
            while True:
                try:
                    line = await resp.content.readline()
                except (aiohttp.ClientError, ValueError, TimeoutError) as exc:
                    raise WatchBroken(f"watch stream: {exc!r}") from exc
                if not line:
                    return
                yield parse_watch_line(line)
        finally:
            resp.close()

    async def _get_json(self, **kwargs: Any) -> dict[str, Any]:
        resp = await self._request(_request_timeout=aiohttp.ClientTimeout(total=60), **kwargs)
        try:
            await _check_status(resp)
            try:
                body: dict[str, Any] = json.loads(await resp.read())
            except (aiohttp.ClientError, ValueError, TimeoutError) as exc:
                raise WatchBroken(f"list response: {exc!r}") from exc
            return body
        finally:
            resp.release()

    async def _request(self, **kwargs: Any) -> aiohttp.ClientResponse:
        if self._selector:
            kwargs["field_selector"] = self._selector
        try:
            resp: aiohttp.ClientResponse = await self._call(_preload_content=False, **kwargs)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise WatchBroken(f"request: {exc!r}") from exc
        return resp


def _list_function(api: client.ApiClient, event_api: EventApi, namespace: str | None) -> Callable[..., Awaitable[Any]]:
    group: Any = client.EventsV1Api(api) if event_api is EventApi.EVENTS_V1 else client.CoreV1Api(api)
    if namespace is None:
        function: Callable[..., Awaitable[Any]] = group.list_event_for_all_namespaces
        return function

    async def namespaced(**kwargs: Any) -> Any:
        return await group.list_namespaced_event(namespace, **kwargs)

    return namespaced


async def _check_status(resp: aiohttp.ClientResponse) -> None:
    if resp.status == 200:
        return
    try:
        text = (await resp.read()).decode(errors="replace")[:300]
    except (aiohttp.ClientError, TimeoutError):
        text = ""
    if resp.status == 410:
        raise Gone(text)
    raise WatchBroken(f"HTTP {resp.status}: {text}")


def parse_watch_line(line: bytes) -> WatchEvent:
    """One line of a watch response; raises ``Gone`` for a 410 and ``WatchBroken`` for anything unusable."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise WatchBroken(f"watch line is not JSON: {line[:120]!r}") from exc
    if not isinstance(data, dict):
        raise WatchBroken(f"watch line is not an object: {line[:120]!r}")
    kind = data.get("type")
    obj = data.get("object")
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise WatchBroken(f"watch line has no type/object: {line[:120]!r}")
    if kind == "ERROR":
        message = f"{obj.get('reason')}: {obj.get('message')}"
        if obj.get("code") == 410:
            raise Gone(message)
        raise WatchBroken(f"watch error {obj.get('code')}: {message}")
    metadata = obj.get("metadata") or {}
    return WatchEvent(kind, obj, metadata.get("resourceVersion"))
