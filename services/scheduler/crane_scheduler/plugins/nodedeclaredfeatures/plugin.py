"""NodeDeclaredFeatures (kube-scheduler 1.37, GA and in the default profile): a pod that needs a node feature (a
restart rule restarting all containers, a host-network pod in a user namespace, bind mount options) fits only
the nodes whose ``status.declaredFeatures`` declare it.

PreFilter infers the pod's requirements (``features.infer_for_scheduling``) and skips the pod when there are none
(most pods: then its Filter does not run); Filter rejects, UnschedulableAndUnresolvable, every node lacking one:
"node(s) didn't match Pod's required features". The nodes' declared features are kept as a bit set per table
row (``features.try_map``: the registered ones, as kube's NodeInfo maps them), so Filter is one comparison.

Cluster events, as kube's ``EventsToRegister``: a node added, or its declared features changed
(``after_node_change``); the pod's own update changing its requirements (``after_target_pod_update``; the fields
are immutable, and crane's queue retries a pending pod whose spec changed in any case).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins.nodedeclaredfeatures.features import NAMES, infer_for_scheduling, try_map
from crane_scheduler.podinfo import NodeInfo, PodInfo

NAME = "NodeDeclaredFeatures"
REASON = "node(s) didn't match Pod's required features"
STATE_KEY = "PreFilter" + NAME
COLUMN = "nodedeclaredfeatures.bits"
_BIT = {name: 1 << i for i, name in enumerate(NAMES)}


def feature_bits(names: Iterable[str]) -> int:
    bits = 0
    for name in names:
        bits |= _BIT.get(name, 0)
    return bits


def node_bits(node: NodeInfo) -> int:
    """The node's declared features that kube knows, as bits (``NodeInfo.SetNode``'s ``TryMap``)."""
    return feature_bits(try_map(node.declared_features))


class NodeDeclaredFeatures(fwk.PreFilterPlugin, fwk.FilterPlugin, fwk.QueueingHintPlugin):
    name = NAME
    decider_pre_filter = "pod"  # DeciderPreFilterPlugin: for a pod a worker may decide, its spec's features
    reads_node_pods = False  # PodBlindFilterPlugin: preemption's reprieve rounds leave it out

    def __init__(self, table: NodeTable) -> None:
        if not table.has_column(COLUMN):
            table.register_column(COLUMN, node_bits, dtype=np.int64, default=0)

    def pre_filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> fwk.PreFilterResult:
        required = infer_for_scheduling(pod.raw.get("spec") or {})
        if not required:
            return fwk.PreFilterResult(fwk.Status(fwk.Code.SKIP))
        state[STATE_KEY] = feature_bits(required)
        return fwk.PreFilterResult()

    def filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> list[fwk.Rejection]:
        required = state.get(STATE_KEY)
        if required is None:
            required = feature_bits(infer_for_scheduling(pod.raw.get("spec") or {}))
        if not required:
            return []
        lacking = (table.column(COLUMN) & required) != required
        if not lacking.any():
            return []
        return [fwk.Rejection(REASON, lacking, unresolvable=True)]

    def events_to_register(self) -> fwk.ClusterEvent:
        return fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE

    def queueing_hints(self) -> fwk.QueueingHints:
        return {fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE: after_node_change}


def after_node_change(pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
    """kube's ``isSchedulableAfterNodeChange``: a node added, or one whose declared features changed."""
    old, new = change.old, change.new
    if isinstance(old, NodeInfo) and isinstance(new, NodeInfo) and old.declared_features == new.declared_features:
        return fwk.QueueingHint.SKIP
    return fwk.QueueingHint.QUEUE


def after_target_pod_update(old: Mapping[str, Any], new: Mapping[str, Any]) -> fwk.QueueingHint:
    """kube's ``isSchedulableAfterTargetPodUpdate``: the pod's own update changed its requirements."""
    before = infer_for_scheduling(old.get("spec") or {})
    after = infer_for_scheduling(new.get("spec") or {})
    return fwk.QueueingHint.SKIP if before == after else fwk.QueueingHint.QUEUE


def new(args: Mapping[str, Any], handle: fwk.Handle) -> NodeDeclaredFeatures:
    fwk.no_args(NAME)(args)
    return NodeDeclaredFeatures(handle.table)
