"""The Dynamic policy: crane's load-aware Filter and Score, upstream's contract with deliberate fixes.

Kept from upstream (users and upstream's own tools depend on it): thresholds compared strictly (usage > limit
rejects), threshold 0 disables a predicate, a metric is fresh while ``now < ts + syncPeriod + 5m``, the hot value
while ``now < ts + 5m``, DaemonSet pods always pass, score ``Σ(1-u)·w·100/Σw - 10·hot`` clamped to 0..100.

Fixed on purpose:
- the score renormalises over the metrics that are valid, so a new or un-annotated node is neutral
  (``NEUTRAL_SCORE``) rather than worst, and an annotator outage does not halve every score;
- scores are rounded, not truncated (65.999 is 66);
- non-finite, negative and future-dated values are rejected (treated as missing);
- failure reasons name the metric, not the node, so the FitError histogram groups them:
  ``node(s) had cpu_usage_avg_5m above 0.65``;
- missing/stale data fails open (as upstream) or closed (``stale="fail-closed"``); with the policy's opt-in
  ``newNodes.estimate`` (off by default: upstream's fail-open), a node that carries none of the policy's metrics
  yet (a new node) and that this scheduler bound pods to recently is judged per metric by their estimates
  (``usage = 0 + Σ estimates``, none absorbed), so a node an autoscaler just added fills to the thresholds by the
  estimates, not to its whole capacity by requests, before its first reading. Once one metric is annotated the
  node is measured: that reading plus the estimates bounds it, and a metric still missing (the annotator writes
  each on its own period, a 1-day maximum up to 3 hours later) is no data, as before;
- hot spots: the node's hot value adds the scheduler's own bindings made after the hot-value annotation was
  written, and the usage adds an estimate of recently bound pods that the averaged metric has not absorbed yet
  (none for a pod since seen deleted or terminal: ``RecentBinding.left``).

Everything here is a pure function of (annotations, policy, now, recent bindings), so the in-process plugin, the
extender and ``cranectl explain`` give the same answer for the same inputs.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

from crane_shared.annotations import (
    DEFAULT_LEGACY_ZONE,
    DEFAULT_MAX_SKEW,
    HOT_VALUE_FRESHNESS,
    HOT_VALUE_KEY,
    AnnotationError,
    Freshness,
    annotation_key,
    decode,
    freshness,
    metric_freshness_window,
)
from crane_shared.batch import BATCH_CPU_USAGE_KEY, BATCH_MEMORY_USAGE_KEY, batch_metric_key, same_round
from crane_shared.hotvalue import hot_value
from crane_shared.loadaware.learned import LearnArgs
from crane_shared.policy import DynamicSchedulerPolicy

NEUTRAL_SCORE = 50.0
"""Score of a node with no valid load data: between an idle node (100) and a saturated one (0)."""
MAX_SCORE = 100
HOT_VALUE_PENALTY = 10

StalePolicy = Literal["fail-open", "fail-closed"]
ReadingState = Literal["fresh", "missing", "stale", "future", "malformed"]


@dataclass(frozen=True)
class EstimateArgs:
    """Estimated usage of recently bound pods, added until the averaged metric has absorbed them.

    A pod's estimated usage is ``factor * request`` (its limit when it has no request) as a fraction of the
    node's allocatable. A metric averaged over a window ``W`` and stamped at ``T`` already contains the share
    ``(T - bound_at) / W`` of a pod bound at ``bound_at``; the rest, ``1 - clamp((T - bound_at) / W, 0, 1)``,
    is added. ``window`` is the recording rules' averaging window (5m upstream: also the window under the
    ``*_max_avg_*`` metrics, which take maxima of 5-minute averages).

    ``learned``: when the pod's workload has enough measured running pods, their usage replaces
    ``factor * request`` (``crane_shared.loadaware.learned``; the scheduler only, the extender has no pod index).
    """

    enabled: bool = True
    incoming_pod: bool = True
    """Also refuse a node that the pod being scheduled would push over a threshold."""
    cpu_factor: float = 0.6
    memory_factor: float = 0.6
    window: timedelta = timedelta(minutes=5)
    windows: Mapping[str, timedelta] = field(default_factory=dict)
    learned: LearnArgs = field(default_factory=LearnArgs)

    def window_of(self, metric: str) -> timedelta:
        return self.windows.get(metric, self.window)


@dataclass(frozen=True)
class DynamicArgs:
    policy: DynamicSchedulerPolicy
    legacy_zone: ZoneInfo = DEFAULT_LEGACY_ZONE
    stale: StalePolicy = "fail-open"
    max_skew: timedelta = DEFAULT_MAX_SKEW
    own_bindings_in_hot_value: bool = True
    estimate: EstimateArgs = field(default_factory=EstimateArgs)


@dataclass(frozen=True)
class RecentBinding:
    """A pod this scheduler bound recently: enough to count it in the hot value and estimate its usage."""

    node: str
    bound_at: float
    """unix seconds"""
    cpu: float = 0.0
    """estimated cores (request or limit; the factor is applied later)"""
    memory: float = 0.0
    """bytes"""
    learned: bool = False
    """``cpu``/``memory`` are the usage learned from the pod's workload: the factor is not applied"""
    left: bool = False
    """the pod was since seen deleted or terminal: it adds nothing to the estimate (it runs no more) and still
    counts in the hot value (its ``Scheduled`` event does in the annotator's)"""


