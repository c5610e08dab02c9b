"""Coscheduling: the framework adapter (QueueSort, PreFilter, the gang hooks, the PodGroup watch and status)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubernetes_asyncio import client

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins.coscheduling import NAME
from crane_scheduler.plugins.coscheduling import gang as g
from crane_scheduler.plugins.gangwait import GangWaits
from crane_scheduler.podinfo import NodeInfo, PodInfo
from crane_shared.informer import EventType, Informer
from crane_shared.kube import DEFAULT_REQUEST_TIMEOUT, api_failure, raw_json
from crane_shared.logs import LogOnce, get_logger
from crane_shared.retry import sleep_unless

STATUS_PERIOD = 1.0
"""seconds between status passes (only groups whose pods or spec changed, or not final at a resync)"""
RESYNC_PERIOD = 300.0
"""seconds between re-reads of every non-final group's pods, a safety net: a placed member's every update (its phase)
and its leaving (finished, deleted) mark its group through the node table's pod hooks"""
log = get_logger("crane.scheduler.coscheduling")


@dataclass(frozen=True, slots=True)
class CoschedulingArgs:
    """scheduler-plugins' ``CoschedulingArgs`` (same names and defaults)."""

    permit_waiting_time_seconds: int = 60
    pod_group_backoff_seconds: int = 0
    pod_group_reject_percentage: int = 10


def parse_args(args: Mapping[str, Any]) -> CoschedulingArgs:
    problems: list[tuple[str, str]] = []
    fields = {
        "permitWaitingTimeSeconds": 60,
        "podGroupBackoffSeconds": 0,
        "podGroupRejectPercentage": 10,
    }
    values: dict[str, int] = {}
    for key in args:
        if key not in fields:
            problems.append((key, f"unknown field (plugin {NAME} takes {', '.join(fields)})"))
    for key, default in fields.items():
        value = args.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            problems.append((key, f"must be a non-negative integer, got {value!r}"))
        elif key == "podGroupRejectPercentage" and value > 100:
            problems.append((key, f"must be within 0..100, got {value}"))
        else:
            values[key] = value
    if problems:
        raise fwk.ArgsError(problems)
    if values["podGroupRejectPercentage"] != 10:
        log.warning(
            "podGroupRejectPercentage has no effect here: no member waits holding capacity, so none is rejected "
            "optimistically (a gang is placed all or nothing in one cycle)",
            value=values["podGroupRejectPercentage"],
        )
    return CoschedulingArgs(
        values["permitWaitingTimeSeconds"], values["podGroupBackoffSeconds"], values["podGroupRejectPercentage"]
    )


class PodGroupMetrics:
    def __init__(self, metrics: fwk.PluginMetrics) -> None:
        self.malformed = metrics.counter(
            "crane_scheduler_podgroups_malformed_total", "PodGroup objects skipped because they could not be read"
        )
        self.status_writes = metrics.counter(
            "crane_scheduler_podgroup_status_writes_total", "PodGroup status patches, by result", ["result"]
        )


