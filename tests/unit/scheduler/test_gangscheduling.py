"""GangScheduling (1.35's Workload API) through the scheduler's gang cycle, without an API server; and the
unsupported-field gate for profiles that do not enable it."""

from __future__ import annotations

from typing import Any

import pytest

from crane_scheduler.framework import ArgsError, Diagnosis
from crane_scheduler.plugins.gangscheduling.plugin import GangScheduling, gang_key, parse_args, parse_workload
from crane_scheduler.scheduler import Scheduler
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
