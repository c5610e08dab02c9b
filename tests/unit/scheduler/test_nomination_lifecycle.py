"""A pod's nominated node through its cycles, as kube 1.37's ``schedule_one.go`` keeps it: cleared after a failure
past assume (``clearNominatedNode``, in memory and in the failure's one status patch), and written before a PreBind
that takes API round trips (NominatedNodeNameForExpectation), so an autoscaler counts the pod on its node."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from crane_scheduler.framework import SKIP, SUCCESS, Code, CycleState, Status
from crane_scheduler.podinfo import PodInfo, parse_pod
from crane_scheduler.reporting import Reporter
from crane_scheduler.scheduler import Scheduler
from crane_scheduler.writer import Reply
from crane_scheduler.writer.protocol import REFUSED
from tests.support.scheduler import Clock, FakeWriter, node, pod, scheduler_with, step, write_reports

STATUS = "PATCH /api/v1/namespaces/ns/pods/p/status"


class Binder:
    """Answers each bind with ``outcome`` once ``gate`` is set."""

    name = "DefaultBinder"

    def __init__(self, outcome: Status = SUCCESS) -> None:
        self.gate = asyncio.Event()
        self.outcome = outcome
        self.calls: list[tuple[str, str]] = []

    async def bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        self.calls.append((pod.name, node))
        await self.gate.wait()
        return self.outcome


class PreBinder:
    """A PreBind plugin whose pre-flight answers ``flight``; records what the writer had written when its PreBind
    ran (the nomination must be out before)."""

    name = "PreBinder"

    def __init__(self, writer: FakeWriter, flight: Status) -> None:
        self.writer, self.flight = writer, flight
        self.seen: list[list[str]] = []

    def pre_bind_pre_flight(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        return self.flight

    async def pre_bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        self.seen.append(list(self.writer.writes))
        return SUCCESS


def status_patches(writer: FakeWriter) -> list[dict[str, Any]]:
    """The ``status`` of each patch of pod ``p``'s status the writer got, in order."""
    return [body["status"] for write, body in zip(writer.writes, writer.bodies, strict=True) if write == STATUS]


def nominated(raw: dict[str, Any], node_name: str) -> dict[str, Any]:
    return {**raw, "status": {"nominatedNodeName": node_name}}


@pytest.mark.parametrize(
    "outcome",
    [Status(Code.ERROR, ("connection reset",)), Status(Code.UNSCHEDULABLE, ("node went away",), "DefaultBinder")],
)
async def test_a_failure_past_assume_clears_the_nomination_in_memory_and_with_the_condition(outcome: Status) -> None:
    writer, binder = FakeWriter(), Binder(outcome)
    s = scheduler_with(binder, Clock(), writer)
    s.on_node(node("n1"))
    raw = nominated(pod("p"), "n1")  # nominated there by an earlier preemption, or by an autoscaler
    s.on_pod(raw)
    uid = parse_pod(raw).uid
    assert s.table.nominated[uid][1] == "n1"
    await step(s)
    assert binder.calls == [("p", "n1")]
    binder.gate.set()
    await s.drain()
    assert uid not in s.table.nominated  # lower pods no longer leave room for it on n1
    await write_reports(s.reporter)
    [patch] = status_patches(writer)
    assert patch["nominatedNodeName"] is None  # one patch, as kube's updatePod: the condition and the nomination
    [condition] = patch["conditions"]
    assert (condition["type"], condition["status"]) == ("PodScheduled", "False")
    assert condition["reason"] == ("Unschedulable" if outcome.rejected else "SchedulerError")


async def test_a_failure_past_assume_of_a_pod_without_a_nomination_patches_only_its_condition() -> None:
    writer, binder = FakeWriter(), Binder(Status(Code.ERROR, ("connection reset",)))
    s = scheduler_with(binder, Clock(), writer)
    s.on_node(node("n1"))
    s.on_pod(pod("p"))
    await step(s)
    binder.gate.set()
    await s.drain()
    await write_reports(s.reporter)
    [patch] = status_patches(writer)
    assert "nominatedNodeName" not in patch and patch["conditions"][0]["reason"] == "SchedulerError"


