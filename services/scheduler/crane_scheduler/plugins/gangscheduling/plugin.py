"""GangScheduling: the gang models of both Workload APIs (pure), the framework adapter and the watch.

Two API shapes, one plugin; which one it watches is what the API server serves (discovery):

- Kubernetes 1.37, ``scheduling.k8s.io/v1beta1``: a ``PodGroup`` object is the gang
  (``spec.schedulingPolicy{basic|gang{minCount}}``); a pod joins with ``spec.schedulingGroup.podGroupName`` (same
  namespace). Gang key ``namespace/podGroupName``.
- Kubernetes 1.35, ``scheduling.k8s.io/v1alpha1``: a ``Workload`` lists ``spec.podGroups[]{name, policy}``; a pod
  joins with ``spec.workloadRef{name, podGroup, podGroupReplicaKey}``. Gang key
  ``namespace/workload/podGroup/replicaKey``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
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
from crane_shared.kube import api_failure, served_versions
from crane_shared.logs import LogOnce, get_logger

GROUP = "scheduling.k8s.io"
VERSION = "v1alpha1"
"""Kubernetes 1.35's Workload API (``Workload``, pods' ``spec.workloadRef``)"""
PLURAL = "workloads"
POD_GROUP_VERSION = "v1beta1"
"""Kubernetes 1.37's Workload API (``PodGroup``, pods' ``spec.schedulingGroup``)"""
POD_GROUP_PLURAL = "podgroups"
DISCOVERY_RETRY_SECONDS = 30.0
"""how often the plugin asks again while the server serves neither version (a cluster upgraded, a gate turned on)"""
DEFAULT_TIMEOUT_SECONDS = 300
"""kube 1.35's ``defaultSchedulingTimeoutSeconds`` (its Permit wait; 1.37's pod group cycle has none)"""
NOT_ENOUGH_PODS = "waiting for minCount pods from a gang to appear in scheduling queue"
WAITING_ON_PERMIT = "waiting for minCount pods from a gang to be waiting on permit"
NOT_LISTED = "the Workload list has not completed yet"
NOT_SERVED = (
    f"the API server serves neither {GROUP}/{POD_GROUP_VERSION} PodGroups nor {GROUP}/{VERSION} Workloads "
    "(feature gate GenericWorkload and --runtime-config)"
)
log = get_logger("crane.scheduler.gangscheduling")


class WorkloadError(ValueError):
    """A Workload or PodGroup the plugin cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class Workload:
    """1.35: one Workload, its pod groups."""

    namespace: str
    name: str
    groups: Mapping[str, int | None]
    """pod group -> the gang's minCount (None: a ``basic`` group, no gang)"""


@dataclass(frozen=True, slots=True)
class PodGroup:
    """1.37: one PodGroup object, itself the group."""

    namespace: str
    name: str
    min_count: int | None
    """the gang's minCount (None: a ``basic`` policy, no gang)"""
    priority: int
    """kube's ``PodGroupPriority``: ``spec.priority``, else 0; every member must have it"""
    unsupported: str | None = None
    """the first field the group sets that crane-scheduler does not read yet (its members are refused naming it)"""


def _gang_min_count(policy: Mapping[str, Any], where: str) -> int | None:
    gang = policy.get("gang")
    if gang is None:
        return None
    count = gang.get("minCount")
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        raise WorkloadError(f"{where}.gang.minCount must be a positive integer")
    return count


def parse_workload(raw: Mapping[str, Any]) -> Workload:
    meta = raw.get("metadata") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    groups: dict[str, int | None] = {}
    for i, group in enumerate((raw.get("spec") or {}).get("podGroups") or ()):
        groups[str(group.get("name", ""))] = _gang_min_count(
            group.get("policy") or {}, f"Workload {name}: spec.podGroups[{i}].policy"
        )
    return Workload(str(meta.get("namespace", "")), str(meta.get("name", "")), groups)


