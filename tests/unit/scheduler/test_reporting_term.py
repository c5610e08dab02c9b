"""FailedScheduling events and condition patches belong to the leadership term they were queued in: when it ends,
the queued ones are dropped at once (like the binds). A Scheduled event reports a bind that happened: it is kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from crane_scheduler.metrics import SchedulerMetrics
from crane_scheduler.podinfo import parse_pod
from crane_scheduler.reporting import Reporter
from crane_scheduler.writer.protocol import REFUSED, SUPERSEDED, Reply
from crane_shared.leader import Term
from tests.support.scheduler import FakeWriter, write_reports


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"schedulerName": "crane-scheduler", "containers": [{"name": "c", "image": "pause"}]},
    }


def _dropped(metrics: SchedulerMetrics, kind: str) -> float:
    return float(metrics.reports.labels(kind, "dropped")._value.get())


async def test_failures_queued_in_a_lost_term_are_dropped_at_once_and_never_written() -> None:
    fake = FakeWriter()
    writer = fake.as_writer()
    metrics = SchedulerMetrics(CollectorRegistry())
    reporter = Reporter(writer, None, "test", metrics=metrics)
    reporter.term = term = Term()
    pod = parse_pod(_pod("stuck"))
    assert reporter.failed(pod, "0/3 nodes are available", "Unschedulable", "crane-scheduler")
    reporter.scheduled("ns", "bound", "uid-bound", "n1", "crane-scheduler")
    assert reporter.backlog == 3  # FailedScheduling, the PodScheduled condition, Scheduled
    term.lost.set()
    assert reporter.drop_lost() == 2
    assert reporter.backlog == 1  # the Scheduled event of a bind that happened
    assert (_dropped(metrics, "failed"), _dropped(metrics, "condition"), _dropped(metrics, "scheduled")) == (
        1,
        1,
        0,
    )
    await write_reports(reporter)
    assert fake.writes == ["POST /apis/events.k8s.io/v1/namespaces/ns/events"]  # the Scheduled event only
    # the dropped failure was never written: the next term reports the same message again at once
    reporter.term = Term()
    assert reporter.failed(pod, "0/3 nodes are available", "Unschedulable", "crane-scheduler")


async def test_a_failure_of_the_new_term_is_kept_and_written() -> None:
    fake = FakeWriter()
    writer = fake.as_writer()
    reporter = Reporter(writer, None, "test")
    reporter.term = old = Term()
    reporter.failed(parse_pod(_pod("a")), "no fit", "Unschedulable", "crane-scheduler")
    old.lost.set()
    reporter.term = Term()  # leading again: a new term
    reporter.failed(parse_pod(_pod("b")), "no fit", "Unschedulable", "crane-scheduler")
    assert reporter.drop_lost() == 2 and reporter.backlog == 2
    await write_reports(reporter)
    assert sorted(fake.writes) == [
        "PATCH /api/v1/namespaces/ns/pods/b/status",
        "POST /apis/events.k8s.io/v1/namespaces/ns/events",
    ]


async def test_a_failure_the_writer_refused_after_its_term_ended_counts_as_dropped() -> None:
    fake = FakeWriter(answers=[-1, -1])  # REFUSED: the term ended while the writes were in the writer
    metrics = SchedulerMetrics(CollectorRegistry())
    reporter = Reporter(fake.as_writer(), None, "test", metrics=metrics)
    reporter.term = Term()
    reporter.failed(parse_pod(_pod("late")), "no fit", "Unschedulable", "crane-scheduler")
    await write_reports(reporter)
    assert len(fake.writes) == 2  # tried once each, not retried
    assert (_dropped(metrics, "failed"), _dropped(metrics, "condition")) == (1, 1)


async def test_a_condition_a_plugin_writes_itself_is_not_patched_again_but_its_event_is_written() -> None:
    """Preemption writes the attempt's PodScheduled=False with the nomination (kube's updatePod, one call): the
    reporter writes only the FailedScheduling event for that attempt, and patches the next attempt's again."""
    fake = FakeWriter()
    reporter = Reporter(fake.as_writer(), None, "test", repeat_after=0.0)
    pod = parse_pod(_pod("vip"))
    reporter.condition_claimed(pod.uid, "Unschedulable", "0/3 nodes are available: 3 Insufficient cpu.")
    reporter.failed(pod, "0/3 nodes are available: 3 Insufficient cpu.", "Unschedulable", "crane-scheduler")
    await write_reports(reporter)
    assert fake.writes == ["POST /apis/events.k8s.io/v1/namespaces/ns/events"]
    # the claim was for that attempt only: a later failure (the cached pod shows no condition yet) is patched
    reporter.failed(pod, "0/3 nodes are available: 3 Insufficient cpu.", "Unschedulable", "crane-scheduler")
    await write_reports(reporter)
    assert fake.writes[1:] == [
        "POST /apis/events.k8s.io/v1/namespaces/ns/events",
        "PATCH /api/v1/namespaces/ns/pods/vip/status",
    ]


async def test_a_claim_for_another_message_does_not_hold_back_the_condition() -> None:
    fake = FakeWriter()
    reporter = Reporter(fake.as_writer(), None, "test")
    pod = parse_pod(_pod("vip"))
    reporter.condition_claimed(pod.uid, "Unschedulable", "0/3 nodes are available: 3 Insufficient cpu.")
    reporter.failed(pod, "0/3 nodes are available: 3 node(s) had untolerated taint.", "Unschedulable", "crane")
    await write_reports(reporter)
    assert sorted(fake.writes) == [
        "PATCH /api/v1/namespaces/ns/pods/vip/status",
        "POST /apis/events.k8s.io/v1/namespaces/ns/events",
    ]


