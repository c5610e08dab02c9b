"""The scheduling process's side of the decider workers: their replicas' feed, dispatch, answers, restarts.

Every change the scheduling process makes to its table reaches every worker in the same order (``protocol``):
node events, placed and nominated pods' events, the plugins' watched objects (from the cache and the plugins'
watches), and its own assumptions and their undoing (from the table's ``pod_assumed`` / ``pod_forgotten``
hooks). A message is packed once and queued for every live worker; the queues are written once per event-loop
turn. ``submit`` queues a decision behind them on the least busy worker; its answer resolves a future with
(node, messages seen), and ``fresh`` tells whether that node's row changed since (``versions.RowVersions``).

A worker that dies (or answers something unreadable) is restarted with backoff; its decisions in flight resolve
as ("", -1) at once, so the scheduling process decides those pods itself. A new worker first gets the whole
replicated state as of now (``_snapshot``: nodes, pods, objects, the recent assumptions with their times) and
counts from the number of messages sent so far, so its answers compare with the same numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from crane_scheduler.deciders.protocol import APPLY, ASSUME, CONFIRM, DECIDE, DONE, FORGET, INIT, READY_ID
from crane_scheduler.deciders.versions import RowVersions
from crane_scheduler.nodetable import NodeTable, PodRecord
from crane_scheduler.podinfo import PodInfo, scheduled_condition
from crane_shared.informer import object_key
from crane_shared.logs import get_logger
from crane_shared.retry import Backoff

log = get_logger("crane.scheduler.deciders")
IN_FLIGHT = 8
"""decisions queued on one worker at most (it always has the next one while its answer travels)"""
RECENT_ASSUMPTIONS = 3600.0
"""seconds an assumption is replayed to a new worker (longer than any Dynamic window of recent bindings)"""
STOP_TIMEOUT = 5.0
ANSWER_TIMEOUT = 10.0
"""seconds a worker may take to answer its oldest decision (one takes milliseconds); past it, the worker is
killed and restarted, and its decisions are made by the scheduling process"""
READY_TIMEOUT = 60.0
READY_PER_OBJECT = 0.002
"""seconds a started worker may take to build its replica and answer READY: READY_TIMEOUT (the interpreter, the
imports, the profiles) plus READY_PER_OBJECT for each object of its snapshot (applying one takes tens of
microseconds: 15,000 nodes and 10,000 pods get 110 s); one that has not by then is restarted: it reads nothing
meanwhile, so every message sent to it would wait in the pipe's buffer here"""
Answer = tuple[str, int, int]
"""a decision's answer: (node or "", state messages the worker had applied, the worker's index)"""
LOST: Answer = ("", -1, -1)
"""the answer of a decision whose worker died: decide it in the scheduling process"""
PACKED_PODS_KEPT = 10_000
"""packed pod objects kept for their assumption at most (a bound: decisions may end without one)"""


@dataclass
class _Worker:
    index: int
    proc: asyncio.subprocess.Process | None = None
    out: list[bytes] = field(default_factory=list)
    pending: dict[int, asyncio.Future[Answer]] = field(default_factory=dict)
    sent_at: dict[int, float] = field(default_factory=dict)
    """decision id -> when it was queued (monotonic): the watchdog's clock"""
    ready: bool = False
    ready_by: float | None = None
    """until it answers READY, when it must have (monotonic): the watchdog's other clock"""


