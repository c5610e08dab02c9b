"""A decider worker's loop (``python -m crane_scheduler.deciders``, started by ``DeciderPool``, not by hand).

It reads ``protocol`` messages from stdin, keeps its replica of the scheduling process's table in a
``Simulator`` (the same profiles, plugins and algorithm) and answers decisions on stdout. Single-threaded and
synchronous: it applies every message of a chunk in order, answers each decision when it reaches it, and writes
the chunk's answers at once. It exits when its stdin closes, and gets SIGKILL with the scheduling process.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import msgpack

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.deciders.protocol import APPLY, ASSUME, CONFIRM, DECIDE, DONE, FORGET, INIT, READY_ID
from crane_scheduler.framework.runtime import Profile
from crane_scheduler.podinfo import PodInfo, bound_object, parse_pod
from crane_scheduler.simulate import Simulator
from crane_scheduler.writer.process import die_with_parent
from crane_shared.logs import configure_logging, get_logger

log = get_logger("crane.scheduler.decider")
READ_SIZE = 1 << 20


class ReplicaClock:
    """Dynamic's wall clock on the replica: the time now, except while an assumption of the scheduling process is
    replayed, when it is that assumption's time (its recent binding is stamped as the original was)."""

    def __init__(self) -> None:
        self.fixed: float | None = None

    def __call__(self) -> float:
        return time.time() if self.fixed is None else self.fixed


class Replica:
    """The worker's state: the simulator fed the scheduling process's changes, and how many it has applied."""

    def __init__(self, options: dict[str, Any], seed: int, first_row: int, base: int) -> None:
        self.clock = ReplicaClock()
        path = options.get("config_path")
        self.sim = Simulator(
            Path(path) if path else options.get("config"),
            seed=seed,
            clock=time.monotonic,
            wall_clock=self.clock,
            out_of_tree=bool(options.get("out_of_tree", True)),
        )
        self.sim.algorithm.next_start = first_row
        self.seen = base
        self._provisional: dict[str, tuple[PodInfo, str, str]] = {}
        """pods answered, counted on their node until the scheduling process's word on them: uid -> (pod, node,
        profile)"""
        self._replayed: dict[str, list[Any]] = {
            name: [p for p in profile.reserve if getattr(p, "replicated_reserve", False)]
            for name, profile in self.sim.profiles.items()
        }

    def apply(self, kind: str, event: Any, obj: dict[str, Any]) -> None:
        self.seen += 1
        self.sim.apply(event, obj, kind)

    def assume(self, raw: dict[str, Any], node: str, profile: str, at: float) -> None:
        self.seen += 1
        uid = str((raw.get("metadata") or {}).get("uid") or "")
        provisional = self._provisional.get(uid)
        self.done(uid)
        # the pod this worker decided is the object assumed (compared, not trusted): parsed once, not again
        same = provisional[0] if provisional is not None and provisional[0].raw == raw else None
        self._assume(same or parse_pod(raw), node, profile, at)

    def _assume(self, pod: PodInfo, node: str, profile: str, at: float | None) -> None:
        self.sim.table.assume(pod, node)
        self.clock.fixed = at
        try:
            for plugin in self._replayed.get(profile, ()):
                plugin.reserve({}, pod, node)
        finally:
            self.clock.fixed = None

    def confirm(self, uid: str, node: str, resource_version: str, condition: dict[str, Any] | None) -> None:
        """The assumption of ``uid`` bound (``protocol.CONFIRM``): applied as the watch's event would be, its object
        rebuilt from the one assumed here. A replica without that assumption cannot: it exits, and the pool starts
        a new worker from the whole state (``DeciderPool``'s restart)."""
        record = self.sim.table.pods.get(uid)
        if record is None or record.pod is None or not record.assumed:
            raise RuntimeError(f"confirmation of pod {uid}, which this replica has not assumed")
        self.apply("Pod", "MODIFIED", bound_object(record.pod.raw, node, resource_version, condition))

    def forget(self, uid: str, node: str, profile: str) -> None:
        self.seen += 1
        self._forget(uid, node, profile)

    def _forget(self, uid: str, node: str, profile: str) -> None:
        record = self.sim.table.pods.get(uid)
        if record is None or not record.assumed or record.pod is None:
            return
        for plugin in self._replayed.get(profile, ()):
            plugin.unreserve({}, record.pod, node)
        self.sim.table.forget(uid)

    def done(self, uid: str) -> None:
        """The scheduling process's word on a pod this worker answered arrived: its provisional count goes."""
        provisional = self._provisional.pop(uid, None)
        if provisional is not None:
            self._forget(uid, provisional[1], provisional[2])

    def decide(self, profile: str, raw: dict[str, Any]) -> str:
        prof: Profile | None = self.sim.profiles.get(profile)
        if prof is None:
            return ""
        pod: PodInfo = parse_pod(raw)
        try:
            result = self.sim.algorithm.schedule(prof, pod, {})
        except Exception as err:  # the scheduling process decides it again, and reports what fails there
            log.warning("decision failed on the replica", pod=pod.key, error=repr(err))
            return ""
        if not isinstance(result, ScheduleResult) or pod.uid in self.sim.table.pods:
            return ""
        self._provisional[pod.uid] = (pod, result.node, profile)
        self._assume(pod, result.node, profile, None)
        return result.node


def serve(read: Any, write: Any) -> None:
    """Read messages until end of input, answering decisions (``read(n)`` / ``write(bytes)``: the pipes)."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=1 << 31)
    packer = msgpack.Packer()
    replica: Replica | None = None
    ready_at: int | None = None  # READY once the snapshot that follows INIT is applied: it decides on the state
    while chunk := read(READ_SIZE):
        unpacker.feed(chunk)
        out: list[bytes] = []
        for message in unpacker:
            kind = message[0]
            if kind == APPLY:
                assert replica is not None
                replica.apply(message[1], message[2], message[3])
            elif kind == ASSUME:
                assert replica is not None
                replica.assume(message[1], message[2], message[3], message[4])
            elif kind == CONFIRM:
                assert replica is not None
                replica.confirm(message[1], message[2], message[3], message[4])
            elif kind == FORGET:
                assert replica is not None
                replica.forget(message[1], message[2], message[3])
            elif kind == DECIDE:
                assert replica is not None
                out.append(packer.pack((message[1], replica.decide(message[2], message[3]), replica.seen)))
            elif kind == DONE:
                assert replica is not None
                replica.done(message[1])
            elif kind == INIT:
                replica = Replica(message[1], message[2], message[3], message[4])
                ready_at = message[5]
        if ready_at is not None and replica is not None and replica.seen >= ready_at:
            out.append(packer.pack((READY_ID, replica.seen, "")))
            ready_at = None
        if out:
            write(b"".join(out))


def main() -> int:
    """``python -m crane_scheduler.deciders PARENT_PID LOG_LEVEL LOG_FORMAT``: started by ``pool.DeciderPool``."""
    parent, level, fmt = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    die_with_parent(parent)
    configure_logging(level, fmt)
    # The protocol owns the original stdout; anything printed by a library goes to stderr, the scheduler's log.
    out = os.dup(1)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the scheduling process decides when a worker ends
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def write_all(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(out, view) :]

    serve(lambda n: os.read(0, n), write_all)
    return 0
