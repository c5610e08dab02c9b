"""The scheduler's cache: the node table and the pending pods kept in step with the API server.

kube-scheduler's cache and event handlers in one small class. Two ``crane_shared.informer.Informer`` instances
(the one list/watch mechanism of the project) feed it: nodes, and all non-terminal pods (bound ones for the
accounting, pending ones of our profiles to schedule). One pod watch, not two, so a pod's bind and its leaving the
pending set arrive in order. The informer reports differences after a re-list as ADDED/MODIFIED/DELETED events
and keeps its previous view when a list fails, so a failed list can never wipe the node table or the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Any, Protocol

from crane_scheduler.framework.types import ClusterChange, ClusterEvent
from crane_scheduler.internal.queue import SchedulingQueue
from crane_scheduler.listers import Kind, Listers, Obj
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import NodeInfo, PodInfo, bound_version, parse_node, parse_pod
from crane_shared.informer import EventType, Informer, ListFn

PAGE_SIZE = 1000
_OBJECT_EVENTS: dict[Kind, ClusterEvent] = {
    "pvcs": ClusterEvent.PVC_CHANGE,
    "pvs": ClusterEvent.PV_CHANGE,
    "storageclasses": ClusterEvent.STORAGE_CLASS_CHANGE,
    "csinodes": ClusterEvent.CSINODE_CHANGE,
    "volumeattachments": ClusterEvent.VOLUME_ATTACHMENT_DELETE,
    "pdbs": ClusterEvent.PDB_CHANGE,
    "csidrivers": ClusterEvent.CSIDRIVER_UPDATE,
    "csistoragecapacities": ClusterEvent.CSI_STORAGE_CAPACITY_CHANGE,
    "resourceclaims": ClusterEvent.RESOURCE_CLAIM_CHANGE,
    "resourceslices": ClusterEvent.RESOURCE_SLICE_CHANGE,
    "deviceclasses": ClusterEvent.DEVICE_CLASS_CHANGE,
    "devicetaintrules": ClusterEvent.RESOURCE_SLICE_CHANGE,  # kube's tracker reports them as slice updates
}
NON_TERMINAL_PODS = "status.phase!=Succeeded,status.phase!=Failed"


def trim(raw: dict[str, Any]) -> dict[str, Any]:
    """Drop ``metadata.managedFields`` in place (the informer keeps the same object): no plugin reads it, and it is
    a large share of a pod's decoded JSON (kube-scheduler's informers trim it too, ``TrimManagedFields``). The
    informers cut them before decoding already (``crane_shared.managedfields``); this takes what another
    encoder's layout left, and the objects fed without an informer."""
    meta = raw.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return raw


def _labels(pod: PodInfo | None) -> Any:
    return None if pod is None else (pod.raw.get("metadata") or {}).get("labels")


class Mirror(Protocol):
    def node_event(self, event: str, raw: dict[str, Any]) -> None: ...

    def pod_event(
        self,
        event: str,
        raw: dict[str, Any],
        accounting_changed: bool = True,
        assumed_raw: dict[str, Any] | None = None,
    ) -> None: ...


