"""Node classes per round, and the debounce that makes a node hot only after it stayed hot.

A round reads each node's load annotations with the scheduler's own decoder (``crane_shared.loadaware.dynamic.
node_load``: the same freshness windows, skew and malformed-value rules), then:

- ``unknown`` when a metric of its pool is missing, stale, future-dated or malformed: never acted on, and its
  debounce starts over (a node must be seen hot K times on good data in a row);
- ``hot`` when a metric is strictly above its high threshold (the scheduler's Dynamic filter compares strictly
  too), ``idle`` when every metric is strictly below its low threshold, else ``normal``.

Batch pods (``crane_shared.batch``): the annotator writes, per metric, the batch pods' share of it measured over
the metric's own samples (``batch.crane.io/<metric>``, in the same patch and with the same timestamp). A node is
hot **by regular usage** when a metric minus its share crosses a high threshold, read exactly as the scheduler
reads a regular pod's load (``node_load(regular=True)``, ``dynamic.batch_share``); the planner then sheds its
batch pods first. A node hot only with its batch pods' share keeps its regular pods (the heat is batch work, which
yields). A share that is missing, from another round, stale or malformed takes nothing out (the node is judged as
before batch work existed); a malformed one is reported (``batch_problem``).

The debounce (koordinator's anomaly detector, ``crane_shared.debounce``, shared with the annotator's load taint): a
node is *confirmed* hot after ``hot_rounds`` consecutive hot rounds and cools after ``normal_rounds`` consecutive
rounds that are not hot. Evictions need both a confirmed hot
node and a hot reading this round.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from crane_descheduler.policy import AnomalyCondition, NodePool
from crane_shared.debounce import Detector as Detector  # re-exported: the descheduler's rounds carry it
from crane_shared.debounce import step as debounce_step
from crane_shared.loadaware.dynamic import DynamicArgs, NodeLoad, node_load

RawClass = Literal["hot", "normal", "idle", "unknown"]


@dataclass(frozen=True)
class Reading:
    """One round's view of a node: its class, usage per pool metric, and why it is unknown (if it is)."""

    node: str
    raw: RawClass
    usage: Mapping[str, float]
    load: NodeLoad
    problem: str | None = None
    batch: Mapping[str, float] = field(default_factory=dict)
    """metric -> the batch pods' share taken out of it for the regular reading (``dynamic.batch_share``)"""
    batch_problem: str | None = None
    """why a batch usage annotation could not be read (it then counts as none)"""

    def over(self, pool: NodePool) -> dict[str, float]:
        """metric -> usage for the metrics above their high threshold."""
        return {m: u for m, u in self.usage.items() if m in pool.high and u > pool.high[m]}

    def regular_hot(self, pool: NodePool) -> bool:
        """Hot by the regular pods' usage alone (the usage without the batch pods' share)."""
        return any(u - self.batch.get(m, 0.0) > pool.high[m] for m, u in self.usage.items() if m in pool.high)


def read_node(
    node: str, annotations: Mapping[str, str] | None, pool: NodePool, args: DynamicArgs, now: datetime
) -> Reading:
    load = node_load(node, annotations, args, now)
    usage: dict[str, float] = {}
    for metric in pool.high:
        reading = load.readings.get(metric)
        if reading is None or reading.state != "fresh" or reading.usage is None:
            state = reading.state if reading else "missing"
            detail = f": {reading.error}" if reading and reading.error else ""
            return Reading(node, "unknown", {}, load, f"{metric} is {state}{detail}")
        usage[metric] = reading.usage
    regular = node_load(node, annotations, args, now, regular=True)
    batch = {m: regular.readings[m].batch for m in usage if m in regular.readings}
    bad = [key for key, state in regular.batch_state.items() if state == "malformed"]
    problem = f"{bad[0]}: malformed" if bad else None
    if any(value > pool.high[m] for m, value in usage.items()):
        raw: RawClass = "hot"
    elif all(value < pool.low.get(m, 0.0) for m, value in usage.items()):
        raw = "idle"
    else:
        raw = "normal"
    return Reading(node, raw, usage, load, batch=batch, batch_problem=problem)


def step(detector: Detector, raw: RawClass, condition: AnomalyCondition) -> Detector:
    """One round of the shared debounce (``crane_shared.debounce``): an unknown reading starts it over."""
    hot = None if raw == "unknown" else raw == "hot"
    return debounce_step(detector, hot, condition.hot_rounds, condition.normal_rounds)


def node_class(detector: Detector, raw: RawClass) -> RawClass:
    """The class reported for a node: ``hot`` while confirmed (even on a cooler round), else the round's class
    (a node hot this round but not confirmed yet is ``normal``)."""
    if raw == "unknown":
        return "unknown"
    if detector.hot:
        return "hot"
    return "normal" if raw == "hot" else raw
