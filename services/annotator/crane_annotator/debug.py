"""``GET /debug/nodes/{name}``: why a node has (or lacks) its annotations, without reading logs.

Shows the series each metric's last query matched to the node (and how: ip, ip:port, hostname, name), series
that also matched but lost the tie-break, values refused, the last values this instance wrote, the hot value
with its binding counts, the annotations the API server currently holds, and the load taint's reading and
debounce (the leader's last evaluation). ``GET /debug/nodes`` lists the
nodes without a series per metric, the answer to "why no annotations".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from crane_annotator.hot import HotValues
from crane_annotator.matching import Match
from crane_annotator.nodes import NodeInfo
from crane_annotator.rounds import MetricRounds
from crane_annotator.taints import LoadTaints
from crane_shared.durations import format_duration


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _match(m: Match) -> dict[str, str]:
    return {"instance": m.instance, "matched_by": m.kind.label, "value": m.value}


@dataclass
class WriteLog:
    """The last value this instance wrote per node and key, with when it was sent."""

    entries: dict[str, dict[str, tuple[str, float]]] = field(default_factory=dict)

    def record(self, node: str, annotations: Mapping[str, str], at: float) -> None:
        row = self.entries.setdefault(node, {})
        for key, value in annotations.items():
            row[key] = (value, at)


def node_report(
    name: str,
    info: NodeInfo | None,
    rounds: MetricRounds,
    hot: HotValues,
    written: WriteLog,
    leader: bool,
    taints: LoadTaints | None = None,
) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    for spec in rounds.specs.values():
        view = rounds.views.get(spec.name)
        entry: dict[str, Any] = {"annotation_key": spec.key, "period": spec.period_label, "queried_at": None}
        if view is not None:
            chosen = view.result.chosen.get(name)
            entry.update(
                queried_at=_iso(view.at),
                series=_match(chosen) if chosen else None,
                dropped=view.dropped.get(name),
                also_matched=[_match(m) for m in view.result.shadowed.get(name, ())],
            )
        metrics[spec.name] = entry
    latest = hot.latest.get(name)
    return {
        "node": name,
        "known": info is not None,
        "addresses": None
        if info is None
        else {"internal_ips": list(info.addresses.internal_ips), "hostnames": list(info.addresses.hostnames)},
        "leader": leader,
        "metrics": metrics,
        "written": {key: {"value": v, "sent_at": _iso(at)} for key, (v, at) in written.entries.get(name, {}).items()},
        "hot_value": None
        if latest is None
        else {
            "value": latest.value,
            "computed_at": _iso(latest.at),
            "bindings": {format_duration(w): c for w, c in latest.counts.items()},
        },
        "on_node": {}
        if info is None
        else {key: {"value": info.values[key], "timestamp": _iso(info.stamps[key])} for key in sorted(info.stamps)},
        "load_taint": None if taints is None else taint_report(name, taints),
    }


def taint_report(name: str, taints: LoadTaints) -> dict[str, Any] | None:
    """The load taint's view of the node at the leader's last evaluation: the reading and the debounce."""
    reading = taints.readings.get(name)
    if reading is None:
        return None
    state = taints.states.get(name)
    return {
        "evaluation": taints.evaluations,
        "hot": reading.hot,
        "problem": reading.problem or None,
        "metric": reading.metric or None,
        "value": reading.value,
        "threshold": reading.threshold,
        "sample": [_iso(t) for t in reading.sample],
        "confirmed_hot": state.detector.hot if state else False,
        "streak": state.detector.streak if state else 0,
        "counted_sample": [_iso(t) for t in state.sample] if state and state.sample else [],
        "held_by_floor": name in taints.held,
    }


def unmatched_report(nodes: Mapping[str, NodeInfo], rounds: MetricRounds) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric, view in rounds.views.items():
        missing = sorted(set(nodes) - set(view.result.chosen))
        out[metric] = {
            "queried_at": _iso(view.at),
            "nodes_without_series": missing,
            "series_without_node": list(view.result.unmatched_instances),
            "values_refused": dict(sorted(view.dropped.items())),
        }
    return {"nodes": len(nodes), "metrics": out}


def add_routes(
    app: web.Application,
    nodes: Callable[[], Mapping[str, NodeInfo]],
    rounds: MetricRounds,
    hot: HotValues,
    written: WriteLog,
    leader: Callable[[], bool],
    taints: LoadTaints | None = None,
) -> None:
    async def one(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        info = nodes().get(name)
        body = node_report(name, info, rounds, hot, written, leader(), taints)
        return web.json_response(body, status=200 if info is not None else 404)

    async def summary(request: web.Request) -> web.Response:
        return web.json_response(unmatched_report(nodes(), rounds))

    app.router.add_get("/debug/nodes", summary)
    app.router.add_get("/debug/nodes/{name}", one)
