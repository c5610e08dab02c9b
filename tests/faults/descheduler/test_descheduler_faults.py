"""The descheduler process under faults, on the real API server and Prometheus (the descheduler test stack).

- the leader's API connection blackholed for longer than the lease (Toxiproxy): its term ends before the standby
  starts, and once the connection heals it evicts nothing more, though the pods it would evict are still there;
- kill -9 of the leader between evictions: the standby takes over and finishes, no pod evicted twice;
- an API server restart: the descheduler survives it and evicts again once the server is back.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from crane_sandbox.cluster import LocalCluster
from tests.support.descheduler import DeschedulerProc, Scene, pod_terminating
from tests.support.faults import FaultReport, api_host_port, kubeconfig_via, restart_apiserver
from tests.support.serviceproc import FAST_LEASE
from tests.support.waiting import eventually

pytestmark = pytest.mark.slow_fault


async def test_leader_blackholed_longer_than_the_lease_evicts_nothing_more(
    scene: Scene, cluster: LocalCluster, proxy_to: Any, tmp_path: Path, fault_report: FaultReport
) -> None:
    row = fault_report.row("descheduler leader's API connection blackholed (2x lease)")
    await scene.pods("first", usage="cpu=300m", owner="w1")
    proxy = await proxy_to(api_host_port(cluster))
    via = tmp_path / "kubeconfig-via-proxy"
    kubeconfig_via(cluster, f"https://{proxy.host_port}", via, account=scene.identity)
    a = await scene.start(*FAST_LEASE, "--identity", "descheduler-a", kubeconfig=via)
    await eventually(lambda: _terminating(scene, "first"), timeout=60, what="a evicts the first pod")
    # the standby only plans (dry run): whatever is evicted from now on, the old leader evicted it
    b = await scene.start(*FAST_LEASE, "--identity", "descheduler-b", "--dry-run")

    samples: list[tuple[float, str, str]] = []

    async def sample() -> None:
        while True:
            samples.append((time.monotonic(), await a.leadership_or_unreachable(), await b.leadership_or_unreachable()))
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    try:
        await proxy.blackhole()
        cut = time.monotonic()
        # a victim the old leader only learns about once its connection heals
        await scene.pods("second", usage="cpu=300m", owner="w2")
        await eventually(lambda: _is(b, "leader"), timeout=15, what="the standby leads")
        took_over = time.monotonic() - cut
        await asyncio.sleep(max(0.0, 8 - (time.monotonic() - cut)))  # blackholed for twice the lease
        seen_before = await a.saw_other_holder()
        await proxy.heal()

        async def planned_by_b() -> float:  # b sees "second" as a victim: it is there to be evicted
            return await b.counter("evictions", reason="cpu_usage_avg_5m", result="dry_run")

        await eventually(lambda: _positive(planned_by_b), timeout=30, what="the new leader plans the second pod")

        async def a_reached_the_lease() -> bool:  # two lease reads through the healed connection, both b's lease
            return await a.saw_other_holder() >= seen_before + 2

        await eventually(a_reached_the_lease, timeout=30, what="the old leader reads b's lease after the heal")
        assert await a.leadership_or_unreachable() == "standby", "the old leader took the lease back"
        assert await a.counter("evictions", reason="cpu_usage_avg_5m", result="evicted") == 1
        assert not pod_terminating(await scene.core.read_namespaced_pod("second", scene.namespace))
    finally:
        sampler.cancel()
    a_last_leading = max(t for t, sa, _ in samples if sa == "leader")
    b_first_leading = min(t for t, _, sb in samples if sb == "leader")
    assert a_last_leading < b_first_leading, "two descheduler leaders at once"
    row.created = row.bound = 1
    row.recovery = round(took_over, 2)
    row.note = f"old leader stepped down {a_last_leading - cut:.2f}s after the cut; it evicted nothing more"


async def test_kill_9_of_the_leader_between_evictions_the_standby_finishes_and_no_pod_goes_twice(
    scene: Scene, fault_report: FaultReport
) -> None:
    row = fault_report.row("kill -9 of the leading descheduler between evictions")
    names = [f"p{i}" for i in range(4)]
    for i, name in enumerate(names):  # 4 x 0.3 cores never relieve the node: one eviction per hot round each
        await scene.pods(name, usage="cpu=300m", owner=f"w{i}")
    # the leader's rounds 3 s apart (the standby's 0.5 s, as the scene's): it is killed after its first eviction
    # and before it could evict the rest, even when the first is seen seconds late on a loaded machine (with 0.5 s
    # rounds a CI run saw the leader evict all four before the kill, leaving the standby nothing to finish)
    a = await scene.start(*FAST_LEASE, "--identity", "descheduler-a", "--interval", "3s")
    b = await scene.start(*FAST_LEASE, "--identity", "descheduler-b")
    await eventually(lambda: _count_terminating(scene, names, 1), timeout=60, what="the first eviction")
    assert a.process is not None
    await a.process.kill()
    killed = time.monotonic()
    await eventually(lambda: _is(b, "leader"), timeout=15, what="the standby leads")
    took_over = time.monotonic() - killed
    await eventually(lambda: _count_terminating(scene, names, len(names)), timeout=60, what="every pod evicted")
    events = await scene.core.list_namespaced_event(scene.namespace, field_selector="reason=LoadAwareDescheduled")
    per_pod = [e.involved_object.name for e in events.items]
    assert len(per_pod) == len(set(per_pod)), f"a pod evicted twice: {per_pod}"
    assert "descheduler-b" in {e.reporting_instance for e in events.items}
    row.created, row.bound = len(names), len(set(per_pod))
    row.recovery = round(took_over, 2)
    row.note = "every pod evicted once (one Event each); the standby finished"


async def test_api_server_restart_the_descheduler_evicts_again_once_it_is_back(
    scene: Scene, cluster: LocalCluster, fault_report: FaultReport
) -> None:
    row = fault_report.row("API server restart (3s down) under the descheduler")
    proc = await scene.start(*FAST_LEASE)
    await eventually(lambda: _is(proc, "leader"), timeout=15, what="it leads")
    await restart_apiserver(cluster, down_for=3.0)
    back = time.monotonic()
    await scene.pods("after", usage="cpu=3")
    await eventually(lambda: _terminating(scene, "after"), timeout=60, what="an eviction after the restart")
    assert proc.process is not None and proc.process.running, "the descheduler died with the API server"
    row.created = row.bound = 1
    row.recovery = round(time.monotonic() - back, 2)


async def _count_terminating(scene: Scene, names: list[str], at_least: int) -> bool:
    return sum([await _terminating(scene, n) for n in names]) >= at_least


async def _terminating(scene: Scene, name: str) -> bool:
    return pod_terminating(await scene.core.read_namespaced_pod(name, scene.namespace))


async def _is(proc: DeschedulerProc, state: str) -> bool:
    return await proc.leadership_or_unreachable() == state


async def _positive(value: Any) -> bool:
    return bool(await value() > 0)