@dataclass(frozen=True)
class NodeCapacity:
    cpu: float
    """allocatable cores"""
    memory: float
    """allocatable bytes"""


@dataclass(frozen=True)
class MetricReading:
    """One metric of one node as the policy sees it; ``usage`` includes the estimate when fresh."""

    metric: str
    state: ReadingState
    annotated: float | None = None
    timestamp: datetime | None = None
    estimate: float = 0.0
    error: str | None = None
    batch: float = 0.0
    """the batch pods' usage taken out (a regular pod's reading; 0 for a batch pod's or without fresh data)"""
    bindings: int = 0
    """a ``missing`` reading of a node without any metric annotation: how many recent bindings' estimates judge it
    (``estimate`` is their sum, none absorbed); 0: no data, the predicate fails open or closed"""

    @property
    def usage(self) -> float | None:
        if self.state == "missing" and self.bindings:
            return self.estimate  # never measured: 0 plus the estimates of the pods bound since it joined
        if self.annotated is None or self.state != "fresh":
            return None
        own = max(0.0, self.annotated - self.batch) if self.batch else self.annotated
        return own + self.estimate


@dataclass(frozen=True)
class NodeLoad:
    """Everything the Dynamic plugins decide on for one node (also what ``explain`` shows)."""

    node: str
    readings: Mapping[str, MetricReading]
    annotated_hot: int
    hot_state: ReadingState
    own_hot: int
    batch_state: Mapping[str, ReadingState] = field(default_factory=dict)
    """per batch annotation read (a regular pod's load only; see ``batch_share``), its state"""

    @property
    def hot(self) -> int:
        return self.annotated_hot + self.own_hot

    @property
    def malformed(self) -> tuple[str, ...]:
        return tuple(r.metric for r in self.readings.values() if r.state == "malformed")


def resource_of(metric: str) -> Literal["cpu", "memory"] | None:
    """Which resource a metric measures, by upstream's naming (``cpu_*``, ``mem_*``)."""
    if metric.startswith("cpu"):
        return "cpu"
    if metric.startswith("mem"):
        return "memory"
    return None


def _read(
    text: str | None, window: timedelta, now: datetime, args: DynamicArgs
) -> tuple[ReadingState, float | None, datetime | None, str | None]:
    if text is None:
        return "missing", None, None, None
    try:
        sample = decode(text, args.legacy_zone)
    except AnnotationError as err:
        return "malformed", None, None, err.reason
    state = freshness(sample.timestamp, now, window, args.max_skew)
    if state is Freshness.FUTURE:
        return "future", sample.value, sample.timestamp, None
    return ("fresh" if state is Freshness.FRESH else "stale"), sample.value, sample.timestamp, None


