"""GangScheduling (1.37's PodGroups and 1.35's Workloads) through the scheduler's gang cycle, without an API
server; the version the plugin picks by discovery (a loopback server answering ``/apis``); and the unsupported-field
gate for profiles that do not enable it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from crane_scheduler.framework import ArgsError, Diagnosis
from crane_scheduler.plugins.gangscheduling import plugin as gangplugin
from crane_scheduler.plugins.gangscheduling.plugin import (
    GangScheduling,
    gang_key,
    parse_args,
    parse_pod_group,
    parse_workload,
)
from crane_scheduler.scheduler import Scheduler
from crane_shared.kube import api_client_from_dict
from tests.support.fakeapi import kubeconfig_for
from tests.support.scheduler import Clock, HeldBinder, decide, node, pod, scheduler_with, step, table


def config(**args: Any) -> dict[str, Any]:
    profile: dict[str, Any] = {
        "schedulerName": "crane-scheduler",
        "plugins": {"multiPoint": {"enabled": [{"name": "GangScheduling"}]}},
    }
    if args:
        profile["pluginConfig"] = [{"name": "GangScheduling", "args": args}]
    return {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration", "profiles": [profile]}


def workload(name: str = "train", **groups: int | None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "podGroups": [
                {"name": g, "policy": {"gang": {"minCount": n}} if n is not None else {"basic": {}}}
                for g, n in groups.items()
            ]
        },
    }


def worker(name: str, group: str = "workers", cpu: str = "1", wl: str = "train") -> dict[str, Any]:
    return pod(name, cpu=cpu, spec={"workloadRef": {"name": wl, "podGroup": group}})


def gang_scheduler(*workloads: dict[str, Any], **args: Any) -> tuple[Scheduler, HeldBinder, Clock, GangScheduling]:
    binder, clock = HeldBinder(), Clock()
    s = scheduler_with(binder, clock, config=config(**args))
    plugin = s.profiles["crane-scheduler"].plugins["GangScheduling"]
    assert isinstance(plugin, GangScheduling)
    plugin.synced = True
    for w in workloads:
        plugin.set_workload(w)
    return s, binder, clock, plugin


def messages(s: Scheduler) -> dict[str, str]:
    return {qp.pod.name: s.decisions.get(qp.pod.key).message for qp in s.queue.unschedulable.values()}  # type: ignore[union-attr]


def test_a_gang_is_a_workload_pod_group_and_replica() -> None:
    assert gang_key("ns", "train", "workers", "") == "ns/train/workers/"
    parsed = parse_workload(workload(workers=2, driver=None))
    assert parsed.groups == {"workers": 2, "driver": None}
    with pytest.raises(ArgsError):
        parse_args({"schedulingTimeoutSeconds": 0})
    assert parse_args({}) == 300.0


async def test_a_workload_gang_binds_whole_or_holds_nothing_with_kubes_messages() -> None:
    s, binder, _, _ = gang_scheduler(workload(workers=3))
    s.on_node(node("n1", cpu="2"))
    for i in range(3):
        s.on_pod(worker(f"w-{i}"))
    await step(s)
    assert binder.calls == [] and not s.table.pods
    assert messages(s)["w-0"] == "waiting for minCount pods from a gang to be waiting on permit"
    assert messages(s)["w-2"].startswith("0/1 nodes are available: 1 Insufficient cpu.")
    s.on_node(node("n2", cpu="2"))
    s.queue.activate(next(iter(s.queue.unschedulable)))
    await step(s)
    assert sorted(name for name, _ in binder.calls) == ["w-0", "w-1", "w-2"]


async def test_pods_wait_for_their_workload_group_and_count_with_kubes_messages() -> None:
    s, binder, _, plugin = gang_scheduler()
    s.on_node(node("n1", cpu="4"))
    s.on_pod(worker("w-0"))
    await step(s)
    assert messages(s)["w-0"] == (
        '0/1 nodes are available: waiting for pods\'s workload "train" to appear in scheduling queue.'
    )
    plugin.set_workload(workload(other=2))  # activates the member waiting for it
    await step(s)
    assert messages(s)["w-0"] == ('0/1 nodes are available: pod group "workers" doesn\'t exist for a workload "train".')
    plugin.set_workload(workload(workers=2))  # activated, but one pod of two: it waits outside the queue
    s.tell_gated()
    assert s.queue.pop(s.clock()) is None
    assert messages(s)["w-0"] == (
        "0/1 nodes are available: waiting for minCount pods from a gang to appear in scheduling queue."
    )
    s.on_pod(worker("w-1"))
    await step(s)
    assert sorted(name for name, _ in binder.calls) == ["w-0", "w-1"]


async def test_a_basic_group_is_no_gang_and_a_wait_longer_than_kubes_15_minute_permit_cap_times_out() -> None:
    s, binder, clock, _ = gang_scheduler(workload(driver=None, workers=2), schedulingTimeoutSeconds=3600)
    s.on_node(node("n1", cpu="2"))
    s.on_pod(worker("d-0", group="driver"))
    await step(s)
    assert binder.calls == [("d-0", "n1")]  # basic: placed alone
    s.on_pod(worker("w-0"))
    s.on_pod(worker("w-1"))
    await step(s)  # one worker fits next to the driver, the other does not: the wait starts
    clock.now += 3599  # past kube's 15-minute Permit cap, within the group's timeout
    s.queue.activate(next(iter(s.queue.unschedulable)))
    await step(s)
    assert "waiting for minCount pods from a gang to be waiting on permit" in messages(s).values()
    clock.now += 2
    s.queue.activate(next(iter(s.queue.unschedulable)))
    await step(s)
    assert "rejected due to timeout after waiting 1h0m0s at plugin GangScheduling" in messages(s).values()
    assert binder.calls == [("d-0", "n1")]


def test_a_profile_without_gangscheduling_refuses_workload_pods_naming_the_field() -> None:
    result = decide(table(node("a")), worker("w-0"))
    assert isinstance(result, Diagnosis)
    assert "pod uses spec.workloadRef, which crane-scheduler does not support yet" in result.message


# -- 1.37: PodGroup objects, pods joined by spec.schedulingGroup -------------------------------------------------------


def pod_group(name: str = "workers", min_count: int | None = 2, **spec: Any) -> dict[str, Any]:
    policy = {"gang": {"minCount": min_count}} if min_count is not None else {"basic": {}}
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"schedulingPolicy": policy, **spec}}


def member(name: str, group: str = "workers", cpu: str = "1", priority: int = 0) -> dict[str, Any]:
    return pod(name, cpu=cpu, priority=priority, spec={"schedulingGroup": {"podGroupName": group}})


def group_scheduler(*groups: dict[str, Any], **args: Any) -> tuple[Scheduler, HeldBinder, Clock, GangScheduling]:
    s, binder, clock, plugin = gang_scheduler(**args)
    plugin.version = gangplugin.POD_GROUP_VERSION
    for g in groups:
        plugin.set_pod_group(g)
    return s, binder, clock, plugin


def test_a_pod_group_is_a_gang_and_its_unread_fields_are_named() -> None:
    assert parse_pod_group(pod_group(min_count=3)).min_count == 3
    assert parse_pod_group(pod_group(min_count=None)).min_count is None
    assert parse_pod_group(pod_group(priority=7)).priority == 7
    topology = parse_pod_group(pod_group(schedulingConstraints={"topology": [{"key": "zone"}]}))
    assert topology.unsupported == "spec.schedulingConstraints.topology"
    assert parse_pod_group(pod_group(disruptionMode={"all": {}})).unsupported == "spec.disruptionMode.all"
    assert parse_pod_group(pod_group(disruptionMode={"single": {}})).unsupported is None
    with pytest.raises(gangplugin.WorkloadError, match=r"spec\.schedulingPolicy\.gang\.minCount"):
        parse_pod_group(pod_group(min_count=0))


async def test_a_pod_group_gang_binds_whole_or_holds_nothing_with_kube_137s_messages() -> None:
    s, binder, clock, _ = group_scheduler(pod_group(min_count=3))
    s.on_node(node("n1", cpu="2"))
    for i in range(3):
        s.on_pod(member(f"w-{i}"))
    await step(s)
    assert binder.calls == [] and not s.table.pods
    # kube 1.37's pod group cycle: the members that fit hear PlacementFeasible's verdict, the other its FitError
    assert messages(s)["w-0"] == "minCount (3) cannot be satisfied: 2 scheduled, 0 remaining"
    assert messages(s)["w-2"].startswith("0/1 nodes are available: 1 Insufficient cpu.")
    clock.now += 3600  # no Permit wait in 1.37: no timeout, however long the group waits
    s.queue.activate(next(iter(s.queue.unschedulable)))
    await step(s)
    assert messages(s)["w-0"] == "minCount (3) cannot be satisfied: 2 scheduled, 0 remaining"
    s.on_node(node("n2", cpu="2"))
    s.queue.activate(next(iter(s.queue.unschedulable)))
    await step(s)
    assert sorted(name for name, _ in binder.calls) == ["w-0", "w-1", "w-2"]


async def test_a_gang_that_cannot_reach_its_quorum_stops_early_and_says_how_many_remain() -> None:
    s, binder, _, _ = group_scheduler(pod_group(min_count=4))
    s.on_node(node("n1", cpu="1"))
    for i in range(4):
        s.on_pod(member(f"w-{i}"))
    await step(s)
    # w-0 fits, w-1 does not: 1 scheduled + 2 remaining < 4, so w-2 and w-3 are not decided (kube stops there too)
    assert messages(s)["w-0"] == "minCount (4) cannot be satisfied: 1 scheduled, 2 remaining"
    assert messages(s)["w-3"] == "minCount (4) cannot be satisfied: 1 scheduled, 2 remaining"
    assert binder.calls == []


async def test_pods_wait_for_their_pod_group_then_their_count_with_kubes_messages() -> None:
    s, binder, _, plugin = group_scheduler()
    s.on_node(node("n1", cpu="4"))
    s.on_pod(member("w-0"))
    await step(s)
    assert messages(s)["w-0"] == (
        '0/1 nodes are available: waiting for pods\'s pod group "workers" to appear in scheduling queue.'
    )
    plugin.set_pod_group(pod_group(min_count=2))  # activated, but one pod of two: it waits outside the queue
    s.tell_gated()
    assert s.queue.pop(s.clock()) is None
    assert messages(s)["w-0"] == (
        "0/1 nodes are available: waiting for minCount pods from a gang to appear in scheduling queue."
    )
    s.on_pod(member("w-1"))
    await step(s)
    assert sorted(name for name, _ in binder.calls) == ["w-0", "w-1"]


async def test_a_member_of_another_priority_or_of_a_group_using_an_unread_field_is_refused_naming_it() -> None:
    s, binder, _, plugin = group_scheduler(
        pod_group("ranked", min_count=1, priority=5),
        pod_group("zoned", min_count=1, schedulingConstraints={"topology": [{"key": "topology.kubernetes.io/zone"}]}),
    )
    s.on_node(node("n1", cpu="4"))
    s.on_pod(member("r-0", group="ranked"))
    s.on_pod(member("z-0", group="zoned"))
    await step(s)
    await step(s)
    assert messages(s)["r-0"] == (
        "0/1 nodes are available: all pods in a single pod group should have the same priority as the pod "
        "group's priority, got 0 and 5."
    )
    assert messages(s)["z-0"] == (
        "0/1 nodes are available: PodGroup ns/zoned uses spec.schedulingConstraints.topology, which "
        "crane-scheduler does not support yet."
    )
    plugin.set_pod_group(pod_group("ranked", min_count=1, priority=0))  # fixed: its member is retried and placed
    await step(s)
    assert binder.calls == [("r-0", "n1")]


async def test_a_basic_pod_group_is_no_gang() -> None:
    s, binder, _, _ = group_scheduler(pod_group("driver", min_count=None))
    s.on_node(node("n1", cpu="2"))
    s.on_pod(member("d-0", group="driver"))
    await step(s)
    assert binder.calls == [("d-0", "n1")]


def test_a_profile_without_gangscheduling_refuses_pod_group_members_naming_the_field() -> None:
    result = decide(table(node("a")), member("w-0"))
    assert isinstance(result, Diagnosis)
    assert "pod uses spec.schedulingGroup, which crane-scheduler does not support yet" in result.message


# -- which API the plugin watches: discovery ----------------------------------------------------------------------


async def test_the_plugin_watches_what_the_api_server_serves_and_asks_again_while_it_serves_neither(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = ["v1"]  # 1.3x without the gate: neither Workload API version
    asked: list[asyncio.Event] = [asyncio.Event() for _ in range(3)]
    answer = asyncio.Event()

    async def apis(request: web.Request) -> web.Response:
        calls = sum(e.is_set() for e in asked)
        asked[calls].set()
        if calls == 1:  # the second ask waits until the test has looked at the pods meanwhile
            await answer.wait()
        versions = [{"groupVersion": f"scheduling.k8s.io/{v}", "version": v} for v in served]
        groups = [
            {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}]},
            {"name": "scheduling.k8s.io", "versions": versions},
        ]
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    app = web.Application()
    app.router.add_get("/apis/", apis)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    api = await api_client_from_dict(kubeconfig_for(f"http://127.0.0.1:{runner.addresses[0][1]}"))
    monkeypatch.setattr(gangplugin, "DISCOVERY_RETRY_SECONDS", 0.01)
    try:
        s, _, _, plugin = gang_scheduler()
        plugin.synced = False
        task = asyncio.create_task(plugin.discover(api, asyncio.Event()))
        await asyncio.wait_for(asked[1].wait(), 5)  # the first answer was taken in: it asks again
        assert plugin.not_served
        s.on_node(node("n1"))
        s.on_pod(member("w-0"))
        await step(s)
        assert gangplugin.NOT_SERVED in messages(s)["w-0"]
        served.append("v1alpha1")  # a 1.35 server with the gate: the Workloads
        answer.set()
        assert await asyncio.wait_for(task, 5) == gangplugin.VERSION
        assert not plugin.not_served
        served.append("v1beta1")  # a 1.37 server (v1beta1 and v1alpha3; listed with 1.35's to show the preference)
        assert await asyncio.wait_for(plugin.discover(api, asyncio.Event()), 5) == gangplugin.POD_GROUP_VERSION
    finally:
        await api.close()
        await runner.cleanup()
