"""``cranectl replay``: a trace run through crane-scheduler and crane-descheduler on a virtual clock.

The decisions are the products' own, run offline: placement by crane-scheduler (``crane_scheduler.simulate.
Simulator``: the profile, plugins and Dynamic policy, each placed pod assumed and reserved as the scheduler's
cycle does, so Dynamic estimates it until the annotations absorb it), rounds by crane-descheduler
(``crane_descheduler.rounds.RoundState``: its debounce, victim choice, budgets and target check, which runs
crane-scheduler's Filter itself). Only the world around them is simulated, tick by tick (``spec.step`` of the
trace), every clock reading the virtual one:

- **Controllers.** A workload keeps its replicas (``replicas`` / ``create`` events): missing pods are created
  Pending, extra ones deleted (pending first, then the newest, as a ReplicaSet); an evicted pod is deleted at
  once and its controller creates a replacement; a Job's pod ends ``lifetime`` after it started. A bound pod is
  Running and Ready at once.
- **Real usage** of a node = its ``base`` (a fraction: what is not a trace pod) + the usage of the pods running
  there (each pod uses its workload's ``usage`` now; ``usage`` events drift it), capped at the node's size.
- **Prometheus' recording rules** over that, sampled every tick: ``<cpu|mem>_usage_avg_<w>`` is the mean over the
  last ``w``, ``<cpu|mem>_usage_max_avg_<w>`` the maximum over the last ``w`` of the 5-minute mean. History
  starts with the trace (before it, the first sample is all there is). A policy metric of another shape is
  refused naming it.
- **The annotator's rule**: every metric of the policy's ``syncPolicy`` is written on each node every ``period``
  as ``"<value>,<timestamp>"`` with the virtual time as its timestamp, so Dynamic's freshness windows and its
  estimates of recent bindings (which decay against the annotation's stamp) run on the virtual clock; the hot
  value (``hotValue`` rules over the bindings, as the event-recorder records them) is written with every metric
  patch, when it changes, and when a non-zero value is 4 minutes old (``crane_annotator.hot``'s rule). Not
  written: batch shares and ``crane.io/pod-usage`` (a learned estimate falls back to the factor).
- **The scheduler** tries every pending pod, higher priority first, then oldest first, whenever the cluster
  changed since its last pass (a pod or a node object) and at least every minute (kube's timed retries and
  flush). No preemption (PostFilter acts on the cluster; priority only orders the queue).
- **The descheduler** runs a round every ``--descheduler-interval`` (60 s, the service's default) with the
  pods' usage now as its Prometheus answer; every planned eviction succeeds (no PDBs in a trace).

Each tick: events, controllers, usage sampled, annotations written, a descheduler round when due, the scheduler's
pass. Reported over time: each node's real usage and its judged metrics, the nodes over a threshold, the pending
pods, the evictions. A node is **over** when a metric is above its high threshold in the descheduler policy's
pools (by default the scheduler policy's predicate thresholds of its short averages: what a node can be brought
back under; window maximums are not judged), the same judge for every run compared.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from crane_descheduler.policy import KIND as DESCHEDULER_KIND
from crane_descheduler.policy import DeschedulerPolicy
from crane_descheduler.policy import default_policy as default_descheduler_policy
from crane_descheduler.policy import load_policy as load_descheduler_policy
from crane_descheduler.rounds import RoundState
from crane_scheduler.simulate import Simulator
from crane_shared.annotations import HOT_VALUE_KEY, annotation_key, encode_hot_value, encode_usage
from crane_shared.batch import PodUsage
from crane_shared.hotvalue import hot_value
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.policy import DynamicSchedulerPolicy
from cranectl.snapshot import load_document
from cranectl.traces import Trace, WorkloadSpec, format_duration_s
from cranectl.whatif import ManifestError, Setup, columns, page, png_of, pyplot, setup_of

T0 = 1_767_225_600.0
"""2026-01-01T00:00:00Z: where virtual time starts (whole seconds: annotations are stamped to the second)"""
HOT_VALUE_REFRESH = 240.0
"""a non-zero hot value is rewritten at this age (the annotator's ``max_age``, under the 5 m Dynamic allows)"""
RETRY = 60.0
"""the scheduler's pass runs at least this often while pods are pending"""
_METRIC = re.compile(r"(cpu|mem)_usage_(max_)?avg_([0-9]+)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
SHORT = 300.0
"""the mean a window maximum is taken over (crane's recording rules: the maximum of the 5-minute average)"""


@dataclass(frozen=True)
class Rule:
    """A recording rule: the mean of a resource's usage over ``window`` seconds, or (``outer``) the maximum of the
    5-minute mean over ``outer`` seconds."""

    resource: int
    """0: CPU, 1: memory"""
    window: float
    outer: float | None = None


def rule_of(metric: str) -> Rule:
    """The recording rule a policy metric names; ``ManifestError`` naming it when replay cannot derive it."""
    found = _METRIC.fullmatch(metric)
    if found is None:
        raise ManifestError(
            f"policy metric {metric!r}: replay derives only <cpu|mem>_usage_avg_<window> and "
            "<cpu|mem>_usage_max_avg_<window> (e.g. cpu_usage_avg_5m) from the nodes' usage"
        )
    resource, maximum, amount, unit = found.groups()
    seconds = int(amount) * _UNITS[unit]
    index = 0 if resource == "cpu" else 1
    return Rule(index, SHORT, float(seconds)) if maximum else Rule(index, float(seconds))


class Recorder:
    """Every node's real usage sampled each tick (prefix sums), and the recording rules over it, kept current."""

    def __init__(self, nodes: Sequence[str], metrics: Iterable[str]) -> None:
        self.rules = {m: rule_of(m) for m in metrics}
        self.times: list[float] = []
        self.sums = {n: ([0.0], [0.0]) for n in nodes}
        self._maxima: dict[tuple[str, str], deque[tuple[float, float]]] = {
            (n, m): deque() for n in nodes for m, r in self.rules.items() if r.outer is not None
        }
        self.values: dict[str, dict[str, float]] = {n: {} for n in nodes}

    def add(self, now: float, usage: Mapping[str, tuple[float, float]]) -> None:
        self.times.append(now)
        count = len(self.times)
        starts = {w: bisect.bisect_right(self.times, now - w) for w in {r.window for r in self.rules.values()}}
        for node, (cpu, memory) in usage.items():
            sums = self.sums[node]
            sums[0].append(sums[0][-1] + cpu)
            sums[1].append(sums[1][-1] + memory)
            values = self.values[node]
            for metric, rule in self.rules.items():
                start = starts[rule.window]
                column = sums[rule.resource]
                mean = (column[count] - column[start]) / (count - start)
                if rule.outer is None:
                    values[metric] = mean
                    continue
                window = self._maxima[(node, metric)]
                while window and window[-1][1] <= mean:
                    window.pop()
                window.append((now, mean))
                while window[0][0] <= now - rule.outer:
                    window.popleft()
                values[metric] = window[0][1]


@dataclass
class _Workload:
    spec: WorkloadSpec
    desired: int
    usage: list[float]
    """cores, bytes: each pod's real usage now"""
    serial: int = 0


@dataclass
class _Pod:
    uid: str
    """``namespace/name``, also its key in the descheduler's usage answer"""
    workload: _Workload
    obj: dict[str, Any]
    created: float
    node: str | None = None
    started: float | None = None
    version: int = 1


@dataclass(frozen=True)
class Side:
    """One run: a label, crane-scheduler's configuration and policy (``load_aware`` False: kube-scheduler's plugins
    only, no Dynamic), and the descheduler's policy (None: no descheduler)."""

    label: str
    config: Mapping[str, Any] | None
    policy: DynamicSchedulerPolicy
    descheduler: DeschedulerPolicy | None
    load_aware: bool = True
    interval: float = 60.0
    """seconds between descheduler rounds"""


@dataclass(frozen=True)
class Sample:
    t: float
    """seconds since the start"""
    usage: dict[str, tuple[float, float]]
    """node -> real CPU and memory usage, fractions of the node"""
    metrics: dict[str, dict[str, float]]
    """node -> judged metric -> its value (the recording rule now)"""
    over: list[str]
    pending: int
    running: int


@dataclass(frozen=True)
class EvictionRecord:
    t: float
    pod: str
    node: str
    target: str | None
    metric: str
    value: float
    threshold: float
    kind: str


@dataclass
class Result:
    label: str
    nodes: list[str]
    thresholds: dict[str, dict[str, float]]
    """node -> judged metric -> high threshold"""
    samples: list[Sample] = field(default_factory=list)
    evictions: list[EvictionRecord] = field(default_factory=list)
    node_minutes_over: float = 0.0
    placed: int = 0
    max_pending: int = 0
    pending_at_end: int = 0
    waits: list[float] = field(default_factory=list)
    """seconds from each placed pod's creation to its binding"""
    peak: dict[str, float] = field(default_factory=dict)
    """judged metric -> its highest value on any node"""
    seconds: float = 0.0
    """wall-clock seconds the replay took"""
    reasons: dict[str, str] = field(default_factory=dict)
    """pod -> why it was still pending at the end (the scheduler's FitError)"""

    @property
    def mean_wait(self) -> float:
        return sum(self.waits) / len(self.waits) if self.waits else 0.0


def judge(policy: DeschedulerPolicy, trace: Trace) -> dict[str, dict[str, float]]:
    """node -> metric -> high threshold: the pools of ``policy`` (a node no pool selects is not judged)."""
    out: dict[str, dict[str, float]] = {}
    for node in trace.nodes:
        pool = policy.pool_of({"kubernetes.io/hostname": node.name, **node.labels})
        out[node.name] = dict(pool.high) if pool is not None else {}
    return out


class Replay:
    """One trace replayed with one ``Side`` (see the module's docstring): ``run()`` returns the ``Result``."""

    def __init__(
        self, trace: Trace, side: Side, thresholds: Mapping[str, Mapping[str, float]], *, seed: int = 0
    ) -> None:
        self.trace, self.side = trace, side
        self.now = T0
        self.sim = Simulator(
            side.config, dynamic=side.policy, clock=lambda: self.now, seed=seed, out_of_tree=side.load_aware
        )
        self.specs = {n.name: n for n in trace.nodes}
        self.base = {n.name: [n.base.cpu, n.base.memory] for n in trace.nodes}
        self.annotations: dict[str, dict[str, str]] = {n.name: {} for n in trace.nodes}
        self.node_objs: dict[str, dict[str, Any]] = {}
        self.workloads = {w.name: _Workload(w, w.replicas, [w.usage.cpu, w.usage.memory]) for w in trace.workloads}
        self.pods: dict[str, _Pod] = {}
        self.bindings: dict[str, deque[float]] = {n.name: deque() for n in trace.nodes}
        self.hot: dict[str, tuple[int, float]] = {}
        self.synced: dict[str, float] = {}
        judged = {m for t in thresholds.values() for m in t}
        missing = sorted(judged - set(side.policy.metrics()))
        if missing:
            raise ManifestError(f"threshold on {missing[0]!r}, which the scheduler policy does not sync")
        self.recorder = Recorder(list(self.specs), side.policy.metrics())
        self.rounds = RoundState() if side.descheduler is not None else None
        self.args = DynamicArgs(side.policy)
        self.result = Result(side.label, list(self.specs), {n: dict(t) for n, t in thresholds.items()})
        self._changed = True
        self._last_pass = -1e18
        self._last_round = -1e18
        for name in self.specs:
            self._write_node(name)

    # ------------------------------------------------------------------------------------------ the world

    def _write_node(self, name: str) -> None:
        spec = self.specs[name]
        resources = {"cpu": f"{round(spec.cpu * 1000)}m", "memory": str(int(spec.memory)), "pods": "110"}
        obj = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **spec.labels},
                "annotations": dict(self.annotations[name]),
            },
            "spec": {},
            "status": {"allocatable": resources, "capacity": resources},
        }
        self.node_objs[name] = obj  # a new object on every change: the descheduler's snapshot re-reads only those
        self.sim.update(obj)
        self._changed = True

    def _pod_obj(self, pod: _Pod) -> dict[str, Any]:
        spec = pod.workload.spec
        meta: dict[str, Any] = {
            "name": pod.uid.split("/", 1)[1],
            "namespace": spec.namespace,
            "uid": pod.uid,
            "resourceVersion": str(pod.version),
            "creationTimestamp": _iso(pod.created),
            "labels": {"app": spec.name},
        }
        if spec.kind != "Pod":
            owner = "ReplicaSet" if spec.kind == "Deployment" else "Job"
            name = f"{spec.name}-replay" if owner == "ReplicaSet" else spec.name
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1" if owner == "ReplicaSet" else "batch/v1",
                    "kind": owner,
                    "name": name,
                    "uid": f"replay-{owner.lower()}-{spec.namespace}-{name}",
                    "controller": True,
                }
            ]
        body: dict[str, Any] = {
            "containers": [{"name": "app", "image": "replay", "resources": {"requests": dict(spec.requests)}}],
            "priority": spec.priority,
        }
        status: dict[str, Any] = {"phase": "Pending"}
        if pod.node is not None:
            body["nodeName"] = pod.node
            conditions = [{"type": t, "status": "True"} for t in ("PodScheduled", "Ready")]
            status = {"phase": "Running", "startTime": _iso(pod.started or self.now), "conditions": conditions}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body, "status": status}

    def _create(self, workload: _Workload) -> None:
        workload.serial += 1
        spec = workload.spec
        pod = _Pod(f"{spec.namespace}/{spec.name}-{workload.serial}", workload, {}, self.now)
        if spec.node is not None:  # bound by hand, not scheduled
            pod.node, pod.started = spec.node, self.now
        pod.obj = self._pod_obj(pod)
        self.pods[pod.uid] = pod
        if pod.node is not None:
            self.sim.add(pod.obj)
        self._changed = True

    def _delete(self, pod: _Pod) -> None:
        del self.pods[pod.uid]
        if pod.node is not None:
            self.sim.delete(pod.obj)
        self._changed = True

    def _bind(self, pod: _Pod, node: str) -> None:
        pod.node, pod.started = node, self.now
        pod.version += 1
        pod.obj = self._pod_obj(pod)
        self.sim.update(pod.obj)  # the informer's bound pod confirms the assumption
        self.bindings[node].append(self.now)
        self.result.placed += 1
        self.result.waits.append(self.now - pod.created)
        self._changed = True

    def _reconcile(self) -> None:
        """Each workload's controller: create missing pods, delete extra ones (pending first, then the newest)."""
        live: dict[str, list[_Pod]] = {name: [] for name in self.workloads}
        for pod in self.pods.values():
            live[pod.workload.spec.name].append(pod)
        for name, workload in self.workloads.items():
            pods = live[name]
            for _ in range(workload.desired - len(pods)):
                self._create(workload)
            extra = len(pods) - workload.desired
            if extra > 0:
                ranked = sorted(pods, key=lambda p: (p.node is not None, -p.created, p.uid))
                for pod in ranked[:extra]:
                    self._delete(pod)

    def _apply_events(self, events: deque[Any]) -> None:
        elapsed = self.now - T0
        while events and events[0].at <= elapsed:
            event = events.popleft()
            if event.node is not None:
                for i, key in enumerate(("cpu", "memory")):
                    if key in event.base:
                        self.base[event.node][i] = event.base[key]
                continue
            workload = self.workloads[event.workload]
            if event.usage is not None:
                for i, key in enumerate(("cpu", "memory")):
                    if key in event.usage:
                        workload.usage[i] = event.usage[key]
            elif event.replicas is not None:
                workload.desired = event.replicas
            elif event.create is not None:
                workload.desired += event.create

    def _finish_jobs(self) -> None:
        for pod in list(self.pods.values()):
            lifetime = pod.workload.spec.lifetime
            if lifetime is not None and pod.started is not None and self.now >= pod.started + lifetime:
                pod.workload.desired = max(0, pod.workload.desired - 1)
                self._delete(pod)

    def _usage(self) -> dict[str, tuple[float, float]]:
        used = {
            name: [cpu * self.specs[name].cpu, mem * self.specs[name].memory] for name, (cpu, mem) in self.base.items()
        }
        for pod in self.pods.values():
            if pod.node is not None:
                used[pod.node][0] += pod.workload.usage[0]
                used[pod.node][1] += pod.workload.usage[1]
        return {
            name: (min(1.0, cpu / self.specs[name].cpu), min(1.0, mem / self.specs[name].memory))
            for name, (cpu, mem) in used.items()
        }

    # ------------------------------------------------------------------------------------------ the services

    def _annotate(self) -> None:
        """The annotator's round: the metrics due, and the hot values that need writing."""
        policy = self.side.policy
        due = [
            s.name for s in policy.sync_policy if self.now - self.synced.get(s.name, -1e18) >= s.period.total_seconds()
        ]
        stamp = datetime.fromtimestamp(self.now, UTC)
        longest = policy.longest_hot_value_window().total_seconds()
        for name in self.specs:
            notes = self.annotations[name]
            changed = bool(due)
            for metric in due:
                notes[annotation_key(metric)] = encode_usage(self.recorder.values[name][metric], stamp)
            if policy.hot_value:
                times = self.bindings[name]
                while times and times[0] <= self.now - longest:
                    times.popleft()
                counts = {
                    r.time_range: sum(1 for t in times if t > self.now - r.time_range.total_seconds())
                    for r in policy.hot_value
                }
                value = hot_value(counts, policy.hot_value)
                written, at = self.hot.get(name, (-1, -1e18))
                if changed or value != written or (value and self.now - at >= HOT_VALUE_REFRESH):
                    notes[HOT_VALUE_KEY] = encode_hot_value(value, stamp)
                    self.hot[name] = (value, self.now)
                    changed = True
            if changed:
                self._write_node(name)
        for metric in due:
            self.synced[metric] = self.now

    def _deschedule(self) -> None:
        if self.rounds is None or self.side.descheduler is None or self.now - self._last_round < self.side.interval:
            return
        self._last_round = self.now
        measured = {p.uid: PodUsage(*p.workload.usage) for p in self.pods.values() if p.node is not None}
        result = self.rounds.plan(
            list(self.node_objs.values()),
            [p.obj for p in self.pods.values()],
            measured,
            self.side.descheduler,
            self.args,
            datetime.fromtimestamp(self.now, UTC),
        )
        for e in result.plan.evictions:
            pod = self.pods.get(e.pod.uid)
            if pod is None:
                continue
            self._delete(pod)
            self.rounds.evicted(e, self.now, measured[e.pod.key])
            self.result.evictions.append(
                EvictionRecord(self.now - T0, e.pod.key, e.node, e.target, e.metric, e.value, e.threshold, e.kind)
            )

    def _schedule(self) -> None:
        pending = [p for p in self.pods.values() if p.node is None]
        if not pending or not (self._changed or self.now - self._last_pass >= RETRY):
            return
        self._changed = False
        self._last_pass = self.now
        for pod in sorted(pending, key=lambda p: -p.workload.spec.priority):  # stable: oldest first
            placement = self.sim.schedule(pod.obj, preemption=False)  # no preemption: see the docstring
            if placement.node is not None:
                self._bind(pod, placement.node)
            else:
                self.result.reasons[pod.uid] = placement.message

    # ------------------------------------------------------------------------------------------ the run

    def run(self) -> Result:
        started = time.perf_counter()
        events = deque(self.trace.events)
        report = max(60.0, self.trace.step)
        next_report = 0.0
        result = self.result
        end = T0 + self.trace.duration
        while self.now <= end + 1e-9:
            self._apply_events(events)
            self._finish_jobs()
            self._reconcile()
            usage = self._usage()
            self.recorder.add(self.now, usage)
            self._annotate()
            self._deschedule()
            self._reconcile()
            self._schedule()
            if self._measure(usage, self.now - T0 + 1e-9 >= next_report):
                next_report += report
            self.now += self.trace.step
        result.pending_at_end = sum(1 for p in self.pods.values() if p.node is None)
        result.reasons = {
            uid: why for uid, why in result.reasons.items() if uid in self.pods and self.pods[uid].node is None
        }
        result.seconds = time.perf_counter() - started
        return result

    def _measure(self, usage: Mapping[str, tuple[float, float]], sample: bool) -> bool:
        """The tick's totals (node-minutes over, pending, peaks), and a ``Sample`` when ``sample``."""
        result, values = self.result, self.recorder.values
        over = self._over()
        result.node_minutes_over += len(over) * self.trace.step / 60
        pending = sum(1 for p in self.pods.values() if p.node is None)
        result.max_pending = max(result.max_pending, pending)
        for name, judged in result.thresholds.items():
            for metric in judged:
                result.peak[metric] = max(result.peak.get(metric, 0.0), values[name][metric])
        if sample:
            result.samples.append(
                Sample(
                    self.now - T0,
                    {n: (round(c, 4), round(m, 4)) for n, (c, m) in usage.items()},
                    {n: {m: round(values[n][m], 4) for m in t} for n, t in result.thresholds.items()},
                    over,
                    pending,
                    len(self.pods) - pending,
                )
            )
        return sample

    def _over(self) -> list[str]:
        values = self.recorder.values
        return [
            name
            for name, judged in self.result.thresholds.items()
            if any(values[name][m] > limit for m, limit in judged.items())
        ]


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


