"""Coscheduling (PodGroup gangs): the pure parts, and the scheduler's all-or-nothing gang cycle without an API
server (decisions, assumptions, queue; binds held by a fake binder)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from crane_scheduler.explain import render
from crane_scheduler.framework import (
    ArgsError,
    ClusterChange,
    ClusterEvent,
    Handle,
    QueuedPod,
    QueueingHint,
)
from crane_scheduler.gangcycle import index_key, member_slots, smallest_request
from crane_scheduler.gangrules import quorum_met, quorum_out_of_reach
from crane_scheduler.loadaware.args import parse_args as parse_dynamic_args
from crane_scheduler.loadaware.plugin import Dynamic
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins.coscheduling import gang as g
from crane_scheduler.plugins.coscheduling.plugin import Coscheduling, allocatable_grew, parse_args
from crane_scheduler.plugins.gangscheduling import plugin as gangplugin
from crane_scheduler.plugins.gangwait import go_duration, timed_out
from crane_scheduler.podinfo import parse_node, parse_pod
from crane_scheduler.reporting import Reporter
from crane_scheduler.scheduler import Scheduler
from crane_scheduler.simulate import Simulator
from cranectl.__main__ import render_explain
from tests.support.loadaware import NOW, loaded
from tests.support.scheduler import Clock, HeldBinder, node, pod, scheduler_with, step

LABEL = g.POD_GROUP_LABEL


# ---------------------------------------------------------------------------------------------- pure parts


def test_quorum_counts_members_placed_already_and_needs_one_found() -> None:
    assert quorum_met(placed=0, found=3, quorum=3)
    assert not quorum_met(placed=0, found=2, quorum=3)
    assert quorum_met(placed=2, found=1, quorum=3)  # a partially bound group's last member goes alone
    assert not quorum_met(placed=3, found=0, quorum=3)  # nothing found: nothing to place
    assert quorum_out_of_reach(placed=0, members=3, failed=1, quorum=3)
    assert not quorum_out_of_reach(placed=0, members=4, failed=1, quorum=3)


def test_membership_is_the_label_in_the_pods_namespace() -> None:
    raw = member("a", "job")
    assert g.group_of(raw) == "ns/job"
    assert g.group_of(pod("plain")) is None


def test_queue_order_keeps_a_groups_pods_together_by_group_creation() -> None:
    older = [g.sort_key(0, 100.0, 500.0 + i, "ns", f"old-{i}") for i in range(3)]
    newer = [g.sort_key(0, 200.0, 150.0 + i, "ns", f"new-{i}") for i in range(3)]
    loose = g.sort_key(0, None, 150.0, "ns", "loose")  # no group: its own first attempt
    urgent = g.sort_key(10, 300.0, 300.0, "ns", "urgent")
    order = sorted([*newer, loose, *older, urgent])
    assert [k[2] for k in order] == ["ns/urgent", "ns/old-0", "ns/old-1", "ns/old-2", "ns/loose"] + [
        f"ns/new-{i}" for i in range(3)
    ]


def test_resource_gap_walks_the_nodes_as_the_reference() -> None:
    free = [{"cpu": 1000, "pods": 10}, {"cpu": 1500, "pods": 10}]
    assert g.resource_gap({"cpu": 2000}, free, 3) is None
    gap = g.resource_gap({"cpu": 4000, "memory": 2 * 2**30}, free, 3)
    assert gap == {"cpu": 1500, "memory": 2 * 2**30}
    assert g.format_gap(gap) == "map[cpu:1500m memory:2Gi]"


def test_waits_are_printed_as_go_durations() -> None:
    assert [go_duration(s) for s in (60, 5, 3600, 90.5, 3725)] == ["1m0s", "5s", "1h0m0s", "1m30.5s", "1h2m5s"]
    assert timed_out(60, "Coscheduling") == "rejected due to timeout after waiting 1m0s at plugin Coscheduling"


def group_obj(name: str = "job", min_member: int = 3, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{g.GROUP}/{g.VERSION}",
        "kind": g.KIND,
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"minMember": min_member, **spec},
    }


def test_status_follows_the_podgroup_controller_step_by_step() -> None:
    group = g.parse_pod_group(group_obj(min_member=2))
    pending = g.Member("Pending", False, ("job-x",))
    running = g.Member("Running", True)
    assert g.next_status(group, [], "ns", 0)["phase"] == g.PENDING
    group = g.parse_pod_group({**group_obj(min_member=2), "status": {"phase": g.PENDING}})
    assert g.next_status(group, [pending], "ns", 0)["phase"] == g.PENDING  # fewer pods than minMember
    scheduling = g.next_status(group, [pending, pending], "ns", 0)
    assert (scheduling["phase"], scheduling["occupiedBy"]) == (g.SCHEDULING, "ns/job-x")
    assert scheduling["scheduleStartTime"] == "1970-01-01T00:00:00Z"
    group = g.parse_pod_group({**group_obj(min_member=2), "status": scheduling})
    now = g.next_status(group, [running, g.Member("Pending", True)], "ns", 5)
    assert (now["phase"], now["scheduled"], now["running"]) == (g.SCHEDULING, 2, 1)
    assert now["scheduleStartTime"] == "1970-01-01T00:00:00Z"  # kept
    assert g.next_status(group, [running, running], "ns", 5)["phase"] == g.RUNNING
    failed = g.next_status(group, [running, g.Member("Failed", True)], "ns", 5)
    assert failed["phase"] == g.FAILED
    done = g.parse_pod_group({**group_obj(min_member=2), "status": failed})
    assert g.next_status(done, [running, running], "ns", 9) == failed  # final


def test_a_group_found_whole_and_bound_is_scheduling_in_one_write() -> None:
    """One reconcile of a new group whose members all exist and are bound: the status written says Scheduling with
    every member counted, never Pending with scheduled == minMember (it would stay so until the group's next
    change: seen in CI)."""
    group = g.parse_pod_group(group_obj(min_member=3))
    bound = [g.Member("Pending", True, ("job-x",))] * 3
    status = g.settled_status(group, bound, "ns", 7)
    assert (status["phase"], status["scheduled"], status["occupiedBy"]) == (g.SCHEDULING, 3, "ns/job-x")
    running = g.settled_status(group, [g.Member("Running", True)] * 3, "ns", 7)
    assert running["phase"] == g.RUNNING and running["scheduleStartTime"] == "1970-01-01T00:00:07Z"


def test_args_defaults_and_refusals_name_the_field() -> None:
    assert parse_args({}) == parse_args({"permitWaitingTimeSeconds": 60, "podGroupBackoffSeconds": 0})
    with pytest.raises(ArgsError) as err:
        parse_args({"permitWaitingTimeSeconds": -1, "podGroupGC": 3})
    fields = {path for path, _ in err.value.problems}
    assert fields == {"permitWaitingTimeSeconds", "podGroupGC"}


def test_a_malformed_podgroup_is_refused_naming_the_field() -> None:
    with pytest.raises(g.PodGroupError, match=r"spec\.minResources\.cpu"):
        g.parse_pod_group(group_obj(minResources={"cpu": "lots"}))


# ---------------------------------------------------------------------------------------------- the gang cycle


CONFIG = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "profiles": [
        {
            "schedulerName": "crane-scheduler",
            "plugins": {
                "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
                "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
            },
        }
    ],
}


def member(name: str, group: str, cpu: str = "1") -> dict[str, Any]:
    raw = pod(name, cpu=cpu)
    raw["metadata"]["labels"] = {LABEL: group}
    return raw


def gang_scheduler(*groups: dict[str, Any], **args: Any) -> tuple[Scheduler, HeldBinder, Clock, Coscheduling]:
    binder, clock = HeldBinder(), Clock()
    config = json.loads(json.dumps(CONFIG))
    if args:
        config["profiles"][0]["pluginConfig"] = [{"name": "Coscheduling", "args": args}]
    s = scheduler_with(binder, clock, config=config)
    plugin = s.profiles["crane-scheduler"].plugins["Coscheduling"]
    assert isinstance(plugin, Coscheduling)
    plugin.synced = True
    for grp in groups:
        plugin.set_group(grp)
    return s, binder, clock, plugin


def requested_cpu(s: Scheduler) -> int:
    return int(s.table.requested[: s.table.n_rows, s.table.resources["cpu"]].sum())


def waiting_messages(s: Scheduler) -> dict[str, str]:
    return {qp.pod.name: s.decisions.get(qp.pod.key).message for qp in s.queue.unschedulable.values()}  # type: ignore[union-attr]


async def test_a_gang_that_fits_is_placed_in_one_cycle_and_every_member_binds() -> None:
    s, binder, _, plugin = gang_scheduler(group_obj("job", 3))
    s.on_node(node("n1", cpu="2"))
    s.on_node(node("n2", cpu="2"))
    for i in range(3):
        s.on_pod(member(f"job-{i}", "job"))
    await step(s)  # one pop: the whole gang
    assert sorted(name for name, _ in binder.calls) == ["job-0", "job-1", "job-2"]
    assert len(s.queue) == 0 and requested_cpu(s) == 3000
    binder.gate.set()
    await s.drain()
    assert plugin.waits.metrics.placed._value.get() == 1


async def test_a_gang_that_cannot_fit_assumes_nothing_and_the_room_goes_to_another_pod() -> None:
    s, binder, _, _ = gang_scheduler(group_obj("job", 3))
    s.on_node(node("n1", cpu="2"))  # room for two members of three
    for i in range(3):
        s.on_pod(member(f"job-{i}", "job"))
    await step(s)
    assert binder.calls == [] and requested_cpu(s) == 0 and not s.table.pods
    messages = waiting_messages(s)
    assert (
        messages["job-0"]
        == messages["job-1"]
        == ("PodGroup ns/job gets rejected due to Pod job-2 is unschedulable even after PostFilter")
    )
    assert messages["job-2"].startswith("0/1 nodes are available: 1 Insufficient cpu.")
    assert messages["job-2"].endswith(
        "preemption: not attempted for a member of pod group ns/job (gang preemption is not supported)"
    )
    s.on_pod(pod("web", cpu="2"))  # the whole node is free for a pod of no group
    await step(s)
    assert binder.calls == [("web", "n1")]


async def test_a_gang_that_does_not_form_clears_the_nominations_of_the_members_that_found_a_place() -> None:
    """kube's pod group cycle: a member that found a place in a group that failed loses its nomination
    (``clearNominatedNode``); one never tried keeps its own (no result of its own)."""
    s, binder, _, _ = gang_scheduler(group_obj("job", 3))
    s.on_node(node("n1", cpu="2"))  # job-0 fits beside job-2's nominated room; job-1 does not: quorum out of reach
    uids = {}
    for i in range(3):
        raw = member(f"job-{i}", "job")
        if i != 1:
            raw["status"] = {"nominatedNodeName": "n1"}
        s.on_pod(raw)
        uids[f"job-{i}"] = raw["metadata"]["uid"]
    await step(s)
    assert binder.calls == [] and not s.table.pods
    assert "Insufficient cpu" in waiting_messages(s)["job-1"]
    assert {name: uid in s.table.nominated for name, uid in uids.items()} == {
        "job-0": False,  # assumed, then given up with the group
        "job-1": False,  # never nominated
        "job-2": True,  # not tried
    }


async def test_two_gangs_that_fit_one_at_a_time_never_hold_parts_of_the_cluster() -> None:
    s, binder, _, _ = gang_scheduler(group_obj("a", 2), group_obj("b", 2))
    s.on_node(node("n1", cpu="2"))
    for name in ("a-0", "b-0", "a-1", "b-1"):  # interleaved arrivals
        s.on_pod(member(name, name[0]))
    await step(s)  # gang a, whole
    assert sorted(binder.calls) == [("a-0", "n1"), ("a-1", "n1")]
    await step(s)  # gang b: no room, holds nothing
    assert len(binder.calls) == 2 and requested_cpu(s) == 2000
    assert sorted(waiting_messages(s)) == ["b-0", "b-1"]


async def test_too_few_members_wait_with_the_references_message_and_a_new_sibling_brings_them_in() -> None:
    s, binder, _, _ = gang_scheduler(group_obj("job", 3))
    s.on_node(node("n1", cpu="4"))
    s.on_pod(member("job-0", "job"))
    s.on_pod(member("job-1", "job"))
    s.tell_gated()  # the loop's turn: no attempt, the message PreFilter would give
    assert waiting_messages(s)["job-0"] == (
        "0/1 nodes are available: pre-filter pod job-0 cannot find enough sibling pods, current pods number: 2, "
        "minMember of group: 3."
    )
    s.on_pod(member("job-2", "job"))  # its gang cycle takes the waiting siblings along
    await step(s)
    assert sorted(name for name, _ in binder.calls) == ["job-0", "job-1", "job-2"]


async def test_members_of_an_incomplete_group_cost_no_decision_until_the_group_is_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member arriving before its group is whole waits outside the queue (PreEnqueue): no decision, but the
    reference's message, once, with the count when the loop saw it; the member that completes the group brings
    every sibling into one gang cycle, decided in name order (the reference's queue order within a group)."""
    s, binder, _, _ = gang_scheduler(group_obj("job", 5))
    s.on_node(node("n1", cpu="8"))
    decided: list[str] = []
    decide = s.decide

    def counted(profile: Any, pod: Any, state: Any) -> Any:
        decided.append(pod.name)
        return decide(profile, pod, state)

    monkeypatch.setattr(s, "decide", counted)
    for i in range(4):
        s.on_pod(member(f"job-{i}", "job"))
        s.tell_gated()
        assert s.queue.pop(s.clock()) is None
    assert decided == [] and s.metrics.schedule_attempts.labels("unschedulable", "crane-scheduler")._value.get() == 0
    messages = waiting_messages(s)
    assert "current pods number: 1, minMember of group: 5" in messages["job-0"]
    assert "current pods number: 4, minMember of group: 5" in messages["job-3"]
    s.on_pod(member("job-4", "job"))  # the group is whole: one cycle decides every member
    await step(s)
    assert decided == [f"job-{i}" for i in range(5)]
    assert sorted(name for name, _ in binder.calls) == [f"job-{i}" for i in range(5)]


