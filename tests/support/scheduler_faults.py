"""Two real ``crane-scheduler`` replicas on one Lease, and the audit every scheduler fault ends with."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.procs import ManagedProcess
from crane_sandbox.rbac import ServiceIdentity, service_identity
from tests.support.faults import FaultRow, kubeconfig_via
from tests.support.scheduler_cluster import (
    child_process,
    config_for,
    create_nodes,
    create_pods,
    events,
    node,
    pod,
    pods_json,
    wait_for,
)

TIMING = {"leaseDuration": "4s", "renewDeadline": "3s", "retryPeriod": "500ms"}
LEASE_DURATION, RENEW_DEADLINE = 4.0, 3.0
DEFAULT_TIMING: dict[str, str] = {}  # kube-scheduler's: 15s lease, 10s renew deadline, 2s retry period


def lease_config(scheduler_name: str, account: ServiceIdentity, timing: dict[str, str]) -> dict[str, Any]:
    cfg = config_for(scheduler_name)
    cfg["leaderElection"] = {
        "leaderElect": True,
        "resourceNamespace": account.namespace,
        "resourceName": account.lease_name,  # the one Lease the chart lets the account update
        **timing,
    }
    return cfg


@dataclass
class Replica:
    name: str
    proc: ManagedProcess
    port: int
    # leadership transitions seen by polling /readyz: (monotonic time, state)
    seen: list[tuple[float, str]] = field(default_factory=list)

    async def state(self) -> str:
        try:
            timeout = aiohttp.ClientTimeout(total=1)
            async with aiohttp.ClientSession(timeout=timeout) as s, s.get(f"http://127.0.0.1:{self.port}/readyz") as r:
                return str(json.loads(await r.text()).get("leadership"))
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return "down"

    async def metric(self, name: str, **labels: str) -> float:
        """Sum of a metric's samples matching ``labels`` from the replica's /metrics."""
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as s, s.get(f"http://127.0.0.1:{self.port}/metrics") as r:
            text = await r.text()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name):
                continue
            head, _, value = line.rpartition(" ")
            rest = head[len(name) :]
            if rest and not rest.startswith("{"):
                continue
            if all(f'{k}="{v}"' in rest for k, v in labels.items()):
                total += float(value)
        return total

    def leading_since(self) -> float | None:
        """When this replica was first seen leading (monotonic), or None."""
        return next((t for t, s in self.seen if s == "leader"), None)

    def stopped_leading_at(self, after: float) -> float | None:
        """First time after ``after`` it was seen not leading."""
        return next((t for t, s in self.seen if t > after and s != "leader"), None)


class Pair:
    """Replicas ``a`` and ``b`` on one Lease, as the chart's scheduler ServiceAccount ``account`` (of this test's
    namespace: ``service_identity(cluster, "scheduler", namespace)``); ``a`` may reach the API server through
    another kubeconfig (``kubeconfig_via(..., account=account)``)."""

    def __init__(
        self,
        cluster: LocalCluster,
        account: ServiceIdentity,
        selector: str,
        scheduler_name: str,
        timing: dict[str, str] = TIMING,
    ) -> None:
        self.cluster, self.namespace, self.account = cluster, account.namespace, account
        self.cfg = lease_config(scheduler_name, account, timing)
        self.selector = selector
        self.replicas: dict[str, Replica] = {}
        self.fault_at = 0.0  # when the fault was injected (monotonic)
        self.opened: dict[str, int] = {}  # requests a proxy saw during the fault, by kind
        self._watch: asyncio.Task[None] | None = None

    def add(self, name: str, *extra: str) -> Replica:
        proc, port = child_process(
            self.cluster,
            self.cfg,
            self.selector,
            f"{self.namespace}-{name}",
            self.cluster.run_dir,
            *extra,
            kubeconfig=self.account.kubeconfig,
        )
        self.replicas[name] = Replica(f"{self.namespace}-{name}", proc, port)
        return self.replicas[name]

    async def start(self) -> None:
        """Start the first replica, wait until it leads, then the others (so the first one is the leader)."""
        first, *others = self.replicas.values()
        await first.proc.start()
        self._watch = asyncio.create_task(self._poll())
        deadline = time.monotonic() + 30
        while not (first.seen and first.seen[-1][1] == "leader"):
            if time.monotonic() > deadline:
                raise AssertionError(f"{first.name} did not lead within 30s: {first.seen}")
            await asyncio.sleep(0.05)
        for r in others:
            await r.proc.start()

    async def _poll(self) -> None:
        while True:
            states = await asyncio.gather(*(r.state() for r in self.replicas.values()))
            now = time.monotonic()
            for r, s in zip(self.replicas.values(), states, strict=True):
                if not r.seen or r.seen[-1][1] != s:
                    r.seen.append((now, s))
            await asyncio.sleep(0.02)

    async def leader(self, timeout: float = 30.0) -> Replica:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leaders = [r for r in self.replicas.values() if r.seen and r.seen[-1][1] == "leader"]
            if len(leaders) == 1:
                return leaders[0]
            await asyncio.sleep(0.05)
        raise AssertionError(
            f"no single leader within {timeout}s: {[(r.name, r.seen[-3:]) for r in self.replicas.values()]}"
        )

    def two_leaders(self) -> bool:
        """Whether any two replicas were ever seen leading at overlapping times (from the /readyz polls)."""
        spans: list[list[tuple[float, float]]] = []
        for r in self.replicas.values():
            mine, start = [], None
            for t, state in r.seen:
                if state == "leader" and start is None:
                    start = t
                elif state != "leader" and start is not None:
                    mine.append((start, t))
                    start = None
            if start is not None:
                mine.append((start, float("inf")))
            spans.append(mine)
        return any(
            x[0] < y[1] and y[0] < x[1] for i, a in enumerate(spans) for b in spans[i + 1 :] for x in a for y in b
        )

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        for r in self.replicas.values():
            await r.proc.stop()

    async def lease(self, kube: client.ApiClient) -> Any:
        return (
            await client.CoordinationV1Api(kube).read_namespaced_lease(self.account.lease_name, self.namespace)
        ).spec


async def bound_count(kube: client.ApiClient, namespace: str) -> int:
    return sum(1 for p in await pods_json(kube, namespace) if p["spec"].get("nodeName"))


async def audit(kube: client.ApiClient, namespace: str, created: int, row: FaultRow, timeout: float = 120.0) -> None:
    """Wait until every pod is bound and has its Scheduled event (or ``timeout``), then fill ``row``: pods bound,
    Scheduled events doubled, pods lost (unbound or without an event). One binding per pod is the API server's
    rule (a second bind answers 409); the events are what the event-recorder counts, so those are audited."""
    deadline = time.monotonic() + timeout
    while True:
        pods = await pods_json(kube, namespace)
        scheduled = await events(kube, namespace, "Scheduled")
        per_uid = Counter(e["regarding"]["uid"] for e in scheduled)
        bound = {p["metadata"]["uid"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}
        whole = len(bound) == created and set(per_uid) == set(bound)
        if whole or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    row.created, row.bound = created, len(bound)
    row.doubled = sum(n - 1 for n in per_uid.values() if n > 1)
    unreported = set(bound) - set(per_uid)
    row.lost = created - len(bound) + len(unreported)
    silent = [p["metadata"]["name"] for p in pods if p["metadata"]["uid"] in unreported]
    if silent:  # which pods, so that a failing row can be followed in the replicas' logs
        row.note = f"bound without a Scheduled event: {', '.join(sorted(silent)[:5])}"
    wrong = [e for e in scheduled if not e["note"].endswith(f" to {bound.get(e['regarding']['uid'])}")]
    assert not wrong, f"Scheduled events naming another node than the binding: {wrong[:3]}"
    # the binding sets PodScheduled=True; a failed attempt's condition patch sent after it would turn it back
    unscheduled = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName") and _scheduled(p) != "True"]
    assert not unscheduled, f"bound pods whose PodScheduled condition is not True: {sorted(unscheduled)[:5]}"


def _scheduled(pod: dict[str, Any]) -> str | None:
    return next((c.get("status") for c in pod["status"].get("conditions") or () if c["type"] == "PodScheduled"), None)


async def at_least_bound(kube: client.ApiClient, namespace: str, n: int) -> bool:
    return await bound_count(kube, namespace) >= n


async def burst_with_fault(
    kube: client.ApiClient,
    namespace: str,
    scheduler_name: str,
    pair: Pair,
    row: Any,
    fault: Callable[[], Any],
    created: int = 300,
    cut_at: int = 50,
    started: Callable[[], Any] | None = None,
) -> float:
    """Create ``created`` pods at once, run ``fault`` once ``cut_at`` are bound, audit; returns when the fault
    ended (monotonic). ``started``: awaited once the pair runs, before the pods are created."""
    await pair.start()
    if started is not None:
        await started()
    await create_pods(kube, namespace, [pod(f"p-{i:03d}", scheduler_name) for i in range(created)])
    await wait_for(lambda: at_least_bound(kube, namespace, cut_at), timeout=60, what=f"{cut_at} pods bound")
    assert await bound_count(kube, namespace) < created - 50, "the burst was nearly over: nothing was tested"
    pair.fault_at = time.monotonic()
    await fault()
    ended = time.monotonic()
    await audit(kube, namespace, created, row)
    row.recovery = round(time.monotonic() - ended, 2)
    assert not pair.two_leaders(), [(r.name, r.seen) for r in pair.replicas.values()]
    return ended


@dataclass
class Stage:
    """One scheduler fault test's slice of the session cluster: its namespace, node group and schedulerName."""

    cluster: LocalCluster
    kube: client.ApiClient
    namespace: str
    group: str
    selector: str
    scheduler_name: str

    async def pair(self, timing: dict[str, str] = TIMING, nodes: int = 10, cpu: str = "64") -> Pair:
        """The group's ``nodes`` nodes (``cpu`` cores, 256Gi, 500 pods each) and a ``Pair`` on one Lease as the
        chart's scheduler ServiceAccount of the namespace (replicas still to be added)."""
        group = self.group
        await create_nodes(
            self.kube, [node(f"{group}-{i}", group, cpu=cpu, memory="256Gi", pods=500) for i in range(nodes)]
        )
        account = await service_identity(self.cluster, "scheduler", self.namespace)
        return Pair(self.cluster, account, self.selector, self.scheduler_name, timing)

    def kubeconfig_via(self, pair: Pair, server: str) -> Path:
        """A kubeconfig for replica ``a`` of ``pair`` that reaches the API server at ``server`` (a proxy)."""
        path = self.cluster.run_dir / f"{self.namespace}-a.kubeconfig"
        kubeconfig_via(self.cluster, server, path, account=pair.account)
        return path

    async def burst_with_fault(
        self, pair: Pair, row: Any, fault: Callable[[], Any], started: Callable[[], Any] | None = None
    ) -> float:
        return await burst_with_fault(self.kube, self.namespace, self.scheduler_name, pair, row, fault, started=started)


@pytest.fixture
def stage(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, group: str, selector: str, scheduler_name: str
) -> Stage:
    return Stage(cluster, kube, namespace, group, selector, scheduler_name)