POD_GROUP_UNSUPPORTED: tuple[tuple[str, Callable[[Mapping[str, Any]], object]], ...] = (
    # TopologyAwareWorkloadScheduling (alpha): place the whole group within one topology domain
    ("spec.schedulingConstraints.topology", lambda spec: (spec.get("schedulingConstraints") or {}).get("topology")),
    # CompositePodGroup (alpha): the quorum is the composite group's
    ("spec.parentCompositePodGroupName", lambda spec: spec.get("parentCompositePodGroupName")),
    # DRAWorkloadResourceClaims (beta, off): claims shared by the group's pods
    ("spec.resourceClaims", lambda spec: spec.get("resourceClaims")),
    # workload-aware preemption: evicting one member evicts the group; crane's preemption picks pods one by one
    ("spec.disruptionMode.all", lambda spec: (spec.get("disruptionMode") or {}).get("all") is not None),
)
"""PodGroup fields that change where or how its pods may be placed or evicted, which crane-scheduler does not read
yet: never ignored, the members are refused with the field named."""


def parse_pod_group(raw: Mapping[str, Any]) -> PodGroup:
    meta = raw.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    spec = raw.get("spec") or {}
    min_count = _gang_min_count(
        spec.get("schedulingPolicy") or {}, f"PodGroup {namespace}/{name}: spec.schedulingPolicy"
    )
    priority = spec.get("priority")
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
        raise WorkloadError(f"PodGroup {namespace}/{name}: spec.priority must be an integer")
    unsupported = next((path for path, used in POD_GROUP_UNSUPPORTED if used(spec)), None)
    return PodGroup(namespace, name, min_count, int(priority or 0), unsupported)