async def test_a_burst_tells_nothing_to_the_members_of_a_group_complete_by_the_loops_turn() -> None:
    s, binder, _, _ = gang_scheduler(group_obj("job", 3))
    s.on_node(node("n1", cpu="4"))
    for i in range(3):  # e.g. the informer's first list: each member arrives while its group is incomplete
        s.on_pod(member(f"job-{i}", "job"))
    await step(s)
    assert sorted(name for name, _ in binder.calls) == ["job-0", "job-1", "job-2"]
    assert s.reporter._jobs.empty()  # no FailedScheduling, no condition (the binds are held: no Scheduled yet)


async def test_a_group_that_waits_past_its_timeout_is_rejected_with_kubes_wording_and_retried() -> None:
    s, binder, clock, plugin = gang_scheduler(group_obj("job", 2, scheduleTimeoutSeconds=90))
    s.on_node(node("n1", cpu="1"))
    s.on_pod(member("job-0", "job"))
    s.on_pod(member("job-1", "job"))
    await step(s)  # one fits, the other does not: the wait starts
    assert "gets rejected due to Pod job-1" in waiting_messages(s)["job-0"]
    clock.now += 91
    s.queue.activate(next(iter(s.queue.unschedulable)))
    await step(s)
    timed_out_members = [n for n, m in waiting_messages(s).items() if m == timed_out(90, "Coscheduling")]
    assert len(timed_out_members) == 1  # the member that fits; the other keeps its own reason
    assert timed_out(90, "Coscheduling") == "rejected due to timeout after waiting 1m30s at plugin Coscheduling"
    assert plugin.waits.metrics.timed_out._value.get() == 1 and binder.calls == []


