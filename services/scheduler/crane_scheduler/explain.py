"""Decision records: why a pod went where it did, or why it is still pending.

The algorithm leaves a ``Decision`` in the pod's cycle state: references to arrays it computed anyway (each Filter
plugin's rejections, each Score plugin's scores over the scored rows) and the node objects it decided on, so
recording costs almost nothing per pod. Turning a record into per-node JSON happens only when someone asks
(``GET /debug/explain/{namespace}/{name}``, ``cranectl explain``); plugins that implement the optional
``ExplainPlugin`` interface (Dynamic: annotated usage, estimates, hot value, under ``load``) recompute their
inputs then from the node objects as they were at decision time, with the decision's time, so the answer is the
one the scheduler acted on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web

from crane_scheduler.framework.interface import ExplainPlugin, Plugin, PodExplainPlugin
from crane_scheduler.framework.types import EXPLAIN_DECIDER, EXPLAIN_FILTERS, EXPLAIN_SCORES, Rejection, Rows
from crane_scheduler.nodetable import IntArray, Mask, NodeTable
from crane_scheduler.podinfo import NodeInfo, PodInfo
from crane_shared.service import query_int, query_params


@dataclass
class Decision:
    pod: str
    uid: str
    at: float
    """wall-clock time of the decision (unix seconds)"""
    names: list[str]
    nodes: list[NodeInfo | None]
    filters: list[tuple[str, list[Rejection], Mask]] = field(default_factory=list)
    """(plugin, its rejections, the rows still alive before it ran)"""
    scored_rows: Rows | None = None
    scores: list[tuple[str, int, IntArray]] = field(default_factory=list)
    """(plugin, weight, normalised scores over ``scored_rows``; uint8: they are in [0, 100])"""
    node: str | None = None
    message: str = ""
    profile: str = ""
    priority: int = 0
    gang: dict[str, Any] | None = None
    """a gang member's cycle: its group, quorum, the members found places and those missing with why"""
    decider: str = ""
    """how a decider worker's node was taken (the worker's filters and scores are not kept)"""

    @classmethod
    def from_state(
        cls,
        pod: PodInfo,
        at: float,
        table: NodeTable,
        state: Mapping[str, Any],
        node: str | None,
        message: str,
        snapshot: tuple[list[str], list[NodeInfo | None]] | None = None,
    ) -> Decision:
        """What the algorithm left in the cycle state, plus the node objects it saw (``snapshot``, else a copy)."""
        rows, scores = state.get(EXPLAIN_SCORES, (None, []))
        names, nodes = (list(table.names), list(table.nodes)) if snapshot is None else snapshot
        return cls(
            pod.key,
            pod.uid,
            at,
            names,
            nodes,
            list(state.get(EXPLAIN_FILTERS, [])),
            rows,
            list(scores),
            node,
            message,
            pod.scheduler_name,
            pod.priority,
            decider=str(state.get(EXPLAIN_DECIDER, "")),
        )

    def verdicts(self) -> dict[str, dict[str, Any]]:
        """Per node: the first plugin that rejected it and why, else its scores (when scoring ran)."""
        out: dict[str, dict[str, Any]] = {}
        for plugin, rejections, before in self.filters:
            for r in rejections:
                for row in np.flatnonzero(r.mask & before).tolist():
                    name = self.names[row]
                    if name not in out and self.nodes[row] is not None:
                        out[name] = {"filter": {"plugin": plugin, "reason": r.reason}}
        if self.scored_rows is not None:
            for i, row in enumerate(self.scored_rows.tolist()):
                per_plugin = {plugin: int(scores[i]) for plugin, _, scores in self.scores}
                total = sum(int(scores[i]) * weight for _, weight, scores in self.scores)
                out[self.names[row]] = {"filter": "passed", "scores": per_plugin, "total": total}
        if self.node is not None and self.node not in out:
            out[self.node] = {"filter": "passed", "total": 0}  # the only feasible node: nothing to score
        return out