def workload_ref(pod_raw: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(workload, podGroup, podGroupReplicaKey) of 1.35's ``spec.workloadRef``; None without one."""
    ref = (pod_raw.get("spec") or {}).get("workloadRef")
    if not ref:
        return None
    return str(ref.get("name", "")), str(ref.get("podGroup", "")), str(ref.get("podGroupReplicaKey") or "")


def scheduling_group(pod_raw: Mapping[str, Any]) -> str | None:
    """The PodGroup named by 1.37's ``spec.schedulingGroup.podGroupName``; None without one."""
    group = (pod_raw.get("spec") or {}).get("schedulingGroup")
    if not group:
        return None
    return str(group.get("podGroupName") or "")


def gang_key(namespace: str, workload: str, group: str, replica: str) -> str:
    """1.35: one gang per (workload, podGroup, replicaKey) in a namespace (kube's workload-manager key)."""
    return f"{namespace}/{workload}/{group}/{replica}"


def pod_group_key(namespace: str, pod_group: str) -> str:
    """1.37: one gang per PodGroup object (kube's ``PodGroupKey``)."""
    return f"{namespace}/{pod_group}"


def workload_missing(name: str) -> str:
    return f'waiting for pods\'s workload "{name}" to appear in scheduling queue'


def group_missing(group: str, workload: str) -> str:
    return f'pod group "{group}" doesn\'t exist for a workload "{workload}"'


def pod_group_missing(name: str) -> str:
    """kube 1.37's PreEnqueue refusal while the pod's PodGroup does not exist."""
    return f'waiting for pods\'s pod group "{name}" to appear in scheduling queue'


def min_count_unsatisfiable(min_count: int, scheduled: int, remaining: int) -> str:
    """kube 1.37's PlacementFeasible verdict on a group that cannot reach its quorum in this cycle, which the
    members that fit hear."""
    return f"minCount ({min_count}) cannot be satisfied: {scheduled} scheduled, {remaining} remaining"


def priority_mismatch(pod: int, group: int) -> str:
    """kube 1.37's ``validatePodGroup``: every member has the group's priority."""
    return (
        "all pods in a single pod group should have the same priority as the pod group's priority, "
        f"got {pod} and {group}"
    )


def unsupported_group_field(group: PodGroup) -> str:
    where = f"PodGroup {group.namespace}/{group.name}"
    return f"{where} uses {group.unsupported}, which crane-scheduler does not support yet"


def parse_args(args: Mapping[str, Any]) -> float:
    """crane's one arg, ``schedulingTimeoutSeconds`` (kube 1.35's is fixed at 300)."""
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


def is_pod_group_key(gang: str) -> bool:
    return gang.count("/") == 1


class GangScheduling(fwk.PreFilterPlugin, fwk.EnqueueExtensions, fwk.GangPlugin, fwk.WorkerPlugin, fwk.ObjectPlugin):
    name = NAME
    supports_fields = ("spec.workloadRef", "spec.schedulingGroup")

    def __init__(self, timeout: float, handle: fwk.Handle) -> None:
        self.timeout = timeout
        self.handle = handle
        self.waits = GangWaits(handle, NAME)
        self.workloads: dict[str, Workload] = {}
        self.pod_groups: dict[str, PodGroup] = {}
        self.version: str | None = None
        """the API version watched (``POD_GROUP_VERSION`` or ``VERSION``), None until discovery answers"""
        self.synced = False
        self.not_served = False
        """discovery answered: neither version is served (members wait with ``NOT_SERVED``)"""
        self.malformed = handle.metrics.counter(
            "crane_scheduler_workloads_malformed_total",
            "Workload and PodGroup objects skipped because they could not be read",
        )
        self._log_once = LogOnce(log)

    def gang_of(self, pod: PodInfo) -> str | None:
        """The pod's gang; None without ``schedulingGroup``/``workloadRef`` or in a known ``basic`` group
        (scheduled as any pod, with preemption)."""
        group_name = scheduling_group(pod.raw)
        if group_name is not None:
            key = pod_group_key(pod.namespace, group_name)
            group = self.pod_groups.get(key)
            if group is not None and group.min_count is None and group.unsupported is None:
                return None
            return key
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
        if is_pod_group_key(gang):
            group = self.pod_groups.get(gang)
            return (group.min_count or 0) if group is not None else 0
        return self._policy(gang)[3] or 0

    def _waiting_reason(self) -> str:
        return NOT_SERVED if self.not_served else NOT_LISTED

    def pre_filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> fwk.PreFilterResult:
        gang = self.gang_of(pod)
        if gang is None:
            return fwk.PreFilterResult(fwk.Status(fwk.Code.SKIP))
        if is_pod_group_key(gang):
            refusal, count = self._pod_group_verdict(gang, pod)
        else:
            refusal, count = self._workload_verdict(gang)
        if refusal is not None:
            self.waits.hold(gang, pod.uid)
            return _unresolvable(refusal)
        if count is None:  # basic policy: no gang
            return fwk.PreFilterResult(fwk.Status(fwk.Code.SKIP))
        members = state.get(fwk.GANG_MEMBERS)
        if isinstance(members, int) and members < count:
            self.waits.hold(gang, pod.uid)
            return _unresolvable(NOT_ENOUGH_PODS)
        return fwk.PreFilterResult(fwk.Status())

    def _pod_group_verdict(self, gang: str, pod: PodInfo) -> tuple[str | None, int | None]:
        """1.37's refusals, in kube's order (PreEnqueue's missing group, then ``validatePodGroup``), plus the
        fields crane does not read yet."""
        group = self.pod_groups.get(gang)
        if group is None:
            return (pod_group_missing(gang.split("/", 1)[1]) if self.synced else self._waiting_reason()), None
        if group.unsupported is not None:
            return unsupported_group_field(group), None
        if group.min_count is not None and pod.priority != group.priority:
            return priority_mismatch(pod.priority, group.priority), None
        return None, group.min_count

    def _workload_verdict(self, gang: str) -> tuple[str | None, int | None]:
        workload, name, group, count = self._policy(gang)
        if workload is None:
            return (workload_missing(name) if self.synced else self._waiting_reason()), None
        if group not in workload.groups:
            return group_missing(group, name), None
        return None, count

    def events_to_register(self) -> fwk.ClusterEvent:
        # kube's Pod Add and Workload/PodGroup Add (and PodGroup Update): a sibling arriving retries the group
        # through its own gang cycle, a group object arriving or changing activates the members waiting for it
        # (``set_workload``, ``set_pod_group``)
        return fwk.ClusterEvent(0)

    def gang_placed(self, gang: str, uids: Sequence[str]) -> None:
        self.waits.placed(gang)

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
        quorum = self.quorum(gang)
        if is_pod_group_key(gang):
            # kube 1.37 decides a PodGroup in one pod group cycle (no Permit wait, no timeout): the members that
            # fit hear its PlacementFeasible verdict
            verdict = min_count_unsatisfiable(quorum, placed + feasible, untried)
            return self.waits.wait(gang, uids, verdict, feasible, None)
        timeout = self.timeout if quorum else None
        return self.waits.wait(gang, uids, WAITING_ON_PERMIT, feasible, timeout)

    def gang_incomplete(self, gang: str, pod: PodInfo, members: int, quorum: int) -> str:
        """kube's PreEnqueue refusal, told as the plugin's other PreEnqueue refusals are (from PreFilter)."""
        self.waits.hold(gang, pod.uid)
        return NOT_ENOUGH_PODS

    def activate(self, gang: str) -> None:
        self.waits.activate(gang)

    # -- the watch ------------------------------------------------------------------------------------------------

    def _activate_under(self, key: str, exact: bool) -> None:
        for gang in [g for g in self.waits.waiting if (g == key if exact else g.startswith(key + "/"))]:
            self.activate(gang)

    def set_workload(self, raw: Mapping[str, Any]) -> None:
        try:
            workload = parse_workload(raw)
        except WorkloadError as err:
            self.malformed.inc()
            self._log_once.warning("workload", "malformed Workload ignored", error=str(err))
            return
        key = f"{workload.namespace}/{workload.name}"
        self.workloads[key] = workload
        self._activate_under(key, exact=False)

    def set_pod_group(self, raw: Mapping[str, Any]) -> None:
        try:
            group = parse_pod_group(raw)
        except WorkloadError as err:
            self.malformed.inc()
            self._log_once.warning("podgroup", "malformed PodGroup ignored", error=str(err))
            return
        key = pod_group_key(group.namespace, group.name)
        self.pod_groups[key] = group
        self._activate_under(key, exact=True)

    object_kinds = ("Workload", "PodGroup")

    def apply_object(self, kind: str, event: EventType, obj: dict[str, Any]) -> None:
        """Offline, the version is the objects': 1.37's PodGroups (``scheduling.k8s.io/v1beta1``) or 1.35's
        Workloads; scheduler-plugins' PodGroups (``scheduling.x-k8s.io``) are Coscheduling's, not ours."""
        if kind == "PodGroup" and obj.get("apiVersion") != f"{GROUP}/{POD_GROUP_VERSION}":
            return
        self.version = POD_GROUP_VERSION if kind == "PodGroup" else VERSION
        self._on_event(event, obj, None)

    def objects_listed(self) -> None:
        self.synced = True

    def _on_event(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        pod_groups = self.version == POD_GROUP_VERSION
        if kind != "DELETED":
            (self.set_pod_group if pod_groups else self.set_workload)(obj)
            return
        (self.pod_groups if pod_groups else self.workloads).pop(key, None)
        for gang in [g for g in self.waits.waiting if (g == key if pod_groups else g.startswith(key + "/"))]:
            self.waits.forget(gang)

    async def discover(self, api: client.ApiClient, stopping: asyncio.Event) -> str | None:
        """The version to watch: 1.37's ``v1beta1`` where served, else 1.35's ``v1alpha1``; asks again every
        ``DISCOVERY_RETRY_SECONDS`` while neither is (members wait with ``NOT_SERVED``). None once stopping."""
        while not stopping.is_set():
            try:
                versions = await served_versions(api, GROUP)
            except Exception as err:  # a failed discovery is retried, never fatal
                failure = api_failure("get", "/apis", err)
                self._log_once.warning("discovery", "API discovery failed; retrying", **failure)
            else:
                for version in (POD_GROUP_VERSION, VERSION):
                    if version in versions:
                        self.not_served = False
                        return version
                self.not_served = True
                self._log_once.warning("not-served", NOT_SERVED, served=sorted(versions))
                for gang in list(self.waits.waiting):  # their reason changed
                    self.activate(gang)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), DISCOVERY_RETRY_SECONDS)
        return None

    async def run(self, stopping: asyncio.Event) -> None:
        """Watch the PodGroups (1.37) or the Workloads (1.35), whichever the API server serves; pods of either kind
        wait with the reason until the list completes."""
        if self.handle.api is None:
            return
        version = await self.discover(self.handle.api, stopping)
        if version is None:
            return
        self.version = version
        plural = POD_GROUP_PLURAL if version == POD_GROUP_VERSION else PLURAL
        api = client.CustomObjectsApi(self.handle.api)
        informer = Informer(
            plural, partial(api.list_cluster_custom_object, GROUP, version, plural), handler=self._on_event
        )
        log.info("watching the Workload API", version=f"{GROUP}/{version}", resource=plural)
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
