"""NodePorts: a pod's host ports must be free on the node (same protocol and port, overlapping host IP)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import PodInfo

REASON = "node(s) didn't have free ports for the requested pod ports"


class NodePorts(fwk.PreFilterPlugin, fwk.FilterPlugin, fwk.QueueingHintPlugin):
    name = "NodePorts"
    decider_pre_filter = "pod"  # DeciderPreFilterPlugin: for a pod a worker may decide, its host ports

    def pre_filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> fwk.PreFilterResult:
        return fwk.PreFilterResult() if pod.host_ports else fwk.PreFilterResult(fwk.SKIP)

    def filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> list[fwk.Rejection]:
        if not pod.host_ports or not table.ports:
            return []
        mask = np.zeros(table.n_rows, dtype=bool)
        for row, used in table.ports.items():  # sparse: only nodes that have any host port in use
            mask[row] = any(want.conflicts(u) for want in pod.host_ports for u in used)
        return [fwk.Rejection(REASON, mask)] if mask.any() else []

    def events_to_register(self) -> fwk.ClusterEvent:
        return fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE | fwk.ClusterEvent.POD_DELETE

    def queueing_hints(self) -> fwk.QueueingHints:
        return {fwk.ClusterEvent.POD_DELETE: after_pod_deleted}  # node events: no hint, as kube (always requeue)


def after_pod_deleted(pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
    """kube's ``isSchedulableAfterPodDeleted``: the deleted pod held a host port the pod wants. (The cache
    reports only placed and assumed pods' deletions, so kube's unscheduled-pod check is not needed.)"""
    old = change.old
    if not isinstance(old, PodInfo):
        return fwk.QueueingHint.QUEUE
    freed = any(want.conflicts(held) for want in pod.host_ports for held in old.host_ports)
    return fwk.QueueingHint.QUEUE if freed else fwk.QueueingHint.SKIP


def new(args: Mapping[str, Any], handle: fwk.Handle) -> NodePorts:
    fwk.no_args(NodePorts.name)(args)
    return NodePorts()
