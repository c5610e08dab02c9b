"""The writer process: sends the scheduler's API writes (binds, events, pod-status patches) on its own connections.

Why a process: the scheduler is one Python thread, and per pod it makes two HTTPS requests (the bind and the
``Scheduled`` event). Their client side (aiohttp, TLS records, socket sends, responses) was about half of its CPU
(py-spy, ``bench/scheduler/RESULTS.md``), all of it serialised with the decisions. Here it runs beside them, on
another core, fed by msgpack over a pipe (``protocol``): a request costs the scheduler one small pack and a share
of one pipe write per event-loop turn.

Cost per request (``bench.scheduler.writer_cost``): requests leave on the writer's own HTTP/1.1 client
(``http``: keep-alive pool, one bytes object per request, httptools parsing the response), on uvloop; a bind's
body comes from a template (``BIND``), other bodies are dumped once. Binds and reports (events, status patches) are
two lanes, each with its own connections and token bucket, so events never queue behind a burst of binds;
preemption's writes (``URGENT``: nominations, victims' conditions and deletions) take the binds' lane, so they do
not queue behind the reports of a burst of failed attempts.

Safety (leadership): a request carries its term and the instant its term may end (``deadline``, monotonic), which
each renewal of the term moves on (``RENEW``); it is refused once the deadline has passed or the term was ended
(``END_TERM``), checked again after its rate-limiter token and once more when its connection is ready, right
before it goes out (refused then, it gives its token back: a backlog of writes whose deadline passed while they
waited would otherwise take every token, and nothing would go out); ``END_TERM`` and ``CANCEL`` also cancel what
is waiting for a token or a connection.

Order: a pod's status patch (``REQUEST``: a failed attempt's PodScheduled=False) that has not left when a bind of
that pod arrives is refused at the same checks (``SUPERSEDED``), and one already on the wire is answered before
the bind goes: kube's API dispatcher lets a pod's binding overwrite its queued status patch and runs one call of
an object at a time. The two go on different lanes; the patch, landing after the bind, would leave the bound pod
PodScheduled=False. The process gets SIGKILL when the scheduler dies
(``PR_SET_PDEATHSIG``) and exits when its stdin closes, after finishing what it has started.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import functools
import json
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import quote, urlsplit

import msgpack
import uvloop
from kubernetes_asyncio import client

from crane_scheduler.writer import kubeproto
from crane_scheduler.writer.http import Endpoint, HttpPool, Refused
from crane_scheduler.writer.protocol import (
    BIND,
    BIND_REPORTED,
    CANCEL,
    DEADLINE_PASSED,
    END_TERM,
    EVICT,
    JSON,
    NO_DEADLINE,
    NOT_BOUND,
    OBJECT,
    READY,
    READY_ID,
    REFUSED,
    RENEW,
    REQUEST,
    STRATEGIC_MERGE_PATCH,
    SUPERSEDED,
    UNSENT,
    URGENT,
    Connection,
    flush_after,
)
from crane_shared.events import once_scheduled_event
from crane_shared.kube import KubeSettings, TokenBucket, api_client_from_dict, make_api_client, tls_context
from crane_shared.logs import configure_logging, get_logger

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
REPLY_DELAY = 0.002
"""seconds a reply may wait for others before the pipe write that wakes the scheduler"""


def yield_to_decisions() -> bool:
    """Run as ``SCHED_BATCH``: the kernel never lets this process's wake-ups (a reply arriving, a write from the
    scheduler) preempt the task on the CPU (``check_preempt_wakeup_fair`` returns early for a non-normal policy);
    they wait for that task's slice to end. Its work is throughput (an API reply takes milliseconds anyway), the
    scheduling loop's is latency, and on a busy control-plane node both share cores: as SCHED_OTHER, woken at each
    reply, it preempted the loop (``bench.scheduler``, 1,000 nodes, same-run pairs: 489 and 537 pods/s as
    SCHED_OTHER, 712 and 714 as SCHED_BATCH). Same nice level and CPU share; no privilege needed (a process may
    always move itself to SCHED_BATCH). False where the kernel has no such policy."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True