async def test_a_pod_that_fits_nowhere_without_preemption_loses_its_nomination() -> None:
    """kube: no PostFilter plugin to run, so the FitError clears the nomination (``clearNominatedNode``)."""
    config = {
        "profiles": [{"schedulerName": "crane-scheduler", "plugins": {"postFilter": {"disabled": [{"name": "*"}]}}}]
    }
    writer = FakeWriter()
    s = scheduler_with(Binder(), Clock(), writer, config)
    s.on_node(node("n1", cpu="1"))
    raw = nominated(pod("p", cpu="2"), "n1")
    s.on_pod(raw)
    await step(s)
    assert parse_pod(raw).uid not in s.table.nominated
    await write_reports(s.reporter)
    [patch] = status_patches(writer)
    assert patch["nominatedNodeName"] is None and "Insufficient cpu" in patch["conditions"][0]["message"]


def test_a_repeated_failure_still_clears_the_nomination_without_a_second_event() -> None:
    """The event of an unchanged message is held back for ``repeat_after``; the nomination's clear is not."""
    clock = Clock()
    reporter = Reporter(None, None, "test", clock=clock)
    info = parse_pod(pod("p"))
    message = "0/1 nodes are available: 1 Insufficient cpu."
    assert reporter.failed(info, message, "Unschedulable", "s")
    assert reporter.backlog == 2  # the event and the condition
    assert not reporter.failed(info, message, "Unschedulable", "s")
    assert reporter.failed(info, message, "Unschedulable", "s", clear_nomination=True)
    assert reporter.backlog == 3  # the status patch alone


@pytest.mark.parametrize("flight", [SUCCESS, SKIP])
async def test_the_nominated_node_is_written_before_a_prebind_that_works(flight: Status) -> None:
    """kube's order: the nomination, then PreBind's work (and the bind after it)."""
    writer, binder = FakeWriter(), Binder()
    pre_binder = PreBinder(writer, flight)
    s = _with_pre_binder(binder, writer, lambda args, handle: pre_binder)
    s.on_node(node("n1"))
    s.on_pod(pod("p"))
    await step(s)
    binder.gate.set()
    await s.drain()
    if flight.success:
        assert pre_binder.seen == [[STATUS]] and writer.bodies[0] == {"status": {"nominatedNodeName": "n1"}}
        assert writer.urgent == [True]  # on the binds' connections, as the bind that follows
    else:
        assert pre_binder.seen == [[]] and writer.writes == []  # no PreBind work: no nomination written
    assert binder.calls == [("p", "n1")]


async def test_a_pod_already_nominated_to_its_node_is_not_nominated_again() -> None:
    writer, binder = FakeWriter(), Binder()
    s = _with_pre_binder(binder, writer, lambda args, handle: PreBinder(writer, SUCCESS))
    s.on_node(node("n1"))
    s.on_pod(nominated(pod("p"), "n1"))
    await step(s)
    binder.gate.set()
    await s.drain()
    assert writer.writes == [] and binder.calls == [("p", "n1")]


async def test_a_pre_flight_error_fails_the_binding_cycle_naming_the_plugin() -> None:
    writer, binder = FakeWriter(), Binder()
    flight = Status(Code.ERROR, ('no pod volume found for node "n1"',))
    s = _with_pre_binder(binder, writer, lambda args, handle: PreBinder(writer, flight))
    s.on_node(node("n1"))
    raw = pod("p")
    s.on_pod(raw)
    await step(s)
    await s.drain()
    assert binder.calls == [] and not s.table.is_assumed(parse_pod(raw).uid) and s.queue.backoff_len == 1
    await write_reports(s.reporter)
    [patch] = status_patches(writer)
    assert patch["conditions"][0]["message"] == (
        'running PreBindPreFlight "PreBinder": no pod volume found for node "n1"'
    )