BATCH_USAGE_KEYS: Mapping[str, str] = {"cpu": BATCH_CPU_USAGE_KEY, "memory": BATCH_MEMORY_USAGE_KEY}
"""per resource, the annotation holding the batch pods' usage as a fraction of the node"""
LEGACY_BATCH_KEYS = frozenset(BATCH_USAGE_KEYS.values())


def batch_window(args: DynamicArgs) -> timedelta:
    """How long a batch-usage annotation counts: the freshness window of the policy's shortest sync period (the
    annotator writes it in every round, in the same patch as the usage annotations)."""
    periods = [s.period for s in args.policy.sync_policy]
    return metric_freshness_window(min(periods)) if periods else HOT_VALUE_FRESHNESS


def batch_usage(
    annotations: Mapping[str, str] | None, args: DynamicArgs, now: datetime
) -> dict[str, tuple[ReadingState, float, datetime | None]]:
    """Per resource, the older per-resource annotation (``crane.io/batch-*-usage``, the batch pods' usage now):
    (state, fraction to take out, timestamp). Only a fresh annotation takes anything out: a stale, future-dated,
    missing or malformed one subtracts nothing (the regular pod then sees the whole usage)."""
    out: dict[str, tuple[ReadingState, float, datetime | None]] = {}
    window = batch_window(args)
    for resource, key in BATCH_USAGE_KEYS.items():
        state, value, ts, _ = _read((annotations or {}).get(key), window, now, args)
        out[resource] = (state, value if state == "fresh" and value is not None else 0.0, ts)
    return out


def batch_share(
    annotations: Mapping[str, str],
    metric: str,
    resource: str,
    metric_state: ReadingState,
    metric_ts: datetime | None,
    legacy: Mapping[str, tuple[ReadingState, float, datetime | None]],
    args: DynamicArgs,
) -> tuple[str, ReadingState, float]:
    """What a regular pod's reading of ``metric`` takes out: (the annotation read, its state, the fraction).

    The metric's own share (``batch.crane.io/<metric>``, ``crane_shared.batch``) when the node carries one: taken
    only when written in the same round as the metric (same timestamp, so measured over the same samples) and the
    metric is fresh; one from another round is "stale" and takes nothing (fail closed: the regular pod sees the
    whole usage). Without it, the per-resource annotation (``batch_usage``) as before."""
    key = batch_metric_key(metric)
    text = annotations.get(key)
    if text is None:
        state, value, _ = legacy[resource]
        return BATCH_USAGE_KEYS[resource], state, value
    try:
        sample = decode(text, args.legacy_zone)
    except AnnotationError:
        return key, "malformed", 0.0
    if not same_round(sample.timestamp, metric_ts):
        return key, "stale", 0.0
    return key, metric_state, sample.value if metric_state == "fresh" else 0.0


def _estimate(
    metric: str, stamped: datetime, recent: Sequence[RecentBinding], capacity: NodeCapacity | None, args: EstimateArgs
) -> float:
    resource = resource_of(metric)
    if not args.enabled or resource is None or capacity is None or not recent:
        return 0.0
    window = args.window_of(metric).total_seconds()
    stamped_at = stamped.timestamp()
    total = capacity.cpu if resource == "cpu" else capacity.memory
    if total <= 0:
        return 0.0
    factor = args.cpu_factor if resource == "cpu" else args.memory_factor
    added = 0.0
    for b in recent:
        if b.left:
            continue
        absorbed = min(1.0, max(0.0, (stamped_at - b.bound_at) / window)) if window > 0 else 1.0
        amount = b.cpu if resource == "cpu" else b.memory
        added += (1.0 if b.learned else factor) * amount * (1.0 - absorbed)
    return added / total


