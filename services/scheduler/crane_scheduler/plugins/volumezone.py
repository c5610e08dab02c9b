"""VolumeZone (kube-scheduler 1.35): a pod's bound PersistentVolumes carry zone/region labels, and a node with
any topology label must match every one of them (multi-zone values are ``__``-separated).

Claims of WaitForFirstConsumer classes that are not bound yet are skipped (VolumeBinding places them); a missing
claim, class or PV is UnschedulableAndUnresolvable with kube's message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from crane_scheduler import framework as fwk
from crane_scheduler.listers import Listers
from crane_scheduler.nodetable import Mask, NodeTable
from crane_scheduler.plugins.storage import StoragePlugin, volumes_of
from crane_scheduler.plugins.volumebinding.binder import claim_class
from crane_scheduler.podinfo import PodInfo, Requirement

NAME = "VolumeZone"
STATE_KEY = "PreFilter" + NAME
REASON = "node(s) had no available volume zone"
BETA_ZONE = "failure-domain.beta.kubernetes.io/zone"
BETA_REGION = "failure-domain.beta.kubernetes.io/region"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
TOPOLOGY_LABELS = (BETA_ZONE, BETA_REGION, ZONE, REGION)
_GA = {BETA_ZONE: ZONE, BETA_REGION: REGION}


@dataclass(frozen=True)
class PVTopology:
    pv: str
    key: str
    values: frozenset[str]


def pv_topologies(pv: Mapping[str, Any]) -> list[PVTopology]:
    labels = (pv.get("metadata") or {}).get("labels") or {}
    out = []
    for key in TOPOLOGY_LABELS:
        if key in labels:
            values = [v.strip() for v in str(labels[key]).split("__")]
            if any(not v for v in values):
                continue  # kube logs and ignores an unparsable label
            out.append(PVTopology((pv.get("metadata") or {}).get("name", ""), key, frozenset(values)))
    return out


class _Refused(Exception):
    pass


def pod_pv_topologies(pod: PodInfo, listers: Listers) -> list[PVTopology]:
    out: list[PVTopology] = []
    for vol in volumes_of(pod.raw):
        if vol.get("persistentVolumeClaim") is None:
            continue
        name = vol["persistentVolumeClaim"].get("claimName") or ""
        if not name:
            raise _Refused("PersistentVolumeClaim had no name")
        pvc = listers.api_pvc(pod.namespace, name)
        if pvc is None:
            raise _Refused(f'persistentvolumeclaim "{name}" not found')
        pv_name = (pvc.get("spec") or {}).get("volumeName") or ""
        if not pv_name:
            cls_name = claim_class(pvc)
            if not cls_name:
                raise _Refused("PersistentVolumeClaim had no pv name and storageClass name")
            cls = listers.storage_class(cls_name)
            if cls is None:
                raise _Refused(f'storageclass.storage.k8s.io "{cls_name}" not found')
            if cls.get("volumeBindingMode") == "WaitForFirstConsumer":
                continue
            raise _Refused("PersistentVolume had no name")
        pv = listers.api_pv(pv_name)
        if pv is None:
            raise _Refused(f'persistentvolume "{pv_name}" not found')
        out += pv_topologies(pv)
    return out


class VolumeZone(StoragePlugin, fwk.PreFilterPlugin, fwk.FilterPlugin, fwk.EnqueueExtensions):
    name = NAME
    decider_pre_filter = "skip"  # DeciderPreFilterPlugin: for a pod a worker may decide, no volume with a zone
    reads_node_pods = False  # PodBlindFilterPlugin: preemption's reprieve rounds leave it out

    def pre_filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> fwk.PreFilterResult:
        try:
            topologies = pod_pv_topologies(pod, self.listers)
        except _Refused as err:
            return fwk.PreFilterResult(fwk.unschedulable(str(err), unresolvable=True))
        if not topologies:
            return fwk.PreFilterResult(fwk.SKIP)
        state[STATE_KEY] = topologies
        return fwk.PreFilterResult()

    def filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> list[fwk.Rejection]:
        topologies: list[PVTopology] = state.get(STATE_KEY) or []
        if not topologies:
            return []
        constrained = np.zeros(table.n_rows, dtype=bool)
        for key in TOPOLOGY_LABELS:
            constrained |= table.label_mask(Requirement(key, "Exists", ()))
        rejected: Mask = np.zeros(table.n_rows, dtype=bool)
        for topo in topologies:
            has_key = table.label_mask(Requirement(topo.key, "Exists", ()))
            values = tuple(sorted(topo.values))
            ok = has_key & table.label_mask(Requirement(topo.key, "In", values))
            ga = _GA.get(topo.key, topo.key)
            ok |= ~has_key & table.label_mask(Requirement(ga, "In", values))
            rejected |= ~ok
        rejected &= constrained
        return [fwk.Rejection(REASON, rejected, unresolvable=True)] if rejected.any() else []

    def events_to_register(self) -> fwk.ClusterEvent:
        return (
            fwk.ClusterEvent.STORAGE_CLASS_CHANGE
            | fwk.ClusterEvent.NODE_ADD
            | fwk.ClusterEvent.NODE_UPDATE
            | fwk.ClusterEvent.PVC_CHANGE
            | fwk.ClusterEvent.PV_CHANGE
        )


new = VolumeZone.new
