"""Scheduling queue: priority order, backoff, unschedulable pods and the events that move them."""

from __future__ import annotations

from crane_scheduler.framework import ClusterEvent
from crane_scheduler.internal.queue import MIN_TIMED_RETRY, SchedulingQueue
from crane_scheduler.plugins.queuesort import PrioritySort
from crane_scheduler.podinfo import parse_pod
from tests.support.scheduler import pod


def queue(**kw: object) -> SchedulingQueue:
    return SchedulingQueue(PrioritySort().sort_key, **kw)  # type: ignore[arg-type]


def names(q: SchedulingQueue, now: float) -> list[str]:
    out = []
    while (qp := q.pop(now)) is not None:
        out.append(qp.pod.name)
    return out


def test_higher_priority_first_then_arrival_order() -> None:
    q = queue()
    q.add(parse_pod(pod("low-early", priority=0)), now=1)
    q.add(parse_pod(pod("high", priority=100)), now=2)
    q.add(parse_pod(pod("low-late", priority=0)), now=3)
    q.add(parse_pod(pod("mid", priority=10)), now=4)
    assert names(q, now=5) == ["high", "mid", "low-early", "low-late"]


def test_backoff_doubles_from_one_second_and_caps_at_ten() -> None:
    q = queue()
    assert [q.backoff_duration(a) for a in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_failed_pod_waits_out_its_backoff() -> None:
    q = queue()
    q.add(parse_pod(pod("p")), now=0)
    qp = q.pop(now=0)
    assert qp is not None and qp.attempts == 1
    q.add_backoff(qp, now=10)
    assert q.pop(now=10.9) is None
    again = q.pop(now=11)
    assert again is not None and again.attempts == 2
    q.add_backoff(again, now=20)
    assert q.pop(now=21.5) is None and q.pop(now=22) is not None


def test_unschedulable_pod_moves_only_on_an_event_its_rejector_registered() -> None:
    events = {"TaintToleration": ClusterEvent.NODE_ADD | ClusterEvent.NODE_UPDATE, "NodeResourcesFit": ClusterEvent.ALL}
    q = queue(events_of=lambda plugin: events[plugin])
    q.add(parse_pod(pod("tainted")), now=0)
    q.add(parse_pod(pod("full")), now=0)
    first, second = q.pop(0), q.pop(0)
    assert first and second
    q.add_unschedulable(first, frozenset({"TaintToleration"}), now=0)
    q.add_unschedulable(second, frozenset({"NodeResourcesFit"}), now=0)
    q.on_event(ClusterEvent.POD_DELETE)
    assert names(q, now=5) == ["full"]  # backoff (1 s) is over
    q.on_event(ClusterEvent.NODE_ADD)
    assert names(q, now=5) == ["tainted"]


def test_unschedulable_pod_moved_during_its_backoff_waits_in_backoffq() -> None:
    q = queue(pop_from_backoff=False)
    q.add(parse_pod(pod("p")), now=0)
    qp = q.pop(0)
    assert qp
    q.add_unschedulable(qp, frozenset({"X"}), now=10)
    q.on_event(ClusterEvent.NODE_ADD)
    assert q.pop(now=10.5) is None
    assert q.backoff_len == 1
    assert names(q, now=11) == ["p"]


def test_a_pod_moved_during_its_backoff_is_popped_once_activeq_is_empty() -> None:
    """kube's SchedulerPopFromBackoffQ: a pod an event moved while it backs off is tried when nothing else waits
    in activeQ (behind pods that do), the one whose backoff ends first first; a pod backing off after an error
    (kube's podErrorBackoffQ) waits its backoff out."""
    q = queue()
    for name in ("early", "late", "error"):
        q.add(parse_pod(pod(name)), now=0)
    early, late, error = q.pop(0), q.pop(0), q.pop(0)
    assert early and late and error
    q.add_unschedulable(late, frozenset({"X"}), now=10.2)
    q.add_unschedulable(early, frozenset({"X"}), now=10.1)
    q.add_backoff(error, now=10)
    q.add(parse_pod(pod("new")), now=10.3)
    q.on_event(ClusterEvent.NODE_ADD)
    assert names(q, now=10.5) == ["new", "early", "late"]
    assert q.backoff_len == 1 and q.pop(now=10.99) is None
    assert names(q, now=11) == ["error"]


def test_unschedulable_pods_are_retried_after_five_minutes_without_events() -> None:
    q = queue()
    q.add(parse_pod(pod("p")), now=0)
    qp = q.pop(0)
    assert qp
    q.add_unschedulable(qp, frozenset({"X"}), now=0)
    q.flush_unschedulable(now=299)
    assert q.pop(299) is None
    q.flush_unschedulable(now=301)
    assert names(q, now=301) == ["p"]


def test_updated_unschedulable_pod_is_retried_but_status_only_updates_are_not() -> None:
    q = queue()
    raw = pod("p")
    q.add(parse_pod(raw), now=0)
    qp = q.pop(0)
    assert qp
    q.add_unschedulable(qp, frozenset({"X"}), now=0)
    q.update(parse_pod({**raw, "status": {"conditions": [{"type": "PodScheduled", "status": "False"}]}}), now=5)
    assert q.pop(5) is None
    q.update(parse_pod({**raw, "spec": {**raw["spec"], "tolerations": [{"operator": "Exists"}]}}), now=6)
    popped = q.pop(6)
    assert popped is not None and popped.pod.tolerations


def test_deleted_pod_leaves_every_queue() -> None:
    q = queue()
    p = parse_pod(pod("p"))
    q.add(p, now=0)
    q.delete(p.uid)
    assert q.pop(0) is None and len(q) == 0


def test_priority_change_reorders_the_active_queue() -> None:
    q = queue()
    a, b = pod("a"), pod("b")
    q.add(parse_pod(a), now=0)
    q.add(parse_pod(b), now=1)
    q.update(parse_pod({**b, "spec": {**b["spec"], "priority": 5}}), now=2)
    assert names(q, now=3) == ["b", "a"]


def test_a_gated_pod_stays_unschedulable_until_activated_once_ungated() -> None:
    """kube's PreEnqueue: events, the backoff and the 5-minute flush do not move a gated pod; ``activate`` of a
    gated pod leaves it where it is, once ungated it moves."""
    held: set[str] = set()
    q = queue(gated=lambda p: p.name in held)
    q.add(parse_pod(pod("preemptor")), now=0)
    qp = q.pop(0)
    assert qp is not None
    q.add_unschedulable(qp, frozenset({"NodeResourcesFit"}), now=0)
    held.add("preemptor")
    q.on_event(ClusterEvent.POD_DELETE)
    assert q.pop(now=5) is None
    q.flush_unschedulable(now=1000)
    assert q.pop(now=1000) is None
    assert not q.activate(qp.pod.uid)
    assert "preemptor" in [p.pod.name for p in q.unschedulable.values()]
    held.clear()
    assert q.activate(qp.pod.uid)
    assert names(q, now=1000) == ["preemptor"]


def test_a_pod_gated_in_backoff_waits_among_the_unschedulable() -> None:
    held: set[str] = set()
    q = queue(gated=lambda p: p.name in held)
    q.add(parse_pod(pod("p")), now=0)
    qp = q.pop(0)
    assert qp is not None
    held.clear()
    q.add_backoff(qp, now=0)
    held.add("p")
    assert q.pop(now=5) is None and qp.pod.uid in q.unschedulable


def test_a_gated_pod_is_not_popped_early_from_backoffq() -> None:
    """A pod gated after an event moved it to backoffQ goes back among the unschedulable pods instead."""
    held: set[str] = set()
    q = queue(gated=lambda p: p.name in held)
    q.add(parse_pod(pod("preemptor")), now=0)
    qp = q.pop(0)
    assert qp is not None
    q.add_unschedulable(qp, frozenset({"X"}), now=10)
    q.on_event(ClusterEvent.NODE_ADD)
    q.flush_backoff(now=10)
    q._apply_events(now=10)
    assert q.backoff_len == 1
    held.add("preemptor")
    assert q.pop(now=10.5) is None
    assert q.backoff_len == 0 and qp.pod.uid in q.unschedulable


def test_a_pod_gated_on_arrival_waits_until_an_update_or_event_ungates_it() -> None:
    """kube's PreEnqueue on arrival (DynamicResources: the resourceclaim controller has not named the pod's claim
    yet): no attempt, no backoff; the pod status update that names the claim moves it straight to activeQ."""
    q = queue(gated=lambda p: not (p.raw.get("status") or {}).get("resourceClaimStatuses"))
    raw = pod("trainer", spec={"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "tpl"}]})
    q.add(parse_pod(raw), now=0)
    assert q.pop(now=0) is None
    q.on_event(ClusterEvent.RESOURCE_CLAIM_CHANGE)  # the claim appears first: still gated
    assert q.pop(now=1) is None
    named = {**raw, "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "trainer-gpu-x"}]}}
    q.update(parse_pod(named), now=2)
    assert names(q, now=2) == ["trainer"]


def test_a_refusal_with_a_time_retries_the_pod_then_without_any_event() -> None:
    """A queueing hint with a time: the pod comes back when its refusal could lift, not at the 5-minute flush;
    an event-free pod without a time stays."""
    q = queue(max_unschedulable=1e9)
    q.add(parse_pod(pod("timed")), now=0)
    q.add(parse_pod(pod("events-only")), now=0)
    timed, other = q.pop(0), q.pop(0)
    assert timed and other
    q.add_unschedulable(timed, frozenset({"Dynamic"}), now=10, retry_after=7.5)
    q.add_unschedulable(other, frozenset({"Dynamic"}), now=10)
    assert q.next_timed_retry() == 17.5
    assert q.pop(now=17.4) is None
    assert names(q, now=17.5) == ["timed"]
    assert "events-only" in [qp.pod.name for qp in q.unschedulable.values()]
    assert q.next_timed_retry() is None


def test_a_timed_retry_is_bounded_below_and_a_newer_attempt_replaces_it() -> None:
    q = queue()
    q.add(parse_pod(pod("p")), now=0)
    qp = q.pop(0)
    assert qp
    q.add_unschedulable(qp, frozenset({"Dynamic"}), now=10, retry_after=0.0)  # about to lift: not a busy loop
    assert q.next_timed_retry() == 10 + MIN_TIMED_RETRY
    again = q.pop(now=11)
    assert again is not None and again.pod.name == "p"
    q.add_unschedulable(again, frozenset({"Dynamic"}), now=11, retry_after=None)  # refused again, no time now
    assert q.pop(now=100) is None and q.next_timed_retry() is None


def test_a_gated_pod_is_not_retried_by_its_time() -> None:
    gated = {"p"}
    q = queue(gated=lambda p: p.name in gated)
    q.add(parse_pod(pod("p")), now=0)
    qp = q.take(next(iter(q.unschedulable)), 0)
    assert qp
    q.add_unschedulable(qp, frozenset({"Dynamic"}), now=0, retry_after=2)
    assert q.pop(now=5) is None and "p" in [p.pod.name for p in q.unschedulable.values()]
