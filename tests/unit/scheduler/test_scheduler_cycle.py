"""The scheduling and binding cycles without an API server: assume, bind, conflict, failure, reporting limits."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from crane_scheduler.framework import SUCCESS, Code, CycleState, Handle, Status
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import PodInfo, parse_pod
from crane_scheduler.reporting import Reporter
from crane_scheduler.scheduler import Scheduler
from crane_scheduler.simulate import Simulator
from crane_shared.leader import Term
from tests.support.scheduler import Clock, FakeWriter, node, pod, scheduler_with, step
from tests.support.waiting import eventually


class FakeBinder:
    """Binds when told to: ``outcome`` is set per pod name before releasing ``gate``."""

    name = "DefaultBinder"

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.outcome: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []

    async def bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        self.calls.append((pod.name, node))
        await self.gate.wait()
        outcome = self.outcome.get(pod.name, "ok")
        if outcome == "conflict":
            return Status(Code.ALREADY_BOUND, (f"pod {pod.name} is already bound",))
        if outcome == "error":
            raise RuntimeError("connection reset")
        return SUCCESS


async def bind_held(
    name: str = "p", cpu: str = "100m", node_cpu: str = "4"
) -> tuple[Scheduler, FakeBinder, Clock, dict[str, Any]]:
    """Pod ``name`` placed on node ``n1``, its bind waiting at the binder's gate (its outcome still to be set)."""
    binder, clock = FakeBinder(), Clock()
    s = scheduler_with(binder, clock)
    s.on_node(node("n1", cpu=node_cpu))
    raw = pod(name, cpu=cpu)
    s.on_pod(raw)
    await step(s)
    return s, binder, clock, raw


def bound(raw: dict[str, Any], node_name: str) -> dict[str, Any]:
    return {**raw, "spec": {**raw["spec"], "nodeName": node_name}}


async def test_assumed_pod_counts_at_once_and_is_not_queued_again_while_binding() -> None:
    s, binder, _, first = await bind_held("first", cpu="700m", node_cpu="1")
    second = pod("second", cpu="700m")
    assert binder.calls == [("first", "n1")]
    s.on_pod(first)  # an informer update while our bind is in flight
    assert len(s.queue) == 0
    s.on_pod(second)  # the assumed pod already uses 700m of the 1 core
    await step(s)
    assert len(s.queue.unschedulable) == 1 and binder.calls == [("first", "n1")]
    binder.gate.set()
    await s.drain()
    s.on_pod(bound(first, "n1"))  # the informer confirms
    assert not s.table.is_assumed(parse_pod(first).uid)
    assert s.reporter.backlog >= 2  # Scheduled for first, FailedScheduling (+ condition) for second


async def test_bind_error_forgets_the_assumption_and_retries_after_backoff() -> None:
    s, binder, clock, _ = await bind_held(cpu="2")
    binder.outcome["p"] = "error"
    binder.gate.set()
    await s.drain()
    assert int(s.table.requested[0, s.table.resources["cpu"]]) == 0
    assert s.queue.backoff_len == 1 and s.queue.pop(clock.now) is None
    clock.now += 1.0
    assert s.queue.pop(clock.now) is not None


async def test_a_failed_bind_frees_its_resources_for_a_pod_noderesourcesfit_rejected() -> None:
    """kube's handleBindingCycleError: the forgotten assumption is an assigned-pod deletion for the queue, so
    NodeResourcesFit's hint moves the pod that did not fit next to it (not after the 5-minute flush)."""
    s, binder, clock, _ = await bind_held("first", cpu="700m", node_cpu="1")
    s.on_pod(pod("second", cpu="700m"))
    await step(s)
    assert [qp.pod.name for qp in s.queue.unschedulable.values()] == ["second"]
    binder.outcome["first"] = "error"
    binder.gate.set()
    await s.drain()
    clock.now += 10.0  # both backoffs over, far from the 5-minute flush
    popped = [s.queue.pop(clock.now), s.queue.pop(clock.now)]
    assert sorted(qp.pod.name for qp in popped if qp is not None) == ["first", "second"]