class Coscheduling(
    fwk.QueueSortPlugin, fwk.PreFilterPlugin, fwk.QueueingHintPlugin, fwk.GangPlugin, fwk.WorkerPlugin, fwk.ObjectPlugin
):
    """scheduler-plugins' Coscheduling contract, placed all or nothing by the scheduler's gang cycle."""

    name = NAME

    def __init__(self, args: CoschedulingArgs, handle: fwk.Handle, wall_clock: Callable[[], float] = time.time) -> None:
        self.args = args
        self.handle = handle
        self.wall_clock = wall_clock
        self.metrics = PodGroupMetrics(handle.metrics)
        self.waits = GangWaits(handle, NAME)
        self.groups: dict[str, g.PodGroup] = {}
        self.synced = False
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._log_once = LogOnce(log)
        self._placed: dict[str, str] = {}  # placed member uid -> its group
        handle.table.pod_added.append(self._pod_added)
        handle.table.pod_removed.append(self._pod_removed)

    # -- QueueSort ------------------------------------------------------------------------------------------------

    def sort_key(self, qp: fwk.QueuedPod) -> tuple[Any, ...]:
        pod = qp.pod
        key = g.group_of(pod.raw)
        group = self.groups.get(key) if key is not None else None
        # the pod's first attempt on the wall clock (the queue's times are on the handle's clock)
        initial = self.wall_clock() - (self.handle.clock() - (qp.initial_attempt or qp.timestamp))
        return g.sort_key(pod.priority, group.created if group else None, initial, pod.namespace, pod.name)

    # -- PreFilter ------------------------------------------------------------------------------------------------

    def pre_filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> fwk.PreFilterResult:
        key = g.group_of(pod.raw)
        if key is None:
            return fwk.PreFilterResult(fwk.Status(fwk.Code.SKIP))
        group = self.groups.get(key)
        if group is None:
            self.waits.hold(key, pod.uid)
            reason = g.NOT_FOUND if self.synced else "the PodGroup list has not completed yet"
            return _unresolvable(reason)
        if self.waits.backed_off(key):
            self.waits.hold(key, pod.uid)
            return _unresolvable(g.failed_recently(key))
        count = state.get(fwk.GANG_MEMBERS)
        if isinstance(count, int) and count < group.min_member:
            self.waits.hold(key, pod.uid)
            return _unresolvable(g.not_enough_siblings(pod.name, count, group.min_member))
        if group.min_resources:
            gap = g.resource_gap(group.min_resources, self._free(table, key), group.min_member)
            if gap is not None:
                self.waits.hold(key, pod.uid)
                return _unresolvable(f"resource gap: {g.format_gap(gap)}")
        return fwk.PreFilterResult(fwk.Status())

    def _free(self, table: NodeTable, key: str) -> list[dict[str, int]]:
        """Free resources per live node, the group's own placed pods not counted (reference: getNodeResource)."""
        rows = table.live_rows()
        free = table.alloc[rows] - table.requested[rows]
        free[:, table.resources["pods"]] = table.alloc[rows, table.resources["pods"]] - table.pod_count[rows]
        own: dict[str, dict[str, int]] = {}
        for record in table.pods.values():
            if record.pod is not None and g.group_of(record.pod.raw) == key:
                into = own.setdefault(record.node, {})
                for res, value in record.requests.items():
                    into[res] = into.get(res, 0) + value
                into["pods"] = into.get("pods", 0) + 1
        names = table.names
        out = []
        for i, row in enumerate(rows.tolist()):
            node = {res: int(free[i, col]) for res, col in table.resources.items() if col < free.shape[1]}
            for res, value in own.get(names[row], {}).items():
                node[res] = node.get(res, 0) + value
            out.append(node)
        return out

    def events_to_register(self) -> fwk.ClusterEvent:
        # minResources: room freed or added; siblings arriving retry the group through their own gang cycle, and
        # a PodGroup appearing or changing activates its waiting members (``_on_event``)
        return fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE | fwk.ClusterEvent.POD_DELETE

    def queueing_hints(self) -> fwk.QueueingHints:
        return {fwk.ClusterEvent.NODE_UPDATE: allocatable_grew}

    # -- the gang hooks -------------------------------------------------------------------------------------------

    def gang_of(self, pod: PodInfo) -> str | None:
        return g.group_of(pod.raw)

    def quorum(self, gang: str) -> int:
        group = self.groups.get(gang)
        return group.min_member if group is not None else 0

    def gang_placed(self, gang: str, uids: Sequence[str]) -> None:
        self.waits.placed(gang)
        self._mark(gang)

    def gang_waiting(
        self,
        gang: str,
        uids: Sequence[str],
        blocker: str,
        feasible: int,
        refused: bool,
        placed: int = 0,
        untried: int = 0,
    ) -> fwk.GangWait:
        self._mark(gang)
        group = self.groups.get(gang)
        timeout: float | None = None
        if group is not None:
            timeout = group.schedule_timeout
            if timeout is None:
                timeout = float(self.args.permit_waiting_time_seconds)
        # the reference backs a group off when a member did not fit (PostFilter), not for its own refusals
        backoff = 0.0 if refused else float(self.args.pod_group_backoff_seconds)
        return self.waits.wait(gang, uids, g.rejected_with(gang, blocker), feasible, timeout, backoff)

    def gang_incomplete(self, gang: str, pod: PodInfo, members: int, quorum: int) -> str:
        """scheduler-plugins has no PreEnqueue: the pod hears PreFilter's refusal (``cannot find enough sibling
        pods``), once, as if it had been tried; only the cycle is skipped (the reference repeats the attempt at
        every sibling's arrival)."""
        self.waits.hold(gang, pod.uid)
        return g.not_enough_siblings(pod.name, members, quorum)

    def activate(self, gang: str) -> None:
        """Retry the group's waiting members now (its PodGroup appeared or changed, its backoff or wait ended)."""
        self.waits.activate(gang)

    # -- the PodGroup watch ---------------------------------------------------------------------------------------

    def set_group(self, raw: Mapping[str, Any]) -> None:
        try:
            group = g.parse_pod_group(raw)
        except g.PodGroupError as err:
            self.metrics.malformed.inc()
            self._log_once.warning("podgroup", "malformed PodGroup ignored", error=str(err))
            return
        old = self.groups.get(group.key)
        self.groups[group.key] = group
        self._mark(group.key)
        if old is None or (old.min_member, old.min_resources, old.schedule_timeout) != (
            group.min_member,
            group.min_resources,
            group.schedule_timeout,
        ):
            self.waits.backoff_until.pop(group.key, None)
            self.activate(group.key)

    def delete_group(self, key: str) -> None:
        self.groups.pop(key, None)
        self.waits.forget(key)

    object_kinds = ("PodGroup",)

    def apply_object(self, kind: str, event: EventType, obj: dict[str, Any]) -> None:
        """scheduler-plugins' PodGroups only: Kubernetes' own (``scheduling.k8s.io``) are GangScheduling's."""
        if str(obj.get("apiVersion", "")).startswith("scheduling.k8s.io/"):
            return
        self._on_event(event, obj, None)

    def objects_listed(self) -> None:
        self.synced = True

    def _on_event(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if kind == "DELETED":
            meta = obj.get("metadata") or {}
            self.delete_group(g.full_name(str(meta.get("namespace", "")), str(meta.get("name", ""))))
        else:
            self.set_group(obj)

    def _pod_added(self, pod: PodInfo) -> None:
        key = g.group_of(pod.raw)
        if key is not None:
            self._placed[pod.uid] = key
            self._mark(key)

    def _pod_removed(self, uid: str) -> None:
        key = self._placed.pop(uid, None)
        if key is not None:
            self._mark(key)

    def _mark(self, key: str) -> None:
        self._dirty.add(key)
        self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Watch the PodGroups and keep their status up to date (while this replica may write)."""
        if self.handle.api is None:
            return
        api = client.CustomObjectsApi(self.handle.api)
        informer = Informer(
            PLURAL_INFORMER,
            partial(api.list_cluster_custom_object, g.GROUP, g.VERSION, g.PLURAL),
            handler=self._on_event,
        )
        watch = asyncio.create_task(informer.run(stopping))
        try:
            await informer.synced.wait()
            self.synced = True
            for key in list(self.waits.waiting):
                self.activate(key)
            await self._status_loop(stopping, api)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    async def _status_loop(self, stopping: asyncio.Event, api: client.CustomObjectsApi) -> None:
        core = client.CoreV1Api(self.handle.api)
        last_resync = time.monotonic()
        while not stopping.is_set():
            if time.monotonic() - last_resync >= RESYNC_PERIOD:
                last_resync = time.monotonic()
                self._dirty |= {
                    k for k, grp in self.groups.items() if grp.status.get("phase") not in (g.FINISHED, g.FAILED)
                }
            if self._dirty and self.handle.may_bind():
                dirty, self._dirty = self._dirty, set()
                by_namespace: dict[str, list[str]] = {}
                for key in sorted(dirty):
                    group = self.groups.get(key)
                    if group is not None:
                        by_namespace.setdefault(group.namespace, []).append(key)
                for namespace, keys in by_namespace.items():
                    await self._reconcile_namespace(namespace, keys, api, core)
            self._wake.clear()
            if await sleep_unless(stopping, STATUS_PERIOD):
                return

    async def _reconcile_namespace(
        self, namespace: str, keys: list[str], api: client.CustomObjectsApi, core: client.CoreV1Api
    ) -> None:
        """The changed groups of one namespace: their pods in one LIST (every pod of a group, by the label, as the
        controller lists them; one request per namespace and pass, not one per group, so a burst of arrivals over
        many groups costs the API server one scan), then each group's step."""
        try:
            pods = await raw_json(
                core.list_namespaced_pod(
                    namespace,
                    label_selector=g.POD_GROUP_LABEL,
                    _preload_content=False,
                    _request_timeout=DEFAULT_REQUEST_TIMEOUT,
                )
            )
        except Exception as err:  # retried on the next pass, never crashes the loop
            self.metrics.status_writes.labels("error").inc()
            self._log_once.warning(
                "status-list", "could not list PodGroups' pods (retrying)", **api_failure("list", "pods", err)
            )
            self._dirty.update(keys)
            return
        members: dict[str, list[g.Member]] = {key: [] for key in keys}
        for raw in pods.get("items") or ():
            key = g.group_of(raw)
            if key in members:
                members[key].append(g.member_of(raw))
        for key in keys:
            await self._reconcile(key, members[key], api)

    async def _reconcile(self, key: str, members: list[g.Member], api: client.CustomObjectsApi) -> None:
        """One step of scheduler-plugins' PodGroup controller; the patch comes back through the watch and marks
        the group again, so the phase moves on step by step until it is stable, as with the controller."""
        group = self.groups.get(key)
        if group is None:
            return
        try:
            if not any(not m.bound for m in members):
                self.waits.settled(key)  # no member pending any more (deleted, or bound): nothing waits
            status = g.settled_status(group, members, group.namespace, self.wall_clock())
            if status == dict(group.status):
                return
            await raw_json(
                api.patch_namespaced_custom_object_status(
                    g.GROUP,
                    g.VERSION,
                    group.namespace,
                    g.PLURAL,
                    group.name,
                    {"status": status},
                    _content_type="application/merge-patch+json",
                    _preload_content=False,
                    _request_timeout=DEFAULT_REQUEST_TIMEOUT,
                )
            )
            self.metrics.status_writes.labels("ok").inc()
        except Exception as err:  # a failed write is retried on the next pass, never crashes the loop
            self.metrics.status_writes.labels("error").inc()
            self._log_once.warning(
                "status",
                "could not update a PodGroup's status (retrying)",
                group=key,
                **api_failure("patch", f"podgroups/status {key}", err),
            )
            self._dirty.add(key)


PLURAL_INFORMER = "podgroups"


def allocatable_grew(pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
    """A node update helps a group short of room only if the node offers more (not an annotation round)."""
    old, new = change.old, change.new
    if not isinstance(old, NodeInfo) or not isinstance(new, NodeInfo):
        return fwk.QueueingHint.QUEUE
    grew = any(value > old.allocatable.get(res, 0) for res, value in new.allocatable.items())
    return fwk.QueueingHint.QUEUE if grew or (old.unschedulable and not new.unschedulable) else fwk.QueueingHint.SKIP


def _unresolvable(message: str) -> fwk.PreFilterResult:
    return fwk.PreFilterResult(fwk.Status(fwk.Code.UNSCHEDULABLE_AND_UNRESOLVABLE, (message,), NAME))


def new(args: Mapping[str, Any], handle: fwk.Handle) -> Coscheduling:
    return Coscheduling(parse_args(args), handle)
