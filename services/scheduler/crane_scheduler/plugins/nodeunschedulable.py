"""NodeUnschedulable: a cordoned node (``spec.unschedulable``) only takes pods tolerating its taint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crane_scheduler.framework import (
    ClusterChange,
    ClusterEvent,
    CycleState,
    Handle,
    QueueingHint,
    QueueingHints,
    Rejection,
    no_args,
)
from crane_scheduler.framework.interface import EnqueueExtensions, FilterPlugin, QueueingHintPlugin
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import NodeInfo, PodInfo, Taint, tolerated

REASON = "node(s) were unschedulable"
_UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")


class NodeUnschedulable(FilterPlugin, EnqueueExtensions, QueueingHintPlugin):
    name = "NodeUnschedulable"
    reads_node_pods = False  # PodBlindFilterPlugin: preemption's reprieve rounds leave it out

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> list[Rejection]:
        if table.unschedulable_count == 0 or tolerated(pod.tolerations, _UNSCHEDULABLE_TAINT):
            return []
        return [Rejection(REASON, table.unschedulable.copy(), unresolvable=True)]

    def events_to_register(self) -> ClusterEvent:
        return ClusterEvent.NODE_ADD | ClusterEvent.NODE_UPDATE

    def queueing_hints(self) -> QueueingHints:
        return {ClusterEvent.NODE_ADD | ClusterEvent.NODE_UPDATE: after_node_change}


def after_node_change(pod: PodInfo, change: ClusterChange) -> QueueingHint:
    """kube's ``isSchedulableAfterNodeChange``: a schedulable node added, or a node uncordoned."""
    old, new = change.old, change.new
    if not isinstance(new, NodeInfo):
        return QueueingHint.QUEUE
    was_cordoned = old.unschedulable if isinstance(old, NodeInfo) else True
    return QueueingHint.QUEUE if was_cordoned and not new.unschedulable else QueueingHint.SKIP


def new(args: Mapping[str, Any], handle: Handle) -> NodeUnschedulable:
    no_args(NodeUnschedulable.name)(args)
    return NodeUnschedulable()