async def test_a_condition_patch_still_queued_when_the_bind_starts_is_not_sent() -> None:
    """kube's API dispatcher lets a pod's binding overwrite its queued status patch: sent after the bind, the patch
    would leave the bound pod PodScheduled=False (and out of a new leader's recovery of Scheduled events)."""
    fake = FakeWriter()
    metrics = SchedulerMetrics(CollectorRegistry())
    reporter = Reporter(fake.as_writer(), None, "test", metrics=metrics)
    pod = parse_pod(_pod("member"))
    assert reporter.failed(pod, "waiting for 3 more members", "Unschedulable", "crane-scheduler")
    reporter.superseded(pod.uid)  # its gang completed: the bind starts before the reporter got to the patch
    await write_reports(reporter)
    assert fake.writes == ["POST /apis/events.k8s.io/v1/namespaces/ns/events"]  # the FailedScheduling event only
    assert metrics.reports.labels("condition", "superseded")._value.get() == 1
    # the bind failed and so did the next attempt, same message: its condition was never written, so it is now
    assert reporter.failed(pod, "waiting for 3 more members", "Unschedulable", "crane-scheduler")
    # also when that failure comes before the superseded patch's turn (a bind failing at once)
    reporter.superseded(pod.uid)
    assert reporter.failed(pod, "waiting for 3 more members", "Unschedulable", "crane-scheduler")
    await write_reports(reporter)
    assert fake.writes[1:] == [
        "POST /apis/events.k8s.io/v1/namespaces/ns/events",
        "POST /apis/events.k8s.io/v1/namespaces/ns/events",
        "PATCH /api/v1/namespaces/ns/pods/member/status",
    ]


async def test_a_pod_seen_bound_or_a_newer_failure_supersedes_a_queued_condition_patch() -> None:
    fake = FakeWriter()
    reporter = Reporter(fake.as_writer(), None, "test", repeat_after=0.0)
    bound, retried = parse_pod(_pod("bound")), parse_pod(_pod("retried"))
    reporter.failed(bound, "no fit", "Unschedulable", "crane-scheduler")
    reporter.forget(bound.uid)  # the informer saw it bound (by another replica, or our bind whose reply was lost)
    reporter.failed(retried, "0/3 nodes: 3 Insufficient cpu.", "Unschedulable", "crane-scheduler")
    reporter.failed(retried, "0/3 nodes: 3 Insufficient memory.", "Unschedulable", "crane-scheduler")
    await write_reports(reporter)
    patches = [(w, b) for w, b in zip(fake.writes, fake.bodies, strict=True) if w.startswith("PATCH")]
    assert [w for w, _ in patches] == ["PATCH /api/v1/namespaces/ns/pods/retried/status"]  # once: the newer one
    assert patches[0][1]["status"]["conditions"][0]["message"] == "0/3 nodes: 3 Insufficient memory."
    assert len(fake.writes) == 4  # three FailedScheduling events and that patch


async def test_a_condition_patch_the_writer_refused_as_superseded_by_the_bind_is_counted_so_and_not_held_back() -> None:
    """The writer process refuses a pod's status patch that its bind overtook there (``SUPERSEDED``): counted apart
    from the term's drops, and the same failure later is written again (its condition never was)."""
    fake = FakeWriter(answers=[201, Reply(REFUSED, SUPERSEDED)])  # the FailedScheduling event, then the patch
    metrics = SchedulerMetrics(CollectorRegistry())
    reporter = Reporter(fake.as_writer(), None, "test", metrics=metrics)
    reporter.term = Term()
    pod = parse_pod(_pod("overtaken"))
    reporter.failed(pod, "no fit", "Unschedulable", "crane-scheduler")
    await write_reports(reporter)
    assert metrics.reports.labels("condition", "superseded")._value.get() == 1
    assert _dropped(metrics, "condition") == 0
    assert reporter.failed(pod, "no fit", "Unschedulable", "crane-scheduler")


async def test_a_condition_patch_is_no_longer_wanted_once_its_pods_bind_starts_while_it_is_being_written() -> None:
    """The writer sends a status patch refused for its term's deadline again once the term was renewed: it asks
    first whether the patch is still wanted. A bind that started while the patch was in the writer, or a newer
    failure, says no; a patch nothing overtook stays wanted until its write returns."""
    bound, alone, retried = (parse_pod(_pod(name)) for name in ("bound", "alone", "retried"))
    seen: list[tuple[str, bool]] = []

    def meanwhile(path: str, body: Any, wanted: Callable[[], bool] | None) -> None:
        """While a patch is in the writer, ``bound``'s bind starts, and a newer failure of ``retried`` comes."""
        if path.endswith("/status"):
            pod, message = path.split("/")[-2], body["status"]["conditions"][0]["message"]
            assert wanted is not None and wanted(), pod  # wanted while nothing overtook it
            if pod == "bound":
                reporter.superseded(bound.uid)
            elif pod == "retried" and message == "no fit":
                reporter.failed(retried, "a newer failure", "Unschedulable", "crane-scheduler")
            seen.append((f"{pod}: {message}", wanted()))

    fake = FakeWriter()
    fake.during = meanwhile
    reporter = Reporter(fake.as_writer(), None, "test", repeat_after=0.0)
    reporter.term = Term()
    reporter.failed(bound, "no fit", "Unschedulable", "crane-scheduler")
    await write_reports(reporter)
    reporter.failed(retried, "no fit", "Unschedulable", "crane-scheduler")
    await write_reports(reporter)
    reporter.failed(alone, "no fit", "Unschedulable", "crane-scheduler")
    await write_reports(reporter)
    assert seen == [
        ("bound: no fit", False),
        ("retried: no fit", False),
        ("retried: a newer failure", True),
        ("alone: no fit", True),
    ]
    assert reporter._conditions == {}  # no answered patch's token left behind