async def test_a_missing_podgroup_is_refused_before_anything_is_assumed_and_its_arrival_retries() -> None:
    s, binder, _, plugin = gang_scheduler()
    s.on_node(node("n1", cpu="4"))
    s.on_pod(member("job-0", "job"))
    await step(s)
    assert waiting_messages(s)["job-0"] == "0/1 nodes are available: PodGroup not found."
    plugin.set_group(group_obj("job", 1))  # the watch delivers it: the member is activated
    assert s.queue.active_len == 1
    await step(s)
    assert binder.calls == [("job-0", "n1")]


async def test_the_gang_cycle_takes_siblings_out_of_the_queue_with_their_attempts_counted() -> None:
    s, _, clock, _ = gang_scheduler(group_obj("job", 3))
    s.on_node(node("n1", cpu="1"))
    for i in range(3):
        s.on_pod(member(f"job-{i}", "job"))
    await step(s)
    attempts = {qp.pod.name: qp.attempts for qp in s.queue.unschedulable.values()}
    assert attempts == {"job-0": 1, "job-1": 1, "job-2": 1}
    taken = s.queue.take(next(iter(s.queue.unschedulable)), clock.now)
    assert isinstance(taken, QueuedPod) and taken.attempts == 2 and len(s.queue) == 2


async def test_min_resources_the_cluster_cannot_offer_refuse_the_group_naming_the_gap() -> None:
    s, binder, _, _ = gang_scheduler(group_obj("job", 2, minResources={"cpu": "6"}))
    s.on_node(node("n1", cpu="4"))
    s.on_pod(member("job-0", "job"))
    s.on_pod(member("job-1", "job"))
    await step(s)
    assert waiting_messages(s) == {
        "job-0": "0/1 nodes are available: resource gap: map[cpu:2].",
        "job-1": "0/1 nodes are available: resource gap: map[cpu:2].",
    }
    assert binder.calls == []


