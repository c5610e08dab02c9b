"""NodeUnschedulable: a cordoned node (``spec.unschedulable``) only takes pods tolerating its taint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import NodeInfo, PodInfo, Taint, tolerated

REASON = "node(s) were unschedulable"
_UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")


class NodeUnschedulable(fwk.FilterPlugin, fwk.QueueingHintPlugin):
    name = "NodeUnschedulable"
    reads_node_pods = False  # PodBlindFilterPlugin: preemption's reprieve rounds leave it out

    def filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> list[fwk.Rejection]:
        if table.unschedulable_count == 0 or tolerated(pod.tolerations, _UNSCHEDULABLE_TAINT):
            return []
        return [fwk.Rejection(REASON, table.unschedulable.copy(), unresolvable=True)]

    def events_to_register(self) -> fwk.ClusterEvent:
        return fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE

    def queueing_hints(self) -> fwk.QueueingHints:
        return {fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE: after_node_change}


def after_node_change(pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
    """kube's ``isSchedulableAfterNodeChange``: a schedulable node added, or a node uncordoned."""
    old, new = change.old, change.new
    if not isinstance(new, NodeInfo):
        return fwk.QueueingHint.QUEUE
    was_cordoned = old.unschedulable if isinstance(old, NodeInfo) else True
    return fwk.QueueingHint.QUEUE if was_cordoned and not new.unschedulable else fwk.QueueingHint.SKIP


def new(args: Mapping[str, Any], handle: fwk.Handle) -> NodeUnschedulable:
    fwk.no_args(NodeUnschedulable.name)(args)
    return NodeUnschedulable()