class Cache:
    """Applies node and pod events to the table and the queue. ``forget(uid)`` tells the reporter a pod left the
    pending set; ``wake()`` tells the scheduling loop there may be work."""

    def __init__(
        self,
        table: NodeTable,
        queue: SchedulingQueue,
        schedulers: Container[str],
        *,
        clock: Callable[[], float],
        forget: Callable[[str], None] = lambda uid: None,
        wake: Callable[[], None] = lambda: None,
        listers: Listers | None = None,
        bound_unassumed: Callable[[PodInfo], None] = lambda pod: None,
    ) -> None:
        self.listers = listers if listers is not None else Listers()
        self.listers.on_change = self.on_object_change
        self.table = table
        self.queue = queue
        self.schedulers = schedulers
        self.clock = clock
        self.forget = forget
        self.wake = wake
        self.bound_unassumed = bound_unassumed
        """a pending pod of ours was seen bound while the table assumed no bind of ours for it: a bind whose reply
        was lost (it landed, the answer did not, and the attempt was counted as failed), or a bind by someone
        else; the scheduler makes sure it has its Scheduled event"""
        self.pending: dict[str, PodInfo] = {}  # pending pods of our profiles, latest version
        self.in_flight: Container[str] = ()
        """pods popped and not yet decided (a decider worker has them): an update keeps their latest version in
        ``pending`` but does not queue them again"""
        self.mirror: Mirror | None = None
        """the decider workers' feed (``deciders.pool.DeciderPool``): every node and pod event as applied here"""

    # ------------------------------------------------------------------------------------------ informers

    def node_informer(
        self, list_fn: ListFn, label_selector: str | None = None, on_restart: Callable[[str], None] | None = None
    ) -> Informer:
        informer = Informer(
            "nodes",
            list_fn,
            self.node_event,
            label_selector=label_selector,
            page_size=PAGE_SIZE,
            drop_managed_fields=True,
        )
        if on_restart is not None:
            informer.on_restart = on_restart
        return informer

    def pod_informer(self, list_fn: ListFn, on_restart: Callable[[str], None] | None = None) -> Informer:
        informer = Informer(
            "pods",
            list_fn,
            self.pod_event,
            field_selector=NON_TERMINAL_PODS,
            page_size=PAGE_SIZE,
            drop_managed_fields=True,
        )
        if on_restart is not None:
            informer.on_restart = on_restart
        return informer

    def object_informers(self, list_fns: dict[Kind, ListFn]) -> list[Informer]:
        """PVCs, PVs, StorageClasses, CSINodes, VolumeAttachments, PDBs into the listers (kube's shared
        informers for them)."""
        return [self.listers.informer(kind, fn, PAGE_SIZE) for kind, fn in list_fns.items()]

    def on_object_change(self, kind: Kind, new: Obj | None, old: Obj | None) -> None:
        """kube registers Add/Update of PVCs, PVs, StorageClasses, CSINodes and CSIStorageCapacities (VolumeBinding,
        VolumeZone, ...), CSIDriver updates, every PDB change (DefaultPreemption) and of VolumeAttachments only
        deletions (NodeVolumeLimits); deletions of other storage objects never make a pod schedulable."""
        if kind == "volumeattachments":
            if new is not None:
                return
        elif kind == "csidrivers":
            if new is None or old is None:  # kube registers CSIDriver updates only
                return
        elif new is None and kind not in ("pdbs", "devicetaintrules"):
            return
        event = _OBJECT_EVENTS[kind]
        if kind in ("resourceclaims", "deviceclasses"):  # DynamicResources' and NodeResourcesFit's hints read them
            self.queue.on_event(event, ClusterChange(event, old_object=old, new_object=new))
        else:
            self.queue.on_event(event)
        self.wake()

    def node_event(self, kind: EventType, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        trim(new)
        if kind == "DELETED":
            self.on_node_deleted(new)
        else:
            self.on_node(new)

    def pod_event(self, kind: EventType, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        trim(new)
        if kind == "DELETED":
            self.on_pod_deleted(new)
        else:
            self.on_pod(new)

    # ------------------------------------------------------------------------------------------ events

    def _node(self, name: str) -> NodeInfo | None:
        row = self.table.rows.get(name)
        return None if row is None else self.table.nodes[row]

    def on_node(self, raw: dict[str, Any]) -> None:
        node = parse_node(raw)
        old = self._node(node.name)
        kind = self.table.upsert_node(node)
        if self.mirror is not None:
            self.mirror.node_event("MODIFIED" if old is not None else "ADDED", raw)
        if kind is not None:
            event = ClusterEvent.NODE_ADD if kind == "add" else ClusterEvent.NODE_UPDATE
            self.queue.on_event(event, ClusterChange(event, old if kind == "update" else None, node))
            self.wake()

    def on_node_deleted(self, raw: dict[str, Any]) -> None:
        name = (raw.get("metadata") or {}).get("name", "")
        old = self._node(name)
        if self.mirror is not None:
            self.mirror.node_event("DELETED", raw)
        if self.table.remove_node(name):
            self.queue.on_event(ClusterEvent.NODE_DELETE, ClusterChange(ClusterEvent.NODE_DELETE, old))
            self.wake()

    def on_pod(self, raw: dict[str, Any]) -> None:
        spec = raw.get("spec") or {}
        self._track_nomination(raw)
        if self.mirror is not None and not spec.get("nodeName"):
            self.mirror.pod_event("MODIFIED", raw)  # a nomination, or one withdrawn (nothing else is sent)
        if not spec.get("nodeName") and spec.get("schedulerName", "default-scheduler") not in self.schedulers:
            return  # another scheduler's pending pod: nothing to account, nothing to schedule
        held = self._held_version(raw) if spec.get("nodeName") else None
        bound = bound_version(held, raw) if held is not None else None
        pod = bound or parse_pod(raw)
        if pod.node_name:
            was_pending = self.pending.pop(pod.uid, None) is not None
            if was_pending:
                self.queue.delete(pod.uid)
            before = self.table.pods.get(pod.uid)
            if was_pending and before is None:
                self.bound_unassumed(pod)
            old = before.pod if before is not None else None  # add_pod may update the record in place
            old_labels = _labels(old)
            if before is None or before.assumed:
                changed = self.table.add_pod(pod)  # a new peer (affinity) or count (topology spread)
                self.queue.on_event(ClusterEvent.POD_ADD, ClusterChange(ClusterEvent.POD_ADD, None, pod))
            else:
                changed = self.table.add_pod(pod)
                if changed or old_labels != _labels(pod):
                    change = None if old is None else ClusterChange(ClusterEvent.POD_UPDATE, old, pod)
                    self.queue.on_event(ClusterEvent.POD_UPDATE, change)
            if self.mirror is not None:
                read_from = held.raw if bound is not None and held is not None else None
                self.mirror.pod_event("MODIFIED", raw, changed or before is None, read_from)
            self.forget(pod.uid)
            return
        if pod.scheduler_name not in self.schedulers:
            return
        if self.table.is_assumed(pod.uid) or pod.uid in self.in_flight:
            # our bind is in flight, or our decision: keep the latest version, do not queue
            self.pending[pod.uid] = pod
            return
        if pod.deleting or pod.gated:
            self.pending.pop(pod.uid, None)
            self.queue.delete(pod.uid)
            return
        self.pending[pod.uid] = pod
        self.queue.add(pod, self.clock())  # add() updates in place when the pod is already queued
        self.wake()

    def _held_version(self, raw: dict[str, Any]) -> PodInfo | None:
        """The pending version we hold of the bound pod ``raw`` (the pending pod, or the one the table assumed, as a
        decider's replica holds it), to read the bound one from (``podinfo.bound_version``)."""
        uid = (raw.get("metadata") or {}).get("uid", "")
        before = self.pending.get(uid)
        if before is None:
            record = self.table.pods.get(uid)
            before = record.pod if record is not None and record.assumed else None
        return before

    def _track_nomination(self, raw: dict[str, Any]) -> None:
        """kube's nominator: a pending pod (of any scheduler) with ``status.nominatedNodeName`` is expected on that
        node once preemption's victims are gone; Filter counts it there for pods of equal or lower priority."""
        meta = raw.get("metadata") or {}
        uid = meta.get("uid", "")
        node = (raw.get("status") or {}).get("nominatedNodeName")
        placed_or_leaving = (raw.get("spec") or {}).get("nodeName") or meta.get("deletionTimestamp")
        if node and not placed_or_leaving:
            self.table.nominated[uid] = (parse_pod(raw), node)
            return
        kept = self.table.nominated.get(uid)
        if kept is not None and not node and not placed_or_leaving:
            # kube's UpdateNominatedPod: an update that does not touch the nomination (neither the old nor the new
            # object has one) keeps the one made in memory: preemption nominates before its status patch lands,
            # and an update in between (the PodScheduled condition) must not free the node for other pods.
            before = self.pending.get(uid)
            old = before.raw if before is not None else kept[0].raw
            if not (old.get("status") or {}).get("nominatedNodeName"):
                self.table.nominated[uid] = (parse_pod(raw), kept[1])
                return
        self.table.nominated.pop(uid, None)

    def on_pod_deleted(self, raw: dict[str, Any]) -> None:
        uid = (raw.get("metadata") or {}).get("uid", "")
        if self.mirror is not None:
            self.mirror.pod_event("DELETED", raw)
        self.table.nominated.pop(uid, None)
        self.pending.pop(uid, None)
        self.queue.delete(uid)
        self.forget(uid)
        record = self.table.remove_pod(uid, deleted=True)  # deleted, or terminal (out of the watch's selector)
        if record is not None:
            change = None if record.pod is None else ClusterChange(ClusterEvent.POD_DELETE, record.pod)
            self.queue.on_event(ClusterEvent.POD_DELETE, change)
            self.wake()