async def test_a_member_deleted_mid_wait_leaves_nothing_held_and_its_replacement_completes_the_group() -> None:
    s, binder, _, _ = gang_scheduler(group_obj("job", 3))
    s.on_node(node("n1", cpu="3"))
    raws = [member("job-0", "job"), member("job-1", "job"), member("job-2", "job", cpu="2")]
    for raw in raws:
        s.on_pod(raw)
    await step(s)  # job-2 does not fit next to the others: the group waits
    assert binder.calls == [] and requested_cpu(s) == 0
    s.on_pod_deleted(raws[2])
    assert sorted(qp.pod.name for qp in s.queue.unschedulable.values()) == ["job-0", "job-1"]
    s.on_pod(member("job-3", "job"))  # the Job's replacement
    await step(s)
    assert sorted(name for name, _ in binder.calls) == ["job-0", "job-1", "job-3"]


async def test_members_beyond_the_quorum_that_do_not_fit_wait_alone_while_the_quorum_binds() -> None:
    s, binder, _, _ = gang_scheduler(group_obj("job", 2))
    s.on_node(node("n1", cpu="2"))
    for raw in (member("job-0", "job"), member("job-1", "job"), member("job-2", "job")):
        s.on_pod(raw)
    await step(s)
    assert sorted(name for name, _ in binder.calls) == ["job-0", "job-1"]
    assert waiting_messages(s)["job-2"].startswith("0/1 nodes are available: 1 Insufficient cpu.")