def die_with_parent(parent: int) -> None:
    """SIGKILL when the scheduler dies, however it dies; exit at once if it is gone already."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


async def api_client(conn: Connection) -> client.ApiClient:
    if conn.kubeconfig_dict is not None:
        return await api_client_from_dict(conn.kubeconfig_dict, qps=0, request_timeout=conn.request_timeout)
    settings = KubeSettings(kubeconfig=conn.kubeconfig, context=conn.context, request_timeout=conn.request_timeout)
    return await make_api_client(settings)


def endpoint(cfg: client.Configuration) -> tuple[Endpoint, str]:
    """The API server's address and TLS settings (as kubernetes-asyncio's REST client builds them), and the path
    prefix of its URL (e.g. a cluster behind a path-routing proxy)."""
    url = urlsplit(cfg.host)
    tls = tls_context(cfg)
    port = url.port or (443 if tls is not None else 80)
    host = url.hostname or "localhost"
    return Endpoint(host, port, url.netloc, tls, cfg.tls_server_name or None), url.path.rstrip("/")


class ReportGate:
    """Events yield to binds and to preemption's urgent writes: while binds wait for a connection (the API server
    is the bottleneck) or an urgent write is in flight, at most ``while_binds_wait`` events are in flight; the
    others wait here, in order, none dropped, and go as soon as neither holds (or an event in flight ends). A
    bind is what lets a pod start and an eviction what lets a preemptor bind; a ``Scheduled`` or
    ``FailedScheduling`` event only records it (kube-scheduler's event broadcaster even drops events past 1,000
    queued). On a saturated API server every request in flight takes a share of it (``bench/scheduler``: events
    at full concurrency made a burst of binds ~1.6x slower). Status patches do not pass this gate: a
    ``PodScheduled=False`` patch held back could land after the pod's bind."""

    def __init__(self, binds: HttpPool, while_binds_wait: int) -> None:
        self.binds = binds
        self.limit = max(1, while_binds_wait)
        self.in_flight = 0
        self.urgent = 0  # urgent writes (preemption's) not answered yet
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        binds.on_unqueued = self._admit

    def _room(self) -> bool:
        return not (self.binds.queued or self.urgent) or self.in_flight < self.limit

    def urgent_done(self) -> None:
        self.urgent -= 1
        self._admit()

    async def __aenter__(self) -> None:
        if not self._waiters and self._room():
            self.in_flight += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # admitted: ``_admit`` counted it in flight
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # admitted, then cancelled: pass its place on
                self._release()
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    def _release(self) -> None:
        self.in_flight -= 1
        self._admit()

    def _admit(self) -> None:
        while self._waiters and self._room():
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self.in_flight += 1


@dataclass
class Lane:
    """Binds, or reports (events, status patches): their own connections and rate limit, as kube-scheduler gives
    its events a client of their own."""

    pool: HttpPool
    bucket: TokenBucket


_PLAIN_PATH = re.compile(r"[A-Za-z0-9/._~:@!$&'()*+,;=%?-]+")
_POD_STATUS = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/status")
_CONTENT_TYPES = {t: f"Content-Type: {t}\r\n".encode() for t in (JSON, STRATEGIC_MERGE_PATCH, kubeproto.PROTOBUF)}


class Supersedable:
    """A status patch of pod ``key`` (namespace, name) in the writer: ``by_bind`` once a bind of its pod arrived
    before it was sent (refused: ``SUPERSEDED``); ``sent`` once it went out, after which a bind of its pod waits for
    ``answered``."""

    __slots__ = ("answered", "by_bind", "key", "sent")

    def __init__(self, key: tuple[str, str]) -> None:
        self.key = key
        self.by_bind = False
        self.sent = False
        self.answered = asyncio.Event()


def bind_request(namespace: str, name: str, uid: str, node: str) -> tuple[str, bytes]:
    """The path and body (protobuf, ``kubeproto``) of a bind; the UID precondition: a deleted-and-recreated pod
    is not bound."""
    return f"/api/v1/namespaces/{namespace}/pods/{name}/binding", kubeproto.binding(namespace, name, uid, node)


def _error_text(body: bytes) -> str:
    """An error reply's body as text: a protobuf ``Status`` (the reply to a protobuf bind) as its JSON."""
    return kubeproto.status_json(body) or body.decode(errors="replace")


