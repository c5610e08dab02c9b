"""Which nodes carry the load taint (``crane.io/load-hot``), decided from their load annotations: pure.

Each evaluation reads every node's annotations as the API server holds them (the scheduler reads the same), with
the policy's ``spec.loadTaint`` (``crane_shared.loadtaintpolicy``):

- a node is judged only when every threshold metric is fresh (by the scheduler's freshness window and, tighter,
  ``maxDataAge``) and readable; otherwise its debounce starts over and its taint, if any, is lifted at once
  (``stale``): never set on stale data, lifted when its data goes stale;
- hot: one metric, read as a regular pod's load (the batch pods' share out, ``dynamic.node_load(regular=True)``),
  strictly above its threshold; the debounce (``crane_shared.debounce``) counts a reading only when the node has
  a new sample (its metrics' timestamps moved), so K hot rounds are K samples, not K evaluations of one sample;
- confirmed hot: tainted; confirmed cool: lifted; opted out (``crane.io/load-taint: "off"``) or the feature off:
  lifted;
- the floor: at least ``minUntaintedNodes`` schedulable nodes stay untainted: the hottest nodes are tainted first,
  the others wait (``held``) until room opens; a floor raised above what is tainted lifts the coolest.

A new leadership term starts with no debounce state: a node that carries the taint is taken as confirmed hot, so
it is lifted after ``coolRounds`` cool samples (or at once on stale data), and a leader killed mid-round leaves
nothing behind that its successor does not clean up.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from crane_shared.debounce import Detector, step
from crane_shared.loadaware.dynamic import DynamicArgs, node_load, valid_until
from crane_shared.policy import DynamicSchedulerPolicy

Reason = Literal["hot", "cooled", "stale", "opted-out", "disabled", "floor", "unwatched"]


@dataclass(frozen=True)
class TaintNode:
    """What the plan reads of a node."""

    name: str
    annotations: Mapping[str, str]
    """its load annotations as written"""
    tainted: bool
    """carries ``crane.io/load-hot``"""
    opted_out: bool = False
    schedulable: bool = True
    """not cordoned (counts toward the floor)"""
    effect: str = ""
    """our taint's effect when tainted"""


@dataclass(frozen=True)
class Reading:
    hot: bool | None
    """None: not judged (``problem`` says why)"""
    sample: tuple[float, ...] = ()
    """the threshold metrics' timestamps: a new tuple is a new sample"""
    metric: str = ""
    """the metric furthest over (or nearest to) its threshold"""
    value: float = 0.0
    threshold: float = 0.0
    problem: str = ""

    @property
    def ratio(self) -> float:
        return self.value / self.threshold if self.threshold > 0 else 0.0


@dataclass(frozen=True)
class NodeState:
    detector: Detector = field(default_factory=Detector)
    sample: tuple[float, ...] | None = None
    """the last sample counted by the debounce"""


@dataclass(frozen=True)
class Change:
    node: str
    taint: bool
    """True: set the taint; False: lift it"""
    reason: Reason
    reading: Reading


@dataclass
class TaintPlan:
    changes: list[Change] = field(default_factory=list)
    states: dict[str, NodeState] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)
    """confirmed hot, left untainted by the floor"""
    readings: dict[str, Reading] = field(default_factory=dict)


def read(node: TaintNode, policy: DynamicSchedulerPolicy, args: DynamicArgs, now: datetime) -> Reading:
    """The node's taint reading: hot, cool, or not judged (a threshold metric missing, stale, unreadable)."""
    return read_until(node, policy, args, now)[0]


def read_until(
    node: TaintNode, policy: DynamicSchedulerPolicy, args: DynamicArgs, now: datetime
) -> tuple[Reading, float]:
    """``read``, and the first instant (unix seconds) at which it may differ with the same annotations: a freshness
    edge of the scheduler's reading (``dynamic.valid_until``) or a sample turning older than ``maxDataAge``."""
    thresholds = policy.taint_thresholds()
    load = node_load(node.name, node.annotations, args, now, regular=True)
    until = valid_until(load, node.annotations, args, (), now.timestamp())
    max_age = policy.load_taint.max_data_age if policy.load_taint is not None else None
    stamps: list[float] = []
    worst: tuple[float, str, float, float] | None = None
    for metric, limit in sorted(thresholds.items()):
        reading = load.readings.get(metric)
        usage = reading.usage if reading is not None else None
        if reading is None or usage is None or reading.timestamp is None:
            state = reading.state if reading is not None else "missing"
            return Reading(None, problem=f"{metric} is {state}"), until
        if max_age is not None and now - reading.timestamp > max_age:
            return Reading(None, problem=f"{metric} is older than maxDataAge {_seconds(max_age)}"), until
        if max_age is not None:
            until = min(until, (reading.timestamp + max_age).timestamp())
        stamps.append(reading.timestamp.timestamp())
        ratio = usage / limit
        if worst is None or ratio > worst[0]:
            worst = (ratio, metric, usage, limit)
    if worst is None:
        return Reading(None, problem="no threshold"), until
    _, metric, value, limit = worst
    return Reading(value > limit, tuple(stamps), metric, value, limit), until