def binding_horizon(args: DynamicArgs) -> timedelta:
    """How long a binding can still matter: the longest hot-value range, estimate window or new-node window."""
    windows = [args.policy.longest_hot_value_window()]
    estimate = args.estimate
    if estimate.enabled:
        windows += [estimate.window, *estimate.windows.values()]
        if args.policy.new_nodes.window is not None:
            windows.append(args.policy.new_nodes.window)
    return max(windows)


def new_node_window(args: DynamicArgs, metric: str) -> float:
    """Seconds a binding counts on a node never measured (``spec.newNodes.window``; default the estimate's window
    of the metric)."""
    window = args.policy.new_nodes.window
    return (window if window is not None else args.estimate.window_of(metric)).total_seconds()


def _estimate_missing(
    metric: str,
    now: datetime,
    recent: Sequence[RecentBinding],
    capacity: NodeCapacity | None,
    args: EstimateArgs,
    window: float,
) -> tuple[float, int]:
    """A new node's metric's estimate: (fraction of allocatable, bindings counted). Nothing has measured the
    bindings, so none is absorbed; each counts while ``now < bound_at + window`` (``new_node_window``: by default
    the estimate's window, after which an average over the window taken now would hold it whole; longer where a
    new node's first reading comes later than that)."""
    resource = resource_of(metric)
    if not args.enabled or resource is None or capacity is None or not recent:
        return 0.0, 0
    total = capacity.cpu if resource == "cpu" else capacity.memory
    if total <= 0 or window <= 0:
        return 0.0, 0
    now_s = now.timestamp()
    factor = args.cpu_factor if resource == "cpu" else args.memory_factor
    added = 0.0
    counted = 0
    for b in recent:
        if now_s < b.bound_at + window and not b.left:
            amount = b.cpu if resource == "cpu" else b.memory
            added += (1.0 if b.learned else factor) * amount
            counted += 1
    return added / total, counted


def node_load(
    node: str,
    annotations: Mapping[str, str] | None,
    args: DynamicArgs,
    now: datetime,
    recent: Sequence[RecentBinding] = (),
    capacity: NodeCapacity | None = None,
    *,
    regular: bool = False,
) -> NodeLoad:
    """Decode a node's load annotations under the policy; ``recent`` are this scheduler's bindings to it.

    ``regular``: the load a regular pod is judged by, the batch pods' share of each CPU and memory metric
    (``batch_share``) taken out, clamped at 0. A node without per-metric shares falls back to the batch pods'
    usage now taken out of every metric of its resource, an approximation (not inside a window average yet;
    for the long windows a value now against a maximum over a day). Without it: the whole usage, what a batch
    pod is judged by."""
    annotations = annotations or {}
    policy = args.policy
    batch = batch_usage(annotations, args, now) if regular else {}
    never = policy.new_nodes.estimate and not any(  # a new node, not measured, judged by its bindings (opt-in)
        annotation_key(s.name) in annotations for s in policy.sync_policy
    )
    states: dict[str, ReadingState] = {}
    readings: dict[str, MetricReading] = {}
    for sync in policy.sync_policy:
        text = annotations.get(annotation_key(sync.name))
        state, value, ts, error = _read(text, metric_freshness_window(sync.period), now, args)
        estimate = _estimate(sync.name, ts, recent, capacity, args.estimate) if state == "fresh" and ts else 0.0
        bound = 0
        if state == "missing" and never:
            estimate, bound = _estimate_missing(
                sync.name, now, recent, capacity, args.estimate, new_node_window(args, sync.name)
            )
        taken = 0.0
        resource = resource_of(sync.name)
        if regular and resource is not None:
            key, share_state, taken = batch_share(annotations, sync.name, resource, state, ts, batch, args)
            states[key] = share_state
            if state == "missing":
                taken = 0.0  # nothing measured to take the batch pods' share out of
        readings[sync.name] = MetricReading(sync.name, state, value, ts, estimate, error, taken, bound)
    hot_state, hot_annotated, hot_ts, _ = _read(annotations.get(HOT_VALUE_KEY), HOT_VALUE_FRESHNESS, now, args)
    annotated_hot = int(hot_annotated) if hot_state == "fresh" and hot_annotated is not None else 0
    own_hot = 0
    if args.own_bindings_in_hot_value and recent and policy.hot_value:
        after = hot_ts.timestamp() if hot_state == "fresh" and hot_ts else -math.inf
        now_s = now.timestamp()
        counts = {
            rule.time_range: sum(
                1 for b in recent if b.bound_at > after and b.bound_at > now_s - rule.time_range.total_seconds()
            )
            for rule in policy.hot_value
        }
        own_hot = hot_value(counts, policy.hot_value)
    return NodeLoad(node, readings, annotated_hot, hot_state, own_hot, states)