class Writer:
    """Requests in, replies out; one asyncio task per request in flight."""

    def __init__(self, api: client.ApiClient, conn: Connection, out: asyncio.WriteTransport) -> None:
        self.api = api
        rest = api.rest_client
        if rest.proxy:  # kubeconfig proxy-url: this client speaks to the API server directly only
            raise ValueError("the API writer does not support a proxy (kubeconfig proxy-url)")
        where, self.prefix = endpoint(api.configuration)
        accept = f"{kubeproto.PROTOBUF}, application/json"  # binds: protobuf both ways (``kubeproto``)
        self.binds = Lane(
            HttpPool(where, conn.connections, conn.request_timeout, accept), TokenBucket(conn.qps, conn.burst)
        )
        self.reports = Lane(
            HttpPool(where, conn.report_connections, conn.request_timeout), TokenBucket(conn.qps, conn.burst)
        )
        self.events = ReportGate(self.binds.pool, conn.reports_while_binds_wait)
        self.out = out
        self.replies: list[bytes] = []
        self.flush_timer: asyncio.TimerHandle | None = None
        self.flushed_at = 0.0  # the loop's clock at the last pipe write
        self.packer = msgpack.Packer()
        self.tasks: dict[int, tuple[asyncio.Task[None], int]] = {}
        self.ended: set[int] = set()
        self.renewed: dict[int, float] = {}  # term -> its latest deadline (``RENEW``)
        self.status_patches: dict[tuple[str, str], list[Supersedable]] = {}  # (namespace, pod) -> not answered
        self.patch_of: dict[int, Supersedable] = {}  # request id -> its status patch
        self.event_of: dict[int, int] = {}  # a BIND_REPORTED's request id -> its event's (answered when cancelled)
        self._auth: tuple[dict[str, str], bytes] = ({}, b"")

    def receive(self, message: Any) -> None:
        kind = message[0]
        if kind == BIND:
            _, rid, namespace, name, uid, node, term, deadline = message
            path, body = bind_request(namespace, name, uid, node)
            request = functools.partial(
                self._request, self.binds, "POST", path, body, kubeproto.PROTOBUF, term, deadline
            )
            self._start(rid, term, self._answer(rid, self._after_status_patches(namespace, name, request)))
        elif kind == BIND_REPORTED:
            _, rid, namespace, name, uid, node, event_id, scheduler, instance, at, term, deadline = message
            path, body = bind_request(namespace, name, uid, node)
            request = functools.partial(
                self._request, self.binds, "POST", path, body, kubeproto.PROTOBUF, term, deadline
            )
            bind = self._after_status_patches(namespace, name, request)
            event = once_scheduled_event(
                namespace=namespace, pod=name, pod_uid=uid, node=node, scheduler=scheduler, instance=instance, at=at
            )
            self.event_of[rid] = event_id
            self._start(rid, term, self._bind_and_report(rid, bind, event_id, namespace, event))
        elif kind in (REQUEST, URGENT, OBJECT):
            _, rid, method, path, body, content_type, term, deadline = message
            data = json.dumps(body, separators=(",", ":")).encode()
            # urgent: on the binds' lane, and events wait while any is in flight; events yield to binds and urgent
            # writes (``ReportGate``); status patches do not wait
            urgent = kind != REQUEST
            gate = self.events if not urgent and method == "POST" and path.endswith("/events") else None
            lane = self.binds if urgent else self.reports
            patch = self._status_patch(rid, path) if kind == REQUEST and method == "PATCH" else None
            request = functools.partial(
                self._request, lane, method, path, data, content_type, term, deadline, gate, kind == OBJECT, patch
            )
            self._start(rid, term, self._answer(rid, request, urgent=urgent))
        elif kind == EVICT:
            _, rid, namespace, name, uid, condition, term, deadline = message
            evict = functools.partial(self._evict, namespace, name, uid, condition, term, deadline)
            self._start(rid, term, self._answer(rid, evict, urgent=True))
        elif kind == CANCEL:
            found = self.tasks.get(message[1])
            if found is not None:
                found[0].cancel()
        elif kind == RENEW:
            _, term, deadline = message
            if term not in self.ended:
                self.renewed[term] = max(deadline, self.renewed.get(term, deadline))
        elif kind == END_TERM:
            term = message[1]
            self.ended.add(term)
            self.renewed.pop(term, None)
            for task, of in list(self.tasks.values()):
                if of == term:
                    task.cancel()

    def _start(self, rid: int, term: int, send: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(send)
        self.tasks[rid] = (task, term)
        task.add_done_callback(functools.partial(self._done, rid))

    def _done(self, rid: int, task: asyncio.Task[None]) -> None:
        self.tasks.pop(rid, None)
        patch = self.patch_of.pop(rid, None)
        if patch is not None:  # answered, refused or cancelled (also before it ever ran)
            patch.answered.set()
            marks = self.status_patches.get(patch.key)
            if marks is not None and patch in marks:
                marks.remove(patch)
                if not marks:
                    del self.status_patches[patch.key]
        event_id = self.event_of.pop(rid, None)
        if task.cancelled():  # cancelled before ``_answer`` ran (it answers its own cancellation): nothing was sent
            self.reply(rid, REFUSED, "cancelled")
            if event_id is not None:  # nor was the bind's report: its caller's wait for it ends too
                self.reply(event_id, REFUSED, NOT_BOUND)

    def _status_patch(self, rid: int, path: str) -> Supersedable | None:
        """A patch of a pod's status, which a bind of that pod supersedes (not sent yet) or waits for (sent)."""
        found = _POD_STATUS.fullmatch(path)
        if found is None:
            return None
        patch = self.patch_of[rid] = Supersedable((found[1], found[2]))
        self.status_patches.setdefault(patch.key, []).append(patch)
        return patch

    def _after_status_patches(
        self, namespace: str, name: str, bind: Callable[[], Awaitable[tuple[int, str]]]
    ) -> Callable[[], Awaitable[tuple[int, str]]]:
        """``bind``, once the pod's status patches already sent are answered; those not sent are superseded."""
        sent = []
        for mark in self.status_patches.pop((namespace, name), ()):
            if mark.sent:
                sent.append(mark.answered)
            else:
                mark.by_bind = True
        if not sent:
            return bind

        async def after() -> tuple[int, str]:
            for answered in sent:
                await answered.wait()
            return await bind()

        return after

    def _refusal(self, term: int, deadline: float, patch: Supersedable | None = None) -> str | None:
        if patch is not None and patch.by_bind:
            return SUPERSEDED
        if term and term in self.ended:
            return "leadership term ended"
        if time.monotonic() >= max(deadline, self.renewed.get(term, deadline)):
            return DEADLINE_PASSED
        return None

    async def _auth_headers(self) -> bytes:
        """The Authorization header (bearer token, refreshed by kubernetes-asyncio's hooks), encoded once per
        token value."""
        headers: dict[str, str] = {}
        await self.api.update_params_for_auth(headers, [], ["BearerToken"])
        if headers != self._auth[0]:
            lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            if any(c in v for v in headers.values() for c in "\r\n"):
                raise ValueError("the credentials hold a line break")
            self._auth = (headers, lines.encode())
        return self._auth[1]

    async def _evict(
        self, namespace: str, name: str, uid: str, condition: Any, term: int, deadline: float
    ) -> tuple[int, str]:
        """kube's ``PreemptPod`` in one request from the scheduler (``EVICT``): the victim's condition, then (once
        it is written) its deletion with the UID precondition; the deletion's reply, or the first step's when that
        failed (its text says which). The deletion does not wait for the scheduling loop to read the condition's
        reply."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        patch = json.dumps({"status": {"conditions": [condition]}}, separators=(",", ":")).encode()
        status, text = await self._request(
            self.binds, "PATCH", f"{path}/status", patch, STRATEGIC_MERGE_PATCH, term, deadline
        )
        if not 200 <= status <= 299:
            return status, f"the DisruptionTarget condition: {text}"
        delete = json.dumps({"preconditions": {"uid": uid}}, separators=(",", ":")).encode()
        return await self._request(self.binds, "DELETE", path, delete, JSON, term, deadline)

    async def _bind_and_report(
        self,
        rid: int,
        bind: Callable[[], Awaitable[tuple[int, str]]],
        event_id: int,
        namespace: str,
        event: dict[str, Any],
    ) -> None:
        """``BIND_REPORTED``: the bind, answered as ``BIND``'s; once it answered 2xx, the pod's ``Scheduled`` event on
        the reports' lane (behind the binds waiting for a connection, as every event), answered to ``event_id``;
        ``REFUSED`` there when the bind did not succeed, so the caller's wait for it ends."""
        bound = False

        async def exchange() -> tuple[int, str]:
            nonlocal bound
            status, text = await bind()
            bound = 200 <= status <= 299
            return status, text

        try:
            await self._answer(rid, exchange)
        finally:
            if not bound:
                self.reply(event_id, REFUSED, NOT_BOUND)
        if not bound:
            return
        task = asyncio.current_task()
        if task is not None and rid in self.tasks:
            self.tasks[rid] = (task, 0)  # a fact now: the end of the bind's term does not cancel its report
        data = json.dumps(event, separators=(",", ":")).encode()
        path = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
        report = functools.partial(self._request, self.reports, "POST", path, data, JSON, 0, NO_DEADLINE, self.events)
        await self._answer(event_id, report)

    async def _answer(
        self, rid: int, exchange: Callable[[], Awaitable[tuple[int, str]]], *, urgent: bool = False
    ) -> None:
        """Run ``exchange`` and reply to request ``rid`` with its HTTP status, REFUSED (not sent: the term ended,
        its deadline passed, cancelled) or UNSENT (a transport error). ``urgent``: preemption's writes, counted in
        the ``ReportGate`` while in flight."""
        if urgent:
            self.events.urgent += 1
        try:
            status, text = await exchange()
            self.reply(rid, status, text)
        except Refused as refused:
            self.reply(rid, REFUSED, str(refused))
        except asyncio.CancelledError:
            self.reply(rid, REFUSED, "cancelled")
        except Exception as err:  # timeouts, resets, refused connections: the caller decides what to retry
            self.reply(rid, UNSENT, repr(err))
        finally:
            if urgent:
                self.events.urgent_done()

    async def _request(
        self,
        lane: Lane,
        method: str,
        path: str,
        body: bytes,
        content_type: str,
        term: int,
        deadline: float,
        gate: ReportGate | None = None,
        keep: bool = False,
        patch: Supersedable | None = None,
    ) -> tuple[int, str]:
        """Send one request in ``term`` (``Refused`` when the term ended or its deadline passed, or the pod-status
        ``patch`` was superseded, before its token, after it, and right before it goes out); its status and, unless
        2xx, the error body as text (``keep``: the body whatever the status, asked for in JSON)."""
        refusal = self._refusal(term, deadline, patch)
        if refusal is None:
            await lane.bucket.acquire()
            refusal = self._refusal(term, deadline, patch)
            if refusal is not None:  # not sent: its token goes to the next write (a backlog of writes past their
                lane.bucket.refund()  # deadline would otherwise take every token, and nothing would go out)
        if refusal is not None:
            raise Refused(refusal)
        if not _PLAIN_PATH.fullmatch(path):
            path = quote(path, safe="/")
        kind = _CONTENT_TYPES.get(content_type) or f"Content-Type: {content_type}\r\n".encode()
        head = lane.pool.head(method, self.prefix + path, JSON if keep else None) + await self._auth_headers() + kind

        def check() -> str | None:  # right before it goes out
            last = self._refusal(term, deadline, patch)
            if last is None and patch is not None:
                patch.sent = True  # from here a bind of its pod waits for its answer
            return last

        try:
            if gate is None:
                status, text = await lane.pool.request(head, body, check, keep)
            else:
                async with gate:
                    status, text = await lane.pool.request(head, body, check, keep)
        except Refused:
            lane.bucket.refund()  # refused while it waited for a connection: never sent either
            raise
        if 200 <= status <= 299:
            return status, text.decode(errors="replace") if keep else ""
        return status, _error_text(text)

    def reply(self, rid: int, status: int, text: str) -> None:
        self.replies.append(self.packer.pack((rid, status, text)))
        if self.flush_timer is None:  # one pipe write (one wake-up of the scheduler) per REPLY_DELAY at most
            self.flush_timer = flush_after(REPLY_DELAY, self.flushed_at, self.flush)

    def flush(self) -> None:
        if self.flush_timer is not None:
            self.flush_timer.cancel()
            self.flush_timer = None
        self.flushed_at = asyncio.get_running_loop().time()
        data, self.replies = b"".join(self.replies), []
        if data and not self.out.is_closing():
            self.out.write(data)

    async def finish(self) -> None:
        """stdin closed: let what is in flight complete (each bounded by the request timeout)."""
        while self.tasks:
            await asyncio.gather(*(t for t, _ in list(self.tasks.values())), return_exceptions=True)
        self.flush()
        self.binds.pool.close()
        self.reports.pool.close()


async def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), stdin)
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, stdout)
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    writer: Writer | None = None
    api: client.ApiClient | None = None
    try:
        while chunk := await reader.read(1 << 16):
            unpacker.feed(chunk)
            for message in unpacker:
                if writer is None:  # the first object: the connection
                    conn = Connection.from_wire(message)
                    api = await api_client(conn)
                    writer = Writer(api, conn, out)
                    writer.reply(READY_ID, READY, "")
                    writer.flush()
                else:
                    writer.receive(message)
        if writer is not None:
            await writer.finish()
    finally:
        if api is not None:
            await api.close()
        with contextlib.suppress(Exception):
            out.close()


def main() -> int:
    """``python -m crane_scheduler.writer PARENT_PID LOG_LEVEL LOG_FORMAT``: started by ``client.ApiWriter``."""
    parent, level, fmt = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    die_with_parent(parent)
    configure_logging(level, fmt)
    if not yield_to_decisions():
        get_logger("crane.scheduler.writer").info("SCHED_BATCH unavailable; the writer runs as SCHED_OTHER")
    # The protocol owns the original stdout; anything printed by a library goes to stderr, the scheduler's log.
    protocol_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the scheduler decides when this process ends (stdin closed)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    uvloop.run(serve(sys.stdin.buffer, protocol_out))  # its loop and TLS transports: ~20 % less CPU per request
    return 0
