"""NodeName: a pod that names a node (``spec.nodeName``) fits only that node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from crane_scheduler.framework import ClusterEvent, CycleState, Handle, Rejection, no_args
from crane_scheduler.framework.interface import EnqueueExtensions, FilterPlugin
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import PodInfo

REASON = "node(s) didn't match the requested node name"


class NodeName(FilterPlugin, EnqueueExtensions):
    name = "NodeName"
    reads_node_pods = False  # PodBlindFilterPlugin: preemption's reprieve rounds leave it out

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> list[Rejection]:
        if not pod.node_name:
            return []
        mask = np.ones(table.n_rows, dtype=bool)
        row = table.rows.get(pod.node_name)
        if row is not None:
            mask[row] = False
        return [Rejection(REASON, mask, unresolvable=True)]

    def events_to_register(self) -> ClusterEvent:
        return ClusterEvent.NODE_ADD | ClusterEvent.NODE_UPDATE


def new(args: Mapping[str, Any], handle: Handle) -> NodeName:
    no_args(NodeName.name)(args)
    return NodeName()
