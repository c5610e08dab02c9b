"""VolumeRestrictions (kube-scheduler 1.35): in-tree disks that cannot be mounted twice (GCE PD read-write, AWS
EBS, iSCSI and RBD read-write) conflict with the same disk in a pod already on the node, and a
ReadWriteOncePod claim already used by any pod (bound or assumed) makes every node unavailable.

A claim that does not exist is UnschedulableAndUnresolvable in PreFilter, with kube's message.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins.storage import StoragePlugin, Volume, volumes_of
from crane_scheduler.podinfo import PodInfo

NAME = "VolumeRestrictions"
STATE_KEY = "PreFilter" + NAME
REASON_DISK_CONFLICT = "node(s) had no available disk"
REASON_RWOP_CONFLICT = (
    "node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode already in-use by another pod"
)
_RESTRICTED = ("gcePersistentDisk", "awsElasticBlockStore", "rbd", "iscsi")
_SHARED_READ_ONLY = (("gcePersistentDisk", "pdName"), ("iscsi", "iqn"))
"""(volume kind, the field naming its disk): the same disk conflicts unless both mount it read-only"""


def needs_check(vol: Volume) -> bool:
    return any(vol.get(kind) is not None for kind in _RESTRICTED)


def is_volume_conflict(vol: Volume, existing_volumes: Sequence[Volume]) -> bool:
    """kube's ``isVolumeConflict`` between one volume of the pod and the volumes of a pod on the node."""
    for ev in existing_volumes:
        for kind, disk in _SHARED_READ_ONLY:
            a, b = vol.get(kind), ev.get(kind)
            if a is None or b is None or a.get(disk) != b.get(disk):
                continue
            if not (a.get("readOnly") and b.get("readOnly")):
                return True
        a, b = vol.get("awsElasticBlockStore"), ev.get("awsElasticBlockStore")
        if a is not None and b is not None and a.get("volumeID") == b.get("volumeID"):
            return True
        a, b = vol.get("rbd"), ev.get("rbd")
        if a is not None and b is not None:
            overlap = set(a.get("monitors") or ()) & set(b.get("monitors") or ())
            same = (a.get("pool") or "rbd", a.get("image")) == (b.get("pool") or "rbd", b.get("image"))
            if overlap and same and not (a.get("readOnly") and b.get("readOnly")):
                return True
    return False


class VolumeRestrictions(StoragePlugin, fwk.PreFilterPlugin, fwk.FilterPlugin, fwk.EnqueueExtensions):
    name = NAME
    decider_pre_filter = "skip"  # DeciderPreFilterPlugin: a pod a worker may decide has plain volumes only
    # CrossNodeFilterPlugin: the ReadWriteOncePod check counts the claim's users on every node (kube keeps that
    # count in its PreFilter state, adjusted by AddPod/RemovePod), so preemption dry-runs such pods node by node.
    reads_other_nodes = True

    def pre_filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> fwk.PreFilterResult:
        vols = volumes_of(pod.raw)
        check = any(needs_check(v) for v in vols)
        rwop: set[str] = set()
        for vol in vols:
            ref = vol.get("persistentVolumeClaim")
            if ref is None:
                continue
            name = ref.get("claimName", "")
            pvc = self.listers.api_pvc(pod.namespace, name)
            if pvc is None:
                return fwk.PreFilterResult(
                    fwk.unschedulable(f'persistentvolumeclaim "{name}" not found', unresolvable=True)
                )
            if "ReadWriteOncePod" in ((pvc.get("spec") or {}).get("accessModes") or ()):
                rwop.add(name)
        conflicts = sum(1 for name in rwop if self._claim_in_use(pod.namespace, name, table, pod.uid))
        if not check and conflicts == 0:
            return fwk.PreFilterResult(fwk.SKIP)
        state[STATE_KEY] = conflicts
        return fwk.PreFilterResult()

    @staticmethod
    def _claim_in_use(namespace: str, claim: str, table: NodeTable, uid: str) -> bool:
        """``IsPVCUsedByPods``: any pod in the cache (bound or assumed) mounting the claim."""
        for record in table.pods.values():
            if record.pod is None or record.namespace != namespace or record.uid == uid:
                continue
            for vol in volumes_of(record.pod.raw):
                ref = vol.get("persistentVolumeClaim")
                if ref is not None and ref.get("claimName") == claim:
                    return True
        return False

    def filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> list[fwk.Rejection]:
        out: list[fwk.Rejection] = []
        wanted = [v for v in volumes_of(pod.raw) if needs_check(v)]
        if wanted:
            disk = np.zeros(table.n_rows, dtype=bool)
            for record in table.pods.values():
                row = table.rows.get(record.node)
                if row is None or disk[row] or record.pod is None:
                    continue
                existing = volumes_of(record.pod.raw)
                if existing and any(is_volume_conflict(v, existing) for v in wanted):
                    disk[row] = True
            if disk.any():
                out.append(fwk.Rejection(REASON_DISK_CONFLICT, disk))
        if state.get(STATE_KEY):
            rest = np.ones(table.n_rows, dtype=bool)
            if out:
                rest &= ~out[0].mask  # kube reports the disk conflict first on a node
            out.append(fwk.Rejection(REASON_RWOP_CONFLICT, rest))
        return out

    def events_to_register(self) -> fwk.ClusterEvent:
        return (
            fwk.ClusterEvent.POD_DELETE
            | fwk.ClusterEvent.NODE_ADD
            | fwk.ClusterEvent.NODE_UPDATE
            | fwk.ClusterEvent.PVC_CHANGE
        )


new = VolumeRestrictions.new