async def test_conflict_is_someone_elses_success_not_a_retry() -> None:
    s, binder, _, raw = await bind_held()
    binder.outcome["p"] = "conflict"
    binder.gate.set()
    await s.drain()
    assert len(s.queue) == 0 and not s.table.pods
    s.on_pod(bound(raw, "n1"))  # the binding someone else made arrives
    assert parse_pod(raw).uid in s.table.pods and len(s.queue) == 0


@pytest.mark.parametrize("scheduling", [True, False])
async def test_a_bind_whose_reply_was_lost_still_gets_its_one_scheduled_event(scheduling: bool) -> None:
    """An API server restart mid-bind: the bind landed, its reply did not, so the attempt counted as an error and
    queued no Scheduled event; the informer then shows the pod bound before its retry could meet the 409. The
    leader writes the event then (the fault suite's 'API server restart mid-burst' row once lost 2-3 of these); a
    replica whose loop is not running (a standby watching the leader's binds) writes nothing."""
    fake, binder, clock = FakeWriter(), FakeBinder(), Clock()
    s = scheduler_with(binder, clock, fake)
    s.on_node(node("n1"))
    raw = pod("p")
    s.on_pod(raw)
    await step(s)
    binder.outcome["p"] = "error"
    binder.gate.set()
    await s.drain()
    s._leading = scheduling  # what run() sets while a term runs (step() drives the loop by hand here)
    stopping = asyncio.Event()
    run = asyncio.create_task(s.reporter.run(stopping))
    try:
        s.on_pod(bound(raw, "n1"))  # the bind that landed, seen by the informer
        await asyncio.wait_for(s.reporter.drain(), 30)
    finally:
        stopping.set()
        s.reporter.close()
        await run
    scheduled = [b for b in fake.bodies if b.get("reason") == "Scheduled"]
    if scheduling:
        assert [(b["regarding"]["uid"], b["note"].rsplit(" ", 1)[-1]) for b in scheduled] == [
            (parse_pod(raw).uid, "n1")
        ]
    else:
        assert not scheduled


async def test_deleted_pod_is_dropped_even_if_its_bind_fails() -> None:
    s, binder, _, raw = await bind_held()
    s.on_pod_deleted(raw)
    binder.outcome["p"] = "error"
    binder.gate.set()
    await s.drain()
    assert len(s.queue) == 0 and not s.pending


@pytest.mark.parametrize(("gap", "same_message", "written"), [(10, True, False), (61, True, True), (1, False, True)])
def test_failed_scheduling_is_rate_limited_per_pod(gap: float, same_message: bool, written: bool) -> None:
    clock = Clock()
    reporter = Reporter(None, None, "test", clock=clock)
    info = parse_pod(pod("stuck"))
    assert reporter.failed(info, "0/1 nodes are available: 1 Insufficient cpu.", "Unschedulable", "s")
    clock.now += gap
    message = "0/1 nodes are available: 1 Insufficient cpu." if same_message else "0/2 nodes are available: ..."
    assert reporter.failed(info, message, "Unschedulable", "s") is written


def test_factories_receive_args_and_handle() -> None:
    seen: list[Mapping[str, Any]] = []

    def factory(args: Mapping[str, Any], handle: Handle) -> _Probe:
        seen.append(args)
        return _Probe()

    config = {
        "profiles": [
            {
                "schedulerName": "s",
                "plugins": {"filter": {"enabled": [{"name": "Probe"}]}},
                "pluginConfig": [{"name": "Probe", "args": {"threshold": 0.65}}],
            }
        ]
    }
    Simulator(config, plugins={"Probe": factory})  # an added plugin, enabled through the configuration
    assert seen == [{"threshold": 0.65}]


class _Probe:
    name = "Probe"

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> list[Any]:
        return []