def test_an_annotation_round_on_a_node_wakes_no_group_short_of_room() -> None:
    before = parse_node(node("n1", cpu="4"))
    annotated = parse_node({**node("n1", cpu="4"), "metadata": {"name": "n1", "annotations": {"load": "x"}}})
    grown = parse_node(node("n1", cpu="8"))
    waiting = parse_pod(member("job-0", "job"))
    update = ClusterEvent.NODE_UPDATE
    assert allocatable_grew(waiting, ClusterChange(update, before, annotated)) is QueueingHint.SKIP
    assert allocatable_grew(waiting, ClusterChange(update, before, grown)) is QueueingHint.QUEUE


def load_aware_gangs(
    dynamic_args: dict[str, Any],
) -> tuple[Scheduler, HeldBinder, Coscheduling, list[Dynamic]]:
    """A scheduler with Coscheduling and Dynamic (weight 3, clock at ``NOW``), binds held."""
    binder, clock = HeldBinder(), Clock()
    dynamics: list[Dynamic] = []

    def dynamic(args: Any, handle: Handle) -> Dynamic:
        dynamics.append(Dynamic(parse_dynamic_args(args), handle, wall_clock=lambda: NOW))
        return dynamics[-1]

    config = json.loads(json.dumps(CONFIG))
    profile = config["profiles"][0]
    profile["plugins"]["multiPoint"]["enabled"].append({"name": "Dynamic", "weight": 3})
    profile["pluginConfig"] = [{"name": "Dynamic", "args": dynamic_args}]
    plugins = {"DefaultBinder": lambda args, handle: binder, "Dynamic": dynamic}
    sim = Simulator(config, clock=clock, out_of_tree=False, plugins=plugins)
    reporter = Reporter(None, None, "test", clock=clock)
    s = Scheduler(config=sim.config, profiles=sim.profiles, table=sim.table, reporter=reporter, clock=clock)
    plugin = sim.plugin("Coscheduling")
    assert isinstance(plugin, Coscheduling)
    return s, binder, plugin, dynamics


