"""TaintToleration: NoSchedule/NoExecute taints must be tolerated; untolerated PreferNoSchedule taints lower the
score. Tolerations are checked once per distinct taint list (the table's taint groups), not once per node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import IntArray, NodeTable
from crane_scheduler.podinfo import NodeInfo, PodInfo, Toleration, tolerated

REASON = "node(s) had untolerated taint(s)"  # kube-scheduler >= 1.34 no longer names the taint


class TaintToleration(fwk.FilterPlugin, fwk.PreScorePlugin, fwk.NormalizeScorePlugin, fwk.QueueingHintPlugin):
    name = "TaintToleration"
    reads_node_pods = False  # PodBlindFilterPlugin: preemption's reprieve rounds leave it out

    def filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> list[fwk.Rejection]:
        if len(table.taint_sets) == 1:  # no node has ever had a taint
            return []
        bad = np.fromiter(
            (
                any(t.effect in ("NoSchedule", "NoExecute") and not tolerated(pod.tolerations, t) for t in taints)
                for taints in table.taint_sets
            ),
            dtype=bool,
            count=len(table.taint_sets),
        )
        if not bad.any():
            return []
        return [fwk.Rejection(REASON, bad[table.taint_group], unresolvable=True)]

    def pre_score(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> fwk.Status:
        # Tolerations with an empty effect also tolerate PreferNoSchedule.
        state["TaintToleration.prefer"] = tuple(t for t in pod.tolerations if t.effect in ("", "PreferNoSchedule"))
        return fwk.SUCCESS

    def score(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> IntArray:
        tolerations: tuple[Toleration, ...] = state.get("TaintToleration.prefer", pod.tolerations)
        counts: npt.NDArray[np.int64] = np.fromiter(
            (
                sum(1 for t in taints if t.effect == "PreferNoSchedule" and not tolerated(tolerations, t))
                for taints in table.taint_sets
            ),
            dtype=np.int64,
            count=len(table.taint_sets),
        )
        if not counts.any():  # no node has an untolerated PreferNoSchedule taint
            return np.zeros(len(rows), dtype=np.int64)
        return counts[table.taint_group[rows]]

    def normalize_score(self, state: fwk.CycleState, pod: PodInfo, scores: IntArray) -> IntArray:
        return fwk.default_normalize(scores, reverse=True)

    def events_to_register(self) -> fwk.ClusterEvent:
        return fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE

    def queueing_hints(self) -> fwk.QueueingHints:
        return {fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE: after_node_change}


def _untolerated(pod: PodInfo, node: NodeInfo) -> bool:
    return any(t.effect in ("NoSchedule", "NoExecute") and not tolerated(pod.tolerations, t) for t in node.taints)


def after_node_change(pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
    """kube's ``isSchedulableAfterNodeChange``: the node (added, or updated) went from having an untolerated
    NoSchedule/NoExecute taint to having none."""
    old, new = change.old, change.new
    if not isinstance(new, NodeInfo):
        return fwk.QueueingHint.QUEUE
    was = _untolerated(pod, old) if isinstance(old, NodeInfo) else True
    return fwk.QueueingHint.QUEUE if was and not _untolerated(pod, new) else fwk.QueueingHint.SKIP


def new(args: Mapping[str, Any], handle: fwk.Handle) -> TaintToleration:
    fwk.no_args(TaintToleration.name)(args)
    return TaintToleration()
