"""The autoscaling bench's figures, pure: from what the bench saw each tick to the side-by-side table.

The live run (``bench.autoscale.live``) records, every tick, the nodes (the sandbox's own and Karpenter's, with
the instant each turned Ready), each node's real CPU and memory usage (the simulated fleet's ground truth, what the
exporter serves), and the service's pods (created, Running). This module turns that into the issue's figures:

- pods pending at the end of the surge, and the longest time any pod waited for a node (creation to Running);
- nodes added, and how fast: from the surge to the first added node Ready, and Karpenter's own provisioning time
  (NodeClaim seen to its node Ready);
- node-minutes above the policy's threshold (any resource), over the run and after the surge's new nodes were
  Ready;
- nodes removed after the fall, and when the last went;
- node-hours used over the run (every node, the sandbox's own included, from the workload's start to its end).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.autoscale.scenario import Scenario


@dataclass(frozen=True)
class NodeUsage:
    name: str
    cpu: float
    memory: float
    added: bool
    """created by the autoscaler (Karpenter's NodePool label)"""
    ready: bool
    tainted: bool = False
    """carries crane's load taint (``crane.io/load-hot``)"""


@dataclass(frozen=True)
class Tick:
    """One sample, ``t`` seconds into the run."""

    t: float
    nodes: tuple[NodeUsage, ...]
    replicas: int
    running: int
    pending: int
    """the service's pods not Running (unbound, or bound and not yet started)"""
    pod_cpu: float
    """the cores each running replica used"""


@dataclass
class PodLife:
    created: float
    running: float | None = None
    gone: float | None = None

    def waited(self, end: float) -> float:
        """Seconds from creation to Running (or to its deletion, or the end, if it never ran)."""
        stop = self.running if self.running is not None else (self.gone if self.gone is not None else end)
        return max(0.0, stop - self.created)


@dataclass
class NodeLife:
    added: bool
    first_seen: float
    claimed: float | None = None
    """when the bench first saw the NodeClaim that launched it (Karpenter's nodes)"""
    ready: float | None = None
    gone: float | None = None


@dataclass
class Record:
    """Everything one variant's run saw."""

    variant: str
    scenario: Scenario
    threshold: float
    round_s: float
    """the length of one load round (the taint writer's period): the target's slack"""
    ticks: list[Tick] = field(default_factory=list)
    pods: dict[str, PodLife] = field(default_factory=dict)
    nodes: dict[str, NodeLife] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Figures:
    variant: str
    pending_at_surge_end: int
    longest_pending_s: float
    longest_pending_at_surge_end_s: float
    """the longest wait of the pods still pending when the surge ended (0 if none)"""
    nodes_added: int
    first_added_ready_s: float | None
    """seconds from the surge's start until the first added node was Ready"""
    last_surge_node_ready_s: float | None
    """seconds from the surge's start until the last node added during the surge was Ready"""
    provisioning_s: float | None
    """the longest NodeClaim-seen-to-Ready of the added nodes: Karpenter's own provisioning time"""
    hot_node_minutes: float
    hot_node_minutes_after_ready: float
    """node-minutes above the threshold after the surge's new nodes were Ready (from the surge's start if none)"""
    nodes_removed_after_fall: int
    last_removed_s: float | None
    """seconds from the fall's start until the last added node was gone"""
    node_hours: float
    added_node_hours: float
    peak_nodes: int
    nodes_at_end: int

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def hot(node: NodeUsage, threshold: float) -> bool:
    return max(node.cpu, node.memory) > threshold


def integrate(ticks: Sequence[Tick], value: Any, start: float = 0.0, end: float = math.inf) -> float:
    """The integral over time (seconds x value) of ``value(tick)`` between ``start`` and ``end``, each tick's value
    held until the next tick (the last tick's for one tick length)."""
    total = 0.0
    for i, tick in enumerate(ticks):
        nxt = ticks[i + 1].t if i + 1 < len(ticks) else tick.t + (tick.t - ticks[i - 1].t if i else 0.0)
        lo, hi = max(tick.t, start), min(nxt, end)
        if hi > lo:
            total += (hi - lo) * value(tick)
    return total


def figures(record: Record) -> Figures:
    sc = record.scenario
    end = sc.duration_s
    surge_end = sc.fall_start
    pending_at_end = [p for p in record.pods.values() if p.created <= surge_end and _pending_at(p, surge_end)]
    added = {name: n for name, n in record.nodes.items() if n.added}
    surge_nodes = [n for n in added.values() if sc.surge_start <= n.first_seen < surge_end]
    ready_times = [n.ready for n in added.values() if n.ready is not None and n.ready >= sc.surge_start]
    surge_ready = [n.ready for n in surge_nodes if n.ready is not None]
    provisioning = [n.ready - n.claimed for n in added.values() if n.ready is not None and n.claimed is not None]
    removed = [n for n in added.values() if n.gone is not None and n.gone >= surge_end]
    after_ready = max(surge_ready) if surge_ready else sc.surge_start
    threshold = record.threshold
    return Figures(
        variant=record.variant,
        pending_at_surge_end=len(pending_at_end),
        longest_pending_s=max((p.waited(end) for p in record.pods.values()), default=0.0),
        longest_pending_at_surge_end_s=max((surge_end - p.created for p in pending_at_end), default=0.0),
        nodes_added=len(added),
        first_added_ready_s=(min(ready_times) - sc.surge_start) if ready_times else None,
        last_surge_node_ready_s=(max(surge_ready) - sc.surge_start) if surge_ready else None,
        provisioning_s=max(provisioning) if provisioning else None,
        hot_node_minutes=integrate(record.ticks, lambda k: _hot_count(k, threshold)) / 60,
        hot_node_minutes_after_ready=integrate(record.ticks, lambda k: _hot_count(k, threshold), after_ready) / 60,
        nodes_removed_after_fall=len(removed),
        last_removed_s=(max(n.gone for n in removed if n.gone is not None) - surge_end) if removed else None,
        node_hours=integrate(record.ticks, lambda k: len(k.nodes)) / 3600,
        added_node_hours=integrate(record.ticks, lambda k: sum(n.added for n in k.nodes)) / 3600,
        peak_nodes=max((len(k.nodes) for k in record.ticks), default=0),
        nodes_at_end=len(record.ticks[-1].nodes) if record.ticks else 0,
    )


def _pending_at(pod: PodLife, t: float) -> bool:
    started = pod.running is not None and pod.running <= t
    deleted = pod.gone is not None and pod.gone <= t
    return not started and not deleted


def _hot_count(tick: Tick, threshold: float) -> int:
    return sum(hot(n, threshold) for n in tick.nodes)


@dataclass(frozen=True)
class Verdict:
    name: str
    target: str
    measured: str
    met: bool


def verdicts(c: Figures, a: Figures, round_s: float) -> list[Verdict]:
    """The issue's targets for variant (c) against the reference (a) of the same run. The autoscaler's own
    provisioning time is (a)'s longest wait: how long a pod waits for a node when the scheduler decides exactly as
    the autoscaler's simulation does (Karpenter's batching, launch and registration, and as many rounds of them as
    the surge takes); one round is one load round (the policy's sync period), the taint's reaction."""
    limit = a.longest_pending_s + round_s
    saved = 1 - c.node_hours / a.node_hours if a.node_hours else 0.0
    return [
        Verdict(
            "longest pending",
            f"<= the autoscaler's own provisioning time ((a)'s longest wait, {a.longest_pending_s:.0f} s) "
            f"+ one round ({round_s:.0f} s) = {limit:.0f} s",
            f"{c.longest_pending_s:.0f} s",
            c.longest_pending_s <= limit,
        ),
        Verdict(
            "node-minutes above the threshold after the new nodes were Ready",
            "0",
            f"{c.hot_node_minutes_after_ready:.1f}",
            c.hot_node_minutes_after_ready == 0,
        ),
        Verdict(
            "node-hours against (a)",
            "at least 25 % fewer",
            f"{abs(saved):.0%} {'fewer' if saved >= 0 else 'more'} ({c.node_hours:.2f} vs {a.node_hours:.2f})",
            saved >= 0.25,
        ),
    ]


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"


def table(rows: Iterable[Figures]) -> str:
    lines = [
        "| variant | pending at surge end (longest wait) | longest pending | nodes added | first added Ready "
        "| Karpenter provisioning | node-min above threshold (after new nodes Ready) | removed after fall (last) "
        "| node-hours (added) | peak / end nodes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in rows:
        lines.append(
            f"| {f.variant} | {f.pending_at_surge_end} ({_s(f.longest_pending_at_surge_end_s)}) "
            f"| {_s(f.longest_pending_s)} | {f.nodes_added} | {_s(f.first_added_ready_s)} | {_s(f.provisioning_s)} "
            f"| {f.hot_node_minutes:.1f} ({f.hot_node_minutes_after_ready:.1f}) "
            f"| {f.nodes_removed_after_fall} ({_s(f.last_removed_s)}) "
            f"| {f.node_hours:.3f} ({f.added_node_hours:.3f}) | {f.peak_nodes} / {f.nodes_at_end} |"
        )
    return "\n".join(lines)


def verdict_table(items: Iterable[Verdict]) -> str:
    lines = ["| target for (c) | wanted | measured | met |", "|---|---|---|---|"]
    lines += [f"| {v.name} | {v.target} | {v.measured} | {'yes' if v.met else 'NO'} |" for v in items]
    return "\n".join(lines)


def series(record: Record) -> Mapping[str, list[float]]:
    """The plot's columns: time (minutes), nodes, Ready nodes, mean and max CPU utilisation (%), pending pods."""
    ticks = record.ticks
    return {
        "minutes": [round(k.t / 60, 3) for k in ticks],
        "nodes": [float(len(k.nodes)) for k in ticks],
        "ready": [float(sum(n.ready for n in k.nodes)) for k in ticks],
        "mean_cpu": [round(100 * sum(n.cpu for n in k.nodes) / len(k.nodes), 1) if k.nodes else 0.0 for k in ticks],
        "max_cpu": [round(100 * max((n.cpu for n in k.nodes), default=0.0), 1) for k in ticks],
        "pending": [float(k.pending) for k in ticks],
        "tainted": [float(sum(n.tainted for n in k.nodes)) for k in ticks],
    }


def node_timeline(record: Record) -> list[dict[str, Any]]:
    """Every tick's nodes: ``name -> [cpu, memory, added, ready, tainted]`` (the JSON's detail)."""
    return [
        {
            "t": round(k.t, 2),
            "nodes": {n.name: [round(n.cpu, 3), round(n.memory, 3), n.added, n.ready, n.tainted] for n in k.nodes},
        }
        for k in record.ticks
    ]
