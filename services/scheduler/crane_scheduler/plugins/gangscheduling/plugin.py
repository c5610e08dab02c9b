"""GangScheduling: the Workload model (pure), the framework adapter and the Workload watch."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubernetes_asyncio import client

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins.gangscheduling import NAME
from crane_scheduler.plugins.gangwait import GangWaits
from crane_scheduler.podinfo import PodInfo
from crane_shared.informer import EventType, Informer
from crane_shared.logs import LogOnce, get_logger

GROUP = "scheduling.k8s.io"
VERSION = "v1alpha1"
PLURAL = "workloads"
DEFAULT_TIMEOUT_SECONDS = 300
"""kube's ``defaultSchedulingTimeoutSeconds``"""
NOT_ENOUGH_PODS = "waiting for minCount pods from a gang to appear in scheduling queue"
WAITING_ON_PERMIT = "waiting for minCount pods from a gang to be waiting on permit"
log = get_logger("crane.scheduler.gangscheduling")


class WorkloadError(ValueError):
    """A Workload the plugin cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class Workload:
    namespace: str
    name: str
    groups: Mapping[str, int | None]
    """pod group -> the gang's minCount (None: a ``basic`` group, no gang)"""


def parse_workload(raw: Mapping[str, Any]) -> Workload:
    meta = raw.get("metadata") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    groups: dict[str, int | None] = {}
    for i, group in enumerate((raw.get("spec") or {}).get("podGroups") or ()):
        gang = (group.get("policy") or {}).get("gang")
        count = gang.get("minCount") if gang is not None else None
        if gang is not None and (not isinstance(count, int) or count <= 0):
            raise WorkloadError(f"Workload {name}: spec.podGroups[{i}].policy.gang.minCount must be a positive integer")
        groups[str(group.get("name", ""))] = count
    return Workload(str(meta.get("namespace", "")), str(meta.get("name", "")), groups)