async def test_a_gang_its_own_members_would_push_over_the_load_threshold_is_not_placed_and_leaves_no_estimate() -> None:
    """Load-aware gangs: Dynamic's Reserve records each member's estimated usage as it is assumed, so the next
    member sees it; when the group then fails, Unreserve takes every estimate back."""
    s, binder, plugin, dynamics = load_aware_gangs({"estimate": {"cpuFactor": 1.0}, "ownBindingsInHotValue": False})
    plugin.set_group(group_obj("train", 3))
    s.on_node(loaded("a", 0.50, cpu="10"))
    s.on_node(loaded("b", 0.52, cpu="10"))
    for i in range(3):  # each member adds 0.1 to its node's estimate: a third one fits on neither under 0.65
        s.on_pod(member(f"train-{i}", "train"))
    await step(s)
    assert binder.calls == [] and dynamics[0].recent_on("a") == dynamics[0].recent_on("b") == []
    assert "would have cpu_usage_avg_5m above 0.65" in waiting_messages(s)["train-2"]
    plugin.set_group(group_obj("train", 2))  # a quorum of two fits, one member per node
    await step(s)
    assert sorted(node for _, node in binder.calls) == ["a", "b"]


@pytest.mark.parametrize(("policy", "expected"), [("spread", ["a", "a", "b"]), ("together", ["a", "a", "a"])])
async def test_gang_hot_value_together_keeps_a_gangs_members_from_pushing_each_other_apart(
    policy: str, expected: list[str]
) -> None:
    """The hot value counts this scheduler's own recent bindings (upstream's policy: every 2 bindings within a minute
    add 1, i.e. 10 points off the Dynamic score). ``spread`` (the default): the third member sees two siblings on
    the idler node ``a`` and goes to ``b``. ``together``: a gang's own members leave its hot value alone, so the
    whole gang stays on ``a``; other pods' bindings still count."""
    s, binder, plugin, dynamics = load_aware_gangs({"gangHotValue": policy})
    plugin.set_group(group_obj("train", 3))
    s.on_node(loaded("a", 0.10, cpu="100"))
    s.on_node(loaded("b", 0.15, cpu="100"))
    for i in range(3):
        s.on_pod(member(f"train-{i}", "train"))
    await step(s)
    assert sorted(node for _, node in binder.calls) == expected
    if policy == "together":  # a pod of no gang still sees the gang's three bindings on a: hot 1, so b
        s.on_pod(pod("other", cpu="1"))
        await step(s)
        assert binder.calls[-1] == ("other", "b")
        assert [b.node for b in dynamics[0].recent_on("a")] == ["a"] * 3


def test_gang_hot_value_is_spread_or_together_and_anything_else_is_refused_naming_the_field() -> None:
    assert parse_dynamic_args({}).gang_hot_value == "spread"
    assert parse_dynamic_args({"gangHotValue": "together"}).gang_hot_value == "together"
    with pytest.raises(ArgsError, match="gangHotValue"):
        parse_dynamic_args({"gangHotValue": "apart"})


async def test_explain_shows_a_waiting_gang_its_members_found_and_missing_and_why() -> None:
    s, _, _, _ = gang_scheduler(group_obj("job", 3))
    s.on_node(node("n1", cpu="2"))
    for i in range(3):
        s.on_pod(member(f"job-{i}", "job"))
    await step(s)
    decision = s.decisions.get("ns/job-0")
    assert decision is not None
    text = render_explain(render(decision))
    assert "gang ns/job: waiting: 2 member(s) found places, 0 placed before, minMember 3" in text
    assert "  found    job-1 -> n1" in text
    assert "  missing  job-2: 0/1 nodes are available: 1 Insufficient cpu." in text