UPSTREAM_CONFIG: dict[str, Any] = {
    "profiles": [
        {
            "schedulerName": "default-scheduler",
            "pluginConfig": [
                {"name": "Dynamic", "args": {"ownBindingsInHotValue": False, "estimate": {"enabled": False}}}
            ],
        }
    ]
}
"""crane-scheduler with upstream crane's Dynamic behaviour: no estimate of recent bindings or of the pod itself,
its own bindings not in the hot value (``bench.loadaware``'s ``upstream``)"""
MODES = ("requests", "upstream", "no-descheduler")


def check_policy(policy: DynamicSchedulerPolicy, source: str) -> None:
    """Refuse what replay does not simulate, naming the field (the annotator's batch loan and load taint)."""
    if policy.reclaim is not None:
        raise ManifestError(f"{source}: spec.reclaim is not replayed (batch capacity, batch shares, pod usage)")
    if policy.load_taint is not None:
        raise ManifestError(f"{source}: spec.loadTaint is not replayed (the annotator's taint on hot nodes)")


def mode_side(mode: str, base: Side, descheduler: DeschedulerPolicy) -> Side:
    """A built-in ``--compare``: ``requests`` (kube-scheduler's plugins alone, no descheduler), ``upstream``
    (``UPSTREAM_CONFIG``, no descheduler: upstream crane has none), ``no-descheduler`` (the base without one)."""
    if mode == "requests":
        return Side("requests only", None, base.policy, None, load_aware=False)
    if mode == "upstream":
        return Side("upstream crane", UPSTREAM_CONFIG, base.policy, None)
    if mode == "no-descheduler":
        return Side(f"{base.label}, no descheduler", base.config, base.policy, None)
    raise ValueError(f"--compare {mode}: not a file, nor one of {', '.join(MODES)}")


