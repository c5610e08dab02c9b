"""TaintToleration: NoSchedule/NoExecute taints must be tolerated; untolerated PreferNoSchedule taints lower the
score. Tolerations are checked once per distinct taint list (the table's taint groups), not once per node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from crane_scheduler.framework import (
    SUCCESS,
    ClusterChange,
    ClusterEvent,
    CycleState,
    Handle,
    QueueingHint,
    QueueingHints,
    Rejection,
    Rows,
    Status,
    default_normalize,
    no_args,
)
from crane_scheduler.framework.interface import (
    EnqueueExtensions,
    FilterPlugin,
    NormalizeScorePlugin,
    PreScorePlugin,
    QueueingHintPlugin,
    ScorePlugin,
)
from crane_scheduler.nodetable import IntArray, NodeTable
from crane_scheduler.podinfo import NodeInfo, PodInfo, Toleration, tolerated

REASON = "node(s) had untolerated taint(s)"  # kube-scheduler >= 1.34 no longer names the taint


class TaintToleration(
    FilterPlugin, PreScorePlugin, ScorePlugin, NormalizeScorePlugin, EnqueueExtensions, QueueingHintPlugin
):
    name = "TaintToleration"
    reads_node_pods = False  # PodBlindFilterPlugin: preemption's reprieve rounds leave it out

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> list[Rejection]:
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
        return [Rejection(REASON, bad[table.taint_group], unresolvable=True)]

    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable, rows: Rows) -> Status:
        # Tolerations with an empty effect also tolerate PreferNoSchedule.
        state["TaintToleration.prefer"] = tuple(t for t in pod.tolerations if t.effect in ("", "PreferNoSchedule"))
        return SUCCESS

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, rows: Rows) -> IntArray:
        tolerations: tuple[Toleration, ...] = state.get("TaintToleration.prefer", pod.tolerations)
        counts: npt.NDArray[np.int64] = np.fromiter(
            (
                sum(1 for t in taints if t.effect == "PreferNoSchedule" and not tolerated(tolerations, t))
                for taints in table.taint_sets
            ),
            dtype=np.int64,
            count=len(table.taint_sets),
        )
        return counts[table.taint_group[rows]]

    def normalize_score(self, state: CycleState, pod: PodInfo, scores: IntArray) -> IntArray:
        return default_normalize(scores, reverse=True)

    def events_to_register(self) -> ClusterEvent:
        return ClusterEvent.NODE_ADD | ClusterEvent.NODE_UPDATE

    def queueing_hints(self) -> QueueingHints:
        return {ClusterEvent.NODE_ADD | ClusterEvent.NODE_UPDATE: after_node_change}


def _untolerated(pod: PodInfo, node: NodeInfo) -> bool:
    return any(t.effect in ("NoSchedule", "NoExecute") and not tolerated(pod.tolerations, t) for t in node.taints)


def after_node_change(pod: PodInfo, change: ClusterChange) -> QueueingHint:
    """kube's ``isSchedulableAfterNodeChange``: the node (added, or updated) went from having an untolerated
    NoSchedule/NoExecute taint to having none."""
    old, new = change.old, change.new
    if not isinstance(new, NodeInfo):
        return QueueingHint.QUEUE
    was = _untolerated(pod, old) if isinstance(old, NodeInfo) else True
    return QueueingHint.QUEUE if was and not _untolerated(pod, new) else QueueingHint.SKIP


def new(args: Mapping[str, Any], handle: Handle) -> TaintToleration:
    no_args(TaintToleration.name)(args)
    return TaintToleration()
