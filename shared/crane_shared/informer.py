"""List-then-watch of one resource kind, with a local cache, for every service (client-go's informer, small).

Objects stay plain JSON dicts: decoding thousands of pods into kubernetes-asyncio models costs more CPU than the
whole scheduling decision. The watch streams JSON lines straight from the response. A 410 Gone (expired
resourceVersion, as an HTTP status or as an ERROR event) re-lists; any other failure backs off exponentially
(capped) and resumes from the last resourceVersion seen, including bookmarks. ``run`` never raises except on
cancellation, so one bad response cannot take a service down.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kubernetes_asyncio.client.exceptions import ApiException

from crane_shared.kube import raw_json
from crane_shared.logs import get_logger

log = get_logger("crane.informer")

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
Obj = dict[str, Any]
Handler = Callable[[EventType, Obj, Obj | None], None]
ListFn = Callable[..., Awaitable[Any]]


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class Gone(Exception):
    """The resourceVersion we watch from has been compacted away: re-list."""


@dataclass
class Informer:
    """Keeps ``cache`` equal to the API's view of ``list_fn``'s resources; calls ``handler`` on every change.

    ``list_fn`` is a kubernetes-asyncio list method, e.g. ``CoreV1Api(api).list_pod_for_all_namespaces``;
    ``handler(type, new, old)`` receives DELETED with the last known object. On a re-list, objects that vanished
    meanwhile are reported as DELETED and changed ones as MODIFIED, so handlers never miss a transition.
    """

    name: str
    list_fn: ListFn
    handler: Handler | None = None
    field_selector: str | None = None
    label_selector: str | None = None
    page_size: int = 2000
    watch_timeout: int = 300
    max_backoff: float = 30.0
    cache: dict[str, Obj] = field(default_factory=dict)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    resource_version: str = ""
    relists: int = 0
    restarts: int = 0
    on_restart: Callable[[str], None] = lambda reason: None

    def _selectors(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self.field_selector:
            kw["field_selector"] = self.field_selector
        if self.label_selector:
            kw["label_selector"] = self.label_selector
        return kw

    async def list(self) -> None:
        """Full list (paged); replaces the cache and reports the differences."""
        items: dict[str, Obj] = {}
        cont: str | None = None
        while True:
            kw = self._selectors() | {"limit": self.page_size}
            if cont:
                kw["_continue"] = cont
            body = await raw_json(self.list_fn(_preload_content=False, **kw))
            for item in body.get("items", []):
                items[object_key(item)] = item
            cont = body.get("metadata", {}).get("continue")
            if not cont:
                self.resource_version = body.get("metadata", {}).get("resourceVersion", "")
                break
        old = self.cache
        self.cache = items
        for key, obj in items.items():
            before = old.get(key)
            if before is None:
                self._emit("ADDED", obj, None)
            elif before.get("metadata", {}).get("resourceVersion") != obj.get("metadata", {}).get("resourceVersion"):
                self._emit("MODIFIED", obj, before)
        for key, obj in old.items():
            if key not in items:
                self._emit("DELETED", obj, obj)
        self.relists += 1
        self.synced.set()

    async def watch(self) -> None:
        """One watch request from ``resource_version`` until the server ends it."""
        kw = self._selectors() | {
            "watch": True,
            "resource_version": self.resource_version,
            "allow_watch_bookmarks": True,
            "timeout_seconds": self.watch_timeout,
            "_preload_content": False,
            "_request_timeout": self.watch_timeout + 30,
        }
        resp = await self.list_fn(**kw)
        try:
            if resp.status == 410:
                raise Gone()
            if not 200 <= resp.status <= 299:
                err = ApiException(status=resp.status, reason=resp.reason)
                err.body = (await resp.read()).decode(errors="replace")
                raise err
            async for line in resp.content:
                if line.strip():
                    self._apply(json.loads(line))
        finally:
            resp.release()

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj: Obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        rv = obj.get("metadata", {}).get("resourceVersion")
        if rv:
            self.resource_version = rv
        if kind == "BOOKMARK":
            return
        key = object_key(obj)
        if kind == "DELETED":
            old = self.cache.pop(key, None)
            self._emit("DELETED", obj, old)
        elif kind in ("ADDED", "MODIFIED"):
            old = self.cache.get(key)
            self.cache[key] = obj
            self._emit("MODIFIED" if old is not None else "ADDED", obj, old)

    def _emit(self, kind: EventType, obj: Obj, old: Obj | None) -> None:
        if self.handler is None:
            return
        try:
            self.handler(kind, obj, old)
        except Exception:  # a handler bug must not stop the informer
            log.exception("informer handler failed", informer=self.name, key=object_key(obj))

    async def run(self, stopping: asyncio.Event | None = None) -> None:
        """List, then watch forever; re-list on 410, back off on errors."""
        backoff = 0.2
        need_list = True
        while stopping is None or not stopping.is_set():
            try:
                if need_list:
                    await self.list()
                    need_list = False
                await self.watch()
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except Gone:
                log.info("watch expired, re-listing", informer=self.name)
                self.on_restart("gone")
                need_list = True
            except ApiException as err:
                if err.status == 410:
                    need_list = True
                    self.on_restart("gone")
                    continue
                log.warning("watch failed", informer=self.name, status=err.status, reason=err.reason)
                self.on_restart("error")
                await asyncio.sleep(backoff * (1 + random.random() / 2))
                backoff = min(self.max_backoff, backoff * 2)
            except Exception as err:
                log.warning("watch failed", informer=self.name, error=repr(err))
                self.on_restart("error")
                await asyncio.sleep(backoff * (1 + random.random() / 2))
                backoff = min(self.max_backoff, backoff * 2)
            self.restarts += 1