class DeciderPool:
    """``count`` decider workers for a scheduling process whose profiles come from ``config`` (the
    ``KubeSchedulerConfiguration`` file, its parsed mapping, or None for the default profile) and a registry with
    the installed plugins (``out_of_tree``, as ``Simulator``)."""

    def __init__(
        self,
        count: int,
        config: Path | Mapping[str, Any] | None,
        *,
        nodes_hint: Callable[[], int] = lambda: 0,
        log_level: str = "info",
        log_format: str = "text",
        on_restart: Callable[[], None] = lambda: None,
        on_ready: Callable[[int], None] = lambda ready: None,
        out_of_tree: bool = True,
    ) -> None:
        self.count = count
        self.options = {
            "config_path": str(config) if isinstance(config, Path) else None,
            "config": None if isinstance(config, Path) else config,
            "out_of_tree": out_of_tree,
        }
        """what each replica's ``Simulator`` is built with: the scheduling process's profiles, built alike"""
        self.versions = RowVersions(count)
        self.hinted: tuple[str, str, int] | None = None
        """(uid, node, worker) while the scheduling process acts on that worker's answer (``assumed`` tags it)"""
        self._nodes_hint = nodes_hint
        self._argv = [sys.executable, "-m", "crane_scheduler.deciders", str(os.getpid()), log_level, log_format]
        self._on_restart = on_restart
        self._on_ready = on_ready
        """told how many workers answer, whenever that changes (the readiness gauge, on a standby too)"""
        self._workers = [_Worker(i) for i in range(count)]
        self._ids = itertools.count(1)
        self._packer = msgpack.Packer()
        self._packed_pods: dict[str, tuple[dict[str, Any], bytes]] = {}
        """uid -> (the pod object, packed) between its decision and its assumption (``submit``, ``assumed``)"""
        self._flush_scheduled = False
        self._room = asyncio.Event()
        self._closing = False
        self._supervisors: list[asyncio.Task[None]] = []
        # what a new worker is given: kind -> key -> object; pods' nodes; assumptions (uid -> node, profile, at)
        self._state: dict[str, dict[str, dict[str, Any]]] = {}
        self._pod_nodes: dict[str, str] = {}
        self._assumed: OrderedDict[str, tuple[str, str, float]] = OrderedDict()

    # ------------------------------------------------------------------------------------------ lifecycle

    def watch(self, table: NodeTable) -> None:
        """Follow the scheduling process's own assumptions and their undoing."""
        table.pod_assumed.append(self.assumed)
        table.pod_forgotten.append(self.forgotten)

    async def start(self) -> None:
        """Start the workers (each restarted until ``close``); returns at once, they get ready on their own."""
        if self._supervisors:
            return
        self._supervisors = [asyncio.create_task(self._supervise(w)) for w in self._workers]
        self._supervisors.append(asyncio.create_task(self._watchdog()))

    async def close(self) -> None:
        self._closing = True
        for w in self._workers:
            if w.proc is not None and w.proc.returncode is None and w.proc.stdin is not None:
                w.proc.stdin.close()
        for w in self._workers:
            if w.proc is not None and w.proc.returncode is None:
                try:
                    await asyncio.wait_for(w.proc.wait(), STOP_TIMEOUT)
                except TimeoutError:
                    w.proc.kill()
        for task in self._supervisors:
            task.cancel()
        for task in self._supervisors:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for w in self._workers:
            self._lose(w)

    async def wait_ready(self, timeout: float) -> bool:
        """Until every worker answers (or ``timeout`` seconds): whether they all do."""
        deadline = time.monotonic() + timeout
        while self.ready < self.count:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), left)
        return True

    @property
    def pids(self) -> list[int]:
        """the running workers' process ids (benchmarks read their CPU time)"""
        return [w.proc.pid for w in self._workers if w.proc is not None and w.proc.returncode is None]

    @property
    def ready(self) -> int:
        """workers answering now"""
        return sum(1 for w in self._workers if w.ready)

    async def _supervise(self, w: _Worker) -> None:
        backoff = Backoff(initial=0.5, maximum=10.0)
        while not self._closing:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self._argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 20
                )
            except Exception as err:
                log.error("could not start a decider worker", worker=w.index, error=repr(err))
                await asyncio.sleep(backoff.next_delay())
                continue
            self._begin(w, proc)
            try:
                await self._read(w, proc, backoff)
            except Exception as err:  # an answer that does not decode: restart rather than trust it
                log.error("unreadable answer from a decider worker; restarting it", worker=w.index, error=repr(err))
                proc.kill()
            code = await proc.wait()
            self._lose(w)
            if self._closing:
                return
            log.error("a decider worker exited; restarting it", worker=w.index, code=code)
            self._on_restart()
            await asyncio.sleep(backoff.next_delay())

    async def _watchdog(self) -> None:
        """A worker alive but silent (stuck) would hold its decisions, and the loop waiting for room, forever; one
        that never becomes ready would let what is sent to it pile up here."""
        while not self._closing:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for w in self._workers:
                if w.ready_by is not None and now > w.ready_by and w.proc is not None:
                    log.error("a decider worker did not become ready in time; restarting it", worker=w.index)
                    w.ready_by = None
                    with contextlib.suppress(ProcessLookupError):
                        w.proc.kill()
                    continue
                oldest = next(iter(w.sent_at.values()), None)
                if oldest is not None and now - oldest > ANSWER_TIMEOUT and w.proc is not None:
                    log.error("a decider worker did not answer in time; restarting it", worker=w.index)
                    with contextlib.suppress(ProcessLookupError):
                        w.proc.kill()

    def _begin(self, w: _Worker, proc: asyncio.subprocess.Process) -> None:
        """Synchronously (nothing else is sent meanwhile): what the others have queued leaves first, then the new
        worker gets its INIT and the whole state as of the messages sent so far."""
        self.flush()
        first_row = self._nodes_hint() * w.index // max(1, self.count)  # workers search from spread-out starts
        w.proc = proc
        snapshot = self._snapshot()
        w.ready_by = time.monotonic() + READY_TIMEOUT + READY_PER_OBJECT * len(snapshot)
        # the replica counts the snapshot's messages too: after them it has seen exactly what was sent so far
        base = self.versions.sent - len(snapshot)
        w.out = [self._packer.pack((INIT, self.options, w.index, first_row, base, self.versions.sent)), *snapshot]
        self._schedule_flush()

    def _prune(self, now: float) -> None:
        """Assumptions older than any window of recent bindings are no longer replayed to a new worker."""
        cutoff = now - RECENT_ASSUMPTIONS
        while self._assumed and next(iter(self._assumed.values()))[2] < cutoff:
            self._assumed.popitem(last=False)

    def _snapshot(self) -> list[bytes]:
        pack = self._packer.pack
        self._prune(time.time())
        out = [pack((APPLY, "Node", "ADDED", obj)) for obj in self._state.get("Node", {}).values()]
        for kind, objects in self._state.items():
            if kind in ("Node", "Pod"):
                continue
            out.extend(pack((APPLY, kind, "ADDED", obj)) for obj in objects.values())
        for uid, obj in self._state.get("Pod", {}).items():
            assumed = self._assumed.get(uid)
            if assumed is not None:
                out.append(pack((ASSUME, obj, assumed[0], assumed[1], assumed[2])))
            if (obj.get("spec") or {}).get("nodeName") or assumed is None:
                out.append(pack((APPLY, "Pod", "ADDED", obj)))
        return out

    async def _read(self, w: _Worker, proc: asyncio.subprocess.Process, backoff: Backoff) -> None:
        assert proc.stdout is not None
        unpacker = msgpack.Unpacker(raw=False)
        while chunk := await proc.stdout.read(1 << 16):
            unpacker.feed(chunk)
            for rid, node, seen in unpacker:
                if rid == READY_ID:
                    w.ready, w.ready_by = True, None
                    self._on_ready(self.ready)
                    backoff.reset()
                    self._room.set()
                    continue
                future = w.pending.pop(rid, None)
                w.sent_at.pop(rid, None)
                if future is not None and not future.done():
                    future.set_result((node, seen, w.index))
            self._room.set()

    def _lose(self, w: _Worker) -> None:
        w.ready_by = None
        if w.ready:
            w.ready = False
            self._on_ready(self.ready)
        w.proc = None
        w.out = []
        pending, w.pending = w.pending, {}
        w.sent_at.clear()
        for future in pending.values():
            if not future.done():
                future.set_result(LOST)
        self._room.set()  # the loop waiting for room: another worker's, or (none ready) its own decisions

    # ------------------------------------------------------------------------------------------ the feed

    def node_event(self, event: str, raw: dict[str, Any]) -> None:
        name = str((raw.get("metadata") or {}).get("name") or "")
        nodes = self._state.setdefault("Node", {})
        if event == "DELETED":
            nodes.pop(name, None)
        else:
            nodes[name] = raw
        self.versions.step(name)
        if event == "DELETED":
            self.versions.forget(name)
        self._send((APPLY, "Node", event, raw))

    def pod_event(
        self,
        event: str,
        raw: dict[str, Any],
        accounting_changed: bool = True,
        assumed_raw: dict[str, Any] | None = None,
    ) -> None:
        """Bound pods and nominated ones (and the last word on a pod the workers know); a pending pod of no
        nomination is nothing to a replica (a worker gets a pod it decides with the decision).
        ``accounting_changed`` False: the table counted this pod on its node exactly so already (the informer
        confirming an assumption): the replica gets the object, but the row is unchanged. ``assumed_raw``: the
        pending object ``raw``'s bound version was read from (``podinfo.bound_version``); when it is the object the
        workers were sent with the assumption, they get a ``CONFIRM`` instead of the object."""
        meta = raw.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        pods = self._state.setdefault("Pod", {})
        before = self._pod_nodes.get(uid, "")
        node = str((raw.get("spec") or {}).get("nodeName") or "")
        nominated = "" if node else str((raw.get("status") or {}).get("nominatedNodeName") or "")
        if event != "DELETED" and not node and uid in self._assumed:
            return  # a pending version of a pod assumed here (its bind on its way): the assumption stands
        if event == "DELETED" or not (node or nominated):
            if uid not in pods:
                return
            del pods[uid]
            self._pod_nodes.pop(uid, None)
            self._assumed.pop(uid, None)
            self.versions.step(self._row(before))
            self._send((APPLY, "Pod", "DELETED", raw))
            return
        sent = pods.get(uid)
        pods[uid] = raw
        self._pod_nodes[uid] = node or nominated
        if accounting_changed or before != node:
            self.versions.step(self._row(before), self._row(node or nominated))
        else:
            self.versions.step()
            if assumed_raw is not None and sent is assumed_raw and uid in self._assumed:
                rv = str(meta.get("resourceVersion") or "")
                self._send((CONFIRM, uid, node, rv, scheduled_condition(raw)))
                return
        self._send((APPLY, "Pod", event, raw))

    def object_event(self, kind: str, event: str, raw: dict[str, Any]) -> None:
        """An object a plugin watches (namespaces, owners, NUMA topologies: a topology is its node's row)."""
        key = object_key(raw)
        objects = self._state.setdefault(kind, {})
        if event == "DELETED":
            objects.pop(key, None)
        else:
            objects[key] = raw
        row = key if kind == "NodeResourceTopology" else ""
        self.versions.step(row)
        self._send((APPLY, kind, event, raw))

    def assumed(self, pod: PodInfo, node: str) -> None:
        at = time.time()
        self._prune(at)
        self._state.setdefault("Pod", {})[pod.uid] = pod.raw
        self._pod_nodes[pod.uid] = node
        self._assumed[pod.uid] = (node, pod.scheduler_name, at)
        self._assumed.move_to_end(pod.uid)
        hinted = self.hinted
        by = hinted[2] if hinted is not None and hinted[0] == pod.uid and hinted[1] == node else None
        self.versions.step(node, by=by)
        kept = self._packed_pods.pop(pod.uid, None)  # packed for its decision, if a worker decided it
        body = kept[1] if kept is not None and kept[0] is pod.raw else self._packer.pack(pod.raw)
        pack = self._packer.pack
        self._send_packed(
            self._packer.pack_array_header(5) + pack(ASSUME) + body + pack(node) + pack(pod.scheduler_name) + pack(at)
        )

    def forgotten(self, record: PodRecord, unreserved: bool = True) -> None:
        """The scheduling process undid an assumption: the replicas too, with the profile whose Reserve they
        replay (none when the process kept its Reserve state: the pod was bound already). A pending object that
        names a nominated node stays: the replicas keep that nomination (they were sent it), so the watch's word
        that it was cleared, or the pod deleted, must still reach them."""
        self._assumed.pop(record.uid, None)
        pods = self._state.get("Pod", {})
        raw = pods.get(record.uid)
        if raw is not None and not (raw.get("spec") or {}).get("nodeName"):
            nominated = str((raw.get("status") or {}).get("nominatedNodeName") or "")
            if nominated:
                self._pod_nodes[record.uid] = nominated
            else:
                del pods[record.uid]
                self._pod_nodes.pop(record.uid, None)
        profile = record.pod.scheduler_name if record.pod is not None and unreserved else ""
        self.versions.step(self._row(record.node))
        self._send((FORGET, record.uid, record.node, profile))

    def _row(self, node: str) -> str:
        """``node`` if the pool knows it, else '' (no row): a pod of a deleted node, deleted or forgotten after
        it, must not bring back the row version ``versions.forget`` dropped (node names churn)."""
        return node if node in self._state.get("Node", ()) else ""

    def _send(self, message: Any) -> None:
        self._send_packed(self._packer.pack(message))

    def _send_packed(self, data: bytes) -> None:
        for w in self._workers:
            if w.proc is not None:
                w.out.append(data)
        self._schedule_flush()

    # ------------------------------------------------------------------------------------------ decisions

    def has_room(self) -> bool:
        return any(w.ready and len(w.pending) < IN_FLIGHT for w in self._workers)

    async def room(self) -> None:
        """Until a worker can take a decision (or none is ready: the scheduling process decides then)."""
        while self.ready and not self.has_room():
            self._room.clear()
            await self._room.wait()

    def submit(self, profile: str, pod: PodInfo) -> asyncio.Future[Answer] | None:
        """Queue ``pod``'s decision on the least busy ready worker; None when none can take it."""
        best: _Worker | None = None
        for w in self._workers:
            if w.ready and len(w.pending) < IN_FLIGHT and (best is None or len(w.pending) < len(best.pending)):
                best = w
        if best is None:
            return None
        rid = next(self._ids)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        best.pending[rid] = future
        best.sent_at[rid] = time.monotonic()
        # the pod's object is packed once, kept for its assumption (``assumed``): both messages carry it, and packing
        # it is a good part of either one's cost on the scheduling process's critical path
        if len(self._packed_pods) > PACKED_PODS_KEPT:  # decisions that never came to an assumption
            self._packed_pods.clear()
        body: bytes = self._packer.pack(pod.raw)
        self._packed_pods[pod.uid] = (pod.raw, body)
        pack = self._packer.pack
        best.out.append(self._packer.pack_array_header(4) + pack(DECIDE) + pack(rid) + pack(profile) + body)
        self._schedule_flush()
        return future

    def fresh(self, node: str, seen: int, worker: int) -> bool:
        return seen >= 0 and self.versions.fresh(node, seen, worker)

    def done(self, uid: str, worker: int) -> None:
        """The scheduling process acted on ``worker``'s answer for ``uid`` (after its ``ASSUME``, if any)."""
        self._packed_pods.pop(uid, None)
        w = self._workers[worker]
        if w.proc is not None:
            w.out.append(self._packer.pack((DONE, uid)))
            self._schedule_flush()

    # ------------------------------------------------------------------------------------------ pipes

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        for w in self._workers:
            if not w.out:
                continue
            data, w.out = b"".join(w.out), []
            proc = w.proc
            if proc is not None and proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.write(data)