def filter_reason(
    load: NodeLoad, args: DynamicArgs, *, daemonset: bool = False, incoming: Mapping[str, float] | None = None
) -> str | None:
    """None when the node passes; else a node-free reason that groups in the FitError histogram.

    ``incoming`` is the pod's own estimated usage as a fraction of this node (``{"cpu": .., "memory": ..}``, see
    ``incoming_fraction``): a node under the threshold that the pod would push over it is refused too."""
    if daemonset:
        return None
    for predicate in args.policy.predicate:
        if predicate.max_limit_percent == 0:
            continue  # upstream: threshold 0 disables the predicate
        reading = load.readings.get(predicate.name)
        usage = reading.usage if reading else None
        if usage is None:
            if args.stale == "fail-closed":
                return f"node(s) had no fresh {predicate.name}"
            continue
        if usage > predicate.max_limit_percent:
            return f"node(s) had {predicate.name} above {predicate.max_limit_percent:g}"
        resource = resource_of(predicate.name)
        if incoming and resource and usage + incoming.get(resource, 0.0) > predicate.max_limit_percent:
            return f"node(s) would have {predicate.name} above {predicate.max_limit_percent:g}"
    return None


def incoming_fraction(
    args: EstimateArgs, cpu: float, memory: float, capacity: NodeCapacity, learned: bool = False
) -> dict[str, float]:
    """A pod's estimated usage (``factor * request``; ``learned``: ``cpu``/``memory`` are already its workload's
    learned usage, taken as they are) as fractions of a node's allocatable."""
    if not args.enabled or not args.incoming_pod:
        return {}
    cpu_factor, memory_factor = (1.0, 1.0) if learned else (args.cpu_factor, args.memory_factor)
    return {
        "cpu": cpu_factor * cpu / capacity.cpu if capacity.cpu > 0 else 0.0,
        "memory": memory_factor * memory / capacity.memory if capacity.memory > 0 else 0.0,
    }


def raw_score(load: NodeLoad, args: DynamicArgs) -> float:
    """``Σ(1-u)·w·100/Σw`` over the valid metrics (neutral with none), before the hot-value penalty."""
    weighted = 0.0
    weights = 0.0
    for priority in args.policy.priority:
        reading = load.readings.get(priority.name)
        usage = reading.usage if reading else None
        if usage is None or priority.weight == 0:
            continue
        weighted += (1.0 - min(1.0, max(0.0, usage))) * priority.weight
        weights += priority.weight
    return weighted * MAX_SCORE / weights if weights > 0 else NEUTRAL_SCORE


def score(load: NodeLoad, args: DynamicArgs, incoming: Mapping[str, float] | None = None) -> int:
    """The Dynamic score, 0..100, by the policy's ``scoring.strategy``: ``spread`` (upstream's, rounded, clamped,
    minus ``10 * hot``; ``incoming`` unused) or ``pack`` (``pack_score``)."""
    if args.policy.scoring.strategy == "pack":
        return pack_score(load, args, incoming)
    value = raw_score(load, args) - HOT_VALUE_PENALTY * load.hot
    return max(0, min(MAX_SCORE, round(value)))