async def test_losing_the_lease_drops_binds_not_yet_sent_forgets_and_requeues_them() -> None:
    binder, clock = FakeBinder(), Clock()
    s = scheduler_with(binder, clock)
    term = Term()
    s._term = term
    s.on_node(node("n1", cpu="4"))
    for name in ("a", "b"):
        s.on_pod(pod(name, cpu="1"))
        await step(s)
    assert len(binder.calls) == 2 and sum(r.assumed for r in s.table.pods.values()) == 2
    term.lost.set()
    assert s.stop_binding() == 2
    await s.drain()
    assert not s.table.pods  # assumptions forgotten: nothing counts against n1
    assert int(s.table.requested[0, s.table.resources["cpu"]]) == 0
    assert s.queue.active_len == 2  # back in activeQ for the next term, quietly
    assert s.reporter.backlog == 0  # no Scheduled, no FailedScheduling written for them
    # a pod popped after the loss is neither assumed nor bound
    await step(s)
    assert len(binder.calls) == 2 and not s.table.pods and s.queue.active_len == 2


async def test_the_default_binder_sends_no_bind_once_the_term_is_lost() -> None:
    from crane_scheduler.plugins.defaultbinder import DefaultBinder

    term = Term()
    handle = Handle(NodeTable(), api=object(), may_bind=lambda: term.held)
    binder = DefaultBinder(handle)
    term.lost.set()
    status = await binder.bind({}, parse_pod(pod("p")), "n1")  # api=object(): a POST would raise, not return
    assert status.code is Code.ERROR and "leadership lost" in status.message


async def test_a_bind_dropped_before_its_task_started_is_undone_and_frees_its_slot() -> None:
    binder, clock = FakeBinder(), Clock()
    s = scheduler_with(binder, clock)
    s._term = term = Term()
    s.on_node(node("n1", cpu="4"))
    s.on_pod(pod("a", cpu="1"))
    free = s._slots._value
    await s._slots.acquire()
    qp = s.queue.pop(clock.now)
    assert qp is not None
    s.schedule_one(qp)  # the binding task is created but has not run a single step
    assert s.table.is_assumed(qp.pod.uid)
    term.lost.set()
    assert s.stop_binding() == 1
    assert not s.table.pods and s.queue.active_len == 1  # undone at once, not when the task runs
    await s.drain()
    assert binder.calls == [] and s._slots._value == free


async def test_losing_the_lease_also_drops_the_failures_and_conditions_the_term_queued() -> None:
    binder, clock = FakeBinder(), Clock()
    s = scheduler_with(binder, clock)
    s._term = s.reporter.term = term = Term()
    s.on_node(node("n1", cpu="2"))
    s.on_pod(pod("fits", cpu="1"))
    s.on_pod(pod("too-big", cpu="4"))
    binder.gate.set()
    for _ in range(2):
        await step(s)
    await asyncio.wait_for(s.drain(), 10)
    assert s.reporter.backlog == 3  # Scheduled for "fits", FailedScheduling and the condition for "too-big"
    term.lost.set()
    s.stop_binding()
    assert s.reporter.backlog == 1  # the Scheduled event of the bind that happened is kept
    assert s.metrics.reports.labels("failed", "dropped")._value.get() == 1
    assert s.metrics.reports.labels("condition", "dropped")._value.get() == 1


@pytest.mark.parametrize("failing", [(), (2, 3), (2, 3, 4, 5, 6)], ids=["looks", "retried", "given-up"])
async def test_a_term_looks_for_unreported_bindings_again_once_the_previous_terms_binds_have_landed(
    monkeypatch: pytest.MonkeyPatch, failing: tuple[int, ...]
) -> None:
    """A bind the previous term cancelled on losing its lease may have been on the wire: the pod is bound, the
    cache sees it only later. The term looks at its start and once more after ``RECOVERY_SETTLE``; that look is the
    last chance for such a binding, so one that fails (an API server restarting, a timeout) is tried again."""
    from crane_scheduler import scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "RECOVERY_SETTLE", 0.05)
    s = scheduler_with(FakeBinder(), Clock())
    s.synced.set()
    stopping = asyncio.Event()
    looks: list[int] = []

    async def recover(bound: Any, schedulers: set[str]) -> int:
        looks.append(len(looks))
        if len(looks) in failing:
            raise ApiException(status=503)
        if len(looks) == 2 + len(failing):
            stopping.set()
        return 0

    monkeypatch.setattr(s.reporter, "recover_scheduled_events", recover)
    run = asyncio.create_task(s.run(stopping, Term()))
    if len(failing) == scheduler_module.SETTLED_LOOKS:  # every settled look failed: the term stops looking
        await eventually(lambda: len(looks) == 1 + len(failing))
        await asyncio.sleep(3 * scheduler_module.RECOVERY_SETTLE)  # a sixth look would come in one pause
        stopping.set()
    await asyncio.wait_for(run, 10)
    assert looks == list(range(min(2 + len(failing), 1 + scheduler_module.SETTLED_LOOKS)))


