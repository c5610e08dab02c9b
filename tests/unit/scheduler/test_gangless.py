"""A pod that names a PodGroup in a profile without a gang plugin is never placed silently: refused by default
(the message names the profile and the missing plugin), or placed alone with a Warning event; one log line per
profile and group either way. A profile with both gang plugins places each kind of gang all or nothing."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from crane_scheduler import gangless
from crane_scheduler.plugins.coscheduling.plugin import Coscheduling
from crane_scheduler.plugins.gangscheduling.plugin import GangScheduling
from crane_scheduler.scheduler import Scheduler
from tests.support.scheduler import Clock, FakeWriter, HeldBinder, node, pod, scheduler_with, step, write_reports


def member(name: str, group: str = "train", cpu: str = "4") -> dict[str, Any]:
    raw = pod(name, cpu=cpu)
    raw["metadata"]["labels"] = {gangless.POD_GROUP_LABEL: group}
    return raw


async def reported(s: Scheduler, fake: FakeWriter) -> list[dict[str, Any]]:
    """The events the scheduler's reporter wrote (run until its queue is empty)."""
    await write_reports(s.reporter)
    return [b for b in fake.bodies if isinstance(b, dict) and b.get("kind") == "Event"]


async def test_a_pod_group_in_a_profile_without_coscheduling_is_refused_naming_profile_and_plugin() -> None:
    """4 members of 4 CPUs on 3 nodes of 6: placed one at a time, 3 would be bound (a partial gang)."""
    fake, binder = FakeWriter(), HeldBinder()
    s = scheduler_with(binder, Clock(), fake)  # the default profile: no gang plugin
    for i in range(3):
        s.on_node(node(f"n{i}", cpu="6"))
    for i in range(4):
        s.on_pod(member(f"train-{i}"))
    with structlog.testing.capture_logs() as logs:
        for _ in range(4):
            await step(s)
    assert binder.calls == [] and not s.table.pods  # nothing bound, nothing assumed
    expected = (
        "0/3 nodes are available: pod names PodGroup ns/train (label scheduling.x-k8s.io/pod-group) but profile "
        "crane-scheduler has no gang plugin (Coscheduling is not enabled): refused rather than placed one pod at a "
        "time (--pod-group-without-gang-plugin=place-alone places it alone)."
    )
    for i in range(4):
        assert s.decisions.get(f"ns/train-{i}").message.startswith(expected)  # type: ignore[union-attr]
    lines = [e for e in logs if e["event"] == "pod group in a profile without a gang plugin"]
    assert len(lines) == 1  # once per profile and group
    assert lines[0]["profile"] == "crane-scheduler" and lines[0]["missing_plugin"] == "Coscheduling"
    warnings = [e for e in await reported(s, fake) if e["reason"] == "FailedScheduling"]
    assert len(warnings) == 4 and {e["type"] for e in warnings} == {"Warning"}
    assert all(e["note"].startswith(expected) for e in warnings)


async def test_place_alone_places_the_pod_with_a_warning_event() -> None:
    fake, binder = FakeWriter(), HeldBinder()
    s = scheduler_with(binder, Clock(), fake)
    s.gangless = "place-alone"
    s.on_node(node("n1", cpu="6"))
    s.on_pod(member("train-0"))
    s.on_pod(pod("plain", cpu="1"))
    await step(s)
    await step(s)
    assert sorted(binder.calls) == [("plain", "n1"), ("train-0", "n1")]
    binder.gate.set()
    await s.drain()
    events = await reported(s, fake)
    ignored = [e for e in events if e["reason"] == gangless.IGNORED_REASON]
    assert [(e["regarding"]["name"], e["type"]) for e in ignored] == [("train-0", "Warning")]
    assert (
        "profile crane-scheduler has no gang plugin (Coscheduling is not enabled): placed alone" in ignored[0]["note"]
    )


def both_gang_plugins() -> dict[str, Any]:
    """The sandbox's gang plugins: Coscheduling (in place of PrioritySort) and GangScheduling, one profile."""
    plugins = {
        "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
        "multiPoint": {"enabled": [{"name": "Coscheduling"}, {"name": "GangScheduling"}]},
    }
    profile = {"schedulerName": "crane-scheduler", "plugins": plugins}
    return {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration", "profiles": [profile]}


@pytest.mark.parametrize("kind", ["PodGroup", "Workload"])
async def test_a_profile_with_both_gang_plugins_places_either_kind_of_gang_all_or_nothing(kind: str) -> None:
    binder = HeldBinder()
    s = scheduler_with(binder, Clock(), config=both_gang_plugins())
    cosched = s.profiles["crane-scheduler"].plugins["Coscheduling"]
    gangs = s.profiles["crane-scheduler"].plugins["GangScheduling"]
    assert isinstance(cosched, Coscheduling) and isinstance(gangs, GangScheduling)
    cosched.synced = gangs.synced = True
    cosched.set_group(
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "train", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"minMember": 4},
        }
    )
    gangs.set_workload(
        {
            "metadata": {"name": "train", "namespace": "ns"},
            "spec": {"podGroups": [{"name": "workers", "policy": {"gang": {"minCount": 4}}}]},
        }
    )
    for i in range(3):
        s.on_node(node(f"n{i}", cpu="6"))
    for i in range(4):
        raw = member(f"train-{i}") if kind == "PodGroup" else pod(f"train-{i}", cpu="4")
        if kind == "Workload":
            raw["spec"]["workloadRef"] = {"name": "train", "podGroup": "workers"}
        s.on_pod(raw)
    s.on_pod(pod("plain", cpu="1"))  # a pod of no group is unaffected
    await step(s)  # one pop: the whole gang (no room for its fourth member: none is placed)
    await step(s)
    assert [name for name, _ in binder.calls] == ["plain"]
    assert [r.name for r in s.table.pods.values()] == ["plain"]  # no member assumed
