"""The scheduler's side of the writer process (``process``): THE path of its per-pod API writes (binds, events,
pod-status patches, preemption's nominations, conditions and evictions, DynamicResources' claim writes). Reads
(informers, recovery lists) and VolumeBinding's PV/PVC updates stay on the scheduler's own client.

A write is packed and buffered; the buffer goes down the pipe at most once per ``FLUSH_DELAY`` (or at
``FLUSH_BATCH`` messages), so a burst of binds costs one pipe write (and one wake-up of the writer) per few
milliseconds; a write after a pause goes at the end of its loop turn (with whatever else that turn wrote), not
``FLUSH_DELAY`` later, where a pod's writes one after the other (a claim's finalizer, its status, the bind) each
waited it out, and the writer's reply as long again (``protocol.flush_after``). Each write carries its term
(``Term.number``) and the term's deadline (``Term.deadline``, monotonic), which ``renew`` moves on in the process; a
write refused for its deadline is sent again if the term was renewed meanwhile (the renewal's message came too
late); ``end_term`` tells the writer at once, unbuffered, that a term is over. A caller that is cancelled
(``stop_binding`` cancels its binding cycles) cancels its request in the writer too. If the process dies, the writes
in flight answer ``UNSENT`` (a bind is retried with backoff, an event is retried) and it is restarted with backoff;
``alive`` is a readiness check. ``ready`` is set once the process has built its client (its imports take ~1.4 s):
the scheduler waits for it before its first decision, so a start with pods pending does not pile its first writes up
in the pipe."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from crane_scheduler.writer.protocol import (
    BIND,
    BIND_REPORTED,
    CANCEL,
    DEADLINE_PASSED,
    END_TERM,
    EVICT,
    JSON,
    NO_DEADLINE,
    OBJECT,
    READY_ID,
    REFUSED,
    RENEW,
    REQUEST,
    SUPERSEDED,
    UNSENT,
    URGENT,
    Connection,
    Reply,
    flush_after,
)
from crane_shared.leader import Term
from crane_shared.logs import get_logger
from crane_shared.retry import Backoff

log = get_logger("crane.scheduler.writer")
FLUSH_DELAY = 0.002
"""seconds a write may wait in the buffer for others: each pipe write wakes the writer process (a syscall and
context switches, ~12 % of the scheduler's samples when flushed every loop turn); a bind is late by at most this"""
FLUSH_BATCH = 256
"""messages that are flushed at once without waiting"""
SILENCE_MIN = 60.0
"""the least ``ApiWriter.silence_limit``: seconds of silence with requests waiting before the process is restarted"""
STOP_TIMEOUT = 10.0
"""seconds the process gets to finish its requests once its stdin is closed: by then the reporter is done and the
binding cycles are drained, so only writes whose callers gave up are left"""


@dataclass(frozen=True, slots=True)
class ScheduledReport:
    """The ``Scheduled`` event a bind carries (``ApiWriter.bind``): reportingController, reportingInstance, the
    event's time, and who hears how its write went."""

    scheduler: str
    instance: str
    at: float
    done: Callable[[Reply], None]


class ApiWriter:
    def __init__(
        self,
        connection: Connection,
        *,
        log_level: str = "info",
        log_format: str = "text",
        on_restart: Callable[[], None] = lambda: None,
    ) -> None:
        self.connection = connection
        self.term: Term | None = None
        """the term binds are sent in (set by the scheduler when it starts leading)"""
        self._argv = [sys.executable, "-m", "crane_scheduler.writer", str(os.getpid()), log_level, log_format]
        self._on_restart = on_restart
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._out: list[bytes] = []
        self._flush_timer: asyncio.TimerHandle | None = None
        self._flushed_at = 0.0  # the loop's clock at the last pipe write
        self._packer = msgpack.Packer()
        self._proc: asyncio.subprocess.Process | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._closing = False
        self._started = asyncio.Event()
        self.ready = asyncio.Event()
        """set once the running process has built its client (its ``READY``), cleared when it exits"""
        self._heard = time.monotonic()
        """when the process last answered anything (or was started, or was last sent to while all was answered)"""
        self.silence_limit = max(SILENCE_MIN, 2 * connection.request_timeout)
        """requests pending and nothing answered for this long: the process is alive but stuck (a credential plugin
        that hangs, a wait outside every request's timeout), so it is killed and restarted, its requests answered
        ``UNSENT`` and retried as after a crash; a process making progress (a burst behind a rate limit) answers
        something well within it"""

    # ------------------------------------------------------------------------------------------ lifecycle

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and not self._closing

    async def start(self) -> None:
        """Start the process (and keep restarting it until ``close``); returns once the first one runs."""
        self._supervisor = asyncio.create_task(self._supervise())
        await self._started.wait()

    async def __aenter__(self) -> ApiWriter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _spawn(self) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            *self._argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 20
        )
        assert proc.stdin is not None
        proc.stdin.write(self._packer.pack(self.connection.to_wire()))
        return proc

    async def _supervise(self) -> None:
        backoff = Backoff(initial=0.5, maximum=10.0)
        while not self._closing:
            try:
                proc = await self._spawn()
            except Exception as err:
                log.error("could not start the API writer process", error=repr(err))
                self._started.set()
                await asyncio.sleep(backoff.next_delay())
                continue
            self._proc = proc
            self._heard = time.monotonic()
            self._started.set()
            watchdog = asyncio.create_task(self._watch_silence(proc))
            try:
                await self._read(proc, backoff)
            except Exception as err:  # a reply that does not decode: restart rather than leave callers waiting
                log.error("unreadable reply from the API writer process; restarting it", error=repr(err))
                proc.kill()
            finally:
                watchdog.cancel()
            code = await proc.wait()
            self.ready.clear()
            self._fail_pending("the API writer process exited")
            if self._closing:
                return
            log.error("the API writer process exited; restarting it", code=code)
            self._on_restart()
            await asyncio.sleep(backoff.next_delay())

    async def close(self) -> None:
        """Let the process finish what it has (it exits when its stdin closes), then stop supervising it."""
        self._closing = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            self.flush()
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._supervisor is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        self._fail_pending("the API writer is closed")

    async def _watch_silence(self, proc: asyncio.subprocess.Process) -> None:
        """Kill ``proc`` when requests wait and it has answered nothing for ``silence_limit`` seconds."""
        while proc.returncode is None:
            await asyncio.sleep(min(1.0, self.silence_limit / 4))
            if not self._pending:
                self._heard = time.monotonic()  # nothing owed: silence is not a symptom
            elif time.monotonic() - self._heard > self.silence_limit:
                log.error(
                    "the API writer process answered nothing while requests waited; restarting it",
                    waited=round(time.monotonic() - self._heard, 1),
                    pending=len(self._pending),
                )
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                return

    async def _read(self, proc: asyncio.subprocess.Process, backoff: Backoff) -> None:
        assert proc.stdout is not None
        unpacker = msgpack.Unpacker(raw=False)
        while chunk := await proc.stdout.read(1 << 16):
            self._heard = time.monotonic()
            backoff.reset()  # it answers: a later crash restarts it after the initial delay again
            unpacker.feed(chunk)
            for rid, status, text in unpacker:
                if rid == READY_ID:
                    self.ready.set()
                    continue
                future = self._pending.pop(rid, None)
                if future is not None and not future.done():
                    future.set_result(Reply(status, text))

    def _fail_pending(self, why: str) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_result(Reply(UNSENT, why))

    # ------------------------------------------------------------------------------------------ writes

    async def write(
        self,
        method: str,
        path: str,
        body: Any,
        term: Term | None,
        content_type: str = JSON,
        *,
        urgent: bool = False,
        wanted: Callable[[], bool] | None = None,
    ) -> Reply:
        """Send one write through the process; ``term``: the leadership term it belongs to (None: none);
        ``urgent``: on the binds' connections, not behind the reports (preemption's writes, ``protocol.URGENT``);
        ``wanted``: asked before the write is sent again after a renewal (``_send``), False refuses it as
        ``SUPERSEDED`` (a status patch whose pod's bind started meanwhile: the process would take it for a new
        patch, sent after the bind)."""
        return await self._send(URGENT if urgent else REQUEST, (method, path, body, content_type), term, wanted)

    async def write_object(
        self, method: str, path: str, body: Any, term: Term | None, content_type: str = JSON
    ) -> Reply:
        """A write whose answer the caller reads (``protocol.OBJECT``: on the binds' connections, JSON both ways):
        on success the reply's text is the object the API server answered."""
        return await self._send(OBJECT, (method, path, body, content_type), term)

    async def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the process to be ready to send (``READY``); False if it is not."""
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _send(
        self, kind: int, fields: tuple[Any, ...], term: Term | None, wanted: Callable[[], bool] | None = None
    ) -> Reply:
        """A ``REQUEST`` or ``BIND`` message (``protocol``) with its ``fields`` between the id and the term. A write
        refused because its deadline passed while it waited in the process is sent again if the term has been
        renewed since (it still holds, with a later deadline) and its caller still ``wanted`` it: refused, a gang
        member's bind would give its room away while its siblings are bound."""
        while True:
            sent = term.deadline if term is not None else NO_DEADLINE
            reply = await self._send_once(kind, fields, term)
            if not _renewed_since(reply, term, sent):
                return reply
            if wanted is not None and not wanted():
                return Reply(REFUSED, SUPERSEDED)

    async def _send_once(self, kind: int, fields: tuple[Any, ...], term: Term | None) -> Reply:
        if not self.alive:
            return Reply(UNSENT, "the API writer process is not running")
        if term is not None and not term.held:  # also after a restart, when the process never got its END_TERM
            return Reply(REFUSED, "the leadership term has ended")
        rid = next(self._ids)
        number, deadline = (0, NO_DEADLINE) if term is None else (term.number, term.deadline)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self._buffer((kind, rid, *fields, number, deadline))
        try:
            return await future
        except asyncio.CancelledError:
            if self._pending.pop(rid, None) is not None:
                self._buffer((CANCEL, rid))
            raise

    async def bind(
        self, namespace: str, name: str, uid: str, node: str, report: ScheduledReport | None = None
    ) -> Reply:
        """POST pods/<name>/binding in the current term. The UID precondition makes a bind of a deleted-and-
        recreated pod fail instead of binding the new one. With ``report``, the process also writes the pod's
        ``Scheduled`` event once the bind succeeded (``protocol.BIND_REPORTED``) and ``report.done`` gets that
        write's reply (``REFUSED`` with ``NOT_BOUND`` when the bind failed; ``UNSENT`` if the process died)."""
        if report is None or not self.alive or (self.term is not None and not self.term.held):
            return await self._send(BIND, (namespace, name, uid, node), self.term)  # (or its refusal, unsent)
        term = self.term
        while True:  # as ``_send``, each attempt with its own event id: only the last one's report counts
            sent = term.deadline if term is not None else NO_DEADLINE
            event_id = next(self._ids)
            future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
            self._pending[event_id] = future  # answered, or failed with the rest (``_fail_pending``)
            fields = (namespace, name, uid, node, event_id, report.scheduler, report.instance, report.at)
            try:
                reply = await self._send_once(BIND_REPORTED, fields, term)
            except asyncio.CancelledError:
                future.add_done_callback(lambda f: report.done(f.result()))
                raise
            if not _renewed_since(reply, term, sent):
                future.add_done_callback(lambda f: report.done(f.result()))
                return reply
            self._pending.pop(event_id, None)  # this attempt's NOT_BOUND: sent again

    async def evict(self, namespace: str, name: str, uid: str, condition: dict[str, Any]) -> Reply:
        """Preemption's eviction in the current term (``protocol.EVICT``): the victim's ``condition`` written,
        then the pod deleted if its UID is still ``uid``; the deletion's reply, or the condition's if that failed."""
        return await self._send(EVICT, (namespace, name, uid, condition), self.term)

    def renew(self, term: Term) -> None:
        """The term was renewed: its writes waiting in the process may leave until its new deadline."""
        if term.held:
            self._buffer((RENEW, term.number, term.deadline))

    def end_term(self, term: Term) -> None:
        """The term is over: the process refuses its writes not yet sent, from now on (sent unbuffered)."""
        self._buffer((END_TERM, term.number))
        self.flush()

    def _buffer(self, message: tuple[Any, ...]) -> None:
        self._out.append(self._packer.pack(message))
        if len(self._out) >= FLUSH_BATCH:
            self.flush()
        elif self._flush_timer is None:
            self._flush_timer = flush_after(FLUSH_DELAY, self._flushed_at, self.flush)

    def flush(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        self._flushed_at = asyncio.get_running_loop().time()
        data, self._out = b"".join(self._out), []
        proc = self._proc
        if data and proc is not None and proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.write(data)


def _renewed_since(reply: Reply, term: Term | None, sent: float) -> bool:
    """Whether ``reply`` refused a write for its deadline (``sent``) while its term still holds with a later one:
    a renewal came after the write left the scheduler, so it may go again."""
    return reply.refused and reply.text == DEADLINE_PASSED and term is not None and term.held and term.deadline > sent