def _with_pre_binder(binder: Binder, writer: FakeWriter, factory: Any, clock: Clock | None = None) -> Scheduler:
    """The default profile with ``PreBinder`` (made by ``factory``) added at PreBind."""
    config = {
        "profiles": [{"schedulerName": "crane-scheduler", "plugins": {"preBind": {"enabled": [{"name": "PreBinder"}]}}}]
    }
    return scheduler_with(binder, clock or Clock(), writer, config, {"PreBinder": factory})


async def test_a_bind_failing_after_the_nomination_was_written_clears_it_before_the_informer_showed_it() -> None:
    writer, binder = FakeWriter(), Binder(Status(Code.ERROR, ("connection reset",)))
    s = _with_pre_binder(binder, writer, lambda args, handle: PreBinder(writer, SUCCESS))
    s.on_node(node("n1"))
    raw = pod("p")
    s.on_pod(raw)
    await step(s)
    binder.gate.set()
    await s.drain()
    assert parse_pod(raw).uid not in s.table.nominated
    await write_reports(s.reporter)
    statuses = status_patches(writer)
    assert [status.get("nominatedNodeName", "-") for status in statuses] == ["n1", None]


async def test_preemption_without_a_candidate_clears_the_nomination_with_the_condition_in_one_patch() -> None:
    writer = FakeWriter()
    s = scheduler_with(Binder(), Clock(), writer)
    s.on_node(node("n1", cpu="1"))
    raw = nominated(pod("p", cpu="2"), "n1")  # more than the node has: no victim can make room
    s.on_pod(raw)
    await step(s)
    assert parse_pod(raw).uid not in s.table.nominated
    await write_reports(s.reporter)
    [patch] = status_patches(writer)
    assert patch["nominatedNodeName"] is None
    assert "preemption: 0/1 nodes are available" in patch["conditions"][0]["message"]


async def test_a_nomination_the_api_refused_is_not_kept_in_memory() -> None:
    """The write was refused (its term ended): the pod must not stay nominated here, counted against other pods
    on that node, while nothing in the API says so."""
    writer, binder = FakeWriter([Reply(REFUSED, "leadership term ended")]), Binder()
    seen: list[bool] = []
    s: Scheduler | None = None

    class Probe(PreBinder):
        async def pre_bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
            assert s is not None
            seen.append(pod.uid in s.table.nominated)
            return SUCCESS

    s = _with_pre_binder(binder, writer, lambda args, handle: Probe(writer, SUCCESS))
    s.on_node(node("n1"))
    s.on_pod(pod("p"))
    await step(s)
    binder.gate.set()
    await s.drain()
    assert writer.writes == [STATUS] and seen == [False]


class HeldPatches(FakeWriter):
    """Holds each failure's status patch (a condition, no nomination) until ``release``; records, per nomination
    written, whether the held patches had been answered by then."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.nominated_after_release: list[bool] = []

    async def write(self, method: str, path: str, body: Any, term: Any, *args: Any, **kwargs: Any) -> Reply:
        status = body.get("status", {}) if isinstance(body, dict) else {}
        if status.get("nominatedNodeName"):
            self.nominated_after_release.append(self.release.is_set())
        elif "conditions" in status:
            self.holding.set()
            await self.release.wait()
        return await super().write(method, path, body, term, *args, **kwargs)


async def test_the_nomination_waits_for_a_failures_status_patch_still_on_its_way() -> None:
    """The failure's patch (which clears the nomination) is in the writer when the retry's PreBind starts: written
    after the retry's nomination, it would clear it while PreBind works; the nomination goes once it was answered."""
    writer, binder, clock = HeldPatches(), Binder(Status(Code.ERROR, ("connection reset",))), Clock()
    s = _with_pre_binder(binder, writer, lambda args, handle: PreBinder(writer, SUCCESS), clock)
    s.on_node(node("n1"))
    s.on_pod(pod("p"))
    await step(s)
    binder.gate.set()
    await s.drain()  # nominated to n1, then failed: its patch clears the nomination
    stopping = asyncio.Event()
    reports = asyncio.create_task(s.reporter.run(stopping))
    await writer.holding.wait()  # that patch is on its way
    binder.outcome = SUCCESS
    clock.now += 10  # past the backoff
    await step(s)  # the retry: placed on n1 again, PreBind to work
    writer.release.set()
    await s.drain()
    stopping.set()
    s.reporter.close()
    await reports
    assert writer.nominated_after_release == [False, True]
    statuses = status_patches(writer)
    assert [status.get("nominatedNodeName", "-") for status in statuses] == ["n1", None, "n1"]
    assert binder.calls == [("p", "n1"), ("p", "n1")]