def sides(
    policy: DynamicSchedulerPolicy,
    config: Mapping[str, Any] | None,
    *,
    policy_source: str,
    descheduler_policy: str | None = None,
    descheduler: bool = True,
    interval: float = 60.0,
    compare: Sequence[str] = (),
) -> tuple[list[Side], DeschedulerPolicy]:
    """The runs the command line asks for (the base, then each ``--compare``: a ``MODES`` name, a
    LoadAwareDeschedulerPolicy file, or a scheduler policy or configuration file, as ``cranectl simulate
    --compare`` reads it) and the descheduler policy that
    judges them all (the base's: ``descheduler_policy``'s file, else the built-in one over ``policy``)."""
    check_policy(policy, policy_source)

    def deschedule(scheduler: DynamicSchedulerPolicy) -> DeschedulerPolicy:
        if descheduler_policy:
            return load_descheduler_policy(descheduler_policy, scheduler)
        return default_descheduler_policy(scheduler)

    judged = deschedule(policy)
    label = "crane" if descheduler else "crane, no descheduler"
    base = Side(label, config, policy, judged if descheduler else None, interval=interval)
    out = [base]
    for mode in compare:
        if mode in MODES:
            out.append(mode_side(mode, base, judged))
            continue
        doc = load_document(mode, "--compare")
        if doc is not None and doc.get("kind") == DESCHEDULER_KIND:  # another descheduler policy, the same scheduler
            out.append(replace(base, label=Path(mode).stem, descheduler=load_descheduler_policy(mode, policy)))
            continue
        setup = setup_of(doc, Setup(label, config, policy), Path(mode).stem)
        check_policy(setup.policy, mode)
        chosen = deschedule(setup.policy) if descheduler else None
        out.append(replace(base, label=setup.label, config=setup.config, policy=setup.policy, descheduler=chosen))
    return out, judged


