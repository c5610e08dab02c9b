"""DefaultPreemption (kube-scheduler 1.35) as the PostFilter: when no node fits, find the node where evicting the
fewest, least important lower-priority pods (respecting PodDisruptionBudgets as far as possible) makes room,
nominate the pod there and evict them.

As kube's asynchronous preemption (on by default since 1.33): the decision is made in the scheduling cycle and the
pod is nominated at once (so Filter reserves the room for it against pods of equal or lower priority); the API
calls run in a task of their own: the preemptor's ``status.nominatedNodeName``, lower-priority pods nominated to the
same node lose their nomination, and each victim gets the ``DisruptionTarget`` condition (reason
``PreemptionByScheduler``) and is deleted, all through the API writer process (off the scheduling loop's thread,
refused once the leadership term ended). Until that task finishes, the pod does not preempt again; while its
victims terminate it is "not eligible due to a terminating pod on the nominated node".
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from crane_scheduler.framework import (
    ArgsError,
    Code,
    CycleState,
    Diagnosis,
    Handle,
    Status,
    fit_error_message,
    sooner,
)
from crane_scheduler.framework.interface import PostFilterPlugin, PreEnqueuePlugin
from crane_scheduler.nodetable import Mask, NodeTable, PodRecord
from crane_scheduler.plugins.defaultpreemption.evaluator import (
    NOT_HELPFUL,
    Candidate,
    ResourceReprieve,
    VictimOrders,
    dry_run,
    pick_one,
)
from crane_scheduler.plugins.noderesources import NodeResourcesFit
from crane_scheduler.podinfo import UNSCHEDULABLE, PodInfo, unscheduled_condition
from crane_scheduler.writer import Reply
from crane_scheduler.writer.protocol import STRATEGIC_MERGE_PATCH, UNSENT
from crane_shared.kube import ApiCallError, api_failure
from crane_shared.logs import get_logger

NAME = "DefaultPreemption"
NOT_SENT_RETRY = 1.0
"""seconds before a preemptor whose writes were not sent is retried (kube's initial backoff)"""
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
log = get_logger("crane.scheduler.preemption")


def nominated_node_of(pod: PodInfo) -> str:
    return str((pod.raw.get("status") or {}).get("nominatedNodeName") or "")


def terminating_by_preemption(raw: Mapping[str, Any]) -> bool:
    if not (raw.get("metadata") or {}).get("deletionTimestamp"):
        return False
    for cond in (raw.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "DisruptionTarget":
            return bool(cond.get("status") == "True" and cond.get("reason") == "PreemptionByScheduler")
    return False


class PreemptionError(ApiCallError):
    """An API call of a preemption failed (``verb`` of ``obj``, with its status: ``None`` when not sent): the
    preemptor is retried at once after an API error (as kube activates it), after ``NOT_SENT_RETRY`` when the write
    never left (the writer process restarting, the term over), so a preemptor does not spin through PostFilter
    while nothing can be written."""

    def __init__(self, verb: str, obj: str, reply: Reply) -> None:
        self.sent = not reply.refused and reply.status != UNSENT
        super().__init__(verb, obj, reply.status if self.sent else None, reply.describe())


@dataclass
class Choice:
    """What preemption decides for a pod: the PostFilter message when it cannot help, else the candidates found
    and the chosen one."""

    message: str
    candidates: list[Candidate] = field(default_factory=list)
    best: Candidate | None = None
    clear_nomination: bool = False
    rejectors: set[str] = field(default_factory=set)
    """plugins that refused nodes in the dry run (``DryRun.rejectors``)"""
    retry_after: float | None = None


class DefaultPreemption(PostFilterPlugin, PreEnqueuePlugin):
    name = NAME

    def __init__(self, handle: Handle, min_percentage: int = 10, min_absolute: int = 100) -> None:
        self.handle = handle
        self.min_percentage = min_percentage
        self.min_absolute = min_absolute
        self.rng = random.Random()
        self.preempting: set[str] = set()  # preemptors whose API calls are still running
        self._nominating: set[str] = set()  # preemptors whose own nomination is not written yet
        self._nomination_written: dict[str, asyncio.Event] = {}  # the same, set once their write returned
        self._tasks: set[asyncio.Task[None]] = set()
        self._victims: dict[str, set[str]] = {}  # victim uid -> its preemptors (two may pick one), until it is gone
        self._waiting: dict[str, set[str]] = {}  # preemptor uid -> its victims still in the cache
        self._blocked: dict[str, set[str]] = {}  # victim uid -> pods not eligible until it is gone (``eligible``)
        self._blocked_by: dict[str, set[str]] = {}  # the reverse: pod uid -> those victims (``pre_enqueue``)
        self._started: dict[str, float] = {}  # preemptor uid -> when its preemption was decided (monotonic)
        self._started_api: dict[str, float] = {}  # the same, until its API calls are done
        handle.table.pod_removed.append(self._pod_removed)
        self.orders = VictimOrders(handle.table)  # each node's pods sorted by importance, across dry runs
        self.attempts = handle.metrics.counter(
            "crane_scheduler_preemption_attempts_total", "Preemption attempts (PostFilter runs of DefaultPreemption)"
        )
        self.victims_metric = handle.metrics.counter(
            "crane_scheduler_preemption_victims_total", "Pods chosen as preemption victims"
        )
        self.steps = handle.metrics.histogram(
            "crane_scheduler_preemption_step_seconds",
            "Seconds from a preemption's decision until its API calls were acknowledged (step=api) and until the "
            "cache saw its last victim go (step=victims_gone): where a preemptor waits between its two attempts",
            ("step",),
            STEP_BUCKETS,
        )

    # ------------------------------------------------------------------------------------------ decision

    def num_candidates(self, n: int) -> int:
        return min(max(n * self.min_percentage // 100, self.min_absolute), n)

    def eligible(self, pod: PodInfo, diagnosis: Diagnosis) -> str:
        """``PodEligibleToPreemptOthers``: '' when eligible, else kube's reason."""
        if (pod.raw.get("spec") or {}).get("preemptionPolicy") == "Never":
            return "not eligible due to preemptionPolicy=Never."
        table = self.handle.table
        node = nominated_node_of(pod) or (table.nominated.get(pod.uid, (None, ""))[1])
        row = table.rows.get(node) if node else None
        if row is not None and diagnosis.preemptible is not None and diagnosis.preemptible[row]:
            for record in table.pods_on(node):
                victim = record.pod
                if victim is None or victim.priority >= pod.priority:
                    continue
                if terminating_by_preemption(victim.raw):
                    return "not eligible due to a terminating pod on the nominated node."
                if record.uid in self._victims:
                    # A victim of one of our preemptions whose deletion the informer has not shown yet is
                    # terminating too: its DisruptionTarget condition and delete are on their way (with a grace
                    # period kube would see it terminating). Preempting again would evict a second pod for room
                    # that is about to be free; the pod is retried as soon as that victim is gone.
                    self._blocked.setdefault(record.uid, set()).add(pod.uid)
                    self._blocked_by.setdefault(pod.uid, set()).add(record.uid)
                    return "not eligible due to a terminating pod on the nominated node."
        return ""

    def post_filter(self, state: CycleState, pod: PodInfo, diagnosis: Diagnosis) -> Status:
        self.attempts.inc()
        if pod.uid in self.preempting:
            return Status(Code.UNSCHEDULABLE, ("preemption: waiting for the preemption for this pod to be finished",))
        choice = self.select(pod, diagnosis)
        # A refusal in the what-if (Dynamic: "would have cpu_usage_avg_5m above 0.65" with the victims gone) is a
        # reason to wait too: the pod is retried on that plugin's events and when the refusal could lift.
        diagnosis.rejectors |= choice.rejectors
        diagnosis.retry_after = sooner(diagnosis.retry_after, choice.retry_after)
        if choice.best is None:
            # kube's PostFilterResult with no nominated node: the failure's status patch clears the pod's
            # nomination with its condition, and the scheduler's nominator forgets it (``ScheduleOne``)
            diagnosis.clear_nomination = choice.clear_nomination
            return Status(Code.UNSCHEDULABLE, (choice.message,))
        self._nominate(pod, choice.best, diagnosis.message)
        return Status(Code.SUCCESS, ())

    def dry_run(self, pod: PodInfo, diagnosis: Diagnosis) -> tuple[Status, Choice]:
        """``post_filter``'s answer without its actions: nothing nominated (in the table or the API), nothing
        evicted, no metric (the simulator's dry run; ``select`` decides)."""
        choice = self.select(pod, diagnosis)
        if choice.best is None:
            return Status(Code.UNSCHEDULABLE, (choice.message,)), choice
        return Status(Code.SUCCESS, ()), choice

    def select(self, pod: PodInfo, diagnosis: Diagnosis) -> Choice:
        """``Evaluator.Preempt`` up to the choice, without side effects: eligibility, the dry run, the candidate
        kube's ``SelectCandidate`` picks (ties: the first found)."""
        reason = self.eligible(pod, diagnosis)
        if reason:
            return Choice(f"preemption: {reason}")
        table = self.handle.table
        potential: Mask = (
            diagnosis.preemptible.copy() if diagnosis.preemptible is not None else np.zeros(table.n_rows, dtype=bool)
        )
        potential &= table.live
        n = int(potential.sum())
        framework = self.handle.framework
        if n == 0 or framework is None:
            return self._none(Diagnosis(table.num_nodes))

        def run(st: CycleState, p: PodInfo, alive: Mask, /, *, with_nominated: bool = True) -> Any:
            return framework.run_prefilter_and_filter(st, p, table, alive, with_nominated=with_nominated)

        per_node, reprieve = self._dry_run_mode(framework, pod)
        result = dry_run(
            table,
            pod,
            potential,
            run,
            self.handle.listers.pdbs(),
            self.rng.randrange(n),
            self.num_candidates(n),
            per_node=per_node,
            reprieve=reprieve,
            orders=self.orders,
        )
        if not result.candidates:
            d = Diagnosis(table.num_nodes)
            d.reasons.update(result.statuses)
            if table.num_nodes > result.tried:  # nodes not dry-run: their filter failure was unresolvable
                d.reasons[NOT_HELPFUL] += table.num_nodes - result.tried
            choice = self._none(d)
            choice.rejectors, choice.retry_after = result.rejectors, result.retry_after
            return choice
        return Choice("", result.candidates, pick_one(result.candidates))

    def _dry_run_mode(self, framework: Any, pod: PodInfo) -> tuple[bool, ResourceReprieve | None]:
        """How the dry run may go for ``pod``, from the Filter plugins with something to say about it (their
        PreFilter does not SKIP it): node by node when one of them is a ``CrossNodeFilterPlugin`` (victims
        elsewhere change a node's verdict); with the reprieve as arithmetic when NodeResourcesFit is the only one
        that reads pods (the others are ``PodBlindFilterPlugin``s)."""
        table = self.handle.table
        skipped = {pl.name for pl in framework.pre_filter if pl.pre_filter({}, pod, table).status.code is Code.SKIP}
        active = [pl for pl in framework.filter if pl.name not in skipped]
        if any(getattr(pl, "reads_other_nodes", False) for pl in active):
            return True, None
        reading = [pl for pl in active if getattr(pl, "reads_node_pods", True)]
        if len(reading) == 1 and isinstance(reading[0], NodeResourcesFit):
            checked = reading[0].checked(pod)
            if reading[0].delegated(checked):  # a device-backed extended resource is checked on some nodes only
                return True, None
            load = tuple(pl for pl in active if getattr(pl, "reads_victims_load", False))
            return False, ResourceReprieve(tuple(checked), load)
        return False, None

    def _none(self, d: Diagnosis) -> Choice:
        """No candidate: kube reports a FitError of the dry run (and clears the pod's nomination)."""
        if not d.reasons:
            d.reasons[NOT_HELPFUL] = self.handle.table.num_nodes
        return Choice(f"preemption: {fit_error_message(d)}", clear_nomination=True)

    # ------------------------------------------------------------------------------------------ actions

    def _nominate(self, pod: PodInfo, best: Candidate, message: str) -> None:
        """Nominate ``pod`` to the chosen node and start the preemption's API calls; ``message``: the attempt's
        FitError, written with the nomination as the pod's PodScheduled=False condition."""
        table: NodeTable = self.handle.table
        table.nominated[pod.uid] = (pod, best.node)
        lower = [  # pods placed there already (assumed: their bind on its way) are not kube's nominated pods
            p
            for uid, (p, node) in list(table.nominated.items())
            if node == best.node and p.priority < pod.priority and uid not in table.pods
        ]
        for p in lower:
            table.nominated.pop(p.uid, None)
        self.victims_metric.inc(len(best.victims))
        if self.handle.writer is not None:
            self._started[pod.uid] = self._started_api[pod.uid] = time.monotonic()
            self.preempting.add(pod.uid)
            self._nominating.add(pod.uid)
            self._waiting[pod.uid] = {v.uid for v in best.victims}
            for v in best.victims:
                self._victims.setdefault(v.uid, set()).add(pod.uid)
            self.handle.claim_condition(pod.uid, UNSCHEDULABLE, message)
        self._spawn(self._preempt(pod, best, lower, message))

    def pre_enqueue(self, pod: PodInfo) -> bool:
        """kube's PreEnqueue (``IsPodRunningPreemption``): the preemptor is held back until its nomination is
        written and none of its victims is left in the cache un-deleted (kube looks its last victim up in the
        informer's cache the same way, without waiting for that delete call to return: the replies come back
        through the writer process, after the watch has shown the victim gone). Held until the cache has seen
        the deletions, so an event in between cannot retry the pod while its victims still fill the node, which
        would make it preempt a second time; a retry while the calls still run does not preempt again
        (``post_filter``)."""
        if pod.uid in self._nominating:
            return True
        pods = self.handle.table.pods
        for uid in self._blocked_by.get(pod.uid, ()):
            # Not eligible because a victim of another preemptor nominated to its node still fills it: that
            # preemption is running (kube's IsPodRunningPreemption, for the preemption the pod waits for) until
            # the victim's deletion has started; every victim leaving elsewhere would retry the pod in vain
            # meanwhile (and with SchedulerPopFromBackoffQ at once). Activated when that victim is gone.
            record = pods.get(uid)
            if uid in self._victims and record is not None and record.pod is not None and not record.pod.deleting:
                return True
        left = self._waiting.get(pod.uid)
        if not left:
            return False
        for uid in left:
            record = pods.get(uid)
            if record is not None and record.pod is not None and not record.pod.deleting:
                return True
        return False

    def _pod_removed(self, uid: str) -> None:
        """A victim left the cache: once all of a preemptor's are gone (and its nomination is written), it is
        retried at once (kube activates the preemptor when its preemption finishes)."""
        self._unblock(uid)
        for preemptor in sorted(self._victims.pop(uid, ())):
            left = self._waiting.get(preemptor)
            if left is None:
                continue
            left.discard(uid)
            if not left:
                del self._waiting[preemptor]
                started = self._started.pop(preemptor, None)
                if started is not None:
                    self.steps.labels("victims_gone").observe(time.monotonic() - started)
                if preemptor not in self._nominating:
                    self.handle.activate(preemptor)

    def _unblock(self, victim: str) -> None:
        """``victim`` is gone (or will not go: its preemption failed): the pods it kept from preempting again are
        retried."""
        for blocked in self._blocked.pop(victim, ()):
            by = self._blocked_by.get(blocked)
            if by is not None:
                by.discard(victim)
                if not by:
                    del self._blocked_by[blocked]
            self.handle.activate(blocked)

    def _spawn(self, coro: Any) -> None:
        if self.handle.writer is None:  # validating or pure tests: decide only
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _preempt(self, pod: PodInfo, best: Candidate, lower: list[PodInfo], message: str) -> None:
        retry_after = 0.0
        evicted: set[str] = set()  # the victims whose deletion the API accepted
        try:
            # All at once: kube writes the nomination with the attempt's status update while its preemption
            # goroutine clears lower nominations and evicts, so the victims' deletions wait for no other call.
            # Every call settles before a failure is handled: the pod is released (retried, its victims no longer
            # its own) only once no eviction of this preemption is still on its way, as kube activates it after its
            # preemption goroutine returned; released earlier, its retry could preempt on another node too.
            evicting = [v for v in best.victims if v.pod and not v.pod.deleting]
            settled = await asyncio.gather(
                self._nominate_in_api(pod, best.node, message),
                *(self._clear_lower(p) for p in lower),
                *(self._evict(pod, v, best.node) for v in evicting),
                return_exceptions=True,
            )
            evicted = {
                v.uid for v, r in zip(evicting, settled[len(settled) - len(evicting) :], strict=True) if r is True
            }
            failed = next((r for r in settled if isinstance(r, BaseException)), None)
            if failed is not None:
                raise failed
            if (started := self._started_api.get(pod.uid)) is not None:
                self.steps.labels("api").observe(time.monotonic() - started)
        except Exception as err:  # the pod is retried at once (kube activates it); the next attempt decides again
            log.warning("preemption failed", pod=pod.key, node=best.node, **api_failure("preempt", pod.key, err))
            if isinstance(err, PreemptionError) and not err.sent:
                retry_after = NOT_SENT_RETRY
            self._started.pop(pod.uid, None)
            for uid in self._waiting.pop(pod.uid, set()):
                preemptors = self._victims.get(uid)
                if preemptors is None:  # gone already: the pods it held back were retried then
                    continue
                preemptors.discard(pod.uid)
                if uid in evicted:
                    continue  # its deletion was accepted: it still goes, and what it holds back waits for that
                if not preemptors:  # no other preemption evicts it: the pods it held back are retried
                    self._victims.pop(uid, None)
                    self._unblock(uid)
        finally:
            self._started_api.pop(pod.uid, None)
            self.preempting.discard(pod.uid)
            self._nominating.discard(pod.uid)
            if pod.uid not in self._waiting:  # the victims are gone already (or the preemption failed)
                if retry_after:
                    asyncio.get_running_loop().call_later(retry_after, self.handle.activate, pod.uid)
                else:
                    self.handle.activate(pod.uid)

    async def _clear_lower(self, pod: PodInfo) -> None:
        """A lower-priority pod's nomination to the node cleared; a failure is logged, not the preemption's (kube:
        "not critical": the pod's next attempt nominates afresh or is placed). After that pod's own nomination
        write, if it is still on its way (its preemption began just before): landing after the clear, it would
        nominate the pod again."""
        written = self._nomination_written.get(pod.uid)
        if written is not None:
            await written.wait()
        try:
            await self._set_nomination(pod, "")
        except PreemptionError as err:
            log.warning("a lower nomination not cleared", pod=pod.key, **api_failure("patch", pod.key, err))

    async def _nominate_in_api(self, pod: PodInfo, node: str, message: str) -> None:
        """The preemptor's own nomination, in one patch with the attempt's PodScheduled=False condition (kube's
        ``updatePod``); once written, the pod may be retried as soon as its victims are gone (``pre_enqueue``),
        whether or not the replies to the evictions are back. After the pod's older status patches on their way
        (one landing after it would put an older condition back, or clear the nomination)."""
        written = self._nomination_written[pod.uid] = asyncio.Event()
        try:
            await self.handle.status_settled(pod.uid)
            await self._set_nomination(pod, node, unscheduled_condition(pod, UNSCHEDULABLE, message))
        finally:
            self._nominating.discard(pod.uid)
            written.set()
            if self._nomination_written.get(pod.uid) is written:
                del self._nomination_written[pod.uid]
        if pod.uid not in self._waiting:
            self.handle.activate(pod.uid)

    async def _write(self, method: str, path: str, body: Any, content_type: str = STRATEGIC_MERGE_PATCH) -> Reply:
        """One API write through the writer process (its own connections and core, so an eviction does not wait
        for the scheduling loop's turns), in the current leadership term: a leader that lost its lease evicts
        nothing more. Urgent: on the binds' connections, as kube's preemption goroutine writes on the scheduler's
        main client, not behind the events and status patches of a burst of failed attempts."""
        writer = self.handle.writer
        assert writer is not None  # _spawn runs no API call without it
        return await writer.write(method, path, body, writer.term, content_type, urgent=True)

    async def _set_nomination(self, pod: PodInfo, node: str, condition: Mapping[str, Any] | None = None) -> None:
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        status: dict[str, Any] = {"nominatedNodeName": node or None}
        if condition is not None:
            status["conditions"] = [condition]  # strategic merge: conditions merge by type
        reply = await self._write("PATCH", path, {"status": status})
        if not reply.ok and reply.status != 404:
            raise PreemptionError("PATCH", f"the nomination of pod {pod.key}", reply)

    async def _evict(self, preemptor: PodInfo, victim: PodRecord, node: str) -> bool:
        """kube's ``PreemptPod``: the DisruptionTarget condition first (so the pod's owner sees why), then delete
        (both by the writer process, urgent, in the current term), then the ``Preempted`` event on the victim
        (related: the preemptor), as kube-scheduler writes it. True when the API accepted the deletion."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "PreemptionByScheduler",
            "message": f"{preemptor.scheduler_name}: preempting to accommodate a higher priority pod",
            "lastTransitionTime": now,
        }
        writer = self.handle.writer
        assert writer is not None  # _spawn runs no API call without it
        # Both calls in one writer request (``protocol.EVICT``): the deletion follows the condition at once.
        reply = await writer.evict(victim.namespace, victim.name, victim.uid, condition)
        if reply.status in (404, 409):  # gone already, or replaced by a new pod of the same name
            return False  # kube reports nothing for a victim that was already gone
        if not reply.ok:
            raise PreemptionError("evict", f"pod {victim.namespace}/{victim.name}", reply)
        log.info("preempted", victim=f"{victim.namespace}/{victim.name}", preemptor=preemptor.key, node=victim.node)
        self.handle.record_event(
            {"namespace": victim.namespace, "name": victim.name, "uid": victim.uid},
            {"namespace": preemptor.namespace, "name": preemptor.name, "uid": preemptor.uid},
            "Normal",
            "Preempted",
            "Preempting",
            f"Preempted by pod {preemptor.uid} on node {node}",
        )
        return True

    async def drain(self) -> None:
        """Wait for running preemptions (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def new(args: Mapping[str, Any], handle: Handle) -> DefaultPreemption:
    """DefaultPreemptionArgs: ``minCandidateNodesPercentage`` (0..100, default 10) and
    ``minCandidateNodesAbsolute`` (>= 0, default 100), not both 0."""
    problems: list[tuple[str, str]] = []
    pct = args.get("minCandidateNodesPercentage", 10)
    absolute = args.get("minCandidateNodesAbsolute", 100)
    if not isinstance(pct, int) or isinstance(pct, bool) or not 0 <= pct <= 100:
        problems.append(("minCandidateNodesPercentage", "not in valid range [0, 100]"))
    if not isinstance(absolute, int) or isinstance(absolute, bool) or absolute < 0:
        problems.append(("minCandidateNodesAbsolute", "not in valid range [0, inf)"))
    if pct == 0 and absolute == 0:
        problems.append(("", "both minCandidateNodesPercentage and minCandidateNodesAbsolute cannot be zero"))
    for key in args:
        if key not in ("minCandidateNodesPercentage", "minCandidateNodesAbsolute", "apiVersion", "kind"):
            problems.append((key, "unknown field"))
    if problems:
        raise ArgsError(problems)
    return DefaultPreemption(handle, int(pct), int(absolute))