def target_load(usage: float, target: float) -> float:
    """Trimaran TargetLoadPacking's score of one usage (fractions), 0..1: rising from ``target`` at an empty node
    to 1 at ``target``, then falling to 0 at a full node, 0 beyond."""
    u = max(usage, 0.0)
    if u > 1.0:
        return 0.0
    if u > target:
        return target * (1.0 - u) / (1.0 - target)
    return (1.0 - target) * u / target + target


def pack_score(load: NodeLoad, args: DynamicArgs, incoming: Mapping[str, float] | None = None) -> int:
    """The packing score, 0..100: ``target_load`` of each priority metric's usage with the incoming pod's estimated
    share of its resource added (``incoming``, as the Filter adds it), weighted over the valid metrics (neutral
    with none), rounded once. The hot value is no penalty here: recent bindings count through the estimate, and
    packing wants pods together up to the target (the Filter still stops them at its thresholds)."""
    target = args.policy.scoring.target_utilization
    weighted = 0.0
    weights = 0.0
    for priority in args.policy.priority:
        reading = load.readings.get(priority.name)
        usage = reading.usage if reading else None
        if usage is None or priority.weight == 0:
            continue
        resource = resource_of(priority.name)
        if incoming and resource:
            usage = usage + incoming.get(resource, 0.0)
        weighted += target_load(usage, target) * priority.weight
        weights += priority.weight
    value = weighted * MAX_SCORE / weights if weights > 0 else NEUTRAL_SCORE
    return max(0, min(MAX_SCORE, round(value)))


def _until(ts: datetime, state: str, window_s: float, skew_s: float) -> float:
    """When a reading in ``state`` stamped ``ts`` next changes state (inf: never, as time only moves on)."""
    stamp = ts.timestamp()
    if state == "fresh":
        return stamp + window_s
    if state == "future":
        return stamp - skew_s
    return math.inf


def valid_until(
    load: NodeLoad,
    annotations: Mapping[str, str] | None,
    args: DynamicArgs,
    recent: Sequence[RecentBinding],
    computed_at: float,
) -> float:
    """The first instant after ``computed_at`` at which ``node_load`` with the same inputs may differ."""
    skew = args.max_skew.total_seconds()
    until = math.inf
    for sync in args.policy.sync_policy:
        reading = load.readings.get(sync.name)
        if reading is not None and reading.state == "missing" and reading.bindings:
            window = new_node_window(args, sync.name)  # a binding leaves it at bound_at + window
            for binding in recent:
                end = binding.bound_at + window
                if end > computed_at and not binding.left:
                    until = min(until, end)
        if reading is not None and reading.timestamp is not None:
            until = min(
                until,
                _until(reading.timestamp, reading.state, metric_freshness_window(sync.period).total_seconds(), skew),
            )
    hot_text = (annotations or {}).get(HOT_VALUE_KEY)
    if hot_text is not None and load.hot_state in ("fresh", "future"):
        try:
            hot_ts = decode(hot_text, args.legacy_zone).timestamp
        except AnnotationError:
            hot_ts = None
        if hot_ts is not None:
            until = min(until, _until(hot_ts, load.hot_state, HOT_VALUE_FRESHNESS.total_seconds(), skew))
    if load.batch_state:  # a regular pod's load: the per-resource batch annotations' freshness edges (a metric's
        window = batch_window(args).total_seconds()  # own share, same timestamp, changes with the metric)
        for key, state in load.batch_state.items():
            text = (annotations or {}).get(key) if key in LEGACY_BATCH_KEYS else None
            if text is not None and state in ("fresh", "future"):
                with contextlib.suppress(AnnotationError):
                    until = min(until, _until(decode(text, args.legacy_zone).timestamp, state, window, skew))
    if args.own_bindings_in_hot_value:
        for rule in args.policy.hot_value:
            span = rule.time_range.total_seconds()
            for binding in recent:  # counted while bound_at > now - range
                end = binding.bound_at + span
                if end > computed_at:
                    until = min(until, end)
    return until
