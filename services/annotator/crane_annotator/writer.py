"""Sends node patches: a queue per priority drained by ``concurrency`` workers under the client QPS limit.

At most one patch per node is queued and one in flight. A patch submitted for a node that already has one
queued joins it (its annotations are merged in), so a hot-value change rides on the metric patch a round has
queued for the node instead of costing a second patch; if the change is urgent, the joined patch moves to the
urgent queue and goes with the next token. ``merge_only`` submissions never create a patch: they join a queued
one or are reported as held (used before the first metric round has finished, see ``hotloop``).

The hot value is added to a patch at the moment it is sent, from the latest computed value, not when the patch
was built: a round's patches can take a minute to drain at a low QPS, and a hot value that was current when the
round began must not overwrite the fresher one a burst of bindings produced meanwhile.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client
from yarl import URL

from crane_annotator.limiter import PriorityLimiter
from crane_annotator.patches import MERGE_PATCH, merge_patch
from crane_shared.kube import ApiCallError, api_failure, tls_context
from crane_shared.logs import LogOnce, get_logger

log = get_logger("crane.annotator.writer")

Outcome = Literal["ok", "missing", "error", "conflict"]
"""``conflict``: a write with a resourceVersion precondition met a newer object (409)"""
ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"
"""Only the node's metadata back: the API server encodes (and we receive) a fraction of the Node, whose status
(images, conditions) is most of its size; plain JSON from a server that cannot transform."""
HotSupplier = Callable[[str], Mapping[str, str]]
"""node -> the hot-value annotation to add to its patch now (empty when unknown)"""


class Patcher(Protocol):
    async def patch_many(
        self,
        patches: Mapping[str, Mapping[str, str]],
        *,
        hot: HotSupplier | None = None,
        urgent: bool = False,
        merge_only: bool = False,
    ) -> PatchReport: ...


@dataclass
class PatchReport:
    ok: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """nodes deleted meanwhile (404)"""
    failed: list[str] = field(default_factory=list)
    merged: list[str] = field(default_factory=list)
    """nodes whose submission joined a patch already queued (also listed under its outcome)"""
    held: list[str] = field(default_factory=list)
    """``merge_only`` nodes that had no queued patch to join: nothing sent"""

    @property
    def sent(self) -> int:
        return len(self.ok) + len(self.missing) + len(self.failed)


@dataclass
class _Queued:
    annotations: dict[str, str]
    hot: HotSupplier | None
    urgent: bool
    done: asyncio.Future[Outcome]
    waiters: int = 0


class NodePatcher:
    """Merge patches of node annotations over one HTTP session of its own.

    The session is built from the API client's configuration (server, CA, client certificate, bearer token with
    its refresh hook) but not shared with it: kubernetes-asyncio's session has ``trust_env=True``, which looks up
    proxy settings and ``.netrc`` on every request and doubled the client CPU per patch (measured 1.4 ms vs
    0.6 ms), and its generated ``patch_node`` adds serialisation we do not need. Proxies from the environment
    are therefore not used for patches.

    Per patch the client does only what the request needs: the URL and headers are built once (again when the
    token changes), the body is compact JSON, the answer is the node's metadata only (``ACCEPT``) and is read
    in full so the connection is kept (an unread body makes aiohttp close it: a new TLS handshake for the next
    patch on both sides). Every request is status-checked and bounded by ``timeout``.
    """

    def __init__(
        self,
        api: client.ApiClient,
        limiter: PriorityLimiter,
        *,
        concurrency: int = 32,
        timeout: float = 30.0,
        on_sent: Callable[[str, Mapping[str, str], Outcome], None] = lambda node, annotations, outcome: None,
    ) -> None:
        self._configuration = api.configuration
        self._host = str(api.configuration.host).rstrip("/")
        self._urls: dict[str, URL] = {}
        self._token: str | None = None
        self._header_cache: dict[str, str] | None = None
        self._limiter = limiter
        self._concurrency = max(1, concurrency)
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._on_sent = on_sent
        self._log_once = LogOnce(log)
        self._queued: dict[str, _Queued] = {}
        self._urgent: deque[str] = deque()
        self._routine: deque[str] = deque()
        self._sending: set[str] = set()
        self._work = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        # Whether this instance may write now (the leader's term holds); checked right before every PATCH, so a
        # patch queued before the lease was lost never leaves after it. Set by the service; True by default.
        self.may_write: Callable[[], bool] = lambda: True

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=tls_context(self._configuration) or False, limit=self._concurrency)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=self._timeout)
            )
        return self._session

    async def close(self) -> None:
        workers, self._workers = self._workers, []
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for node in list(self._queued):
            self._queued.pop(node).done.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def queued(self, node: str) -> bool:
        """Whether a patch for ``node`` waits in the queue (a submission now would join it)."""
        return node in self._queued

    async def patch(
        self, node: str, annotations: Mapping[str, str], *, hot: HotSupplier | None = None, urgent: bool = False
    ) -> Outcome:
        report = await self.patch_many({node: annotations}, hot=hot, urgent=urgent)
        return "ok" if report.ok else "missing" if report.missing else "error"

    async def patch_many(
        self,
        patches: Mapping[str, Mapping[str, str]],
        *,
        hot: HotSupplier | None = None,
        urgent: bool = False,
        merge_only: bool = False,
    ) -> PatchReport:
        """Queue one patch per node (or join the one queued) and wait until all are sent. Cancelling the caller
        withdraws the queued patches nobody else waits for: a leader that lost its lease sends nothing more."""
        report = PatchReport()
        waiting: dict[str, _Queued] = {}
        for node, body in patches.items():
            entry, joined = self._submit(node, body, hot, urgent, merge_only)
            if entry is None:
                report.held.append(node)
                continue
            waiting[node] = entry
            if joined:
                report.merged.append(node)
        if not waiting:
            return report
        try:
            await asyncio.wait([e.done for e in waiting.values()])
        except asyncio.CancelledError:
            for node, entry in waiting.items():
                self._withdraw(node, entry)
            raise
        for node, entry in waiting.items():
            outcome: Outcome = "error" if entry.done.cancelled() or entry.done.exception() else entry.done.result()
            {"ok": report.ok, "missing": report.missing}.get(outcome, report.failed).append(node)
        return report

    def _submit(
        self, node: str, annotations: Mapping[str, str], hot: HotSupplier | None, urgent: bool, merge_only: bool
    ) -> tuple[_Queued | None, bool]:
        entry = self._queued.get(node)
        joined = entry is not None
        if entry is None:
            if merge_only:
                return None, False
            entry = _Queued(dict(annotations), hot, urgent, asyncio.get_running_loop().create_future())
            self._queued[node] = entry
            (self._urgent if urgent else self._routine).append(node)
        else:
            entry.annotations.update(annotations)
            entry.hot = entry.hot or hot
            if urgent and not entry.urgent:
                entry.urgent = True
                self._urgent.append(node)
        entry.waiters += 1
        self._start_workers()
        self._work.set()
        return entry, joined

    def _withdraw(self, node: str, entry: _Queued) -> None:
        entry.waiters -= 1
        if entry.waiters <= 0 and self._queued.get(node) is entry:
            del self._queued[node]
            entry.done.cancel()

    def _start_workers(self) -> None:
        if not self._workers:
            self._workers = [asyncio.create_task(self._worker()) for _ in range(self._concurrency)]

    def _take(self) -> tuple[str, _Queued] | None:
        """The next patch to send: urgent ones first, each queue in order; nodes with a patch in flight wait
        (they are queued again when it ends)."""
        for queue in (self._urgent, self._routine):
            while queue:
                node = queue.popleft()
                entry = self._queued.get(node)
                if entry is None or node in self._sending or (queue is self._routine and entry.urgent):
                    continue
                del self._queued[node]
                return node, entry
        return None

    async def _worker(self) -> None:
        while True:
            while not (self._urgent or self._routine):
                self._work.clear()
                await self._work.wait()
            await self._limiter.acquire(bool(self._urgent))
            taken = self._take()
            if taken is None:
                continue
            node, entry = taken
            self._sending.add(node)
            body: dict[str, str] = {}
            try:
                body = {**entry.annotations, **(entry.hot(node) if entry.hot else {})}
                outcome: Outcome = await self._send(node, body) if body else "ok"
            except asyncio.CancelledError:  # closing: whoever waits for this patch must not wait forever
                entry.done.cancel()
                raise
            except Exception as err:  # a bug, not an API answer: fail this patch, keep the worker
                self._log_once.warning("patch-bug", "node patch failed unexpectedly", node=node, error=repr(err))
                outcome = "error"
            finally:
                self._sending.discard(node)
                requeued = self._queued.get(node)
                if requeued is not None:
                    (self._urgent if requeued.urgent else self._routine).append(node)
                    self._work.set()
            if body:
                self._on_sent(node, body, outcome)
            if not entry.done.done():
                entry.done.set_result(outcome)

    async def _send(self, node: str, annotations: Mapping[str, str]) -> Outcome:
        return await self._patch(node, merge_patch(annotations))

    async def patch_status(self, node: str, body: Mapping[str, object]) -> Outcome:
        """One merge patch of the node's status subresource (the batch extended resources), sent now under the
        same QPS limit (routine priority), leadership check, timeout and status check as annotation patches.
        Not queued: the caller decides per node whether it is worth a write (``reclaim.should_write``)."""
        await self._limiter.acquire(False)
        return await self._patch(node, body, "/status")

    async def patch_taints(self, node: str, taints: list[dict[str, object]], resource_version: str) -> Outcome:
        """Replace the node's ``spec.taints`` (a list that strategic merge cannot merge by key, so the whole list
        goes, as kube's own taint helpers send it) if the node is still at ``resource_version``: a concurrent
        change of someone else's taint answers ``conflict``, never lost. Sent now, under the same QPS limit
        (urgent: a taint matters more than a routine annotation), leadership check, timeout and status check as
        annotation patches."""
        await self._limiter.acquire(True)
        body = {"metadata": {"resourceVersion": resource_version}, "spec": {"taints": taints}}
        return await self._patch(node, body)

    async def _patch(self, node: str, patch: Mapping[str, object], subresource: str = "") -> Outcome:
        if not self.may_write():
            self._log_once.warning("patch-not-leader", "not patching: leadership lost", node=node)
            return "error"
        session = self._open()
        body = json.dumps(patch, separators=(",", ":")).encode()
        what = f"node {node}{subresource}"
        url = self._url(node)
        if subresource:
            url = URL(str(url) + subresource, encoded=True)
        try:
            async with session.patch(url, data=body, headers=await self._headers()) as resp:
                status = resp.status
                # Read in full: aiohttp closes a connection whose response body was left unread, and the next
                # patch on it pays a new TLS handshake (measured: about 1 patch in 100 at 5,000 nodes).
                payload = await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            failed = api_failure("PATCH", what, err)
            self._log_once.warning("patch-connection", "node patch failed", node=node, **failed)
            return "error"
        if status < 300:
            return "ok"
        if status == 404:
            self._urls.pop(node, None)
            return "missing"
        if status == 409:
            return "conflict"
        failed = ApiCallError("PATCH", what, status, payload[:300].decode(errors="replace")).log_fields()
        self._log_once.warning(f"patch-{status}", "node patch failed", node=node, **failed)
        return "error"

    def _url(self, node: str) -> URL:
        """The node's URL, parsed and encoded once (aiohttp would otherwise re-parse the string every patch)."""
        url = self._urls.get(node)
        if url is None:
            url = self._urls[node] = URL(f"{self._host}/api/v1/nodes/{quote(node, safe='')}", encoded=True)
        return url

    async def _headers(self) -> Mapping[str, str]:
        """Request headers, rebuilt only when the bearer token changes (its refresh hook still runs per patch,
        as for any kubernetes-asyncio request)."""
        token = None
        if "BearerToken" in self._configuration.api_key:
            token = await self._configuration.get_api_key_with_prefix("BearerToken")
        if token != self._token or self._header_cache is None:
            self._token = token
            self._header_cache = {"Content-Type": MERGE_PATCH, "Accept": ACCEPT}
            if token:
                self._header_cache["Authorization"] = token
        return self._header_cache