def replay(trace: Trace, sides: Sequence[Side], judged: DeschedulerPolicy, *, seed: int = 0) -> list[Result]:
    """Each side over the same trace, judged by the same thresholds (``judged``'s pools)."""
    thresholds = judge(judged, trace)
    return [Replay(trace, side, thresholds, seed=seed).run() for side in sides]


# ------------------------------------------------------------------------------------------ rendering


def _minutes(seconds: float) -> str:
    return format_duration_s(round(seconds))


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def summary(results: Sequence[Result]) -> list[str]:
    metrics = list(dict.fromkeys(m for r in results for t in r.thresholds.values() for m in t))
    rows = [
        [
            "RUN",
            "OVER (node-min)",
            "EVICTIONS",
            "PLACED",
            "PENDING max/end",
            "WAIT mean",
            *(f"PEAK {m}" for m in metrics),
            "TOOK",
        ]
    ]
    for r in results:
        rows.append(
            [
                r.label,
                f"{r.node_minutes_over:.1f}",
                str(len(r.evictions)),
                str(r.placed),
                f"{r.max_pending}/{r.pending_at_end}",
                _minutes(r.mean_wait),
                *(f"{r.peak.get(m, 0.0):.2f}" for m in metrics),
                f"{r.seconds:.2f}s",
            ]
        )
    return columns(rows)


