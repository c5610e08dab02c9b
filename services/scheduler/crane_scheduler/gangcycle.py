"""The gang cycle: a pod group placed all or nothing, in one scheduling cycle.

When the loop pops a member of a gang (a pod a ``GangPlugin`` of its profile groups), the other pending members of
its group are taken out of the queue with it and decided one after another (in name order, the reference's queue
order within a group), each decision seeing the members before it assumed (so they see each other: ports,
affinity, spread, load estimates). Then:

- the members placed already (bound or assumed) plus those found places now reach the group's quorum
  (``minMember``): every one found a place is bound (the binds go only while the leadership term is held: the bind
  path checks it), those that did not fit wait as any unschedulable pod does;
- else none is kept: every assumption is undone (Unreserve, forget) before the loop takes the next pod, so a
  waiting gang holds no capacity another pod or gang could use, and two gangs never hold parts of the cluster
  while waiting for each other. The members wait among the unschedulable pods (the ones that fit with the
  reference's ``PodGroup ... gets rejected due to Pod ... is unschedulable even after PostFilter``); they are
  retried on the cluster events their rejectors registered, when a sibling arrives (its own gang cycle takes
  them), or when the plugin says (backoff, timeout).

A member whose bind fails after the quorum was met: the members bound stay bound (Kubernetes has no unbind); the
failed one goes back to the queue with backoff, and at its next attempt the bound members count towards the
quorum, so it is placed as soon as it fits, alone, ahead of later groups (the queue orders groups by creation).
A leader that dies between binds leaves the same state to the next leader, which recovers it the same way.

Gang members never run PostFilter (preemption for a whole gang is not supported): their FailedScheduling message
says so rather than leaving it unsaid.

A group-level queueing hint (``futile_wakeups``): a cluster event that would move a waiting member back to the
queue leaves it waiting while its group could not be placed even if every free resource were its own (too few
members exist for the quorum, or the live nodes' free room holds fewer of its smallest member than the quorum still
needs). Such a retry could only fail again; skipping it is what a hint answering ``QueueSkip`` does in kube. Without
it, every pod deleted from a full cluster (a finished gang's pods, one watch event each) retried every waiting gang.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import numpy as np

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework.interface import GANG, GANG_MEMBERS, GangPlugin
from crane_scheduler.framework.runtime import Profile
from crane_scheduler.framework.types import CycleState, Diagnosis, QueuedPod, Status
from crane_scheduler.gangrules import gang_of, no_preemption, quorum_met, quorum_out_of_reach
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import PODS, PodInfo
from crane_scheduler.schedule_one import CycleHost


def smallest_request(pods: Iterable[PodInfo]) -> dict[str, int]:
    """Per resource, the least any of ``pods`` asks (0 where one asks none): a pod asking this fits wherever any
    of them does."""
    pods = list(pods)
    names = set().union(*(p.requests for p in pods)) if pods else set()
    return {r: least for r in names if (least := min(p.requests.get(r, 0) for p in pods)) > 0}


def member_slots(table: NodeTable, request: Mapping[str, int]) -> int:
    """How many pods asking ``request`` the live nodes' free room holds in all (each node's free native resources
    and pod count divided by the request): no plugin lets more of them be placed now, so a gang needing more
    members than this cannot be placed, whatever else it asks. Extended resources do not bound it: a node that
    does not advertise one may still give it (DRA's extended resources, a resource NodeResourcesFit ignores)."""
    rows = table.live_rows()
    if not len(rows):
        return 0
    slots = table.alloc[rows, table.resources[PODS]] - table.pod_count[rows]
    for res, want in request.items():
        if res == PODS or not _native(res):
            continue
        col = table.resources.get(res)
        if col is None:  # no node has it
            return 0
        slots = np.minimum(slots, (table.alloc[rows, col] - table.requested[rows, col]) // want)
    return int(np.maximum(slots, 0).sum())


def _native(resource: str) -> bool:
    """kube's native resources (``v1helper.IsNativeResource``): no domain, or the ``kubernetes.io/`` one."""
    return "/" not in resource or resource.startswith("kubernetes.io/")


def futile_wakeups(
    table: NodeTable,
    index: GangIndex,
    pending: Mapping[str, PodInfo],
    gangs: Mapping[str, tuple[GangPlugin, ...]],
    pods: Iterable[PodInfo],
) -> set[str]:
    """The uids among ``pods`` (waiting pods a cluster event would move back to the queue) whose group could not
    be placed now even with every free resource (the group-level hint, see the module's docstring): too few
    members exist for the quorum (a new member retries the group through its own gang cycle), or fewer of its
    smallest member fit the free room than the quorum still needs. A group its plugin does not know, or whose
    quorum is met already, is never held."""
    verdicts: dict[str, bool] = {}
    slots: dict[tuple[tuple[str, int], ...], int] = {}
    held: set[str] = set()
    for pod in pods:
        found = gang_of(gangs.get(pod.scheduler_name, ()), pod)
        if found is None:
            continue
        plugin, gang = found
        key = index_key(plugin.name, gang)
        verdict = verdicts.get(key)
        if verdict is None:
            placed = index.placed.get(key, set())
            needed = plugin.quorum(gang) - len(placed)
            members = [p for uid in index.pending.get(key, ()) if uid not in placed and (p := pending.get(uid))]
            if plugin.quorum(gang) <= 0 or needed <= 0:
                verdict = False
            elif len(members) < needed:
                verdict = True
            else:
                request = tuple(sorted(smallest_request(members).items()))
                if request not in slots:
                    slots[request] = member_slots(table, dict(request))
                verdict = slots[request] < needed
            verdicts[key] = verdict
        if verdict:
            held.add(pod.uid)
    return held


class GangHost(CycleHost, Protocol):
    """What the gang cycle needs from the scheduler: the cycle's public steps, and the group index."""

    gang_index: GangIndex


def index_key(plugin: str, gang: str) -> str:
    """A group's key in ``GangIndex``: its plugin's name with its name, so two plugins' groups of one name (a
    Coscheduling PodGroup and a 1.37 PodGroup ``ns/job``) stay two gangs."""
    return f"{plugin} {gang}"


class GangIndex:
    """Group (``index_key``) -> the uids of its pending pods and of its placed ones (bound or assumed), kept up to
    date by the pending set (``IndexedPending``) and the node table's pod hooks, so a gang cycle finds its members
    without walking every pod (at 1,000 gangs of 3 the walk cost more than the decisions)."""

    def __init__(self, gang_of: Callable[[PodInfo], str | None], table: NodeTable, *, gangs: bool = True) -> None:
        """``gangs``: some profile has a gang plugin; without one no pod is in a group, and the table's pod
        hooks (two a pod on the critical path) are not installed."""
        self.gang_of = gang_of
        self.pending: dict[str, set[str]] = {}
        self.placed: dict[str, set[str]] = {}
        self._pending_of: dict[str, str] = {}
        self._placed_of: dict[str, str] = {}
        if not gangs:
            return
        table.pod_added.append(self.placed_set)
        table.pod_assumed.append(lambda pod, node: self.placed_set(pod))
        table.pod_removed.append(self.placed_removed)

    def pending_set(self, pod: PodInfo) -> None:
        _put(self.pending, self._pending_of, pod.uid, self.gang_of(pod))

    def pending_removed(self, uid: str) -> None:
        _put(self.pending, self._pending_of, uid, None)

    def placed_set(self, pod: PodInfo) -> None:
        _put(self.placed, self._placed_of, pod.uid, self.gang_of(pod))

    def placed_removed(self, uid: str) -> None:
        _put(self.placed, self._placed_of, uid, None)


def _put(index: dict[str, set[str]], of: dict[str, str], uid: str, gang: str | None) -> None:
    old = of.get(uid)
    if old == gang:
        return
    if old is not None:
        members = index[old]
        members.discard(uid)
        if not members:
            del index[old]
        del of[uid]
    if gang is not None:
        index.setdefault(gang, set()).add(uid)
        of[uid] = gang


class IndexedPending(dict[str, PodInfo]):
    """The scheduler's pending pods, telling a ``GangIndex`` what comes and goes (the cache only sets and pops)."""

    def __init__(self, index: GangIndex) -> None:
        super().__init__()
        self.index = index

    def __setitem__(self, uid: str, pod: PodInfo) -> None:
        super().__setitem__(uid, pod)
        self.index.pending_set(pod)

    def __delitem__(self, uid: str) -> None:
        super().__delitem__(uid)
        self.index.pending_removed(uid)

    def pop(self, uid: str, *default: Any) -> Any:
        self.index.pending_removed(uid)
        return super().pop(uid, *default)


def group_size(index: GangIndex, key: str) -> int:
    """How many pods the group (``index_key``) has, pending or placed (an assumed pod is both)."""
    pending = index.pending.get(key, set())
    return len(pending) + sum(1 for uid in index.placed.get(key, ()) if uid not in pending)


def members_of(host: GangHost, profile: Profile, key: str, first: PodInfo) -> tuple[list[PodInfo], int]:
    """The group's (``index_key``) other pending members of this profile (not on their way already), in name
    order, and how many of its pods are placed (bound or assumed)."""
    placed = host.gang_index.placed.get(key, set())
    pending = host.pending
    siblings = sorted(
        (
            p
            for uid in host.gang_index.pending.get(key, ())
            if uid != first.uid and uid not in placed and (p := pending.get(uid)) is not None
            if p.scheduler_name == profile.name
        ),
        key=lambda p: p.name,
    )
    return siblings, len(placed)


def schedule_gang(host: GangHost, profile: Profile, qp: QueuedPod, plugin: GangPlugin, gang: str) -> None:
    """One gang cycle from the popped member ``qp`` (see the module's docstring). Holds the popped pod's bind
    slot, handed to the first member's binding task or released here."""
    start = time.perf_counter()
    now = host.clock()
    siblings, placed = members_of(host, profile, index_key(plugin.name, gang), qp.pod)
    quorum = plugin.quorum(gang)
    total = placed + 1 + len(siblings)
    waiting = [qp.pod.uid, *(pod.uid for pod in siblings)]
    if total < quorum:
        # Too few members exist for the quorum (rare: the gate keeps such members out of the queue, but one popped
        # after a sibling was deleted gets here): only the popped one is decided (it hears the plugin's count); the
        # others stay where they wait, with what they heard (no decision per sibling, quadratic in the size).
        siblings = []
    queued = [qp]
    for pod in siblings:
        taken = host.queue.take(pod.uid, now)
        if taken is None:  # pending but not queued (e.g. gated by a running preemption): a fresh entry
            taken = QueuedPod(pod, timestamp=now, initial_attempt=now, attempts=1)
        taken.pod = pod
        queued.append(taken)
    queued.sort(key=lambda m: m.pod.name)  # the reference's queue order within a group (the popped one is often
    # the last to arrive: the member that completed the group)
    assumed: list[tuple[QueuedPod, CycleState, str]] = []
    failed: list[tuple[QueuedPod, CycleState, Diagnosis | Status]] = []
    untried: list[QueuedPod] = []
    for i, member in enumerate(queued):
        # stop deciding once the quorum is out of reach; the gang plugin's own refusals (a group-level verdict,
        # made in PreFilter at no cost) go on, so every member hears its own
        if (
            failed
            and _rejectors(failed[-1][2]) != {plugin.name}
            and quorum_out_of_reach(placed, len(queued), len(failed), quorum)
        ):
            untried = queued[i:]
            break
        state: CycleState = {GANG_MEMBERS: total, GANG: gang}
        result = host.decide(profile, member.pod, state)
        if isinstance(result, ScheduleResult):
            host.table.assume(member.pod, result.node)
            status = profile.run_reserve(state, member.pod, result.node)
            if status.success:
                assumed.append((member, state, result.node))
                continue
            host.table.forget(member.pod.uid)
            failed.append((member, state, status))
        else:
            failed.append((member, state, result))

    wall = time.time()
    if quorum_met(placed, len(assumed), quorum) and host.may_bind():
        plugin.gang_placed(gang, [m.pod.uid for m, _, _ in assumed])
        for k, (member, state, node) in enumerate(assumed):
            host.decisions.record(member.pod, wall, host.table, state, node, "")
            host.start_binding(profile, member, state, node, start, holds_slot=k == 0)
        for member, state, result in failed:
            _fail(host, profile, member, state, result, frozenset(), gang, plugin.name, start, wall)
        _explain(host, gang, quorum, placed, "placed", queued, assumed)
        return

    for member, state, node in reversed(assumed):  # none is kept: the gang holds nothing while it waits
        profile.run_unreserve(state, member.pod, node)
        host.table.forget(member.pod.uid)
    host.release_slot()
    if not host.may_bind():  # the term ended during this cycle: leave the group to the next leader
        for member in queued:
            host.requeue_dropped(member.pod.uid)
        return
    blocker = failed[0][0].pod.name if failed else qp.pod.name
    refused = bool(failed) and all(_rejectors(r) == {plugin.name} for _, _, r in failed)
    wait = plugin.gang_waiting(gang, waiting, blocker, len(assumed), refused, placed, len(untried))
    rejectors = frozenset({plugin.name}).union(*(_rejectors(r) for _, _, r in failed))
    for member, state, result in failed:
        _fail(host, profile, member, state, result, rejectors, gang, plugin.name, start, wall)
    for member, state, _ in assumed:  # found a place, the group did not: kube clears each such member's nomination
        host.decisions.record(member.pod, wall, host.table, state, None, wait.message)
        host.unschedulable(profile, member, rejectors, wait.message, start, clear_nomination=True)
    for member in untried:  # not tried: kept, as kube's pod group cycle keeps a pod's without a result of its own
        host.decisions.record(member.pod, wall, host.table, {}, None, wait.message)
        host.unschedulable(profile, member, rejectors, wait.message, start)
    _explain(host, gang, quorum, placed, "timed out" if wait.timed_out else "waiting", queued, assumed)


def _explain(
    host: GangHost,
    gang: str,
    quorum: int,
    placed: int,
    outcome: str,
    queued: list[QueuedPod],
    assumed: list[tuple[QueuedPod, CycleState, str]],
) -> None:
    """The cycle as ``cranectl explain`` shows it on each member's decision: the members found places (and
    where), those missing and why (each one's own reason, or the group's)."""
    nodes = {m.pod.uid: node for m, _, node in assumed}
    found = [{"pod": m.pod.name, "node": nodes[m.pod.uid]} for m in queued if m.pod.uid in nodes]
    missing = []
    for m in queued:
        decision = host.decisions.get(m.pod.key)
        if m.pod.uid not in nodes:
            missing.append({"pod": m.pod.name, "reason": decision.message if decision is not None else ""})
    summary = {
        "group": gang,
        "minMember": quorum,
        "placedBefore": placed,
        "outcome": outcome,
        "found": found,
        "missing": missing,
    }
    for m in queued:
        decision = host.decisions.get(m.pod.key)
        if decision is not None:
            decision.gang = summary


def _rejectors(result: Diagnosis | Status) -> frozenset[str]:
    if isinstance(result, Diagnosis):
        return frozenset(result.rejectors)
    return frozenset({result.plugin} - {""})


def _fail(
    host: GangHost,
    profile: Profile,
    member: QueuedPod,
    state: CycleState,
    result: Diagnosis | Status,
    extra: frozenset[str],
    gang: str,
    plugin: str,
    start: float,
    wall: float,
) -> None:
    """A member that found no place: its own reason, never a preemption (the group's timeout is what the members
    that fit hear)."""
    if isinstance(result, Diagnosis):
        if result.rejectors - {plugin}:  # the gang plugin's own refusals are not a matter of room
            result.post_filter_msg = no_preemption(gang)
        message = result.message
        host.decisions.record(member.pod, wall, host.table, state, None, message)
        host.unschedulable(  # no PostFilter runs for a member (kube's pod group cycle): its nomination stays
            profile,
            member,
            frozenset(result.rejectors) | extra,
            message,
            start,
            retry_after=result.retry_after,
            clear_nomination=result.num_all_nodes == 0,
        )
    elif result.rejected:  # Reserve refused it, past assume: its nomination ends (kube's clearNominatedNode)
        message = result.message
        host.decisions.record(member.pod, wall, host.table, state, None, message)
        host.unschedulable(profile, member, _rejectors(result) | extra, message, start, clear_nomination=True)
    else:
        host.decisions.record(member.pod, wall, host.table, state, None, result.message)
        host.error(profile, member, result.message, start)
