"""NodeName: a pod that names a node (``spec.nodeName``) fits only that node.

Since Kubernetes 1.37 its PreFilter also restricts the cycle to that node (a ``PreFilterResult``): every other node
is UnschedulableAndUnresolvable with the framework's ``node(s) didn't satisfy plugin(s) [NodeName]`` (so not a
preemption target), and Filter's own reason is heard only on nodes by that name that PreFilter let through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import PodInfo

REASON = "node(s) didn't match the requested node name"


class NodeName(fwk.PreFilterPlugin, fwk.FilterPlugin, fwk.EnqueueExtensions):
    name = "NodeName"
    decider_pre_filter = "pod"  # DeciderPreFilterPlugin: for a pod a worker may decide, its node name
    reads_node_pods = False  # PodBlindFilterPlugin: preemption's reprieve rounds leave it out

    def pre_filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> fwk.PreFilterResult:
        if not pod.node_name:
            return fwk.PreFilterResult()
        return fwk.PreFilterResult(node_names=frozenset({pod.node_name}))

    def filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> list[fwk.Rejection]:
        if not pod.node_name:
            return []
        mask = np.ones(table.n_rows, dtype=bool)
        row = table.rows.get(pod.node_name)
        if row is not None:
            mask[row] = False
        return [fwk.Rejection(REASON, mask, unresolvable=True)]

    def events_to_register(self) -> fwk.ClusterEvent:
        return fwk.ClusterEvent.NODE_ADD  # kube 1.37: only a new node can be the one the pod names


def new(args: Mapping[str, Any], handle: fwk.Handle) -> NodeName:
    fwk.no_args(NodeName.name)(args)
    return NodeName()
