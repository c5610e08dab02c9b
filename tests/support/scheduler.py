"""Pod and node API objects (as JSON dicts) for the scheduler's unit tests, and a scheduler to run them through."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, cast

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import EXPLAIN_SCORES, SUCCESS, CycleState, Diagnosis, Handle, Status
from crane_scheduler.framework.runtime import Profile
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import PodInfo, parse_node, parse_pod
from crane_scheduler.reporting import Reporter
from crane_scheduler.scheduler import Scheduler
from crane_scheduler.simulate import Simulator
from crane_scheduler.writer import ApiWriter, Connection, Reply
from crane_scheduler.writer.protocol import JSON
from tests.support.fakeapi import kubeconfig_for

_uids = itertools.count(1)
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def node(
    name: str,
    cpu: str = "4",
    memory: str = "8Gi",
    pods: int = 110,
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": str(pods), **(extra or {})}},
    }


def container(
    cpu: str | None = None,
    memory: str | None = None,
    *,
    name: str = "c",
    extra: dict[str, str] | None = None,
    ports: list[dict[str, Any]] | None = None,
    restart: str | None = None,
) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None} | (extra or {})
    c: dict[str, Any] = {"name": name, "image": "pause", "resources": {"requests": requests}}
    if ports:
        c["ports"] = ports
    if restart:
        c["restartPolicy"] = restart
    return c


def pod(
    name: str = "p",
    cpu: str | None = "100m",
    memory: str | None = "100Mi",
    *,
    priority: int = 0,
    node_name: str = "",
    scheduler: str = "crane-scheduler",
    spec: dict[str, Any] | None = None,
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}-{next(_uids)}"},
        "spec": {
            "schedulerName": scheduler,
            "nodeName": node_name or None,
            "priority": priority,
            "containers": containers if containers is not None else [container(cpu, memory)],
            **(spec or {}),
        },
    }


def labelled(raw: dict[str, Any], namespace: str = "ns", **labels: str) -> dict[str, Any]:
    """``raw`` (a pod) with exactly these labels, in ``namespace``."""
    raw["metadata"]["labels"] = labels
    raw["metadata"]["namespace"] = namespace
    return raw


def table(*nodes: dict[str, Any], bound: list[dict[str, Any]] | None = None) -> NodeTable:
    t = NodeTable(capacity=2)
    for n in nodes:
        t.upsert_node(parse_node(n))
    for p in bound or ():
        t.add_pod(parse_pod(p))
    return t


def simulator(t: NodeTable, config: dict[str, Any] | None = None, seed: int | None = 0) -> Simulator:
    """The offline scheduler over ``t`` with kube-scheduler's built-in plugins (no Dynamic) and ``config``."""
    return Simulator(config, table=t, seed=seed, out_of_tree=False)


def profile(t: NodeTable, config: dict[str, Any] | None = None) -> Profile:
    return next(iter(simulator(t, config).profiles.values()))


def decide(
    t: NodeTable, p: dict[str, Any] | PodInfo, config: dict[str, Any] | None = None, seed: int = 0
) -> ScheduleResult | Diagnosis | Status:
    """The algorithm's own answer (its result types: these fixtures serve crane-scheduler's own tests)."""
    info = p if isinstance(p, PodInfo) else parse_pod(p)
    sim = simulator(t, config, seed)
    return sim.algorithm.schedule(next(iter(sim.profiles.values())), info, {})


def chosen(t: NodeTable, p: dict[str, Any], config: dict[str, Any] | None = None) -> str:
    result = decide(t, p, config)
    assert isinstance(result, ScheduleResult), result
    return result.node


def feasible(t: NodeTable, p: dict[str, Any], config: dict[str, Any] | None = None) -> set[str]:
    """The nodes that passed every filter for ``p`` (all of them scored: tables here are below the sampling
    threshold); empty when none did."""
    state: dict[str, Any] = {}
    sim = simulator(t, config, None)
    result = sim.algorithm.schedule(next(iter(sim.profiles.values())), parse_pod(p), state)
    if not isinstance(result, ScheduleResult):
        return set()
    if EXPLAIN_SCORES not in state:  # one feasible node: chosen without scoring
        return {result.node}
    rows, _ = state[EXPLAIN_SCORES]
    return {t.names[int(r)] for r in rows}


def failure(t: NodeTable, p: dict[str, Any], config: dict[str, Any] | None = None) -> str:
    result = decide(t, p, config)
    assert isinstance(result, Diagnosis), result
    return result.message


