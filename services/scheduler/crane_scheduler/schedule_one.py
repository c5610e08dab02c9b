"""The scheduling cycle and the binding cycle of one pod (kube-scheduler's ``schedule_one.go``).

``scheduler.py`` assembles the service (cache, queue, reporter, API writer, the loop); this module is what happens
to one popped pod: ``schedule_one`` decides it (``decide``: the algorithm, timed, with the collector paused),
assumes the chosen node and runs Reserve (``_assume_and_bind``), then hands it to a binding task
(``start_binding``: Permit, PreBind, Bind, PostBind); a failure goes back to the queue (``unschedulable``,
``error``), a bind withheld at the end of a leadership term is undone (``_undo``) and requeued quietly
(``requeue_dropped``).

``CycleHost`` is what another cycle built on these steps may call: the gang cycle (``gangcycle.schedule_gang``)
decides, assumes and binds a whole group through it, never through the scheduler's private methods.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import resource
import time
from collections.abc import Callable
from typing import Protocol

from crane_scheduler import gangless
from crane_scheduler.algorithm import Algorithm, Hint, ScheduleResult, nominated_node
from crane_scheduler.deciders.eligible import pod_refusal
from crane_scheduler.deciders.pool import Answer, DeciderPool
from crane_scheduler.explain import DecisionLog
from crane_scheduler.framework.interface import GangPlugin
from crane_scheduler.framework.runtime import Profile
from crane_scheduler.framework.types import (
    SCHEDULED_WITH_BIND,
    ClusterChange,
    ClusterEvent,
    Code,
    CycleState,
    Diagnosis,
    QueuedPod,
    Status,
)
from crane_scheduler.gangrules import gang_of
from crane_scheduler.internal.queue import SchedulingQueue
from crane_scheduler.metrics import SchedulerMetrics
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import SCHEDULER_ERROR, UNSCHEDULABLE, PodInfo
from crane_scheduler.reporting import Reporter
from crane_shared.leader import Term
from crane_shared.logs import LogOnce, get_logger

log = get_logger("crane.scheduler")
_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)


def thread_usage() -> tuple[float, int] | None:
    """(CPU seconds, involuntary context switches) of the calling thread so far; None where the OS cannot say
    (``RUSAGE_THREAD`` is Linux's). The CPU time is ``thread_time``'s: getrusage's is tick-sampled per thread."""
    if _RUSAGE_THREAD is None:
        return None
    return time.thread_time(), resource.getrusage(_RUSAGE_THREAD).ru_nivcsw


class CycleHost(Protocol):
    """What a scheduling cycle built on this one's steps (the gang cycle) may use: the node table and the queue,
    the pending pods, the decision log, and the cycle's public steps."""

    table: NodeTable
    queue: SchedulingQueue
    pending: dict[str, PodInfo]
    decisions: DecisionLog
    clock: Callable[[], float]

    def may_bind(self) -> bool: ...

    def decide(self, profile: Profile, pod: PodInfo, state: CycleState) -> ScheduleResult | Diagnosis | Status: ...

    def start_binding(
        self, profile: Profile, qp: QueuedPod, state: CycleState, node: str, start: float, holds_slot: bool = True
    ) -> None: ...

    def release_slot(self) -> None: ...

    def requeue_dropped(self, uid: str) -> None: ...

    def unschedulable(
        self,
        profile: Profile,
        qp: QueuedPod,
        rejectors: frozenset[str],
        message: str,
        start: float,
        *,
        retry_after: float | None = None,
        clear_nomination: bool = False,
    ) -> None: ...

    def error(self, profile: Profile, qp: QueuedPod, message: str, start: float) -> None: ...


class SchedulingCycle:
    """The per-pod cycle's steps as methods of the scheduler (``Scheduler`` inherits them; kube's
    ``schedule_one.go`` is methods of its ``Scheduler`` too). The attributes below are the scheduler's."""

    profiles: dict[str, Profile]
    table: NodeTable
    queue: SchedulingQueue
    pending: dict[str, PodInfo]
    decisions: DecisionLog
    clock: Callable[[], float]
    metrics: SchedulerMetrics
    reporter: Reporter
    algorithm: Algorithm
    _gangs: dict[str, tuple[GangPlugin, ...]]
    gangless: gangless.Mode
    _gangless_told: set[str]
    _gangless_log: LogOnce
    _observers: dict[str, Callable[[str, str, float], None]]
    _slots: asyncio.Semaphore
    _binds: dict[asyncio.Task[None], tuple[Profile, CycleState, PodInfo, str]]
    _dropped: set[asyncio.Task[None]]
    _slotless: set[asyncio.Task[None]]
    _term: Term | None
    deciders: DeciderPool | None
    _deciding: dict[str, asyncio.Future[Answer]]
    _worker_refusals: dict[str, str | None]

    def schedule_gang(self, profile: Profile, qp: QueuedPod, plugin: GangPlugin, gang: str) -> None:
        """A popped gang member's cycle (the scheduler runs ``gangcycle.schedule_gang`` on itself)."""
        raise NotImplementedError

    def _wake(self) -> None:
        """Tell the loop there is work (the scheduler's wake-up event)."""
        raise NotImplementedError

    def release_slot(self) -> None:
        """Free the popped pod's bind slot (a cycle that starts no binding task for it)."""
        self._slots.release()

    def may_bind(self) -> bool:
        """Whether a bind may be sent now: always without leader election, else only while the term holds."""
        return self._term is None or self._term.held

    def dispatch(self, qp: QueuedPod) -> bool:
        """Hand a popped pod's decision to a decider worker (``crane_scheduler.deciders``) if one may decide it
        and can take it now; its answer comes back to ``schedule_one`` as a hint. False: decide it here."""
        pool = self.deciders
        pod = self.pending.get(qp.pod.uid)
        profile = self.profiles.get(pod.scheduler_name) if pod else None
        if pool is None or pod is None or profile is None or self.table.is_assumed(pod.uid):
            return False
        if (
            self._worker_refusals.get(profile.name) is not None
            or gangless.pod_group(pod.raw) is not None
            or pod.uid in self.table.nominated
            or pod_refusal(pod) is not None
        ):
            return False
        future = pool.submit(profile.name, pod)
        if future is None:
            return False
        qp.pod = pod
        self._deciding[pod.uid] = future
        future.add_done_callback(lambda done: self._decided(qp, pod, done))
        return True

    def _decided(self, qp: QueuedPod, sent: PodInfo, future: asyncio.Future[Answer]) -> None:
        """A worker's answer: the scheduling cycle, with its node as a hint (``algorithm.Hint``), fresh when the
        node's row did not change since the worker's view and the pod is the version it decided."""
        uid = sent.uid
        pool = self.deciders
        assert pool is not None
        node, seen, worker = future.result()
        if self._deciding.get(uid) is not future:  # abandoned (the loop stopped) or superseded
            if worker >= 0:
                pool.done(uid, worker)  # the worker counts it nowhere any more
            return
        del self._deciding[uid]
        try:
            if not node:
                self.metrics.child(self.metrics.decider_results, "lost" if seen < 0 else "none").inc()
                self.schedule_one(qp)
                return
            fresh = (
                pool.fresh(node, seen, worker)
                and self.pending.get(uid) is sent
                and not self.table.nominated.waiting_on(node, self.table.pods)
            )
            pool.hinted = (uid, node, worker)
            try:
                self.schedule_one(qp, Hint(node, fresh))
            finally:
                pool.hinted = None
        except Exception as err:  # handed to the loop, which raises it
            self.cycle_failed(err)
        finally:
            if worker >= 0:
                pool.done(uid, worker)

    def cycle_failed(self, err: Exception) -> None:
        """A cycle run from a worker's answer (a callback, outside the loop's task) raised: the loop raises it
        as it raises a cycle of its own, rather than the pod staying lost and its bind slot held."""
        raise NotImplementedError

    def abandon_decisions(self) -> None:
        """The loop stopped: the pods workers still decide go back to the queue (their answers are ignored)."""
        for uid in list(self._deciding):
            del self._deciding[uid]
            self._slots.release()
            self.requeue_dropped(uid)

    def schedule_one(self, qp: QueuedPod, hint: Hint | None = None) -> None:
        """Scheduling cycle for one popped pod; hands a chosen node to a binding task. Holds one bind slot,
        released here unless a binding task takes it over. ``hint``: a decider worker's node (``dispatch``)."""
        pod = self.pending.get(qp.pod.uid)
        profile = self.profiles.get(pod.scheduler_name) if pod else None
        if pod is None or profile is None or self.table.is_assumed(pod.uid):
            self._slots.release()  # deleted, bound by someone else, or already on its way
            return
        if pod.deleting or pod.gated:  # changed so while a worker decided it (the cache left it pending)
            del self.pending[pod.uid]
            self._slots.release()
            return
        qp.pod = pod
        found = gang_of(self._gangs.get(profile.name, ()), pod)
        if found is not None:
            self.schedule_gang(profile, qp, found[0], found[1])
            return
        state: CycleState = {}
        start = time.perf_counter()
        refusal = self._without_gang_plugin(profile, pod)
        result = self.decide(profile, pod, state, hint) if refusal is None else refusal
        if hint is not None:
            self._count_hint(hint, result)
        if isinstance(result, Diagnosis):  # PostFilter (preemption) first: its message is part of the decision
            profile.run_post_filter(state, pod, result)
        self.decisions.record(
            pod,
            time.time(),
            self.table,
            state,
            result.node if isinstance(result, ScheduleResult) else None,
            result.message if isinstance(result, Diagnosis | Status) else "",
        )
        if isinstance(result, Diagnosis):
            self.unschedulable(
                profile,
                qp,
                frozenset(result.rejectors),
                result.message,
                start,
                retry_after=result.retry_after,
                # kube's clearNominatedNode: no nodes at all, no PostFilter to run, or PostFilter says so (no
                # candidate for preemption); a pod preemption did not try (not eligible) keeps its nomination
                clear_nomination=result.clear_nomination or not profile.post_filter or result.num_all_nodes == 0,
            )
            self._slots.release()
            return
        if isinstance(result, Status):
            self.error(profile, qp, result.message, start)
            self._slots.release()
            return
        self._assume_and_bind(profile, qp, state, result, start)

    def _without_gang_plugin(self, profile: Profile, pod: PodInfo) -> Diagnosis | None:
        """A pod naming a PodGroup that no gang plugin of its profile reads (``gangless``): logged once per profile
        and group; refused (the default), or told by a Warning event that it is placed alone."""
        group = gangless.pod_group(pod.raw)
        if group is None:
            return None
        text = gangless.message(profile.name, pod.namespace, group, self.gangless)
        self._gangless_log.warning(
            f"{profile.name}/{pod.namespace}/{group}",
            "pod group in a profile without a gang plugin",
            profile=profile.name,
            missing_plugin=gangless.PLUGIN,
            pod_group=f"{pod.namespace}/{group}",
            action=self.gangless,
        )
        if self.gangless == "refuse":
            return Diagnosis(self.table.num_nodes, rejectors={gangless.GATE}, pre_filter_msg=text)
        if pod.uid not in self._gangless_told:
            if len(self._gangless_told) > 100_000:
                self._gangless_told.clear()
            self._gangless_told.add(pod.uid)
            regarding = {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid}
            self.reporter.event(profile.name, regarding, None, "Warning", gangless.IGNORED_REASON, "Scheduling", text)
        return None

    def _count_hint(self, hint: Hint, result: ScheduleResult | Diagnosis | Status) -> None:
        taken = isinstance(result, ScheduleResult) and result.node == hint.node and result.evaluated == 1
        outcome = ("taken" if hint.fresh else "checked") if taken else "refused"
        self.metrics.child(self.metrics.decider_results, outcome).inc()

    def decide(
        self, profile: Profile, pod: PodInfo, state: CycleState, hint: Hint | None = None
    ) -> ScheduleResult | Diagnosis | Status:
        """The algorithm for one pod, timed (wall clock, CPU, preempted by the OS) with the collector paused."""
        collecting = gc.isenabled()
        gc.disable()  # a collection triggered by the decision's allocations runs right after it instead
        before = thread_usage()  # system calls, outside the timed section: the OS may preempt at their return
        start = time.perf_counter()
        try:
            result = self.algorithm.schedule(profile, pod, state, self._observers[profile.name], hint)
        except Exception as err:
            log.exception("scheduling failed", pod=pod.key)
            result = Status(Code.ERROR, (f"running the scheduling framework: {err!r}",))
        finally:
            if collecting:
                gc.enable()
        decided = time.perf_counter()
        after = thread_usage()
        self.metrics.child(self.metrics.algorithm_duration, profile.name).observe(decided - start)
        if before is not None and after is not None:
            self.metrics.child(self.metrics.algorithm_cpu, profile.name).observe(after[0] - before[0])
            if after[1] > before[1]:
                self.metrics.child(self.metrics.algorithm_preempted, profile.name).inc()
        return result

    def _assume_and_bind(
        self, profile: Profile, qp: QueuedPod, state: CycleState, result: ScheduleResult, start: float
    ) -> None:
        pod, node = qp.pod, result.node
        if not self.may_bind():  # the term ended during this cycle: leave the pod for the next leader
            self.requeue_dropped(pod.uid)
            self._slots.release()
            return
        self.table.assume(pod, node)
        status = profile.run_reserve(state, pod, node)
        if not status.success:
            self.table.forget(pod.uid)
            self._failed(profile, qp, status, start)
            self._slots.release()
            return
        self.start_binding(profile, qp, state, node, start)

    def start_binding(
        self, profile: Profile, qp: QueuedPod, state: CycleState, node: str, start: float, holds_slot: bool = True
    ) -> None:
        """The binding cycle of an assumed, reserved pod, as a task (holding the popped pod's bind slot, unless
        ``holds_slot`` is False: a gang's other members)."""
        self.reporter.superseded(qp.pod.uid)  # a PodScheduled=False still queued for it would land after the bind
        task = asyncio.create_task(self._binding_cycle(profile, qp, state, node, start))
        self._binds[task] = (profile, state, qp.pod, node)
        if not holds_slot:
            self._slotless.add(task)
        task.add_done_callback(self._bind_done)

    def _bind_done(self, task: asyncio.Task[None]) -> None:
        """Every binding cycle ends here, even one cancelled before it started: its bind slot is freed, and a
        cycle cancelled by anything but ``stop_binding`` (which undid it already) is undone."""
        profile, state, pod, node = self._binds.pop(task)
        if task in self._slotless:
            self._slotless.discard(task)
        else:
            self._slots.release()
        if task in self._dropped:
            self._dropped.discard(task)
        elif task.cancelled():
            self._undo(profile, state, pod, node)

    def _undo(self, profile: Profile, state: CycleState, pod: PodInfo, node: str) -> None:
        """A bind that will not be sent by us: Unreserve, forget the assumption, requeue the pod quietly."""
        profile.run_unreserve(state, pod, node)
        self.table.forget(pod.uid)
        self.requeue_dropped(pod.uid)

    async def _binding_cycle(self, profile: Profile, qp: QueuedPod, state: CycleState, node: str, start: float) -> None:
        pod = qp.pod
        self.metrics.binds_in_flight.inc()
        bind_start = time.perf_counter()
        try:
            status = profile.run_pre_bind_pre_flights(state, pod, node)
            if status.success and nominated_node(pod) != node:  # PreBind will take API round trips
                await self._nominate_for_expectation(pod, node)
            if status.code is not Code.ERROR:
                status = await profile.run_binding(state, pod, node, self._observers[profile.name])
        finally:
            self.metrics.binds_in_flight.dec()
        if asyncio.current_task() in self._dropped:  # dropped (and undone) by stop_binding while finishing
            return
        if not status.success and status.code is not Code.ALREADY_BOUND and not self.may_bind():
            profile.run_unreserve(state, pod, node)
            self.table.forget(pod.uid)
            self.requeue_dropped(pod.uid)
            return
        if status.code is Code.ALREADY_BOUND:
            self.table.forget(pod.uid, unreserved=False)  # the informer will account the real binding
            self.reporter.already_bound(pod, profile.name)
            self.metrics.child(self.metrics.bind_duration, "conflict").observe(time.perf_counter() - bind_start)
            return
        if not status.success:
            self.metrics.child(self.metrics.bind_duration, "error").observe(time.perf_counter() - bind_start)
            profile.run_unreserve(state, pod, node)
            self.table.forget(pod.uid)
            # kube's handleBindingCycleError: the resources (and the peer) the assumption held are free again
            placed = dataclasses.replace(pod, node_name=node)
            self.queue.on_event(ClusterEvent.POD_DELETE, ClusterChange(ClusterEvent.POD_DELETE, placed))
            self._failed(profile, qp, status, start)
            return
        self.metrics.child(self.metrics.bind_duration, "bound").observe(time.perf_counter() - bind_start)
        profile.run_post_bind(state, pod, node)
        if state.get(SCHEDULED_WITH_BIND):
            self.reporter.bound(pod.uid)  # its Scheduled event went with the bind (``Reporter.with_bind``)
        else:
            self.reporter.scheduled(pod.namespace, pod.name, pod.uid, node, profile.name)
        self.metrics.child(self.metrics.schedule_attempts, "scheduled", profile.name).inc()
        self.metrics.child(self.metrics.attempt_duration, "scheduled", profile.name).observe(
            time.perf_counter() - start
        )

    async def _nominate_for_expectation(self, pod: PodInfo, node: str) -> None:
        """kube's NominatedNodeNameForExpectation: the node goes into the pod's status before a PreBind that works
        (``Reporter.expect_on``), and into the nominator as the informer will show it, so a failure from here on
        clears it (``_clear_nomination``) even before the informer has."""
        written = await self.reporter.expect_on(pod, node)
        if written and pod.uid in self.pending and self.table.is_assumed(pod.uid):  # not deleted meanwhile
            self.table.nominated[pod.uid] = (pod, node)

    def requeue_dropped(self, uid: str) -> None:
        """A pod whose bind was withheld goes back to activeQ quietly (no event: nothing failed), if still pending."""
        pod = self.pending.get(uid)
        if pod is not None and not self.table.is_assumed(uid):
            self.queue.add(pod, self.clock())

    # ------------------------------------------------------------------------------------------ failures

    def _failed(self, profile: Profile, qp: QueuedPod, status: Status, start: float) -> None:
        """A failure past assume (Reserve, Permit, PreBind, Bind): the pod's nomination ends with it (kube's
        ``clearNominatedNode``)."""
        if status.rejected:
            self.unschedulable(
                profile, qp, frozenset({status.plugin} - {""}), status.message, start, clear_nomination=True
            )
        else:
            self.error(profile, qp, status.message, start)

    def _clear_nomination(self, uid: str) -> bool:
        """kube's ``clearNominatedNode`` in memory (the nominator): lower pods stop leaving room for the pod on
        that node. Returns whether the pod had a nomination, here or in its status, for the failure's status
        patch to clear in the API too."""
        had = self.table.nominated.pop(uid, None) is not None
        pod = self.pending.get(uid)
        return had or (pod is not None and bool(nominated_node(pod)))

    def unschedulable(
        self,
        profile: Profile,
        qp: QueuedPod,
        rejectors: frozenset[str],
        message: str,
        start: float,
        *,
        retry_after: float | None = None,
        clear_nomination: bool = False,
    ) -> None:
        """``retry_after``: seconds until a refusal could lift with no event (``Diagnosis.retry_after``);
        ``clear_nomination``: the failure ends the pod's nomination (kube's ``clearNominatedNode``)."""
        self.metrics.child(self.metrics.schedule_attempts, "unschedulable", profile.name).inc()
        self.metrics.child(self.metrics.attempt_duration, "unschedulable", profile.name).observe(
            time.perf_counter() - start
        )
        clear = clear_nomination and self._clear_nomination(qp.pod.uid)
        if qp.pod.uid in self.pending:  # still pending (not deleted, not bound meanwhile)
            self.queue.add_unschedulable(qp, rejectors, self.clock(), retry_after)
            self.reporter.failed(self.pending[qp.pod.uid], message, UNSCHEDULABLE, profile.name, clear_nomination=clear)

    def error(self, profile: Profile, qp: QueuedPod, message: str, start: float) -> None:
        """An error (not a refusal) anywhere in the cycle: retried with backoff, its nomination cleared (kube
        clears it on every error)."""
        self.metrics.child(self.metrics.schedule_attempts, "error", profile.name).inc()
        self.metrics.child(self.metrics.attempt_duration, "error", profile.name).observe(time.perf_counter() - start)
        log.warning("scheduling attempt failed, retrying with backoff", pod=qp.pod.key, error=message)
        clear = self._clear_nomination(qp.pod.uid)
        if qp.pod.uid in self.pending:
            self.queue.add_backoff(qp, self.clock())
            self.reporter.failed(
                self.pending[qp.pod.uid], message, SCHEDULER_ERROR, profile.name, clear_nomination=clear
            )
            self._wake()