async def test_the_gang_index_follows_pods_from_pending_to_assumed_bound_and_gone() -> None:
    s, binder, _, _ = gang_scheduler(group_obj("job", 2))
    s.on_node(node("n1", cpu="4"))
    raws = [member("job-0", "job"), member("job-1", "job")]
    for raw in raws:
        s.on_pod(raw)
    uids = {raw["metadata"]["uid"] for raw in raws}
    job, other = index_key("Coscheduling", "ns/job"), index_key("Coscheduling", "ns/other")
    assert s.gang_index.pending == {job: uids} and s.gang_index.placed == {}
    await step(s)
    assert s.gang_index.placed == {job: uids}  # assumed
    binder.gate.set()
    await s.drain()
    for raw in raws:
        s.on_pod({**raw, "spec": {**raw["spec"], "nodeName": "n1"}})  # the informer confirms
    assert s.gang_index.pending == {} and s.gang_index.placed == {job: uids}
    relabelled = {**raws[0], "metadata": {**raws[0]["metadata"], "labels": {LABEL: "other"}}}
    s.on_pod({**relabelled, "spec": {**raws[0]["spec"], "nodeName": "n1"}})
    assert s.gang_index.placed[other] == {raws[0]["metadata"]["uid"]}
    for raw in raws:
        s.on_pod_deleted(raw)
    assert s.gang_index.placed == {} and s.gang_index.pending == {}


async def test_a_group_that_failed_is_held_back_for_its_backoff_and_its_own_refusals_do_not_renew_it() -> None:
    s, binder, clock, _ = gang_scheduler(group_obj("job", 2), podGroupBackoffSeconds=30)
    s.on_node(node("n1", cpu="1"))
    s.on_pod(member("job-0", "job"))
    s.on_pod(member("job-1", "job"))
    await step(s)  # one does not fit: backed off for 30 s
    clock.now += 20
    s.queue.activate(next(iter(s.queue.unschedulable)))
    await step(s)
    assert set(waiting_messages(s).values()) == {"0/1 nodes are available: podGroup ns/job failed recently."}
    s.on_node(node("n2", cpu="1"))  # room now; the backoff (not renewed by the refusal above) ends at 30 s
    clock.now += 11
    s.queue.activate(next(iter(s.queue.unschedulable)))
    await step(s)
    assert sorted(name for name, _ in binder.calls) == ["job-0", "job-1"]


def test_member_slots_count_the_free_room_of_live_nodes_for_the_smallest_member() -> None:
    table = NodeTable()
    table.upsert_node(parse_node(node("n1", cpu="4", pods=3)))
    table.upsert_node(parse_node(node("n2", cpu="3")))
    table.add_pod(parse_pod(pod("placed", cpu="1", node_name="n1")))
    members = [parse_pod(member("a", "job", cpu="1500m")), parse_pod(member("b", "job", cpu="2"))]
    request = smallest_request(members)
    assert request["cpu"] == 1500 and "memory" in request
    assert member_slots(table, request) == 2 + 2  # n1: 3 CPUs free, 2 pods left; n2: 3 CPUs free
    # an extended resource no node advertises may come from DRA (or Fit may ignore it): it bounds nothing
    assert member_slots(table, {**request, "example.com/gpu": 1}) == 2 + 2
    assert member_slots(table, {**request, "hugepages-2Mi": 1}) == 0  # a native resource no node has
    table.remove_node("n2")
    assert member_slots(table, request) == 2


