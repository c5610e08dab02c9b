"""List-then-watch of one resource kind, with a local cache: the one informer of every service and the sandbox.

client-go's reflector in small. Objects stay plain JSON dicts: decoding thousands of pods into kubernetes-asyncio
models costs more CPU than a whole scheduling decision. Requests are made with ``_preload_content=False``, which
kubernetes-asyncio never status-checks, so every response is checked here:

- a list page answering 429/403/5xx (or anything non-2xx) keeps the previous cache and backs off; a list is
  applied only once all its pages arrived, so a failure on page 7 cannot wipe what page 1 replaced;
- 410 Gone (on a list page: an expired continue token; on a watch: a compacted resourceVersion, as an HTTP status
  or as an ERROR event) re-lists from scratch;
- a non-2xx watch backs off and resumes from the last resourceVersion seen (bookmarks included);
- a watch silent for longer than ``liveness`` is dropped and resumed (a half-open connection otherwise hangs
  until the kernel gives up); a watch that ends at once with nothing in it backs off instead of spinning;
- the stream is read in chunks and split into lines here, so one object larger than aiohttp's line limit (64 KiB)
  is fine; a line beyond ``max_line_bytes`` is an error (back off, resume), not unbounded memory.

Every request has a timeout. Every retry uses ``crane_shared.retry.Backoff`` (exponential, jittered, capped, reset
by a watch that delivered something). ``on_restart(reason)`` counts restarts (``gone``, ``error``, ``stalled``,
``requested``) for the caller's metrics. ``run(stopping)`` never raises except on cancellation, so no response
can take a service down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from crane_shared import managedfields
from crane_shared.logs import get_logger
from crane_shared.retry import Backoff, sleep_unless

__all__ = ["ApiError", "Gone", "Informer", "ListFn", "Obj", "Stalled", "object_key"]

log = get_logger("crane.informer")

EventType = Literal["ADDED", "MODIFIED", "DELETED"]
Obj = dict[str, Any]
Objs = list[Obj]  # spelled here: inside Informer, ``list`` is the method
Handler = Callable[[EventType, Obj, Obj | None], None]
ListFn = Callable[..., Awaitable[Any]]

# A watch that ends (cleanly) sooner than this with nothing in it is retried with backoff, not in a hot loop.
_MIN_WATCH_SECONDS = 1.0
# Hand control back to the event loop every this many watch events: a buffered stream's read never suspends.
_YIELD_EVERY = 64


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class Gone(Exception):
    """410: the resourceVersion (or continue token) is older than the server keeps: re-list."""


class ApiError(Exception):
    """A non-2xx answer other than 410, or an ERROR watch event; ``retry_after`` from the server, if any."""

    def __init__(self, status: int | None, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.retry_after = retry_after


class Stalled(Exception):
    """The watch sent nothing (not even a bookmark) for longer than the liveness deadline."""


@dataclass
class Informer:
    """Keeps ``cache`` equal to the API's view of ``list_fn``'s resources; calls ``handler`` on every change.

    ``list_fn`` is a kubernetes-asyncio list method, e.g. ``CoreV1Api(api).list_pod_for_all_namespaces``;
    ``handler(type, new, old)`` receives DELETED with the last known object. On a re-list, objects that vanished
    meanwhile are reported as DELETED and changed ones as MODIFIED, so handlers never miss a transition; with
    ``on_replace`` set, a completed list is handed over whole instead (``on_replace(items)``, no per-object
    events), for consumers that rebuild in bulk. ``keep_cache=False`` keeps no objects (a consumer that only
    reacts to events, e.g. the event recorder); then a re-list cannot be diffed and needs ``on_replace``.
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
    # Added by the one-informer redesign (all optional):
    on_replace: Callable[[Objs], None] | None = None
    liveness: float | None = None
    """seconds a watch may stay silent before it is dropped; default twice ``watch_timeout`` + 30 (the longest
    server-side timeout asked for, plus a margin): a quiet resource may send nothing, not even bookmarks"""
    request_timeout: float = 60.0
    """total timeout of one list page; also the connect timeout of a watch"""
    max_line_bytes: int = 64 << 20
    keep_cache: bool = True
    on_page: Callable[[Objs], None] | None = None
    """with ``keep_cache=False``: each list page handed over as it arrives (a consumer that only adds, e.g. the
    event recorder, whose list of an hour of events must never be held whole), then ``on_replace`` with no items
    once the list completed"""
    drop_managed_fields: bool = False
    """cut ``metadata.managedFields`` out of each list and watch event before decoding it (``managedfields``):
    for a consumer that reads none of them (the scheduler, as kube-scheduler's informers trim them)"""
    backoff: Backoff | None = None
    """retry timing; default exponential from 0.2 s up to ``max_backoff``"""
    clock: Callable[[], float] = time.monotonic
    _relist_requested: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _relist_reason: str = field(init=False, default="")
    _need_list: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        if self.backoff is None:
            self.backoff = Backoff(initial=min(0.2, self.max_backoff), maximum=self.max_backoff)
        if not self.keep_cache and self.on_replace is None:
            raise ValueError(f"informer {self.name}: keep_cache=False needs on_replace to hand over re-lists")
        if self.on_page is not None and self.keep_cache:
            raise ValueError(f"informer {self.name}: on_page is for a consumer that keeps no cache (keep_cache=False)")

    @property
    def watch_liveness(self) -> float:
        return self.liveness if self.liveness is not None else 2 * self.watch_timeout + 30.0

    def _selectors(self) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if self.field_selector:
            kw["field_selector"] = self.field_selector
        if self.label_selector:
            kw["label_selector"] = self.label_selector
        return kw

    def request_relist(self, reason: str) -> None:
        """Drop the watch and list everything again (e.g. downstream storage lost what it had been given)."""
        self._relist_reason = reason
        self._need_list = True  # also when it comes while ``run`` backs off (the event is cleared on the next pass)
        self._relist_requested.set()

    async def list(self) -> None:
        """Full list (paged); replaces the cache once every page arrived and reports the differences."""
        items: Objs = []
        cont: str | None = None
        while True:
            kw = self._selectors() | {"limit": self.page_size}
            if cont:
                kw["_continue"] = cont
            body = await self._get_json(kw)
            page = body.get("items") or []
            if not isinstance(page, list):
                raise ApiError(None, f"list of {self.name}: items is not a list")
            if self.on_page is not None:
                self._hand_over(page)
            else:
                items.extend(page)
            metadata = body.get("metadata") or {}
            cont = metadata.get("continue")
            if not cont:
                self.resource_version = str(metadata.get("resourceVersion") or "")
                break
            await asyncio.sleep(0)
        self._replace(items)
        self.relists += 1
        self._need_list = False
        self.synced.set()

    def _hand_over(self, page: Objs) -> None:
        assert self.on_page is not None
        try:
            self.on_page(page)
        except Exception:  # a handler bug must not stop the informer
            log.exception("informer on_page failed", informer=self.name)

    def _replace(self, items: Objs) -> None:
        if self.on_replace is not None:
            if self.keep_cache:
                self.cache = {object_key(item): item for item in items}
            try:
                self.on_replace(items)
            except Exception:  # a handler bug must not stop the informer
                log.exception("informer on_replace failed", informer=self.name)
            return
        fresh = {object_key(item): item for item in items}
        old, self.cache = self.cache, fresh
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                self._emit("ADDED", obj, None)
            elif _rv(before) != _rv(obj):
                self._emit("MODIFIED", obj, before)
        for key, obj in old.items():
            if key not in fresh:
                self._emit("DELETED", obj, obj)

    async def _get_json(self, kw: dict[str, Any]) -> dict[str, Any]:
        resp = await self.list_fn(
            _preload_content=False, _request_timeout=aiohttp.ClientTimeout(total=self.request_timeout), **kw
        )
        try:
            await _check_status(resp)
            try:
                body = self._loads(await resp.read())
            except ValueError as err:
                raise ApiError(resp.status, f"list of {self.name}: body is not JSON ({err})") from err
        finally:
            resp.release()
        if not isinstance(body, dict):
            raise ApiError(resp.status, f"list of {self.name}: body is not an object")
        return body

    async def watch(self) -> int:
        """One watch request from ``resource_version`` until the server ends it; returns the events seen."""
        kw = self._selectors() | {
            "watch": True,
            "resource_version": self.resource_version,
            "allow_watch_bookmarks": True,
            # Randomised like client-go (between the timeout and twice it), so watchers do not all reconnect at once.
            "timeout_seconds": int(random.uniform(self.watch_timeout, 2 * self.watch_timeout)),
            "_preload_content": False,
            # Liveness is enforced per read below; sock_read is a backstop should a read ever escape it.
            "_request_timeout": aiohttp.ClientTimeout(
                sock_connect=self.request_timeout, sock_read=self.watch_liveness + 5.0
            ),
        }
        resp = await self.list_fn(**kw)
        seen = 0
        try:
            await _check_status(resp)
            buffer = bytearray()
            while True:
                try:
                    # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation that arrives as
                    # the read completes, and run() then waits forever for this cycle (a requested re-list hung).
                    async with asyncio.timeout(self.watch_liveness):
                        chunk = await resp.content.readany()
                except TimeoutError:
                    raise Stalled(f"no data for {self.watch_liveness:g}s") from None
                if not chunk:
                    break
                buffer += chunk
                end = buffer.rfind(b"\n")
                if end < 0:
                    self._check_line(len(buffer))
                    continue
                lines = bytes(buffer[:end]).split(b"\n")
                del buffer[: end + 1]
                for line in lines:
                    self._check_line(len(line))
                    if line.strip():
                        self._apply(_parse_event(line, self._loads))
                        seen += 1
                        if seen % _YIELD_EVERY == 0:
                            await asyncio.sleep(0)
            if buffer.strip():
                self._apply(_parse_event(bytes(buffer), self._loads))
                seen += 1
        finally:
            resp.release()
        return seen

    def _loads(self, data: bytes) -> Any:
        return managedfields.loads(data) if self.drop_managed_fields else json.loads(data)

    def _check_line(self, length: int) -> None:
        if length > self.max_line_bytes:
            raise ApiError(None, f"watch line longer than {self.max_line_bytes} bytes")

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj: Obj = event.get("object") or {}
        if kind == "ERROR":
            message = f"{obj.get('reason')}: {obj.get('message')}"
            if obj.get("code") == 410:
                raise Gone(message)
            raise ApiError(obj.get("code"), f"watch error {message}")
        rv = (obj.get("metadata") or {}).get("resourceVersion")
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
            if self.keep_cache:
                self.cache[key] = obj
            self._emit("ADDED" if old is None and (self.keep_cache or kind == "ADDED") else "MODIFIED", obj, old)

    def _emit(self, kind: EventType, obj: Obj, old: Obj | None) -> None:
        if self.handler is None:
            return
        try:
            self.handler(kind, obj, old)
        except Exception:  # a handler bug must not stop the informer
            log.exception("informer handler failed", informer=self.name, key=object_key(obj))

    async def _cycle(self) -> None:
        """List when needed, then one watch. Raises on any failure; the caller decides how long to wait."""
        if self._need_list:
            await self.list()
        started = self.clock()
        seen = await self.watch()
        if seen:
            assert self.backoff is not None
            self.backoff.reset()
        elif self.clock() - started < _MIN_WATCH_SECONDS:
            raise ApiError(200, "watch ended at once with no events")

    async def run(self, stopping: asyncio.Event) -> None:
        """List, then watch until ``stopping``; re-list on 410 or on request, back off on every other failure."""
        assert self.backoff is not None
        gone_in_a_row = 0
        while not stopping.is_set():
            self._relist_requested.clear()
            cycle = asyncio.create_task(self._cycle(), name=f"informer {self.name}")
            stop = asyncio.create_task(stopping.wait())
            relist = asyncio.create_task(self._relist_requested.wait())
            try:
                await asyncio.wait({cycle, stop, relist}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (cycle, stop, relist):
                    task.cancel()
                # Waited for, not awaited one by one: a cancellation of ``run`` itself must propagate.
                await asyncio.wait({cycle, stop, relist})
            if stopping.is_set():
                return
            if not cycle.done() or cycle.cancelled():  # relist requested
                self._restart("requested", self._relist_reason)
                self._need_list = True
                continue
            error = cycle.exception()
            if error is None:
                gone_in_a_row = 0
                continue  # the server ended the watch normally: resume from the last resourceVersion
            if isinstance(error, Gone):
                self._restart("gone", str(error))
                self._need_list = True
                gone_in_a_row += 1
                if gone_in_a_row == 1:
                    continue  # client-go re-lists at once; a second 410 in a row backs off like any failure
            else:
                gone_in_a_row = 0
                self._restart("stalled" if isinstance(error, Stalled) else "error", repr(error))
            delay = self.backoff.next_delay()
            if isinstance(error, ApiError) and error.retry_after:
                delay = max(delay, min(error.retry_after, self.max_backoff))
            await sleep_unless(stopping, delay)

    def _restart(self, reason: str, detail: str) -> None:
        self.restarts += 1
        level = log.info if reason in ("gone", "requested") else log.warning
        level("informer restarting", informer=self.name, reason=reason, detail=detail[:300], listed=not self._need_list)
        try:
            self.on_restart(reason)
        except Exception:
            log.exception("informer on_restart failed", informer=self.name)


def _rv(obj: Mapping[str, Any]) -> Any:
    return (obj.get("metadata") or {}).get("resourceVersion")


def _parse_event(line: bytes, loads: Callable[[bytes], Any] = json.loads) -> Mapping[str, Any]:
    try:
        event = loads(line)
    except ValueError as err:
        raise ApiError(None, f"watch line is not JSON: {line[:120]!r}") from err
    if (
        not isinstance(event, dict)
        or not isinstance(event.get("type"), str)
        or not isinstance(event.get("object"), dict)
    ):
        raise ApiError(None, f"watch line is not an event: {line[:120]!r}")
    return event


async def _check_status(resp: Any) -> None:
    """Raise for a non-2xx answer: ``Gone`` for 410, ``ApiError`` (with Retry-After) for the rest."""
    status = resp.status
    if 200 <= status <= 299:
        return
    try:
        text = (await resp.read()).decode(errors="replace")[:300]
    except (aiohttp.ClientError, TimeoutError):
        text = ""
    if status == 410:
        raise Gone(text)
    retry_after: float | None = None
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        retry_after = float(resp.headers.get("Retry-After"))
    raise ApiError(status, text or str(resp.reason), retry_after)