def render(decision: Decision, explainers: Sequence[Plugin] = (), limit: int = 50) -> dict[str, Any]:
    """JSON for one decision: the outcome, then the chosen and best-scored nodes, then the rejected ones. Each
    ``ExplainPlugin`` among ``explainers`` adds its section per listed node; each ``PodExplainPlugin`` adds what it
    chose for the placed pod to the result."""
    node_explainers = [p for p in explainers if isinstance(p, ExplainPlugin)]
    verdicts = decision.verdicts()
    passed = sorted(((n, v) for n, v in verdicts.items() if v["filter"] == "passed"), key=lambda nv: -nv[1]["total"])
    rejected = sorted((n, v) for n, v in verdicts.items() if v["filter"] != "passed")
    rows = {name: row for row, name in enumerate(decision.names)}
    nodes: list[dict[str, Any]] = []
    for name, verdict in [*passed, *rejected][:limit]:
        entry = {"node": name, **verdict}
        info = decision.nodes[rows[name]]
        if info is not None:
            for plugin in node_explainers:
                explained = plugin.explain_node(info, decision.at, decision.uid, decision.priority)
                entry[plugin.explain_section] = dict(explained)
        nodes.append(entry)
    reasons: dict[str, int] = {}
    for _, verdict in rejected:
        reasons[verdict["filter"]["reason"]] = reasons.get(verdict["filter"]["reason"], 0) + 1
    result: dict[str, Any] = {"node": decision.node} if decision.node else {"pending": decision.message}
    if decision.decider:
        result["decidedBy"] = decision.decider
    if decision.node:
        for explainer in explainers:
            if isinstance(explainer, PodExplainPlugin):
                result.update(explainer.explain_pod(decision.uid, decision.node))
    out = {
        "pod": decision.pod,
        "uid": decision.uid,
        "decidedAt": decision.at,
        "result": result,
        "feasibleNodes": len(passed),
        "rejectedByReason": reasons,
        "nodes": nodes,
    }
    if decision.gang is not None:
        out["gang"] = decision.gang
    return out


class DecisionLog:
    """The latest decision of the most recent pods (bounded)."""

    def __init__(self, size: int = 2000) -> None:
        self.size = size
        self._by_pod: OrderedDict[str, Decision] = OrderedDict()
        self._snapshot: tuple[int, list[str], list[NodeInfo | None]] = (-1, [], [])

    def record(
        self, pod: PodInfo, at: float, table: NodeTable, state: Mapping[str, Any], node: str | None, message: str
    ) -> None:
        """Keep this decision. The node objects are shared by every decision until a node changes: thousands of
        decisions in a burst must not each copy thousands of references."""
        if self._snapshot[0] != table.nodes_version:
            self._snapshot = (table.nodes_version, list(table.names), list(table.nodes))
        _, names, nodes = self._snapshot
        self.add(Decision.from_state(pod, at, table, state, node, message, (names, nodes)))

    def add(self, decision: Decision) -> None:
        self._by_pod.pop(decision.pod, None)
        self._by_pod[decision.pod] = decision
        while len(self._by_pod) > self.size:
            self._by_pod.popitem(last=False)

    def get(self, pod: str) -> Decision | None:
        return self._by_pod.get(pod)


def add_routes(app: web.Application, decisions: DecisionLog, explainers: Callable[[str], Sequence[Plugin]]) -> None:
    """``GET /debug/explain/{namespace}/{name}``: the pod's latest decision as JSON (404 when none is kept).

    ``explainers(scheduler_name)`` gives that profile's plugins; those implementing ``ExplainPlugin`` or
    ``PodExplainPlugin`` add to the answer."""

    async def explain(request: web.Request) -> web.Response:
        limit = query_int(query_params(request, {"limit"}), "limit", 50, minimum=0, maximum=100_000)
        key = f"{request.match_info['namespace']}/{request.match_info['name']}"
        decision = decisions.get(key)
        if decision is None:
            raise web.HTTPNotFound(
                text=f"no recent scheduling decision for pod {key} (kept: the last "
                f"{decisions.size} pods this scheduler tried)"
            )
        return web.json_response(render(decision, explainers(decision.profile), limit))

    app.router.add_get("/debug/explain/{namespace}/{name}", explain)
