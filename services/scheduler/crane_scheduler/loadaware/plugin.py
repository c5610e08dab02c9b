"""The ``Dynamic`` Filter/Score/Reserve plugin: crane's load-aware policy inside our scheduler.

Filter and Score evaluate every node at once over ``LoadColumns`` (decoded when a node's annotations change, not
per pod). Reserve remembers the pods this scheduler placed (``RecentEffects``): they add to their node's hot value
(only bindings after the hot-value annotation's timestamp, so none is counted twice) and their estimated usage is
added until the averaged metric has absorbed them or their pod is seen deleted or terminal; with the policy's
``newNodes.estimate`` (opt-in), a node annotated with no metric yet (just added) is judged by their estimates alone,
none absorbed, while they are younger than the estimate window. Both effects are cached per node and updated
when a binding or an annotation changes, so a decision costs a few vector operations however many pods were bound
recently. A burst of pods therefore spreads instead of piling onto the node that looked idlest a minute ago; a
gang's members may be kept out of each other's hot value (``gangHotValue: together``, see ``args``).

Preemption's victims leave a node in Filter (``leaving.py``): in the dry run's what-if (told through
``NodeTable.victims_simulated``) and once gone, their measured usage (``crane.io/pod-usage``) and their estimates
go with them, so a higher-priority pod preempts the lower-priority pods that make a node hot. A refusal carries
the soonest instant it could lift with no event (``lift.py``): the pod is retried then.
Two classes of pods (``crane_shared.batch``): a batch pod is judged by the node's whole usage, a regular pod by
the usage without the batch pods' (``LoadColumns.regular_values``); each class keeps its own cached results.
The estimate of the incoming pod and of a pod just bound is its workload's learned usage when enough of its
running pods are measured (``learned.WorkloadUsage``), else ``factor x request``.

The policy file is re-read when it changes (a ConfigMap update swaps the mounted file): a valid new policy
applies to the next pod; an invalid one is refused with a logged reason and the old policy stays.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
from prometheus_client import Counter, Gauge

from crane_scheduler import framework as fwk
from crane_scheduler.loadaware.args import PluginArgs, parse_args
from crane_scheduler.loadaware.columns import FloatArray, LoadColumns
from crane_scheduler.loadaware.learned import WorkloadUsage
from crane_scheduler.loadaware.leaving import Leaving, LeavingLoad, PodUsageIndex, preempted, started
from crane_scheduler.loadaware.lift import next_change, retry_after
from crane_scheduler.loadaware.nominated import NominatedLoad
from crane_scheduler.loadaware.recent import RecentEffects
from crane_scheduler.nodetable import IntArray, Mask, NodeTable, Nomination, PodRecord
from crane_scheduler.podinfo import CPU, MEMORY, NodeInfo, PodInfo
from crane_scheduler.rowcache import PASS, Codes, FilterCache, RowVersions, ScoreCache
from crane_shared.annotations import metric_freshness_window
from crane_shared.batch import BATCH_CPU, BATCH_MEMORY, POD_USAGE_KEY
from crane_shared.loadaware.dynamic import (
    DynamicArgs,
    MetricReading,
    NodeCapacity,
    RecentBinding,
    binding_horizon,
    filter_reason,
    incoming_fraction,
    new_node_window,
    node_load,
    score,
)
from crane_shared.loadaware.podsize import is_daemonset_pod, pod_size
from crane_shared.logs import LogOnce, get_logger
from crane_shared.policy import DynamicSchedulerPolicy, PolicyError, default_policy, load_policy
from crane_shared.policyfile import PolicyFile

NAME = "Dynamic"
RELOAD_CHECK_INTERVAL = 2.0
JUDGED_KEPT = 4096
"""pods whose class and estimate are kept for explain"""
ONE_BY_ONE = 16
"""up to this many changed rows are refreshed one at a time in Python (cheaper than numpy calls on a few rows)"""

log = get_logger("crane.scheduler.dynamic")


class DynamicMetrics:
    """The plugin's metrics, in the registry the framework handle gives it (shared by every profile's Dynamic)."""

    def __init__(self, metrics: fwk.PluginMetrics) -> None:
        self.rejections: Counter = metrics.counter(
            "crane_scheduler_dynamic_rejections", "Nodes the Dynamic filter rejected, by metric", ["metric"]
        )
        self.malformed: Counter = metrics.counter(
            "crane_scheduler_dynamic_malformed_annotations", "Load annotations that could not be decoded", ["metric"]
        )
        self.reloads: Counter = metrics.counter(
            "crane_scheduler_policy_reloads", "Policy file reloads by result", ["result"]
        )
        self.batch_ignored: Counter = metrics.counter(
            "crane_scheduler_dynamic_batch_usage_ignored",
            "Batch-usage annotations found stale: regular pods saw the node's whole usage",
        )
        self.thresholds: Gauge = metrics.gauge(
            "crane_scheduler_dynamic_policy_threshold",
            "The loaded policy's Filter threshold per metric (maxLimitPecent, a ratio; disabled ones absent)",
            ["profile", "metric"],
        )


def export_thresholds(gauge: Gauge, profile: str, policy: DynamicSchedulerPolicy, exported: set[str]) -> set[str]:
    """Set ``gauge`` to ``policy``'s enabled thresholds for ``profile``, dropping the series of ``exported`` (the
    previous policy's metrics) it no longer has, so dashboards draw the limits actually in force. Returns the
    metrics now exported."""
    now = {p.name: p.max_limit_percent for p in policy.predicate if p.max_limit_percent > 0}
    for metric in exported - now.keys():
        gauge.remove(profile, metric)
    for metric, limit in now.items():
        gauge.labels(profile, metric).set(limit)
    return set(now)


def estimated_resources(pod: PodInfo) -> tuple[float, float]:
    """(cores, bytes) a pod is expected to use: the shared pod-sizing rule (``crane_shared.loadaware.podsize``)."""
    size = pod_size(pod.raw.get("spec"), pod.requests)
    return size.cpu, size.memory


class Dynamic(fwk.FilterPlugin, fwk.ScorePlugin, fwk.ReservePlugin, fwk.QueueingHintPlugin, fwk.ExplainPlugin):
    name = NAME
    # PodBlindFilterPlugin: annotations and own recent bindings, not the pod accounting a what-if moves
    reads_node_pods = False
    # VictimLoadFilterPlugin: preemption's victims take their usage out of the node (``leaving.py``)
    reads_victims_load = True
    explain_section = "load"
    # A decider worker's replica replays this Reserve for every assumption of the scheduling process (its recent
    # bindings count in Filter and Score), with an empty state: the estimate is computed again from the pod.
    replicated_reserve = True

    def __init__(
        self,
        args: PluginArgs,
        handle: fwk.Handle,
        wall_clock: Callable[[], float] = time.time,
        *,
        policy: DynamicSchedulerPolicy | None = None,
    ) -> None:
        """``policy``: a caller that reads and reloads the policy file itself (the descheduler, running this
        plugin as its target check) hands it over; ``args.policy_path`` must then be None."""
        self.handle = handle
        self.wall_clock = wall_clock
        self.metrics = DynamicMetrics(handle.metrics)
        given = policy
        try:
            self.policy_file = PolicyFile(
                args.policy_path, load_policy, default_policy if given is None else lambda: given, self.metrics.reloads
            )
        except PolicyError as err:  # reported with the config's field path, like every other bad arg
            raise fwk.ArgsError([("policyConfigPath", str(err))]) from err
        self._thresholds = export_thresholds(self.metrics.thresholds, handle.profile, self.policy_file.policy, set())
        self.args = DynamicArgs(
            self.policy_file.policy,
            args.legacy_zone,
            args.stale,
            own_bindings_in_hot_value=args.own_bindings_in_hot_value,
            estimate=args.estimate,
        )
        self.gang_hot_value = args.gang_hot_value
        self._log_once = LogOnce(log)
        self._next_reload_check = 0.0
        self.columns = LoadColumns(self.args)
        self.recent = RecentEffects(self.columns)
        self.nominated = NominatedLoad(self.columns, handle.table.rows)
        self.leaving = LeavingLoad(self.columns)
        self.pod_usage = PodUsageIndex(self._malformed_pod_usage)
        # Results per node row, refreshed for the rows whose inputs changed (``rowcache``).
        self.versions = RowVersions()
        self._scores = {regular: ScoreCache(self.versions) for regular in (False, True)}
        self._codes = FilterCache(self.versions)
        self._pack_scores = FilterCache(self.versions)
        """``pack`` strategy: scores per pod size (they count the incoming pod)"""
        self._batch_ignored = 0
        self._reasons = self.columns.all_reasons()
        self._reason_index = {r: i for i, r in enumerate(self._reasons)}
        self._incoming_cache: tuple[int, int, FloatArray, FloatArray] | None = None
        self._incoming_of: tuple[tuple[int, int, float, float, float, float], dict[str, FloatArray]] | None = None
        self._horizon_of: tuple[DynamicArgs | None, float] = (None, 0.0)
        # Measured usage of the running pods per workload (learned estimates): pods from the informer only.
        self.learned = WorkloadUsage(args.estimate.learned)
        # One column per plugin instance: every profile has its own Dynamic (own args, own recent bindings).
        column = f"Dynamic.malformed.{handle.profile}.{id(self)}"
        handle.table.register_column(column, self._decode_node, dtype=np.int64)
        # Pods nominated by preemption count in the estimate until the table accounts them (``nominated.py``).
        table = handle.table
        table.nominated.listeners.append(self._nomination_changed)
        table.pod_added.append(lambda pod: self.nominated.placed(pod.uid, True))
        table.pod_assumed.append(lambda pod, node: self.nominated.placed(pod.uid, True))
        table.pod_removed.append(lambda uid: self.nominated.placed(uid, False))
        for uid, nomination in table.nominated.items():
            self._nomination_changed(uid, nomination)
        table.victims_simulated.append(self._victims_simulated)
        table.pod_left.append(self._pod_left)
        table.pod_deleted.append(self._pod_deleted)
        table.pod_added.append(self._pod_added)
        table.pod_removed.append(self.learned.pod_removed)
        for record in table.pods.values():
            if record.pod is not None and not record.assumed:
                self._pod_added(record.pod)
        self._judged: dict[str, tuple[bool, float, float, bool]] = {}
        """pod uid -> (regular, estimated cpu, memory, learned) as Filter judged it last (for explain)"""

    # -- node annotations -> columns ------------------------------------------------------------------------------

    def _decode_node(self, node: NodeInfo) -> int:
        """Table hook, called when a node is added or changes: decode its load annotations once."""
        row = self.handle.table.rows[node.name]
        bad = self.columns.set_row(row, node.annotations)
        cpu, memory = _capacity(node)
        self.recent.node_changed(row, node.name, cpu, memory, self.wall_clock())
        self.nominated.node_changed(row, node.name, cpu, memory)
        self.pod_usage.set_row(row, node.name, node.annotations.get(POD_USAGE_KEY))
        self.leaving.node_changed(row, node.name, cpu, memory)
        self.versions.touch((row,))  # allocatable may have changed: the incoming pod's fraction too
        error = self.learned.node_changed(node.name, node.annotations)
        if error is not None:
            self.metrics.malformed.labels("pod-usage").inc()
            self._log_once.warning("malformed:pod-usage", "malformed pod-usage annotation skipped", node=node.name)
        for metric in bad:
            self.metrics.malformed.labels(metric).inc()
            self._log_once.warning(
                f"malformed:{metric}", "malformed load annotation skipped", node=node.name, metric=metric
            )
        return len(bad)

    def _malformed_pod_usage(self, node: str, error: str) -> None:
        self.metrics.malformed.labels(POD_USAGE_KEY).inc()
        self._log_once.warning(
            f"malformed:{POD_USAGE_KEY}",
            "malformed pod-usage annotation skipped: its pods count as not measured",
            node=node,
            error=error,
        )

    def _leaving(self, record: PodRecord, left: float) -> Leaving | None:
        """A victim as ``leaving.py`` counts it: its measured usage on its node; None when not measured."""
        row = self.handle.table.rows[record.node]
        usage = self.pod_usage.usage(row, f"{record.namespace}/{record.name}")
        if usage is None:
            return None
        raw = record.pod.raw if record.pod is not None else None
        return Leaving(record.seq, started(raw), left, usage.cpu_cores, usage.memory_bytes)

    def _victims_simulated(self, records: list[PodRecord], sign: int) -> None:
        """Preemption's what-if took ``records`` out (-1) or put them back (+1). A victim neither measured nor
        one of our recent bindings changes nothing here, and costs nothing."""
        leaving = self.leaving
        relevant = self.victim_rows()
        if not relevant:
            return  # nothing measured, no recent binding: no victim changes a verdict
        rows: set[int] = set()
        for record in records:
            row = self.handle.table.rows.get(record.node)
            if row is None or row not in relevant:
                continue
            if sign < 0:
                entry = self._leaving(record, math.inf)
                if entry is None:
                    if record.uid not in self.recent:
                        continue
                    entry = Leaving(record.seq, -math.inf, math.inf, 0.0, 0.0)
                leaving.take_out(row, record.uid, entry)
            elif not leaving.put_back(row, record.uid):
                continue
            rows.add(row)
        for row in rows:
            leaving.set_estimates(row, self.recent.added_by(row, set(leaving.what_if.get(row, ()))))

    def victim_rows(self, pod: PodInfo | None = None) -> set[int]:
        """Rows where a victim (of ``pod``: a pod of lower priority) may take something out: measured pods, recent
        bindings (of lower priority), a what-if running."""
        if pod is None:
            bound = self.recent.rows()
        else:
            pods = self.handle.table.pods
            bound = {row for uid, row in self.recent.placed() if _lower(pods.get(uid), pod.priority)}
        return self.pod_usage.rows() | bound | set(self.leaving.what_if)

    def _pod_left(self, record: PodRecord) -> None:
        """A pod left the table: a preemption victim takes its usage and its estimate with it (``leaving.py``)."""
        row = self.handle.table.rows.get(record.node)
        if row is None or record.pod is None or not preempted(record.pod.raw):
            return
        now = self.wall_clock()
        entry = self._leaving(record, now)
        if entry is not None:
            self.leaving.depart(row, record.uid, entry)
        self.recent.remove(record.uid, now)

    def _pod_deleted(self, record: PodRecord) -> None:
        """A pod seen deleted or terminal: its estimate stops counting on its node now (``RecentEffects.depart``),
        on a new node judged by its bindings (``newNodes.estimate``) as on a measured one."""
        self.recent.depart(record.uid, self.wall_clock())

    def _pod_added(self, pod: PodInfo) -> None:
        self.learned.pod_added(pod.uid, pod.namespace, pod.name, pod.raw.get("metadata"))

    def estimate_of(self, pod: PodInfo, now: float) -> tuple[float, float, bool]:
        """(cores, bytes, learned): the workload's learned usage when known, else the pod's size (the factor is
        applied to it later)."""
        found = self.learned.estimate(pod.raw.get("metadata"), now)
        if found is not None:
            return found.cpu_cores, found.memory_bytes, True
        cpu, memory = estimated_resources(pod)
        return cpu, memory, False

    def _nomination_changed(self, uid: str, nomination: Nomination | None) -> None:
        if nomination is None:
            self.nominated.clear(uid)
            return
        pod, node = nomination
        cpu, memory = estimated_resources(pod)
        self.nominated.nominate(uid, node, pod.priority, cpu, memory, uid in self.handle.table.pods)

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now < self._next_reload_check:
            return
        self._next_reload_check = now + RELOAD_CHECK_INTERVAL
        policy = self.policy_file.reload()
        if policy is None:
            return
        self.args = replace(self.args, policy=policy)
        self._thresholds = export_thresholds(self.metrics.thresholds, self.handle.profile, policy, self._thresholds)
        old = self.recent
        self.columns = LoadColumns(self.args, capacity=max(64, self.handle.table.n_rows))
        self.recent = RecentEffects(self.columns, capacity=max(64, self.handle.table.n_rows))
        self.nominated = NominatedLoad(self.columns, self.handle.table.rows, capacity=max(64, self.handle.table.n_rows))
        gone = self.leaving.departed
        self.leaving = LeavingLoad(self.columns, capacity=max(64, self.handle.table.n_rows))
        for uid, nomination in self.handle.table.nominated.items():
            self._nomination_changed(uid, nomination)
        now = self.wall_clock()
        for row, node in enumerate(self.handle.table.nodes):
            if node is not None:
                self.columns.set_row(row, node.annotations)
                self.recent.node_changed(row, node.name, *_capacity(node), now)
                self.nominated.node_changed(row, node.name, *_capacity(node))
                for uid, bound_at, cpu, memory, learned, group, left in old.uids_of(row):
                    self.recent.add(uid, row, node.name, bound_at, cpu, memory, learned, group)
                    if left:
                        self.recent.depart(uid, now)
                self.leaving.node_changed(row, node.name, *_capacity(node))
                for uid, entry in gone.get(row, {}).items():
                    self.leaving.depart(row, uid, entry)
        self._reasons = self.columns.all_reasons()
        self._reason_index = {r: i for i, r in enumerate(self._reasons)}
        self._codes.clear()
        self._pack_scores.clear()
        self.versions.touch_all()

    # -- recent bindings of this scheduler ----------------------------------------------------------------------

    def _horizon(self) -> float:
        """How long a binding can matter (``dynamic.binding_horizon``); cached per policy."""
        return self._horizon_for(self.args)

    def _horizon_for(self, args: DynamicArgs) -> float:
        if self._horizon_of[0] is not args:
            self._horizon_of = (args, binding_horizon(args).total_seconds())
        return self._horizon_of[1]

    def recent_on(self, node: str, until: float = math.inf) -> list[RecentBinding]:
        """This scheduler's recent bindings to one node (for the reference evaluation and explain)."""
        row = self.handle.table.rows.get(node)
        if row is None:
            return []
        return [b for b in self.recent.bindings_of(row) if b.bound_at <= until]

    def _size_key(
        self, cpu: float, memory: float, learned: bool, regular: bool
    ) -> tuple[bool, float, float, bool] | bool:
        """What of the pod the filter depends on: its class, and its estimate when the incoming pod's estimate is
        enabled."""
        est = self.args.estimate
        return (regular, cpu, memory, learned) if est.enabled and est.incoming_pod and (cpu or memory) else regular

    def _incoming(
        self, table: NodeTable, cpu: float, memory: float, learned: bool = False
    ) -> dict[str, FloatArray] | None:
        """The pod's estimated usage as a fraction of every row's allocatable (see ``incoming_fraction``).

        The divisors are cached per node-table change; the arithmetic is ``incoming_fraction``'s, in its order."""
        est = self.args.estimate
        if not est.enabled or not est.incoming_pod or not (cpu or memory):
            return None
        cpu_factor, memory_factor = (1.0, 1.0) if learned else (est.cpu_factor, est.memory_factor)
        key = (table.nodes_version, table.n_rows, cpu, memory, cpu_factor, memory_factor)
        if self._incoming_of is not None and self._incoming_of[0] == key:
            return self._incoming_of[1]
        cached = self._incoming_cache
        if cached is None or cached[:2] != (table.nodes_version, table.n_rows):
            alloc = table.alloc
            cores = alloc[:, table.resources[CPU]] / 1000
            mem = alloc[:, table.resources[MEMORY]].astype(np.float64)
            cached = self._incoming_cache = (table.nodes_version, table.n_rows, cores, mem)
        _, _, cores, mem = cached
        with np.errstate(divide="ignore", invalid="ignore"):
            fractions = {
                "cpu": np.where(cores > 0, cpu_factor * cpu / cores, 0.0),
                "memory": np.where(mem > 0, memory_factor * memory / mem, 0.0),
            }
        self._incoming_of = (key, fractions)  # the last pod size's: a burst of one size computes it once
        return fractions

    def explain_node(self, info: NodeInfo, at: float, uid: str = "", priority: int | None = None) -> dict[str, Any]:
        """The load inputs of one node as the policy saw them at ``at`` for the pod ``uid`` (for ``explain``): the
        pod's class (a regular pod sees the usage less the batch pods') and its estimate as Filter judged them."""
        capacity = NodeCapacity(info.allocatable.get(CPU, 0) / 1000, float(info.allocatable.get(MEMORY, 0)))
        recent = self.recent_on(info.name, until=at)
        when = datetime.fromtimestamp(at, UTC)
        regular, cpu, memory, learned = self._judged.get(uid, (True, 0.0, 0.0, False))
        load = node_load(info.name, info.annotations, self.args, when, recent, capacity, regular=regular)
        # Filter also counts the pods nominated here (as bindings made now; see ``nominated.py``), Score does not.
        nominated = self.nominated.counting(info.name, uid, priority)
        with_nominated = [*recent, *(RecentBinding(info.name, at, n.cpu, n.memory) for n in nominated)]
        filtered = (
            node_load(info.name, info.annotations, self.args, when, with_nominated, capacity, regular=regular)
            if nominated
            else load
        )
        row = self.handle.table.rows.get(info.name)
        gone = self.leaving.departed.get(row, {}) if row is not None else {}
        if gone:  # preemption's victims gone from here: their usage is out of Filter's (``leaving.py``)
            out = self.leaving.extra
            readings = {
                m: replace(r, estimate=r.estimate - float(out[m][row]))
                if m in out and (r.state == "fresh" or r.bindings)
                else r
                for m, r in filtered.readings.items()
            }
            filtered = replace(filtered, readings=readings)
        incoming = incoming_fraction(self.args.estimate, cpu, memory, capacity, learned)
        limits = {p.name: p.max_limit_percent for p in self.args.policy.predicate}
        return {
            "metrics": {
                r.metric: {
                    "state": r.state,
                    **_judged_by(r),
                    "annotated": r.annotated,
                    "estimate": round(r.estimate, 5),
                    "usage": r.usage,
                    "batchTakenOut": r.batch,
                    "threshold": limits.get(r.metric),
                    "timestamp": r.timestamp.isoformat() if r.timestamp else None,
                }
                for r in load.readings.values()
            },
            "hotValue": {"annotated": load.annotated_hot, "ownBindings": load.own_hot, "total": load.hot},
            "nominatedPods": len(nominated),
            "preemptionVictimsGone": len(gone),
            "podClass": "regular" if regular else "batch",
            "podEstimate": {"cpu": cpu, "memory": memory, "source": "learned" if learned else "factor x request"},
            "dynamicScore": score(load, self.args, incoming),
            "scoring": _scoring(self.args),
            "filter": filter_reason(filtered, self.args, incoming=incoming) or "passed",
        }

    # -- extension points ---------------------------------------------------------------------------------------

    def _sync(self, now: float, n_rows: int) -> tuple[dict[str, FloatArray], FloatArray, dict[str, Mask]]:
        """Bring freshness and the recent bindings' effects to ``now``; mark the rows whose inputs changed.
        Returns (estimated extra usage per metric, own hot value, judged metrics of new nodes) over the rows."""
        self.columns.evaluate(now)
        self.recent.prune(now - self._horizon(), now)
        extra, own_hot = self.recent.at(now, n_rows)
        judged = self.recent.judged_at(n_rows)
        self.nominated.ensure(max(0, n_rows - 1))  # its columns cover every row the decision reads
        self.leaving.ensure(max(0, n_rows - 1))
        self.leaving.prune(now)
        if self.columns.changed or self.recent.changed or self.nominated.changed or self.leaving.changed:
            self.versions.touch(
                self.columns.changed | self.recent.changed | self.nominated.changed | self.leaving.changed
            )
            self.columns.changed.clear()
            self.recent.changed.clear()
            self.nominated.changed.clear()
            self.leaving.changed.clear()
        if self.columns.batch_ignored != self._batch_ignored:
            self.metrics.batch_ignored.inc(self.columns.batch_ignored - self._batch_ignored)
            self._batch_ignored = self.columns.batch_ignored
            self._log_once.warning("batch-stale", "stale batch-usage annotation: regular pods see the whole usage")
        return extra, own_hot, judged

    def filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> list[fwk.Rejection]:
        found = self._codes_of(state, pod, table)
        if found is None:
            return []
        codes, now = found
        reasons = self._reasons
        rejected = (codes != PASS) & table.live
        if not rejected.any():
            return []
        rejections = []
        counts = np.bincount(codes[rejected], minlength=len(reasons)).tolist()
        # The soonest over them all (what the queue retries at), computed only if the attempt fails: a walk over
        # the refused rows and their bindings that a pod placed elsewhere does not need (``Rejection.lifts_in``).
        later = functools.cache(
            functools.partial(self._retry_after, rejected, now, self.args, self.columns, self.recent)
        )
        for k, count in enumerate(counts):  # the policy's order, as the reference gives them
            if count:
                self.metrics.rejections.labels(_metric_of(reasons[k])).inc(count)
                rejections.append(fwk.Rejection(reasons[k], rejected & (codes == k), retry_after_of=later))
        return rejections

    def refuses(self, pod: PodInfo, table: NodeTable) -> Mask:
        """Filter's verdict alone (rows refused), for preemption's reprieve rounds (``victim_rows``)."""
        found = self._codes_of({}, pod, table)
        if found is None:
            return np.zeros(table.n_rows, dtype=bool)
        refused: Mask = (found[0] != PASS) & table.live
        return refused

    def _codes_of(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> tuple[Codes, float] | None:
        """Filter's code per row (an index into ``_reasons``, or PASS) and the time it was taken for; None for a
        pod Dynamic always passes."""
        self._maybe_reload()
        if is_daemonset_pod(pod.raw.get("metadata")):
            return None
        now = self.wall_clock()
        n = table.n_rows
        extra, own_hot, judged = self._sync(now, n)
        state["Dynamic.inputs"] = (now, extra, own_hot)  # Score uses the same inputs
        state["Dynamic.judged"] = judged
        cpu, memory, learned = self.estimate_of(pod, now)
        state["Dynamic.size"] = (cpu, memory, learned)  # Reserve records the same estimate
        regular = is_regular(pod)
        state["Dynamic.regular"] = regular  # Score judges the same class
        kept = self._judged
        kept[pod.uid] = (regular, cpu, memory, learned)
        if len(kept) > JUDGED_KEPT:
            del kept[next(iter(kept))]
        index = self._reason_index
        nominated = self.nominated
        if nominated.counted:  # Filter's estimate: recent bindings plus every nominated pod not placed yet
            nom = nominated.extra
            extra = {metric: arr + nom[metric][:n] for metric, arr in extra.items()}
            judged = {metric: arr | nominated.judged[metric][:n] for metric, arr in judged.items()}
        if self.leaving.counted:  # ... less what preemption's victims take out (what-if, or gone)
            out = self.leaving.extra
            extra = {metric: arr - out[metric][:n] for metric, arr in extra.items()}

        def compute(rows: fwk.Rows) -> Codes:
            incoming = self._incoming(table, cpu, memory, learned)
            if len(rows) <= ONE_BY_ONE:
                found = [self.columns.reason_of(row, incoming, extra, regular, judged) for row in rows.tolist()]
                return np.array([PASS if r is None else index[r] for r in found], dtype=np.int8)
            codes = np.full(len(rows), PASS, dtype=np.int8)
            for reason, mask in self.columns.filter(rows, now, incoming, extra, regular, judged):
                codes[mask] = index[reason]
            return codes

        codes = self._codes.get(self._size_key(cpu, memory, learned, regular), n, compute)
        if nominated.counted:
            incoming = self._incoming(table, cpu, memory, learned)
            codes = self._without_uncounted(codes, pod, table, extra, incoming, regular, judged)
        return codes, now

    def _retry_after(
        self, mask: Mask, now: float, args: DynamicArgs, columns: LoadColumns, recent: RecentEffects
    ) -> float | None:
        """Seconds until the refused rows' inputs could change with no event (``lift.py``); ``args``, ``columns``
        and ``recent`` as the Filter call saw them (a policy reload replaces them)."""
        rows = np.flatnonzero(mask)
        policy = args.policy
        judged = {p.name for p in policy.predicate if p.max_limit_percent != 0}  # only these refuse a pod
        windows = {
            s.name: metric_freshness_window(s.period).total_seconds() for s in policy.sync_policy if s.name in judged
        }
        stamps = {metric: columns.stamps[metric][rows] for metric in windows}
        oldest = recent.oldest(mask)
        skew = args.max_skew.total_seconds()
        soonest = next_change(stamps, windows, skew, oldest, self._horizon_for(args), now)
        if windows and policy.new_nodes.estimate:  # a binding leaves a new node's estimate at ``bound_at + window``
            left = min(new_node_window(args, metric) for metric in windows)
            soonest = min(soonest, next_change({}, {}, skew, oldest, left, now))
        return retry_after(soonest, now)

    def _without_uncounted(
        self,
        codes: Codes,
        pod: PodInfo,
        table: NodeTable,
        extra: dict[str, FloatArray],
        incoming: dict[str, FloatArray] | None,
        regular: bool,
        judged: dict[str, Mask],
    ) -> Codes:
        """The cached codes count every nominated pod not placed yet; on the rows holding ones that do not count
        for ``pod`` (its own nomination, lower priorities: kube's ``addGENominatedPods``) the verdict is taken
        again without them. Usually no row or one (the pod's own nominated node)."""
        rows = self.nominated.exclusions(pod.uid, pod.priority)
        if not rows:
            return codes
        recent, n = self.recent.extra, table.n_rows
        out = self.leaving.extra if self.leaving.counted else None
        fixed = {metric: arr.copy() for metric, arr in extra.items()}
        fixed_judged = {metric: arr.copy() for metric, arr in judged.items()}
        for row, nominated in rows.items():
            if row >= n:
                continue
            for metric, arr in fixed.items():
                arr[row] = recent[metric][row] + nominated.get(metric, 0.0)
                if out is not None:
                    arr[row] = arr[row] - out[metric][row]
            for metric, judges in self.nominated.judges(row, pod.uid, pod.priority).items():
                fixed_judged[metric][row] = self.recent.judged[metric][row] or judges
        codes = codes.copy()
        for row in rows:
            if row < n:
                reason = self.columns.reason_of(row, incoming, fixed, regular, fixed_judged)
                codes[row] = PASS if reason is None else self._reason_index[reason]
        return codes

    def score(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> IntArray:
        if is_daemonset_pod(pod.raw.get("metadata")):  # exempt from the score as from the filter: no ranking
            return np.zeros(len(rows), dtype=np.int64)
        inputs = state.get("Dynamic.inputs")
        judged = state.get("Dynamic.judged")
        if inputs is None or judged is None:  # Filter disabled in this profile
            now = self.wall_clock()
            extra, own_hot, judged = self._sync(now, table.n_rows)
            inputs = (now, extra, own_hot)
        now, extra, own_hot = inputs
        regular = state.get("Dynamic.regular")
        if regular is None:
            regular = is_regular(pod)

        def compute(changed: fwk.Rows) -> IntArray:
            if len(changed) <= ONE_BY_ONE:
                return np.array(
                    [self.columns.score_of(row, extra, own_hot, regular, None, judged) for row in changed.tolist()],
                    np.int64,
                )
            return self.columns.scores(changed, now, extra, own_hot, regular, None, judged)

        if self.args.policy.scoring.strategy == "pack":
            return self._pack(state, pod, table, rows, now, extra, regular, judged)
        scores = self._scores[regular].get(table.n_rows, compute)
        group = state.get(fwk.GANG)
        if self.gang_hot_value == "together" and group is not None:
            scores = self._without_own_gang(scores, group, now, extra, own_hot, regular, judged)
        return scores[rows]

    def _pack(
        self,
        state: fwk.CycleState,
        pod: PodInfo,
        table: NodeTable,
        rows: fwk.Rows,
        now: float,
        extra: dict[str, FloatArray],
        regular: bool,
        judged: dict[str, Mask],
    ) -> IntArray:
        """The ``pack`` strategy's scores (``dynamic.pack_score``): they count the pod's own estimate, so they are
        cached per pod size, as Filter's codes are. No hot-value term, so ``gangHotValue`` changes nothing here."""
        size = state.get("Dynamic.size")
        cpu, memory, learned = size if size is not None else self.estimate_of(pod, now)
        incoming = self._incoming(table, cpu, memory, learned)

        def compute(changed: fwk.Rows) -> IntArray:
            if len(changed) <= ONE_BY_ONE:
                return np.array(
                    [self.columns.score_of(row, extra, None, regular, incoming, judged) for row in changed.tolist()],
                    np.int64,
                )
            return self.columns.scores(changed, now, extra, None, regular, incoming, judged)

        scores: IntArray = self._pack_scores.get(self._size_key(cpu, memory, learned, regular), table.n_rows, compute)
        return scores[rows]

    def _without_own_gang(
        self,
        scores: IntArray,
        group: str,
        now: float,
        extra: dict[str, FloatArray],
        own_hot: FloatArray,
        regular: bool,
        judged: dict[str, Mask],
    ) -> IntArray:
        """``gangHotValue: together``: the cached scores with the rows holding ``group``'s members scored again
        leaving those members out of the own-bindings hot value (usually a handful of rows)."""
        rows = [row for row in self.recent.rows_of(group) if row < len(scores)]
        if not rows:
            return scores
        own = own_hot.copy()
        for row in rows:
            own[row] = self.recent.own_hot_without(row, group, now)
        scores = scores.copy()
        for row in rows:
            scores[row] = self.columns.score_of(row, extra, own, regular, None, judged)
        return scores

    def reserve(self, state: fwk.CycleState, pod: PodInfo, node: str) -> fwk.Status:
        now = self.wall_clock()
        size = state.get("Dynamic.size")
        cpu, memory, learned = size if size is not None else self.estimate_of(pod, now)
        self.recent.add(pod.uid, self.handle.table.rows[node], node, now, cpu, memory, learned, state.get(fwk.GANG))
        return fwk.SUCCESS

    def unreserve(self, state: fwk.CycleState, pod: PodInfo, node: str) -> None:
        self.recent.remove(pod.uid, self.wall_clock())

    def events_to_register(self) -> fwk.ClusterEvent:
        # POD_DELETE: a preemption victim leaving takes its usage out of its node (``leaving.py``), a recent
        # binding of ours its estimate
        return fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE | fwk.ClusterEvent.POD_DELETE

    def queueing_hints(self) -> fwk.QueueingHints:
        """Node events always queue (annotations change the load); a pod deletion only when it was a victim or one
        of our recent bindings (its estimate left its node: ``_pod_deleted`` ran before the hint)."""
        return {fwk.ClusterEvent.POD_DELETE: self._pod_left_hint}

    def _pod_left_hint(self, pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
        gone = change.old
        if isinstance(gone, PodInfo) and gone.uid in self.recent:
            return fwk.QueueingHint.QUEUE
        return _victim_left(pod, change)


def _judged_by(reading: MetricReading) -> dict[str, str]:
    """explain's note on a new node's metric that recent bindings judge (none otherwise)."""
    if reading.state != "missing" or not reading.bindings:
        return {}
    n = reading.bindings
    return {"judgedBy": f"missing: judged by {n} recent binding{'s' if n > 1 else ''}' estimates (none absorbed)"}


def _scoring(args: DynamicArgs) -> str:
    """The score's strategy as explain shows it."""
    scoring = args.policy.scoring
    if scoring.strategy == "pack":
        return f"pack toward {scoring.target_utilization:g} (the pod's estimate included; no hot-value penalty)"
    return "spread (least used first, minus 10 x hot value)"


def _lower(record: PodRecord | None, priority: int) -> bool:
    return record is not None and record.pod is not None and record.pod.priority < priority


def _victim_left(pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
    gone = change.old
    left = isinstance(gone, PodInfo) and bool(gone.node_name) and preempted(gone.raw)
    return fwk.QueueingHint.QUEUE if left else fwk.QueueingHint.SKIP


def is_regular(pod: PodInfo) -> bool:
    """Not a batch pod: ``crane_shared.batch.is_batch`` read from the pod's requests (two dict lookups per decision
    instead of a walk over its containers). The same for every pod the API server admits: its defaulting copies a
    limit without a request into the request, and an extended resource's request must equal its limit."""
    requests = pod.requests
    return BATCH_CPU not in requests and BATCH_MEMORY not in requests


def _capacity(node: NodeInfo) -> tuple[float, float]:
    """(cores, bytes) allocatable, as ``NodeCapacity`` and the table's columns give them."""
    return node.allocatable.get(CPU, 0) / 1000, float(node.allocatable.get(MEMORY, 0))


def _metric_of(reason: str) -> str:
    # "node(s) had <metric> above <limit>" / "node(s) had no fresh <metric>"
    words = reason.split()
    return words[-3] if "above" in words else words[-1]


def new(args: Mapping[str, Any], handle: fwk.Handle) -> Dynamic:
    return Dynamic(parse_args(args), handle)