async def test_a_deletion_retries_a_waiting_gang_only_once_its_quorum_could_fit() -> None:
    """A pod deleted from a full cluster wakes a waiting gang's members only when the free room could hold the
    members its quorum still needs: the members of a gang that would fail again keep waiting, no attempt
    counted, nothing reported (a queueing hint's skip), and the deletion that makes room retries them."""
    s, binder, _, _ = gang_scheduler(group_obj("job", 3))
    s.on_node(node("n1", cpu="2"))
    s.on_node(node("n2", cpu="2"))
    fillers = [pod("f1", cpu="2", node_name="n1"), pod("f2", cpu="2", node_name="n2")]
    for raw in fillers:
        s.on_pod(raw)
    for i in range(3):
        s.on_pod(member(f"job-{i}", "job"))
    await step(s)  # no room: the group waits
    assert sorted(waiting_messages(s)) == ["job-0", "job-1", "job-2"] and binder.calls == []
    s.on_pod_deleted(fillers[0])  # room for two of three
    assert s.queue.pop(s.clock()) is None
    assert {qp.pod.name: qp.attempts for qp in s.queue.unschedulable.values()} == {f"job-{i}": 1 for i in range(3)}
    assert s.metrics.queue_hint_skips.labels("Coscheduling")._value.get() == 3
    s.on_pod_deleted(fillers[1])  # room for all three
    await step(s)
    assert sorted(name for name, _ in binder.calls) == ["job-0", "job-1", "job-2"]


async def test_a_deletion_does_not_retry_a_group_short_of_members_and_a_new_member_still_does() -> None:
    s, binder, _, _ = gang_scheduler(group_obj("job", 3))
    s.on_node(node("n1", cpu="4"))
    filler = pod("f1", cpu="1", node_name="n1")
    s.on_pod(filler)
    s.on_pod(member("job-0", "job"))
    s.tell_gated()  # too few members
    s.on_pod_deleted(filler)
    assert s.queue.pop(s.clock()) is None and len(s.queue.unschedulable) == 1
    s.on_pod(member("job-1", "job"))
    s.on_pod(member("job-2", "job"))
    await step(s)
    assert sorted(name for name, _ in binder.calls) == ["job-0", "job-1", "job-2"]


async def test_a_podgroup_lowering_its_min_member_lets_its_waiting_members_out_of_the_gate() -> None:
    s, binder, _, plugin = gang_scheduler(group_obj("job", 3))
    s.on_node(node("n1", cpu="4"))
    s.on_pod(member("job-0", "job"))
    s.on_pod(member("job-1", "job"))
    s.tell_gated()
    assert s.queue.pop(s.clock()) is None
    plugin.set_group(group_obj("job", 2))  # the PodGroup changed: its waiting members are activated
    await step(s)
    assert sorted(name for name, _ in binder.calls) == ["job-0", "job-1"]


async def test_a_coscheduling_group_and_a_pod_group_of_one_name_stay_two_gangs() -> None:
    """One profile with both gang plugins; in namespace ns a scheduler-plugins PodGroup ``job`` (minMember 2, two
    labelled pods) and a 1.37 PodGroup ``job`` (minCount 3, one pod so far). Merged, the 1.37 gang's one pod made
    the other's quorum and was bound alone; now it waits for its own group."""
    config = json.loads(json.dumps(CONFIG))
    config["profiles"][0]["plugins"]["multiPoint"]["enabled"].append({"name": "GangScheduling"})
    binder, clock = HeldBinder(), Clock()
    s = scheduler_with(binder, clock, config=config)
    cos = s.profiles["crane-scheduler"].plugins["Coscheduling"]
    gs = s.profiles["crane-scheduler"].plugins["GangScheduling"]
    cos.synced = gs.synced = True  # type: ignore[attr-defined]
    gs.version = gangplugin.POD_GROUP_VERSION  # type: ignore[attr-defined]
    cos.set_group(group_obj("job", 2))  # type: ignore[attr-defined]
    # kube 1.37's PodGroup ns/job, minCount 3, and a pod joining it by spec.schedulingGroup
    gs.set_pod_group(  # type: ignore[attr-defined]
        {"metadata": {"name": "job", "namespace": "ns"}, "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}}
    )
    s.on_node(node("n1", cpu="4"))
    joined = pod("k-0", cpu="1", spec={"schedulingGroup": {"podGroupName": "job"}})
    for raw in (member("c-0", "job"), member("c-1", "job"), joined):
        s.on_pod(raw)
    for _ in range(4):
        if s.queue.active_len:
            await step(s)
    assert sorted(name for name, _ in binder.calls) == ["c-0", "c-1"]