@asynccontextmanager
async def api_writer(url: str) -> AsyncIterator[ApiWriter]:
    """The scheduler's API writer process, writing to the test server at ``url``; closed on exit."""
    async with ApiWriter(Connection(kubeconfig_dict=kubeconfig_for(url), qps=0)) as writer:
        yield writer


class FakeWriter:
    """The API writer's interface in process (pure tests of its callers): records each write as "METHOD path" and
    its body, and answers the next status of ``answers`` (201 after)."""

    def __init__(self, answers: Sequence[int | Reply] | None = None) -> None:
        self.writes: list[str] = []
        self.bodies: list[Any] = []
        self.answers: list[int | Reply] = list(answers or [])
        self.term: Any = None
        self.urgent: list[bool] = []
        """per ``write`` call (an EVICT has no such flag: the writer process sends it on the binds' lane)"""
        self.wanted: list[Callable[[], bool] | None] = []
        """per ``write`` call: what the real writer asks before it sends the write again after a renewal"""
        self.during: Callable[[str, Any, Callable[[], bool] | None], None] | None = None
        """called with each write's path, body and ``wanted`` before it is answered (what happens meanwhile)"""
        self.evicting = asyncio.Event()
        """set once an EVICT was sent"""
        self.ready = asyncio.Event()
        self.ready.set()

    async def write(
        self,
        method: str,
        path: str,
        body: Any,
        term: Any,
        content_type: str = JSON,
        *,
        urgent: bool = False,
        wanted: Callable[[], bool] | None = None,
    ) -> Reply:
        self.writes.append(f"{method} {path}")
        self.urgent.append(urgent)
        self.bodies.append(body)
        self.wanted.append(wanted)
        if self.during is not None:
            self.during(path, body, wanted)
        return self._answer()

    async def evict(self, namespace: str, name: str, uid: str, condition: dict[str, Any]) -> Reply:
        """Records what the caller sends, one ``protocol.EVICT`` (as "EVICT path", its body the victim's UID and
        condition), and answers it; the writer process turns it into the condition patch and the delete
        (tested against that process in ``tests/integration/scheduler/test_writer.py``), not this fake."""
        self.evicting.set()
        self.writes.append(f"EVICT /api/v1/namespaces/{namespace}/pods/{name}")
        self.bodies.append({"uid": uid, "condition": condition})
        return self._answer()

    def _answer(self) -> Reply:
        answer = self.answers.pop(0) if self.answers else 201
        return answer if isinstance(answer, Reply) else Reply(answer)

    async def wait_ready(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self.ready.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def as_writer(self) -> ApiWriter:
        return cast(ApiWriter, self)


class HeldBinder:
    """Records binds; they complete when ``gate`` is set."""

    name = "DefaultBinder"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.calls: list[tuple[str, str]] = []

    async def bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        self.calls.append((pod.name, node))
        await self.gate.wait()
        return SUCCESS


class Clock:
    """A settable clock for the scheduler's queue and backoffs (``now`` in seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scheduler_with(
    binder: Any,
    clock: Callable[[], float],
    writer: FakeWriter | None = None,
    config: dict[str, Any] | None = None,
    plugins: Mapping[str, Callable[[Mapping[str, Any], Handle], Any]] | None = None,
) -> Scheduler:
    """A ``Scheduler`` with the default profile (or ``config``'s, whose plugins then get ``clock`` too) on a fresh
    node table, its DefaultBinder replaced by ``binder``, ``plugins`` added (name: factory); no API client;
    reports stay queued, or go to ``writer`` while its reporter runs."""
    factories = {"DefaultBinder": lambda args, handle: binder, **(plugins or {})}
    sim = Simulator(config, clock=clock, plugins=factories, out_of_tree=False)
    reporter = Reporter(None if writer is None else writer.as_writer(), None, "test", clock=clock)
    return Scheduler(config=sim.config, profiles=sim.profiles, table=sim.table, reporter=reporter, clock=clock)


async def write_reports(reporter: Reporter) -> None:
    """Run ``reporter``'s workers until everything it has queued is written, then stop them."""
    stopping = asyncio.Event()
    run = asyncio.create_task(reporter.run(stopping))
    try:
        await asyncio.wait_for(reporter.drain(), 30)
    finally:
        stopping.set()
        reporter.close()
        await asyncio.wait_for(run, 30)


async def step(s: Scheduler) -> None:
    """One turn of the loop: tell the gang members gated since the last turn, pop, decide, start the bind."""
    await s._slots.acquire()
    s.tell_gated()
    qp = s.queue.pop(s.clock())
    assert qp is not None
    s.schedule_one(qp)
    await asyncio.sleep(0)