async def test_a_preemptors_nomination_waits_for_its_older_status_patch_still_on_its_way() -> None:
    """The pod's last failure patch is in the writer when preemption nominates it: written before it, the
    nomination and its newer condition would be overwritten by the older patch (kube's one call per object at a
    time)."""
    writer, clock = HeldPatches(), Clock()
    s = scheduler_with(Binder(), clock, writer)
    handle = s.profiles["crane-scheduler"].handle
    assert handle is not None
    handle.writer = writer.as_writer()  # preemption's own writes (``__main__`` sets it so)
    s.on_node(node("n1", cpu="1"))
    high = pod("high", cpu="1", priority=1000, node_name="n1")
    s.on_pod(high)
    s.on_pod(pod("vip", cpu="1", priority=100))
    await step(s)  # nothing it may preempt: PodScheduled=False, held in the writer
    stopping = asyncio.Event()
    reports = asyncio.create_task(s.reporter.run(stopping))
    await writer.holding.wait()
    s.on_pod_deleted(high)
    s.on_pod(pod("low", cpu="1", priority=1, node_name="n1"))
    clock.now += 10
    await step(s)  # now it preempts "low": its nomination waits for the held patch
    plugin = s.profiles["crane-scheduler"].plugins["DefaultPreemption"]
    await writer.evicting.wait()  # the preemption's calls run (the victim's eviction does not wait)
    writer.release.set()
    await plugin.drain()  # type: ignore[attr-defined]
    stopping.set()
    s.reporter.close()
    await reports
    assert writer.nominated_after_release == [True]


async def test_a_condition_the_plugin_writes_itself_drops_the_older_patch_still_queued() -> None:
    """Preemption writes the attempt's condition with the nomination: the pod's older patch still queued is not
    sent after it, and dropping it does not release the repeat hold of the event that was written."""
    writer, clock = FakeWriter(), Clock()
    reporter = Reporter(writer.as_writer(), None, "test", clock=clock)
    info = parse_pod(pod("p"))
    message = "0/1 nodes are available: 1 Insufficient cpu."
    assert reporter.failed(info, message, "Unschedulable", "s")  # the event and the condition, queued
    reporter.condition_claimed(info.uid, "Unschedulable", message)  # preemption's own patch carries it
    await write_reports(reporter)
    assert [w for w in writer.writes if w == STATUS] == []
    assert not reporter.failed(info, message, "Unschedulable", "s")  # the same event, held back as before


async def test_a_prebind_failing_after_the_nomination_was_written_clears_it() -> None:
    """The nomination went before PreBind; PreBind fails: the failure's patch clears it (kube's
    handleBindingCycleError with clearNominatedNode)."""
    writer, binder = FakeWriter(), Binder()

    class Failing(PreBinder):
        async def pre_bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
            return Status(Code.ERROR, ("claim write failed",))

    s = _with_pre_binder(binder, writer, lambda args, handle: Failing(writer, SUCCESS))
    s.on_node(node("n1"))
    raw = pod("p")
    s.on_pod(raw)
    await step(s)
    await s.drain()
    assert binder.calls == [] and parse_pod(raw).uid not in s.table.nominated
    await write_reports(s.reporter)
    statuses = status_patches(writer)
    assert [status.get("nominatedNodeName", "-") for status in statuses] == ["n1", None]