def workload_ref(pod_raw: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(workload, podGroup, podGroupReplicaKey) of ``spec.workloadRef``; None without one."""
    ref = (pod_raw.get("spec") or {}).get("workloadRef")
    if not ref:
        return None
    return str(ref.get("name", "")), str(ref.get("podGroup", "")), str(ref.get("podGroupReplicaKey") or "")


def gang_key(namespace: str, workload: str, group: str, replica: str) -> str:
    """One gang per (workload, podGroup, replicaKey) in a namespace (kube's workload-manager key)."""
    return f"{namespace}/{workload}/{group}/{replica}"


def workload_missing(name: str) -> str:
    return f'waiting for pods\'s workload "{name}" to appear in scheduling queue'


def group_missing(group: str, workload: str) -> str:
    return f'pod group "{group}" doesn\'t exist for a workload "{workload}"'


def parse_args(args: Mapping[str, Any]) -> float:
    """crane's one arg, ``schedulingTimeoutSeconds`` (kube's is fixed at 300)."""
    unknown = [
        (k, f"unknown field (plugin {NAME} takes schedulingTimeoutSeconds)")
        for k in args
        if k != "schedulingTimeoutSeconds"
    ]
    value = args.get("schedulingTimeoutSeconds", DEFAULT_TIMEOUT_SECONDS)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        unknown.append(("schedulingTimeoutSeconds", f"must be a positive integer, got {value!r}"))
    if unknown:
        raise fwk.ArgsError(unknown)
    return float(value)


class GangScheduling(fwk.PreFilterPlugin, fwk.EnqueueExtensions, fwk.GangPlugin, fwk.WorkerPlugin, fwk.ObjectPlugin):
    name = NAME
    supports_fields = ("spec.workloadRef",)

    def __init__(self, timeout: float, handle: fwk.Handle) -> None:
        self.timeout = timeout
        self.handle = handle
        self.waits = GangWaits(handle, NAME)
        self.workloads: dict[str, Workload] = {}
        self.synced = False
        self.malformed = handle.metrics.counter(
            "crane_scheduler_workloads_malformed_total", "Workload objects skipped because they could not be read"
        )
        self._log_once = LogOnce(log)

    def gang_of(self, pod: PodInfo) -> str | None:
        """The pod's gang; None without ``workloadRef`` or in a known ``basic`` group (scheduled as any pod, with
        preemption)."""
        ref = workload_ref(pod.raw)
        if ref is None:
            return None
        workload = self.workloads.get(f"{pod.namespace}/{ref[0]}")
        if workload is not None and ref[1] in workload.groups and workload.groups[ref[1]] is None:
            return None
        return gang_key(pod.namespace, *ref)

    def _policy(self, gang: str) -> tuple[Workload | None, str, str, int | None]:
        namespace, name, group, _ = gang.split("/", 3)
        workload = self.workloads.get(f"{namespace}/{name}")
        return workload, name, group, workload.groups.get(group) if workload is not None else None

    def quorum(self, gang: str) -> int:
        return self._policy(gang)[3] or 0

    def pre_filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> fwk.PreFilterResult:
        gang = self.gang_of(pod)
        if gang is None:
            return fwk.PreFilterResult(fwk.Status(fwk.Code.SKIP))
        workload, name, group, count = self._policy(gang)
        if workload is None:
            self.waits.hold(gang, pod.uid)
            return _unresolvable(workload_missing(name) if self.synced else "the Workload list has not completed yet")
        if group not in workload.groups:
            self.waits.hold(gang, pod.uid)
            return _unresolvable(group_missing(group, name))
        if count is None:  # basic policy: no gang
            return fwk.PreFilterResult(fwk.Status(fwk.Code.SKIP))
        members = state.get(fwk.GANG_MEMBERS)
        if isinstance(members, int) and members < count:
            self.waits.hold(gang, pod.uid)
            return _unresolvable(NOT_ENOUGH_PODS)
        return fwk.PreFilterResult(fwk.Status())

    def events_to_register(self) -> fwk.ClusterEvent:
        # kube's Pod Add and Workload Add: a sibling arriving retries the group through its own gang cycle, a
        # Workload arriving activates the members waiting for it (``set_workload``)
        return fwk.ClusterEvent(0)

    def gang_placed(self, gang: str, uids: Sequence[str]) -> None:
        self.waits.placed(gang)

    def gang_waiting(self, gang: str, uids: Sequence[str], blocker: str, feasible: int, refused: bool) -> fwk.GangWait:
        timeout = self.timeout if self.quorum(gang) else None
        return self.waits.wait(gang, uids, WAITING_ON_PERMIT, feasible, timeout)

    def gang_incomplete(self, gang: str, pod: PodInfo, members: int, quorum: int) -> str:
        """kube's PreEnqueue refusal, told as the plugin's other PreEnqueue refusals are (from PreFilter)."""
        self.waits.hold(gang, pod.uid)
        return NOT_ENOUGH_PODS

    def activate(self, gang: str) -> None:
        self.waits.activate(gang)

    # -- the Workload watch ---------------------------------------------------------------------------------------

    def set_workload(self, raw: Mapping[str, Any]) -> None:
        try:
            workload = parse_workload(raw)
        except WorkloadError as err:
            self.malformed.inc()
            self._log_once.warning("workload", "malformed Workload ignored", error=str(err))
            return
        key = f"{workload.namespace}/{workload.name}"
        self.workloads[key] = workload
        for gang in [g for g in self.waits.waiting if g.startswith(key + "/")]:
            self.activate(gang)

    object_kinds = ("Workload",)

    def apply_object(self, kind: str, event: EventType, obj: dict[str, Any]) -> None:
        self._on_event(event, obj, None)

    def objects_listed(self) -> None:
        self.synced = True

    def _on_event(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if kind == "DELETED":
            meta = obj.get("metadata") or {}
            key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
            self.workloads.pop(key, None)
            for gang in [g for g in self.waits.waiting if g.startswith(key + "/")]:
                self.waits.forget(gang)
        else:
            self.set_workload(obj)

    async def run(self, stopping: asyncio.Event) -> None:
        """Watch the Workloads (an alpha API: where it is not served the informer retries, and pods with
        ``workloadRef`` wait with the reason)."""
        if self.handle.api is None:
            return
        api = client.CustomObjectsApi(self.handle.api)
        informer = Informer(
            PLURAL, partial(api.list_cluster_custom_object, GROUP, VERSION, PLURAL), handler=self._on_event
        )
        watch = asyncio.create_task(informer.run(stopping))
        try:
            await informer.synced.wait()
            self.synced = True
            for gang in list(self.waits.waiting):
                self.activate(gang)
            await stopping.wait()
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)


def _unresolvable(message: str) -> fwk.PreFilterResult:
    return fwk.PreFilterResult(fwk.Status(fwk.Code.UNSCHEDULABLE_AND_UNRESOLVABLE, (message,), NAME))


def new(args: Mapping[str, Any], handle: fwk.Handle) -> GangScheduling:
    return GangScheduling(parse_args(args), handle)
