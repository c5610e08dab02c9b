"""List and watch with raw JSON: the scheduler's view of nodes and pods.

kubernetes-asyncio's models are far too slow to deserialise thousands of pods a second, so we ask for the raw
response and parse JSON ourselves. The loop is client-go's reflector in small: list (paginated) at a consistent
resourceVersion, hand the full set to the handler, then watch from that version with bookmarks. A 410 Gone (the
version fell out of the API server's window) triggers a fresh list; any other failure is retried with capped
exponential backoff, from the last version seen. Nothing here ever ends the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from crane_scheduler import metrics
from crane_shared.logs import LogOnce, get_logger

log = get_logger("crane.scheduler.informer")

ListFn = Callable[..., Awaitable[Any]]


class Handler(Protocol):
    def replace(self, items: list[dict[str, Any]]) -> None: ...

    def upsert(self, obj: dict[str, Any]) -> None: ...

    def delete(self, obj: dict[str, Any]) -> None: ...


class Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


class Informer:
    def __init__(
        self,
        resource: str,
        list_fn: ListFn,
        handler: Handler,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        page_size: int = 1000,
        watch_timeout: int = 300,
    ) -> None:
        self.resource = resource
        self._list_fn = list_fn
        self._handler = handler
        self._selectors = {
            k: v for k, v in (("field_selector", field_selector), ("label_selector", label_selector)) if v
        }
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self.synced = asyncio.Event()
        self.rv: str | None = None  # last resourceVersion seen; None: list first
        self._log_once = LogOnce(log)

    async def run(self, stopping: asyncio.Event) -> None:
        delay = 0.5
        while not stopping.is_set():
            try:
                if self.rv is None:
                    self.rv = await self._list()
                    self.synced.set()
                await self._watch(self.rv)
                delay = 0.5
            except Gone:
                metrics.WATCH_RESTARTS.labels(self.resource, "gone").inc()
                log.info("watch expired, listing again", resource=self.resource)
                self.rv = None
            except asyncio.CancelledError:
                raise
            except Exception as err:  # network, API errors, bad JSON: back off and retry, never die
                metrics.WATCH_RESTARTS.labels(self.resource, "error").inc()
                log.warning("list/watch failed, retrying", resource=self.resource, error=repr(err), retry_in=delay)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stopping.wait(), delay)
                delay = min(delay * 2, 30.0)

    async def _list(self) -> str:
        items: list[dict[str, Any]] = []
        cont: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self._page_size, **self._selectors}
            if cont:
                kwargs["_continue"] = cont
            resp = await self._list_fn(**kwargs, _preload_content=False, _request_timeout=120)
            try:
                page = json.loads(await resp.read())
            finally:
                resp.release()
            items.extend(page.get("items") or ())
            meta = page.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                self._safely(self._handler.replace, items)
                return str(meta.get("resourceVersion", ""))

    async def _watch(self, rv: str) -> None:
        """Watch until the server ends the stream, keeping ``self.rv`` at the last version seen."""
        try:
            resp = await self._list_fn(
                watch=True,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                **self._selectors,
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(sock_connect=10, sock_read=self._watch_timeout + 30),
            )
        except ApiException as err:
            if err.status == 410:
                raise Gone from err
            raise
        try:
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._dispatch(json.loads(line))
        finally:
            resp.release()

    def _dispatch(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone
            raise RuntimeError(f"watch error: {obj.get('message')}")
        if kind in ("ADDED", "MODIFIED"):
            self._safely(self._handler.upsert, obj)
        elif kind == "DELETED":
            self._safely(self._handler.delete, obj)
        self.rv = (obj.get("metadata") or {}).get("resourceVersion") or self.rv

    def _safely(self, fn: Callable[[Any], None], arg: Any) -> None:
        try:
            fn(arg)
        except Exception as err:  # one malformed object must not stop the informer
            self._log_once.warning(
                f"{self.resource}:{type(err).__name__}", "object skipped", resource=self.resource, error=repr(err)
            )