async def test_a_decision_reports_its_cpu_time_beside_its_wall_time() -> None:
    """The decision's own cost apart from the machine's: its CPU time does not exceed its wall-clock latency
    (beyond the two system calls that read it), and the preempted count is per decision."""
    s, binder, _, _ = await bind_held()
    registry = s.metrics.registry
    labels = {"profile": "crane-scheduler"}
    wall = registry.get_sample_value("scheduler_scheduling_algorithm_duration_seconds_sum", labels)
    cpu = registry.get_sample_value("crane_scheduler_scheduling_algorithm_cpu_seconds_sum", labels)
    assert registry.get_sample_value("crane_scheduler_scheduling_algorithm_cpu_seconds_count", labels) == 1
    assert wall is not None and cpu is not None and 0 < cpu <= wall + 0.0005
    preempted = registry.get_sample_value("crane_scheduler_scheduling_algorithm_preempted_total", labels) or 0.0
    assert preempted in (0.0, 1.0)
    binder.gate.set()
    await s.drain()


@pytest.mark.parametrize("ready_later", [True, False])
async def test_the_first_decision_waits_for_the_api_writer_to_be_ready(
    monkeypatch: pytest.MonkeyPatch, ready_later: bool
) -> None:
    """A scheduler started with pods pending decides nothing before its writer process can send: its writes (a
    preemption's evictions among them) would only wait in the pipe meanwhile. A writer that never gets ready
    delays the first decision by ``WRITER_READY_TIMEOUT`` at most."""
    from crane_scheduler import scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "WRITER_READY_TIMEOUT", 30.0 if ready_later else 0.05)
    binder = FakeBinder()
    s = scheduler_with(binder, Clock())
    writer = FakeWriter()
    writer.ready.clear()
    s.writer = writer.as_writer()
    s.on_node(node("n1", cpu="2"))
    s.on_pod(pod("p", cpu="1"))
    s.synced.set()
    stopping = asyncio.Event()
    run = asyncio.create_task(s.run(stopping))
    if ready_later:
        for _ in range(20):
            await asyncio.sleep(0)
        assert binder.calls == [] and s.queue.active_len == 1  # not decided yet
        writer.ready.set()
    await eventually(lambda: binder.calls == [("p", "n1")], 10, "the pod decided and its bind started")
    binder.gate.set()
    stopping.set()
    await asyncio.wait_for(run, 10)


async def test_a_binding_seen_while_the_terms_first_look_runs_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first look lists the Scheduled events (seconds on a busy API server) over the table as it was when the
    term began; a pending pod the old leader bound that the informer delivers meanwhile is reported at once."""
    s = scheduler_with(FakeBinder(), Clock())
    s.cache.on_node(node("n1"))
    pending = pod("late")
    s.cache.on_pod(pending)
    s.synced.set()
    stopping = asyncio.Event()

    async def recover(bound: Any, schedulers: set[str]) -> int:
        s.cache.on_pod({**pending, "spec": {**pending["spec"], "nodeName": "n1"}})  # the old leader's bind lands
        stopping.set()
        return 0

    monkeypatch.setattr(s.reporter, "recover_scheduled_events", recover)
    await asyncio.wait_for(s.run(stopping, Term()), 10)
    assert s.reporter.backlog == 1  # its Scheduled event