def timeline(result: Result, every: float, limit: int) -> list[str]:
    """A row every ``every`` seconds: each node's real CPU/memory usage (``!``: over a threshold), the nodes over,
    the pending pods, the evictions since the previous row."""
    nodes = result.nodes[:limit]
    rows = [["TIME", *nodes, "OVER", "PENDING", "EVICTED"]]
    last = -1e18
    counted = 0
    for sample in result.samples:
        if sample.t - last < every - 1e-9 and sample is not result.samples[-1]:
            continue
        last = sample.t
        evicted = sum(1 for e in result.evictions if e.t <= sample.t) - counted
        counted += evicted
        cells = [f"{sample.usage[n][0]:.2f}/{sample.usage[n][1]:.2f}{'!' if n in sample.over else ''}" for n in nodes]
        rows.append([_minutes(sample.t), *cells, str(len(sample.over)), str(sample.pending), str(evicted)])
    lines = [f"{result.label}: real usage per node (CPU/memory, a fraction of the node; ! over a threshold)"]
    lines += columns(rows)
    if len(result.nodes) > limit:
        lines.append(f"({limit} of {len(result.nodes)} nodes shown; -o json has every node)")
    return lines


def table(trace: Trace, results: Sequence[Result], every: float | None = None, limit: int = 8) -> str:
    every = every or max(60.0, math.ceil(trace.duration / 10 / 60) * 60)  # about ten rows
    lines = [
        f"trace {trace.name}: {trace.description}",
        f"{_minutes(trace.duration)} of virtual time in steps of {_minutes(trace.step)}, {len(trace.nodes)} nodes, "
        f"{_count(len(trace.workloads), 'workload')}, {_count(len(trace.events), 'event')}",
        "",
        *summary(results),
    ]
    for r in results:
        lines += ["", *timeline(r, every, limit)]
        for e in r.evictions:
            target = f"(target e.g. {e.target})" if e.target else "(batch, no place: yields)"
            why = f"{e.metric} {e.value:.3f} > {e.threshold:g}"
            if e.kind == "drain":  # an idle node emptied (spec.drain)
                why = f"drain, {e.metric} {e.value:.3f} < {e.threshold:g}"
            lines.append(f"  evicted at {_minutes(e.t)}: {e.pod} from {e.node} {target}, {why}")
        by_reason: dict[str, list[str]] = {}
        for pod, why in r.reasons.items():
            by_reason.setdefault(why, []).append(pod)
        for why, pods in by_reason.items():
            named = ", ".join(pods[:3]) + (f" and {len(pods) - 3} more" if len(pods) > 3 else "")
            lines.append(f"  pending at the end: {named}: {why}")
    lines.append("")
    lines.append(
        "(OVER: node-minutes with a judged metric above its high threshold; WAIT: creation to binding; TOOK: wall "
        "time of the replay)"
    )
    return "\n".join(lines)


