"""The scheduler: informers feed the node table and the queue; one loop decides; binds run concurrently.

This module assembles the service (kube-scheduler's ``scheduler.go``): the cache, the queue with the plugins'
hints and gates, the reporter and the API writer wired together, the informers, the loop and leadership. What
happens to each popped pod (decide, assume, Reserve, the binding cycle, failures) is ``schedule_one.py``
(``schedule_one.go``), whose steps ``Scheduler`` inherits; the gang cycle (``gangcycle.py``) runs on their public
interface (``schedule_one.CycleHost``).

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
import functools
import gc
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client

from crane_scheduler import gangless
from crane_scheduler.algorithm import Algorithm
from crane_scheduler.config import SchedulerConfig
from crane_scheduler.deciders.eligible import profile_refusal
from crane_scheduler.deciders.pool import Answer, DeciderPool
from crane_scheduler.explain import DecisionLog
from crane_scheduler.framework.interface import GangPlugin, ObjectPlugin, QueueingHintPlugin
from crane_scheduler.framework.runtime import Profile
from crane_scheduler.framework.types import ClusterEvent, CycleState, Diagnosis, QueuedPod, QueueingHints
from crane_scheduler.gangcycle import (
    GangIndex,
    IndexedPending,
    futile_wakeups,
    group_size,
    index_key,
    schedule_gang,
)
from crane_scheduler.gangrules import gang_of
from crane_scheduler.internal.cache import Cache
from crane_scheduler.internal.queue import NO_HINTS, SchedulingQueue
from crane_scheduler.listers import Listers
from crane_scheduler.metrics import SchedulerMetrics
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import UNSCHEDULABLE, PodInfo
from crane_scheduler.reporting import Reporter
from crane_scheduler.schedule_one import SchedulingCycle
from crane_scheduler.writer import ApiWriter
from crane_shared.kube import api_failure
from crane_shared.leader import Term
from crane_shared.logs import LogOnce, get_logger
from crane_shared.retry import sleep_unless
from crane_shared.worker import cancel_and_wait

RECOVERY_SETTLE = 35.0
"""seconds into a term before the second look for unreported bindings: a bind the previous term had on the wire
has landed (or failed) within its request timeout (30 s by default), and the cache has seen it"""
SETTLED_LOOKS = 5
"""tries of that second look when it fails (each ``RECOVERY_SETTLE`` after the last)"""
log = get_logger("crane.scheduler")
UNSCHEDULABLE_FLUSH_PERIOD = 30.0
WRITER_READY_TIMEOUT = 10.0
"""seconds the first decision waits for the API writer process to be ready (its writes would only wait in the
pipe meanwhile, and a preemption's evictions with them); past that, scheduling goes on and the writes wait in the
pipe until the process reads them (or answer UNSENT if it exits)"""
OLD_GENERATION_THRESHOLD = 1_000_000
"""gen1 collections before CPython may collect the old generation: in effect never by itself (see ``collector``)"""
FULL_COLLECTION_PERIOD = 300.0
"""seconds between full collections, run when the scheduler is idle (or after twice as long regardless)"""


def tune_collector() -> None:
    """After the initial sync: the listed nodes and pods are long-lived, so the collector never rescans them
    (``gc.freeze``), and the old generation is not collected automatically: its collection scans every object
    bound since, hundreds of milliseconds in a burst of thousands of pods. ``Scheduler._flush_loop`` collects it
    when idle; decisions run with the collector paused (``schedule_one``), so a pause lands between them."""
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, OLD_GENERATION_THRESHOLD)


class Scheduler(SchedulingCycle):
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
        deciders: DeciderPool | None = None,
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
                profile.handle.status_settled = self.reporter.settled
                profile.handle.scheduled_report = functools.partial(self.reporter.with_bind, profile.name)
        self._gangs: dict[str, tuple[GangPlugin, ...]] = {
            name: tuple(p for p in profile.plugins.values() if isinstance(p, GangPlugin))
            for name, profile in profiles.items()
        }
        gangs = any(self._gangs.values())
        self.gang_index = GangIndex(self._gang_of, table, gangs=gangs)
        if gangs:
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
        self.deciders = deciders
        self._loop_task: asyncio.Task[Any] | None = None  # the scheduling loop's, while it runs
        self._cycle_error: Exception | None = None  # a cycle a worker's answer ran raised it: the loop raises it
        self._deciding: dict[str, asyncio.Future[Answer]] = {}  # pods a decider worker has
        self._worker_refusals = {name: profile_refusal(p) for name, p in profiles.items()}
        if deciders is not None:
            self._feed(deciders)
        self._leading = False  # a term runs here (a standby's cache sees the leader's binds: not its to report)

    def _gang_of(self, pod: PodInfo) -> str | None:
        """The pod's gang as its profile's gang plugins say (a placed pod of any scheduler counts for its group:
        then every profile's plugins are asked)."""
        plugins = self._gangs.get(pod.scheduler_name) or tuple(p for ps in self._gangs.values() for p in ps)
        found = gang_of(plugins, pod)
        return index_key(found[0].name, found[1]) if found is not None else None

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
        members = group_size(self.gang_index, index_key(plugin.name, gang))
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
        if self._leading and self.may_bind():
            self.reporter.scheduled(pod.namespace, pod.name, pod.uid, pod.node_name, pod.scheduler_name)

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

    def _feed(self, pool: DeciderPool) -> None:
        """The decider workers' replicas follow this process's table: the cache's node and pod events, the
        assumptions and their undoing, the objects the plugins' watches read (one plugin per kind)."""
        self.cache.mirror = pool
        self.cache.in_flight = self._deciding
        pool.watch(self.table)
        tapped: set[str] = set()
        for profile in self.profiles.values():
            for plugin in profile.plugins.values():
                if isinstance(plugin, ObjectPlugin) and not tapped.issuperset(plugin.object_kinds):
                    tapped.update(plugin.object_kinds)
                    plugin.apply_object = _tapped(plugin.apply_object, pool.object_event)  # type: ignore[method-assign]
        for name, why in self._worker_refusals.items():
            if why is not None:
                log.info("profile decided in the scheduling process only", profile=name, reason=why)

    async def run(self, stopping: asyncio.Event, term: Term | None = None) -> None:
        """Schedule until ``stopping`` (or until cancelled on losing leadership, ``term``); in-flight binds
        finish, or are dropped by ``stop_binding``."""
        self._term = term
        self.reporter.term = term  # reports queued from now on belong to this term
        if self.writer is not None:
            self.writer.term = term  # and binds
        self._leading = True  # from here on a pod found bound unassumed is reported (recovery's list may be slow)
        try:
            await self.synced.wait()
            if self.writer is not None and not await self.writer.wait_ready(WRITER_READY_TIMEOUT):
                log.warning("the API writer process is not ready; scheduling anyway", waited=WRITER_READY_TIMEOUT)
            await self._recover_scheduled_events()
            await self._schedule(stopping)
        finally:
            self._leading = False

    async def _schedule(self, stopping: asyncio.Event) -> None:
        flusher = asyncio.create_task(self._flush_loop(stopping))
        settled = asyncio.create_task(self._recover_once_settled(stopping))
        log.info("scheduling", profiles=sorted(self.profiles))
        pool = self.deciders
        if pool is not None:
            await pool.start()
        self._loop_task, self._cycle_error = asyncio.current_task(), None
        try:
            while not stopping.is_set():
                await self._slots.acquire()
                if pool is not None:
                    await pool.room()
                qp = await self._next_pod(stopping)
                if qp is None:
                    self._slots.release()
                    break
                if not self.dispatch(qp):
                    self.schedule_one(qp)
                await asyncio.sleep(0)  # let informers and binds run between decisions
        except asyncio.CancelledError:
            if self._cycle_error is not None:
                raise self._cycle_error from None
            raise
        finally:
            self._loop_task = None
            self.abandon_decisions()
            flusher.cancel()
            settled.cancel()
            await self.drain()

    def cycle_failed(self, err: Exception) -> None:
        log.error("a scheduling cycle failed", error=repr(err))
        if self._loop_task is not None and self._cycle_error is None:
            self._cycle_error = err
            self._loop_task.cancel()

    async def _recover_scheduled_events(self) -> bool:
        """Write the Scheduled events of bindings nobody reported; False when the look failed (logged)."""
        try:
            await self.reporter.recover_scheduled_events(list(self.table.pods.values()), set(self.profiles))
        except Exception as err:  # reporting must never keep the leader from scheduling
            log.warning("could not check for unreported bindings", **api_failure("list", "Scheduled events", err))
            return False
        return True

    async def _recover_once_settled(self, stopping: asyncio.Event) -> None:
        """Look for unreported bindings once more when the previous term's binds have landed: a bind cancelled
        on a lost lease may have been on the wire already (the pod gets bound, no event), and the cache may not
        have seen it bound when this term began. A look that fails is tried again after the same pause (at most
        ``SETTLED_LOOKS`` times: one that keeps failing, e.g. a role without the events list, is logged each time)."""
        for _ in range(SETTLED_LOOKS):
            if await sleep_unless(stopping, RECOVERY_SETTLE) or not self.may_bind():
                return
            if await self._recover_scheduled_events():
                return

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

    def schedule_gang(self, profile: Profile, qp: QueuedPod, plugin: GangPlugin, gang: str) -> None:
        schedule_gang(self, profile, qp, plugin, gang)

    def update_gauges(self) -> None:
        self.metrics.pending_pods.labels("active").set(self.queue.active_len)
        self.metrics.pending_pods.labels("backoff").set(self.queue.backoff_len)
        self.metrics.pending_pods.labels("unschedulable").set(len(self.queue.unschedulable))
        self.metrics.cache_size.labels("nodes").set(self.table.num_nodes)
        self.metrics.cache_size.labels("pods").set(len(self.table.pods))
        self.metrics.cache_size.labels("assumed_pods").set(sum(1 for r in self.table.pods.values() if r.assumed))


def _tapped(apply: Callable[[str, Any, dict[str, Any]], None], also: Callable[[str, Any, dict[str, Any]], None]) -> Any:
    def apply_object(kind: str, event: Any, obj: dict[str, Any]) -> None:
        apply(kind, event, obj)
        also(kind, event, obj)

    return apply_object


def _observer(metrics: SchedulerMetrics, profile: str) -> Callable[[str, str, float], None]:
    def observe(point: str, status: str, seconds: float) -> None:
        metrics.child(metrics.extension_point_duration, point, status, profile).observe(seconds)

    return observe
