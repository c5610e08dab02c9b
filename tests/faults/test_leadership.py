"""Leader election on the real API server with Toxiproxy on the leader's connection: never two leaders.

Two candidates contend for one Lease; the leader's traffic goes through Toxiproxy. Every term of both is kept
as a [start, end) interval on this process' monotonic clock, so "never two leaders" is checked directly: no
two intervals overlap.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_shared.kube import KubeSettings, api_client_from_dict, make_api_client
from crane_shared.leader import LeaderElector, LeaseConfig, make_lease_client
from tests.support.faults import FaultReport, api_host_port, kubeconfig_via, restart_apiserver
from tests.support.waiting import eventually

TIMING = {"lease_duration": 4.0, "renew_deadline": 3.0, "retry_period": 0.5}


@dataclass
class Candidate:
    identity: str
    api: client.ApiClient
    elector: LeaderElector
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    terms: list[list[float]] = field(default_factory=list)  # [start, end]; end is inf while leading
    task: asyncio.Task[None] | None = None

    def on_change(self, leading: bool) -> None:
        if leading:
            self.terms.append([time.monotonic(), float("inf")])
        else:
            self.terms[-1][1] = time.monotonic()

    async def lead(self) -> None:
        await asyncio.Event().wait()

    def start(self) -> None:
        self.elector.on_change = self.on_change
        self.task = asyncio.create_task(self.elector.run(self.lead, self.stopping))

    @property
    def leading(self) -> bool:
        return self.elector.is_leader

    async def stop(self) -> None:
        self.stopping.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 15)
        await self.api.close()


def overlaps(a: Candidate, b: Candidate) -> list[tuple[list[float], list[float]]]:
    return [(x, y) for x in a.terms for y in b.terms if x[0] < y[1] and y[0] < x[1]]


@pytest_asyncio.fixture
async def contenders(cluster: LocalCluster, namespace: str) -> AsyncIterator[Callable[..., Any]]:
    made: list[Candidate] = []

    async def make(identity: str, server: str | None = None) -> Candidate:
        config = kubeconfig_via(cluster, server) if server else cluster.kubeconfig_dict()
        lease = LeaseConfig(namespace, "lease", identity, **TIMING)
        api = await api_client_from_dict(config, request_timeout=lease.request_timeout)
        c = Candidate(identity, api, LeaderElector(api, lease))
        made.append(c)
        c.start()
        return c

    yield make
    for c in made:
        await c.stop()


async def lease_spec(kube: client.ApiClient, namespace: str) -> Any:
    return (await client.CoordinationV1Api(kube).read_namespaced_lease("lease", namespace)).spec


async def leader_behind_a_proxy(
    cluster: LocalCluster, proxy_to: Callable[..., Any], contenders: Callable[..., Any]
) -> tuple[Any, Any, Any]:
    """(proxy, a, b): ``a`` leading through a Toxiproxy in front of the API server, ``b`` started as its standby."""
    proxy = await proxy_to(api_host_port(cluster))
    a = await contenders("a", f"https://{proxy.host_port}")
    await eventually(lambda: a.leading, what="a leads")
    return proxy, a, await contenders("b")


async def test_leader_blackholed_longer_than_the_lease_stops_before_the_standby_leads(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    proxy_to: Callable[..., Any],
    contenders: Callable[..., Any],
    fault_report: FaultReport,
) -> None:
    row = fault_report.row("API connection of the leader blackholed (2x lease)")
    proxy, a, b = await leader_behind_a_proxy(cluster, proxy_to, contenders)
    await asyncio.sleep(2 * TIMING["retry_period"])
    assert not b.leading

    await proxy.blackhole()
    cut = time.monotonic()
    await eventually(lambda: b.leading, timeout=TIMING["lease_duration"] + 5, what="the standby leads")
    took_over = time.monotonic() - cut
    assert a.terms[0][1] - cut <= TIMING["renew_deadline"] + 0.5, "the leader noticed too late"
    assert not overlaps(a, b), "two leaders at once"
    # Longer than the lease: then the partition heals and the old leader must stay a standby.
    await asyncio.sleep(max(0.0, 2 * TIMING["lease_duration"] - (time.monotonic() - cut)))
    await proxy.heal()
    await asyncio.sleep(4 * TIMING["retry_period"])
    assert not a.leading and b.leading and len(a.terms) == 1
    spec = await lease_spec(kube, namespace)
    assert spec.holder_identity == "b" and spec.lease_transitions == 1

    row.doubled = len(overlaps(a, b))
    row.recovery = round(took_over, 2)
    row.note = f"old leader stepped down after {a.terms[0][1] - cut:.2f}s; standby led after {took_over:.2f}s"


async def test_added_latency_keeps_the_lease_where_it_is(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    proxy_to: Callable[..., Any],
    contenders: Callable[..., Any],
    fault_report: FaultReport,
) -> None:
    row = fault_report.row("400 ms latency on the leader's API connection")
    proxy, a, b = await leader_behind_a_proxy(cluster, proxy_to, contenders)
    await proxy.latency(400, jitter_ms=100)  # each GET+PUT renewal: about a second, a third of the deadline
    await asyncio.sleep(3 * TIMING["lease_duration"])
    assert len(a.terms) == 1 and a.leading and not b.terms
    assert (await lease_spec(kube, namespace)).lease_transitions == 0
    row.note = "lease kept, leaseTransitions 0"


@pytest.mark.slow_fault
async def test_api_server_restart_never_makes_two_leaders(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    contenders: Callable[..., Any],
    fault_report: FaultReport,
) -> None:
    row = fault_report.row(f"API server restart ({TIMING['lease_duration']:.0f}s down) under the lease")
    a = await contenders("a")
    await eventually(lambda: a.leading, what="a leads")
    b = await contenders("b")
    await restart_apiserver(cluster, down_for=TIMING["lease_duration"])
    back = time.monotonic()
    await eventually(lambda: a.leading or b.leading, timeout=30, what="a leader again")
    recovery = time.monotonic() - back
    await asyncio.sleep(2 * TIMING["lease_duration"])
    assert not overlaps(a, b), "two leaders at once"
    assert a.leading != b.leading
    row.recovery = round(recovery, 2)
    row.note = f"terms: a {len(a.terms)}, b {len(b.terms)}; none overlapping"


@pytest.mark.parametrize("lease_client", ["own", pytest.param("shared", marks=pytest.mark.slow_fault)])
async def test_a_saturated_service_client_costs_the_lease_only_when_lease_traffic_shares_it(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str, fault_report: FaultReport, lease_client: str
) -> None:
    """The issue's probe in small: the service's limiter holds 20 s of queued requests (as 1,000 pending binds
    at QPS 50 did) and a standby contends. On its own client the leader keeps the lease (leaseTransitions 0);
    sharing the service's limiter it loses it, but steps down before the standby leads (the renew deadline is
    enforced while the renewal waits in the queue)."""
    row = fault_report.row(f"service client saturated (20 s queue), lease on {lease_client} client")
    settings = KubeSettings(kubeconfig=str(cluster.kubeconfig_path), qps=5, burst=5)
    lease = LeaseConfig(namespace, "lease", "a", **TIMING)
    service = await make_api_client(settings)
    lease_api = await make_lease_client(settings, lease) if lease_client == "own" else service
    a = Candidate("a", lease_api, LeaderElector(lease_api, lease))
    a.start()
    standby_api = await api_client_from_dict(cluster.kubeconfig_dict())
    b = Candidate("b", standby_api, LeaderElector(standby_api, LeaseConfig(namespace, "lease", "b", **TIMING)))
    core = client.CoreV1Api(service)
    await eventually(lambda: a.leading, what="a leads")
    queued = [asyncio.create_task(core.list_namespaced_config_map(namespace)) for _ in range(100)]
    try:
        b.start()
        await asyncio.sleep(3 * TIMING["lease_duration"])
        assert not all(t.done() for t in queued), "the queue drained: the saturation did not cover the test"
        transitions = (await lease_spec(kube, namespace)).lease_transitions
        if lease_client == "own":
            assert len(a.terms) == 1 and a.leading and not b.terms
            assert transitions == 0
        else:
            assert b.leading and not a.leading and transitions >= 1
        assert not overlaps(a, b), "two leaders at once"
    finally:
        for t in queued:
            t.cancel()
        await asyncio.gather(*queued, return_exceptions=True)
        await a.stop()
        await b.stop()
        if lease_client == "own":
            await service.close()
    row.doubled = len(overlaps(a, b))
    row.note = f"leaseTransitions {transitions}; terms a {len(a.terms)}, b {len(b.terms)}; none overlapping"
