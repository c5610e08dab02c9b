"""The scheduler: informers feed the node table and the queue; one loop decides; binds run concurrently.

Life of a pod (kube-scheduler's scheduleOne, in asyncio):

1. The pod informer sees a pending pod of one of our profiles; it enters activeQ.
2. The scheduling loop pops it and decides synchronously (no await between reading the node table and assuming
   the result, so every decision sees every earlier one). The chosen node is *assumed*: the pod counts against
   it at once. Reserve plugins run.
3. A binding task runs Permit, PreBind, Bind, PostBind; at most ``bind_concurrency`` run at a time, and the loop
   waits for a free slot before taking the next pod (backpressure instead of an unbounded pile of binds).
4. Success: the ``Scheduled`` event is queued; the informer later confirms the binding. Failure: Unreserve,
   forget the assumption, back to the queue with backoff. A 409 means the pod is bound already (by another
   replica before a failover, or by us before a crash): someone else's success, not a retry.

A pod no node fits waits among the unschedulable pods and gets a ``FailedScheduling`` event and
PodScheduled=False condition. Informers run on every replica (a standby has a warm cache); only the leader runs
the loop. A pod never gets two binds: it is either queued or assumed, never both, and a bound pod is never
pending (after a restart the informer's list says so).

Losing the lease (``stop_binding``, called from the elector's ``on_change(False)`` before the loop is cancelled):
every binding cycle that has not yet sent its bind is cancelled at once (also those waiting for a token of the
client's rate limiter), its Reserve undone, its assumption forgotten and its pod put back in the queue; the bind
plugin checks the term (``may_bind``) before handing its POST to the API writer process, which is told at once
that the term ended (``end_term``: it refuses that term's writes not yet sent, and a write past the term's
deadline in any case). The process then stays up as a clean standby: the
informers keep its cache warm, the queue holds every pending pod, and a later term starts from there (a pod the
new leader bound meanwhile has left the pending set through the informer).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import resource
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client

from crane_scheduler import gangless
from crane_scheduler.algorithm import Algorithm, ScheduleResult
from crane_scheduler.config import SchedulerConfig
from crane_scheduler.explain import DecisionLog
from crane_scheduler.framework.interface import GangPlugin, QueueingHintPlugin
from crane_scheduler.framework.runtime import Profile
from crane_scheduler.framework.types import (
    SCHEDULED_WITH_BIND,
    ClusterChange,
    ClusterEvent,
    Code,
    CycleState,
    Diagnosis,
    QueuedPod,
    QueueingHints,
    Status,
)
from crane_scheduler.gangcycle import GangIndex, IndexedPending, futile_wakeups, gang_of, group_size, schedule_gang
from crane_scheduler.internal.cache import Cache
from crane_scheduler.internal.queue import NO_HINTS, SchedulingQueue
from crane_scheduler.listers import Listers
from crane_scheduler.metrics import SchedulerMetrics
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import SCHEDULER_ERROR, UNSCHEDULABLE, PodInfo
from crane_scheduler.reporting import Reporter
from crane_scheduler.writer import ApiWriter
from crane_shared.kube import api_failure
from crane_shared.leader import Term
from crane_shared.logs import LogOnce, get_logger
from crane_shared.retry import sleep_unless
from crane_shared.worker import cancel_and_wait

RECOVERY_SETTLE = 35.0
"""seconds into a term before the second look for unreported bindings: a bind the previous term had on the wire
has landed (or failed) within its request timeout (30 s by default), and the cache has seen it"""
log = get_logger("crane.scheduler")
UNSCHEDULABLE_FLUSH_PERIOD = 30.0
WRITER_READY_TIMEOUT = 10.0
"""seconds the first decision waits for the API writer process to be ready (its writes would only wait in the
pipe meanwhile, and a preemption's evictions with them); past that, scheduling goes on and the writes wait in the
pipe until the process reads them (or answer UNSENT if it exits)"""
OLD_GENERATION_THRESHOLD = 1_000_000
"""gen1 collections before CPython may collect the old generation: in effect never by itself (see ``collector``)"""
_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)
FULL_COLLECTION_PERIOD = 300.0
"""seconds between full collections, run when the scheduler is idle (or after twice as long regardless)"""


def thread_usage() -> tuple[float, int] | None:
    """(CPU seconds, involuntary context switches) of the calling thread so far; None where the OS cannot say
    (``RUSAGE_THREAD`` is Linux's). The CPU time is ``thread_time``'s: getrusage's is tick-sampled per thread."""
    if _RUSAGE_THREAD is None:
        return None
    return time.thread_time(), resource.getrusage(_RUSAGE_THREAD).ru_nivcsw


def tune_collector() -> None:
    """After the initial sync: the listed nodes and pods are long-lived, so the collector never rescans them
    (``gc.freeze``), and the old generation is not collected automatically: its collection scans every object
    bound since, hundreds of milliseconds in a burst of thousands of pods. ``Scheduler._flush_loop`` collects it
    when idle; decisions run with the collector paused (``schedule_one``), so a pause lands between them."""
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, OLD_GENERATION_THRESHOLD)


class Scheduler:
    def __init__(
        self,
        *,
        config: SchedulerConfig,
        profiles: dict[str, Profile],
        table: NodeTable,
        reporter: Reporter,
        api: client.ApiClient | None = None,
        bind_concurrency: int = 256,
        node_selector: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: SchedulerMetrics | None = None,
        listers: Listers | None = None,
        writer: ApiWriter | None = None,
        pod_group_without_gang_plugin: gangless.Mode = "refuse",
    ) -> None:
        self.config = config
        self.gangless: gangless.Mode = pod_group_without_gang_plugin
        self._gangless_told: set[str] = set()  # uids of pods placed alone that heard so (place-alone)
        self._gangless_log = LogOnce(log)
        self.metrics = metrics or reporter.metrics
        self.profiles = profiles
        self.table = table
        self.reporter = reporter
        self.api = api
        self.writer = writer
        self.clock = clock
        self.node_selector = node_selector
        sort_plugin = next(iter(profiles.values())).queue_sort
        self.queue = SchedulingQueue(
            sort_plugin.sort_key,
            initial_backoff=config.pod_initial_backoff,
            max_backoff=config.pod_max_backoff,
            events_of=self._events_of,
            hints_of=self._hints_of,
            on_hint_error=self._hint_error,
            on_incoming=lambda event, queue: self.metrics.queue_incoming.labels(event, queue).inc(),
            on_hint_skip=lambda plugin: self.metrics.queue_hint_skips.labels(plugin).inc(),
            gated=self._gated,
            hold_back=self._futile_wakeups,
            on_gated=self._gated_gang,
        )
        self._untold: dict[str, None] = {}  # gang members gated on arrival, told why at the loop's next turn
        self._hint_failures: set[str] = set()
        self._registered: dict[str, ClusterEvent] = {}
        self._hints: dict[tuple[str, str], QueueingHints] = {}
        self._observers: dict[str, Callable[[str, str, float], None]] = {
            name: _observer(self.metrics, name) for name in profiles
        }
        self.algorithm = Algorithm(table, config.percentage_of_nodes_to_score)
        self.decisions = DecisionLog()
        self.synced = asyncio.Event()
        self._wakeup = asyncio.Event()
        if listers is None:  # the profiles' plugins read the listers their handle holds: feed those
            listers = next((p.handle.listers for p in profiles.values() if p.handle is not None), None)
        self.cache = Cache(
            table,
            self.queue,
            profiles,
            clock=clock,
            forget=reporter.forget,
            wake=self._wakeup.set,
            listers=listers,
            bound_unassumed=self._bound_unassumed,
        )
        self.listers = self.cache.listers
        for profile in profiles.values():
            if profile.handle is not None:
                profile.handle.activate = self._activate
                profile.handle.record_event = functools.partial(self.reporter.event, profile.name)
                profile.handle.claim_condition = self.reporter.condition_claimed
                profile.handle.scheduled_report = functools.partial(self.reporter.with_bind, profile.name)
        self._gangs: dict[str, tuple[GangPlugin, ...]] = {
            name: tuple(p for p in profile.plugins.values() if isinstance(p, GangPlugin))
            for name, profile in profiles.items()
        }
        self.gang_index = GangIndex(self._gang_of, table)
        if any(self._gangs.values()):
            self.cache.pending = IndexedPending(self.gang_index)
        self.pending = self.cache.pending  # pending pods of our profiles, latest version
        self.on_node, self.on_node_deleted = self.cache.on_node, self.cache.on_node_deleted
        self.on_pod, self.on_pod_deleted = self.cache.on_pod, self.cache.on_pod_deleted
        self._slots = asyncio.Semaphore(bind_concurrency)
        # binding cycles in flight -> what to undo when one is dropped (profile, state, pod, node)
        self._binds: dict[asyncio.Task[None], tuple[Profile, CycleState, PodInfo, str]] = {}
        self._dropped: set[asyncio.Task[None]] = set()
        self._slotless: set[asyncio.Task[None]] = set()  # a gang's binding cycles beyond the popped member's
        self._term: Term | None = None  # the leadership term the loop runs in; None without leader election
        self._scheduling = False  # the loop runs (a standby's cache sees the leader's binds: not its to report)

    def _gang_of(self, pod: PodInfo) -> str | None:
        """The pod's gang as its profile's gang plugins say (a placed pod of any scheduler counts for its group:
        then every profile's plugins are asked)."""
        plugins = self._gangs.get(pod.scheduler_name) or tuple(p for ps in self._gangs.values() for p in ps)
        found = gang_of(plugins, pod)
        return found[1] if found is not None else None

    def _gated(self, pod: PodInfo) -> bool:
        """kube's PreEnqueue: a plugin of the pod's profile holds it back (a preemptor whose victims are not gone),
        or the pod's gang has fewer pods than its quorum (``incomplete``)."""
        profile = self.profiles.get(pod.scheduler_name)
        if profile is None:
            return False
        return any(pl.pre_enqueue(pod) for pl in profile.pre_enqueue) or self._incomplete(pod) is not None

    def _incomplete(self, pod: PodInfo) -> tuple[GangPlugin, str, int, int] | None:
        """(plugin, group, its pods, its quorum) when the pod's gang has fewer pods (pending or placed) than its
        quorum: no cycle could place it, so it waits outside the queue until a sibling completes the group."""
        found = gang_of(self._gangs.get(pod.scheduler_name, ()), pod)
        if found is None:
            return None
        plugin, gang = found
        quorum = plugin.quorum(gang)
        members = group_size(self.gang_index, gang)
        return (plugin, gang, members, quorum) if 0 < members < quorum else None

    def _gated_gang(self, qp: QueuedPod) -> None:
        """A gang member held by the gate: its gang plugin is its rejector (kube's ``GatingPlugin``), so only the
        events that plugin registered look at it again (not every bind confirmed while it waits: a pass over
        thousands of gated members per bind cost more than the decisions); it is told why at the next turn."""
        found = self._incomplete(qp.pod)
        if found is not None:
            qp.rejectors = frozenset({found[0].name})
            self._untold[qp.pod.uid] = None

    def tell_gated(self) -> None:
        """The gang members gated since the loop's last turn (on arrival, or activated while their group is
        incomplete) hear their plugin's refusal (its PreFilter message, with the group's count now), as an attempt
        would have told them, without the attempt. Told at the loop's turn, not at once, so a burst (the informer's
        first list, a Job's pods created together) tells nothing to the pods of a group complete by then: those
        leave the gate (the gang cycle of the member that completed the group takes them along)."""
        untold, self._untold = self._untold, {}
        for uid in untold:
            pod = self.pending.get(uid)
            if pod is None or uid not in self.queue.unschedulable:
                continue  # deleted, bound, or taken by a gang cycle meanwhile
            found = self._incomplete(pod)
            if found is None:
                self._activate(uid)
                continue
            plugin, gang, members, quorum = found
            refusal = plugin.gang_incomplete(gang, pod, members, quorum)
            told = Diagnosis(self.table.num_nodes, rejectors={plugin.name}, pre_filter_msg=refusal).message
            self.decisions.record(pod, time.time(), self.table, {}, None, told)
            self.reporter.failed(pod, told, UNSCHEDULABLE, pod.scheduler_name)

    def _futile_wakeups(self, pods: list[PodInfo]) -> set[str]:
        """Gang members an event would retry while their group cannot be placed: they keep waiting (counted as
        skipped by the gang plugin's hint)."""
        if not any(self._gangs.values()):
            return set()
        held = futile_wakeups(self.table, self.gang_index, self.pending, self._gangs, pods)
        if held:
            skipped = Counter(
                found[0].name
                for uid in held
                if (pod := self.pending.get(uid)) is not None
                and (found := gang_of(self._gangs.get(pod.scheduler_name, ()), pod)) is not None
            )
            for name, count in skipped.items():
                self.metrics.queue_hint_skips.labels(name).inc(count)
        return held

    def _events_of(self, plugin: str) -> ClusterEvent:
        """The events ``plugin`` registered in any profile, read once (as kube reads ``EventsToRegister``): the
        queue asks for every waiting pod's rejectors at every pass, and each read ran runtime-protocol checks
        (most of a pass's cost with thousands of waiting pods)."""
        events = self._registered.get(plugin)
        if events is None:
            events = ClusterEvent(0)
            for profile in self.profiles.values():
                events |= profile.events_of(plugin)
            self._registered[plugin] = events
        return events

    def _hints_of(self, profile: str, plugin: str) -> QueueingHints:
        """The queueing hints of ``plugin`` in the pod's profile (none: every registered event requeues); asked
        once per pair, as kube reads ``EventsToRegister`` once."""
        hints = self._hints.get((profile, plugin))
        if hints is None:
            found = self.profiles.get(profile)
            instance = found.plugins.get(plugin) if found is not None else None
            hints = instance.queueing_hints() if isinstance(instance, QueueingHintPlugin) else NO_HINTS
            self._hints[(profile, plugin)] = hints
        return hints

    def _hint_error(self, plugin: str, err: BaseException) -> None:
        self.metrics.queue_hint_errors.labels(plugin).inc()
        if plugin not in self._hint_failures:  # logged once per plugin, counted always
            self._hint_failures.add(plugin)
            log.warning("queueing hint failed, requeueing the pod (logged once)", plugin=plugin, error=repr(err))

    # ------------------------------------------------------------------------------------------ informers

    async def run_informers(self, stopping: asyncio.Event) -> None:
        """Nodes and all non-terminal pods (bound ones for accounting, pending ones of our profiles to
        schedule). One pod watch, not two, so a pod's bind and its leaving the pending set arrive in order."""
        core = client.CoreV1Api(self.api)
        nodes = self.cache.node_informer(
            core.list_node, self.node_selector, lambda cause: self.metrics.watch_restarts.labels("nodes", cause).inc()
        )
        pods = self.cache.pod_informer(
            core.list_pod_for_all_namespaces, lambda cause: self.metrics.watch_restarts.labels("pods", cause).inc()
        )
        storage = client.StorageV1Api(self.api)
        resource = client.ResourceV1Api(self.api)
        objects = self.cache.object_informers(
            {
                "pvcs": core.list_persistent_volume_claim_for_all_namespaces,
                "pvs": core.list_persistent_volume,
                "storageclasses": storage.list_storage_class,
                "csinodes": storage.list_csi_node,
                "volumeattachments": storage.list_volume_attachment,
                "pdbs": client.PolicyV1Api(self.api).list_pod_disruption_budget_for_all_namespaces,
                "csidrivers": storage.list_csi_driver,
                "csistoragecapacities": storage.list_csi_storage_capacity_for_all_namespaces,
                "resourceclaims": resource.list_resource_claim_for_all_namespaces,
                "resourceslices": resource.list_resource_slice,
                "deviceclasses": resource.list_device_class,
            }
        )
        for informer in objects:
            informer.on_restart = self._count_restart(informer.name)
        tasks = [asyncio.create_task(i.run(stopping)) for i in (nodes, pods, *objects)]
        try:
            for informer in (nodes, pods, *objects):
                await informer.synced.wait()
            self.synced.set()
            tune_collector()
            log.info("caches synced", nodes=self.table.num_nodes, pods=len(self.table.pods), pending=len(self.pending))
            await stopping.wait()
        finally:
            await cancel_and_wait(tasks)

    def _activate(self, uid: str) -> None:
        if self.queue.activate(uid):
            self._wake()

    def _count_restart(self, kind: str) -> Callable[[str], None]:
        return lambda cause: self.metrics.watch_restarts.labels(kind, cause).inc()

    def _wake(self) -> None:
        self._wakeup.set()

    # ------------------------------------------------------------------------------------------ the loop

    def _bound_unassumed(self, pod: PodInfo) -> None:
        """A pending pod of ours turned up bound with no bind of ours assumed for it, most often a bind whose reply
        was lost in an API server restart: the attempt counted as failed, so no Scheduled event was queued, and
        the pod left the pending set before a retry could meet the 409 (which would have written it). Its one
        Scheduled event is written now (one name per UID: a second create is a harmless 409)."""
        if self._scheduling and self.may_bind():
            self.reporter.scheduled(pod.namespace, pod.name, pod.uid, pod.node_name, pod.scheduler_name)

    def may_bind(self) -> bool:
        """Whether a bind may be sent now: always without leader election, else only while the term holds."""
        return self._term is None or self._term.held

    def stop_binding(self) -> int:
        """Leadership is lost: cancel every binding cycle and, right here, undo its Reserve, forget its
        assumption and requeue its pod (also for a cycle whose task has not started yet, which no handler inside
        it would see). Returns how many were dropped."""
        if self.writer is not None and self._term is not None:
            self.writer.end_term(self._term)  # first: the writer refuses this term's binds not yet sent
        binds = [task for task in self._binds if not task.done() and task not in self._dropped]
        for task in binds:
            task.cancel()
            self._dropped.add(task)
            profile, state, pod, node = self._binds[task]
            self._undo(profile, state, pod, node)
        if binds:
            log.warning("leadership lost: dropped binds not yet sent", count=len(binds))
        self.metrics.binds_dropped.inc(len(binds))
        self.reporter.drop_lost()  # and the events and conditions the lost term queued
        return len(binds)

    async def run(self, stopping: asyncio.Event, term: Term | None = None) -> None:
        """Schedule until ``stopping`` (or until cancelled on losing leadership, ``term``); in-flight binds
        finish, or are dropped by ``stop_binding``."""
        self._term = term
        self.reporter.term = term  # reports queued from now on belong to this term
        if self.writer is not None:
            self.writer.term = term  # and binds
        await self.synced.wait()
        if self.writer is not None and not await self.writer.wait_ready(WRITER_READY_TIMEOUT):
            log.warning("the API writer process is not ready; scheduling anyway", waited=WRITER_READY_TIMEOUT)
        await self._recover_scheduled_events()
        flusher = asyncio.create_task(self._flush_loop(stopping))
        settled = asyncio.create_task(self._recover_once_settled(stopping))
        log.info("scheduling", profiles=sorted(self.profiles))
        self._scheduling = True
        try:
            while not stopping.is_set():
                await self._slots.acquire()
                qp = await self._next_pod(stopping)
                if qp is None:
                    self._slots.release()
                    break
                self.schedule_one(qp)
                await asyncio.sleep(0)  # let informers and binds run between decisions
        finally:
            flusher.cancel()
            settled.cancel()
            try:
                await self.drain()
            finally:
                self._scheduling = False

    async def _recover_scheduled_events(self) -> None:
        try:
            await self.reporter.recover_scheduled_events(list(self.table.pods.values()), set(self.profiles))
        except Exception as err:  # reporting must never keep the leader from scheduling
            log.warning("could not check for unreported bindings", **api_failure("list", "Scheduled events", err))

    async def _recover_once_settled(self, stopping: asyncio.Event) -> None:
        """Look for unreported bindings once more when the previous term's binds have landed: a bind cancelled
        on a lost lease may have been on the wire already (the pod gets bound, no event), and the cache may not
        have seen it bound when this term began."""
        if not await sleep_unless(stopping, RECOVERY_SETTLE) and self.may_bind():
            await self._recover_scheduled_events()

    async def drain(self) -> None:
        """Wait for in-flight binding cycles (shutdown, leadership loss)."""
        while self._binds:
            await asyncio.gather(*list(self._binds), return_exceptions=True)

    async def _next_pod(self, stopping: asyncio.Event) -> QueuedPod | None:
        while not stopping.is_set():
            self._wakeup.clear()
            if self._untold:
                self.tell_gated()
            qp = self.queue.pop(self.clock())
            if qp is not None:
                return qp
            expiry = self.queue.next_backoff_expiry()
            timed = self.queue.next_timed_retry()
            if timed is not None:
                expiry = timed if expiry is None else min(expiry, timed)
            timeout = 1.0 if expiry is None else max(0.0, min(1.0, expiry - self.clock()))
            waiters = [asyncio.ensure_future(self._wakeup.wait()), asyncio.ensure_future(stopping.wait())]
            try:
                await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()
        return None

    async def _flush_loop(self, stopping: asyncio.Event) -> None:
        last_unschedulable_flush = self.clock()
        last_full_collection = time.monotonic()
        while not stopping.is_set():
            await asyncio.sleep(1.0)
            since = time.monotonic() - last_full_collection
            idle = not self.queue.active_len and not self._binds
            if since >= 2 * FULL_COLLECTION_PERIOD or (idle and since >= FULL_COLLECTION_PERIOD):
                gc.collect()  # the old generation (see ``tune_collector``)
                last_full_collection = time.monotonic()
            now = self.clock()
            if now - last_unschedulable_flush >= UNSCHEDULABLE_FLUSH_PERIOD:
                self.queue.flush_unschedulable(now)
                last_unschedulable_flush = now
            self.queue.flush_backoff(now)
            if self.queue.active_len:
                self._wake()
            self.update_gauges()

    def update_gauges(self) -> None:
        self.metrics.pending_pods.labels("active").set(self.queue.active_len)
        self.metrics.pending_pods.labels("backoff").set(self.queue.backoff_len)
        self.metrics.pending_pods.labels("unschedulable").set(len(self.queue.unschedulable))
        self.metrics.cache_size.labels("nodes").set(self.table.num_nodes)
        self.metrics.cache_size.labels("pods").set(len(self.table.pods))
        self.metrics.cache_size.labels("assumed_pods").set(sum(1 for r in self.table.pods.values() if r.assumed))

    # ------------------------------------------------------------------------------------------ one pod

    def schedule_one(self, qp: QueuedPod) -> None:
        """Scheduling cycle for one popped pod; hands a chosen node to a binding task. Holds one bind slot,
        released here unless a binding task takes it over."""
        pod = self.pending.get(qp.pod.uid)
        profile = self.profiles.get(pod.scheduler_name) if pod else None
        if pod is None or profile is None or self.table.is_assumed(pod.uid):
            self._slots.release()  # deleted, bound by someone else, or already on its way
            return
        qp.pod = pod
        found = gang_of(self._gangs.get(profile.name, ()), pod)
        if found is not None:
            schedule_gang(self, profile, qp, found[0], found[1])
            return
        state: CycleState = {}
        start = time.perf_counter()
        refusal = self._without_gang_plugin(profile, pod)
        result = self.decide(profile, pod, state) if refusal is None else refusal
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
            self._unschedulable(
                profile, qp, frozenset(result.rejectors), result.message, start, retry_after=result.retry_after
            )
            self._slots.release()
            return
        if isinstance(result, Status):
            self._error(profile, qp, result.message, start)
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

    def decide(self, profile: Profile, pod: PodInfo, state: CycleState) -> ScheduleResult | Diagnosis | Status:
        """The algorithm for one pod, timed (wall clock, CPU, preempted by the OS) with the collector paused."""
        collecting = gc.isenabled()
        gc.disable()  # a collection triggered by the decision's allocations runs right after it instead
        before = thread_usage()  # system calls, outside the timed section: the OS may preempt at their return
        start = time.perf_counter()
        try:
            result = self.algorithm.schedule(profile, pod, state, self._observers[profile.name])
        except Exception as err:
            log.exception("scheduling failed", pod=pod.key)
            result = Status(Code.ERROR, (f"running the scheduling framework: {err!r}",))
        finally:
            if collecting:
                gc.enable()
        decided = time.perf_counter()
        after = thread_usage()
        self.metrics.algorithm_duration.labels(profile.name).observe(decided - start)
        if before is not None and after is not None:
            self.metrics.algorithm_cpu.labels(profile.name).observe(after[0] - before[0])
            if after[1] > before[1]:
                self.metrics.algorithm_preempted.labels(profile.name).inc()
        return result

    def _assume_and_bind(
        self, profile: Profile, qp: QueuedPod, state: CycleState, result: ScheduleResult, start: float
    ) -> None:
        pod, node = qp.pod, result.node
        if not self.may_bind():  # the term ended during this cycle: leave the pod for the next leader
            self._requeue_dropped(pod.uid)
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
        self._requeue_dropped(pod.uid)

    async def _binding_cycle(self, profile: Profile, qp: QueuedPod, state: CycleState, node: str, start: float) -> None:
        pod = qp.pod
        self.metrics.binds_in_flight.inc()
        bind_start = time.perf_counter()
        try:
            status = await profile.run_binding(state, pod, node, self._observers[profile.name])
        finally:
            self.metrics.binds_in_flight.dec()
        if asyncio.current_task() in self._dropped:  # dropped (and undone) by stop_binding while finishing
            return
        if not status.success and status.code is not Code.ALREADY_BOUND and not self.may_bind():
            profile.run_unreserve(state, pod, node)
            self.table.forget(pod.uid)
            self._requeue_dropped(pod.uid)
            return
        if status.code is Code.ALREADY_BOUND:
            self.table.forget(pod.uid)  # the informer will account the real binding
            self.reporter.already_bound(pod, profile.name)
            self.metrics.bind_duration.labels("conflict").observe(time.perf_counter() - bind_start)
            return
        if not status.success:
            self.metrics.bind_duration.labels("error").observe(time.perf_counter() - bind_start)
            profile.run_unreserve(state, pod, node)
            self.table.forget(pod.uid)
            # kube's handleBindingCycleError: the resources (and the peer) the assumption held are free again
            placed = dataclasses.replace(pod, node_name=node)
            self.queue.on_event(ClusterEvent.POD_DELETE, ClusterChange(ClusterEvent.POD_DELETE, placed))
            self._failed(profile, qp, status, start)
            return
        self.metrics.bind_duration.labels("bound").observe(time.perf_counter() - bind_start)
        profile.run_post_bind(state, pod, node)
        if state.get(SCHEDULED_WITH_BIND):
            self.reporter.bound(pod.uid)  # its Scheduled event went with the bind (``Reporter.with_bind``)
        else:
            self.reporter.scheduled(pod.namespace, pod.name, pod.uid, node, profile.name)
        self.metrics.schedule_attempts.labels("scheduled", profile.name).inc()
        self.metrics.attempt_duration.labels("scheduled", profile.name).observe(time.perf_counter() - start)

    def _requeue_dropped(self, uid: str) -> None:
        """A pod whose bind was withheld goes back to activeQ quietly (no event: nothing failed), if still pending."""
        pod = self.pending.get(uid)
        if pod is not None and not self.table.is_assumed(uid):
            self.queue.add(pod, self.clock())

    # ------------------------------------------------------------------------------------------ failures

    def _failed(self, profile: Profile, qp: QueuedPod, status: Status, start: float) -> None:
        if status.rejected:
            self._unschedulable(profile, qp, frozenset({status.plugin} - {""}), status.message, start)
        else:
            self._error(profile, qp, status.message, start)

    def _unschedulable(
        self,
        profile: Profile,
        qp: QueuedPod,
        rejectors: frozenset[str],
        message: str,
        start: float,
        *,
        retry_after: float | None = None,
    ) -> None:
        """``retry_after``: seconds until a refusal could lift with no event (``Diagnosis.retry_after``)."""
        self.metrics.schedule_attempts.labels("unschedulable", profile.name).inc()
        self.metrics.attempt_duration.labels("unschedulable", profile.name).observe(time.perf_counter() - start)
        if qp.pod.uid in self.pending:  # still pending (not deleted, not bound meanwhile)
            self.queue.add_unschedulable(qp, rejectors, self.clock(), retry_after)
            self.reporter.failed(self.pending[qp.pod.uid], message, UNSCHEDULABLE, profile.name)

    def _error(self, profile: Profile, qp: QueuedPod, message: str, start: float) -> None:
        self.metrics.schedule_attempts.labels("error", profile.name).inc()
        self.metrics.attempt_duration.labels("error", profile.name).observe(time.perf_counter() - start)
        log.warning("scheduling attempt failed, retrying with backoff", pod=qp.pod.key, error=message)
        if qp.pod.uid in self.pending:
            self.queue.add_backoff(qp, self.clock())
            self.reporter.failed(self.pending[qp.pod.uid], message, SCHEDULER_ERROR, profile.name)
            self._wake()


def _observer(metrics: SchedulerMetrics, profile: str) -> Callable[[str, str, float], None]:
    children: dict[tuple[str, str], Any] = {}

    def observe(point: str, status: str, seconds: float) -> None:
        child = children.get((point, status))
        if child is None:
            child = children[(point, status)] = metrics.extension_point_duration.labels(point, status, profile)
        child.observe(seconds)

    return observe
