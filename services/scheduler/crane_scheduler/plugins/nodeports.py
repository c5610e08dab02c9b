"""NodePorts: a pod's host ports must be free on the node (same protocol and port, overlapping host IP)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from crane_scheduler.framework import (
    SKIP,
    ClusterChange,
    ClusterEvent,
    CycleState,
    Handle,
    PreFilterResult,
    QueueingHint,
    QueueingHints,
    Rejection,
    no_args,
)
from crane_scheduler.framework.interface import EnqueueExtensions, FilterPlugin, PreFilterPlugin, QueueingHintPlugin
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import PodInfo

REASON = "node(s) didn't have free ports for the requested pod ports"


class NodePorts(PreFilterPlugin, FilterPlugin, EnqueueExtensions, QueueingHintPlugin):
    name = "NodePorts"

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> PreFilterResult:
        return PreFilterResult() if pod.host_ports else PreFilterResult(SKIP)

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> list[Rejection]:
        if not pod.host_ports or not table.ports:
            return []
        mask = np.zeros(table.n_rows, dtype=bool)
        for row, used in table.ports.items():  # sparse: only nodes that have any host port in use
            mask[row] = any(want.conflicts(u) for want in pod.host_ports for u in used)
        return [Rejection(REASON, mask)] if mask.any() else []

    def events_to_register(self) -> ClusterEvent:
        return ClusterEvent.NODE_ADD | ClusterEvent.NODE_UPDATE | ClusterEvent.POD_DELETE

    def queueing_hints(self) -> QueueingHints:
        return {ClusterEvent.POD_DELETE: after_pod_deleted}  # node events: no hint, as kube (always requeue)


def after_pod_deleted(pod: PodInfo, change: ClusterChange) -> QueueingHint:
    """kube's ``isSchedulableAfterPodDeleted``: the deleted pod held a host port the pod wants. (The cache
    reports only placed and assumed pods' deletions, so kube's unscheduled-pod check is not needed.)"""
    old = change.old
    if not isinstance(old, PodInfo):
        return QueueingHint.QUEUE
    freed = any(want.conflicts(held) for want in pod.host_ports for held in old.host_ports)
    return QueueingHint.QUEUE if freed else QueueingHint.SKIP


def new(args: Mapping[str, Any], handle: Handle) -> NodePorts:
    no_args(NodePorts.name)(args)
    return NodePorts()