def as_json(trace: Trace, results: Sequence[Result]) -> str:
    runs = []
    for r in results:
        body = asdict(r)
        body["meanWait"] = r.mean_wait
        runs.append(body)
    return json.dumps(
        {
            "trace": trace.name,
            "description": trace.description,
            "duration": trace.duration,
            "step": trace.step,
            "runs": runs,
        },
        indent=1,
    )


def plot_png(results: Sequence[Result], limit: int = 12) -> bytes:
    """One column per run: per judged metric, each node's value over time with its thresholds drawn (the
    ``limit`` nodes with the highest peak); below, the nodes over a threshold and the pending pods, evictions
    marked."""
    plt = pyplot()
    metrics = list(dict.fromkeys(m for r in results for t in r.thresholds.values() for m in t))
    rows = len(metrics) + 1
    fig, axes = plt.subplots(rows, len(results), figsize=(7 * len(results), 2.6 * rows), squeeze=False, sharex=True)
    for col, r in enumerate(results):
        minutes = [s.t / 60 for s in r.samples]
        for row, metric in enumerate(metrics):
            ax = axes[row][col]
            peaks = {n: max((s.metrics[n].get(metric, 0.0) for s in r.samples), default=0.0) for n in r.nodes}
            shown = sorted(sorted(r.nodes, key=lambda n: -peaks[n])[:limit])
            for n in shown:
                ax.plot(minutes, [s.metrics[n].get(metric, 0.0) for s in r.samples], linewidth=1, label=n)
            for limit_line in sorted({t[metric] for t in r.thresholds.values() if metric in t}):
                ax.axhline(limit_line, color="red", linestyle="--", linewidth=1)
            ax.set_ylim(0, 1.0)
            extra = f", {len(shown)} of {len(r.nodes)} nodes" if len(shown) < len(r.nodes) else ""
            ax.set_title(f"{r.label}: {metric} per node (threshold dashed{extra})", fontsize=9)
            ax.set_ylabel("fraction of node")
            if len(shown) <= 12:
                ax.legend(fontsize=6, loc="upper left", ncol=2)
        ax = axes[-1][col]
        ax.step(minutes, [len(s.over) for s in r.samples], where="post", color="red", label="nodes over a threshold")
        ax.step(minutes, [s.pending for s in r.samples], where="post", color="#7f7f7f", label="pending pods")
        if r.evictions:
            ax.plot([e.t / 60 for e in r.evictions], [0] * len(r.evictions), "kx", label="eviction")
        ax.set_title(
            f"{r.label}: {r.node_minutes_over:.0f} node-minutes over, {len(r.evictions)} evictions, "
            f"{r.pending_at_end} pending at the end",
            fontsize=9,
        )
        ax.yaxis.set_major_locator(plt.MaxNLocator(integer=True))
        ax.set_xlabel("minutes")
        ax.legend(fontsize=7, loc="upper right")
    return png_of(fig)


def html_page(trace: Trace, results: Sequence[Result], png: bytes, text: str) -> str:
    title = f"cranectl replay {trace.name}: {' vs '.join(r.label for r in results)}"
    return page(title, "load per node over time, nodes over a threshold, pending pods, evictions", png, text)