class Readings:
    """Each node's reading, kept until its annotations change (a node update brings a new mapping) or time can
    change it (``read_until``): between rounds an evaluation decodes nothing."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[Mapping[str, str], DynamicArgs, float, Reading]] = {}

    def get(self, node: TaintNode, policy: DynamicSchedulerPolicy, args: DynamicArgs, now: datetime) -> Reading:
        kept = self._kept.get(node.name)
        if kept is not None and kept[0] is node.annotations and kept[1] is args and now.timestamp() < kept[2]:
            return kept[3]
        reading, until = read_until(node, policy, args, now)
        self._kept[node.name] = (node.annotations, args, until, reading)
        return reading

    def retain(self, names: Collection[str]) -> None:
        for name in self._kept.keys() - set(names):
            del self._kept[name]


def plan(
    nodes: Mapping[str, TaintNode],
    states: Mapping[str, NodeState],
    policy: DynamicSchedulerPolicy,
    args: DynamicArgs,
    now: datetime,
    readings: Readings | None = None,
) -> TaintPlan:
    """The changes to make now and the debounce state to carry to the next evaluation (``readings``: kept from
    one evaluation to the next, ``args`` being ``policy``'s)."""
    out = TaintPlan()
    section = policy.load_taint
    if section is None:
        out.changes = [Change(n.name, False, "disabled", Reading(None)) for n in nodes.values() if n.tainted]
        return out
    want: dict[str, bool] = {}
    for name, node in nodes.items():
        if node.opted_out:
            want[name] = False
            out.readings[name] = Reading(None, problem="opted out")
            continue
        state = states.get(name)
        if state is None:  # a new term: a taint found is taken as confirmed
            state = NodeState(Detector(hot=node.tainted))
        reading = readings.get(node, policy, args, now) if readings is not None else read(node, policy, args, now)
        out.readings[name] = reading
        if reading.hot is None:
            state = NodeState()
        elif reading.sample != state.sample:
            detector = step(state.detector, reading.hot, section.hot_rounds, section.cool_rounds)
            state = NodeState(detector, reading.sample)
        out.states[name] = state
        want[name] = state.detector.hot
    for name, node in nodes.items():
        if node.tainted and not want[name]:
            reading = out.readings[name]
            reason: Reason = "opted-out" if node.opted_out else "stale" if reading.hot is None else "cooled"
            out.changes.append(Change(name, False, reason, reading))
    _floor(nodes, want, section.min_untainted_nodes, out)
    lifted = {c.node for c in out.changes if not c.taint}
    for name, node in nodes.items():  # the effect changed in the policy: rewritten on the nodes kept tainted
        if node.tainted and want[name] and name not in lifted and node.effect != section.effect:
            out.changes.append(Change(name, True, "hot", out.readings[name]))
    return out


def _floor(nodes: Mapping[str, TaintNode], want: Mapping[str, bool], floor: int, out: TaintPlan) -> None:
    """Add the taints wanted, hottest first, while at least ``floor`` schedulable nodes stay untainted; lift the
    coolest kept ones if the floor is already broken."""
    kept = [n for n in nodes.values() if n.tainted and want[n.name]]
    new = [n for n in nodes.values() if not n.tainted and want[n.name]]
    schedulable = sum(1 for n in nodes.values() if n.schedulable)
    untainted = schedulable - sum(1 for n in kept if n.schedulable)

    def hotness(node: TaintNode) -> tuple[float, str]:
        return (-out.readings[node.name].ratio, node.name)

    for node in sorted((n for n in kept if n.schedulable), key=hotness, reverse=True):
        if untainted >= floor:
            break
        out.changes.append(Change(node.name, False, "floor", out.readings[node.name]))
        untainted += 1
    # a new taint counts only the nodes untainted now: a lift planned here frees its node once it is written (the
    # next evaluation), so a lift that keeps failing never lets the floor be crossed
    free = sum(1 for n in nodes.values() if n.schedulable and not n.tainted)
    for node in sorted(new, key=hotness):
        if node.schedulable and free - 1 < floor:
            out.held.append(node.name)
            continue
        out.changes.append(Change(node.name, True, "hot", out.readings[node.name]))
        free -= 1 if node.schedulable else 0


def _seconds(age: timedelta) -> str:
    return f"{age.total_seconds():g}s"
