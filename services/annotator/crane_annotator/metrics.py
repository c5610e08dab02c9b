"""The annotator's own metrics, all prefixed ``crane_annotator_``, in a registry per instance.

A registry per instance (not prometheus-client's global one) lets tests run several annotators in one process.
Annotation age and staleness are computed at scrape time from the node cache and the last successful query, so
they grow while Prometheus is down even though no round completes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from crane_annotator.nodes import NodeInfo
from crane_shared.annotations import HOT_VALUE_KEY
from crane_shared.batch import BATCH_CPU_USAGE_KEY, BATCH_MEMORY_USAGE_KEY
from crane_shared.metrics import MetricSet

P = "crane_annotator_"
_ROUND_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class AnnotatorMetrics(MetricSet):
    prefix = P

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.round_duration = self.histogram(
            "round_duration_seconds",
            "Wall time of a metric round, per sync period it served.",
            ["period"],
            buckets=_ROUND_BUCKETS,
        )
        self.round_queries = self.gauge(
            "round_queries", "PromQL requests (retries included) of the last round, per sync period.", ["period"]
        )
        self.round_patches = self.gauge(
            "round_patches", "Node patches sent by the last round, per sync period.", ["period"]
        )
        self.queries = self.counter("queries_total", "PromQL requests sent, retries included.", ["metric"])
        self.patches = self.counter(
            "patches_total", "Node patches sent, by cause (metrics, hot_value) and outcome.", ["cause", "outcome"]
        )
        self.nodes_matched = self.gauge(
            "nodes_matched", "Nodes that got a series in the last query of a metric.", ["metric"]
        )
        self.nodes_unmatched = self.gauge(
            "nodes_unmatched", "Nodes without a series in the last query of a metric.", ["metric"]
        )
        self.series_unmatched = self.gauge(
            "series_unmatched", "Series of the last query of a metric that matched no node.", ["metric"]
        )
        self.values_dropped = self.counter(
            "values_dropped_total",
            "Values refused (non-finite, negative, unparseable), not written.",
            ["metric", "reason"],
        )
        self.prometheus_errors = self.counter(
            "prometheus_errors_total", "Failed PromQL requests, by kind.", ["metric", "kind"]
        )
        self.partial_responses = self.counter(
            "prometheus_partial_responses_total",
            "Answers flagged partial (VictoriaMetrics isPartial, a store warning), by handling (rejected: no node "
            "updated; accepted: the nodes present updated).",
            ["metric", "handling"],
        )
        self.query_warnings = self.counter(
            "prometheus_warnings_total", "Warnings and infos in Prometheus answers, by kind.", ["metric", "kind"]
        )
        self.nodes_with_several_series = self.gauge(
            "nodes_with_several_series",
            "Nodes matched by more than one series in the last query of a metric (one is chosen deterministically).",
            ["metric"],
        )
        self.prometheus_up = self.gauge("prometheus_up", "1 when the last query of the last round succeeded, else 0.")
        self.last_success = self.gauge(
            "metric_last_success_timestamp_seconds", "When a metric was last queried successfully.", ["metric"]
        )
        self.hot_refreshes = self.counter(
            "hot_value_refreshes_total",
            "Hot-value computations from Redis, by trigger and outcome.",
            ["trigger", "outcome"],
        )
        self.hot_refresh_duration = self.histogram(
            "hot_value_refresh_duration_seconds", "Time to count bindings in Redis for a refresh.", ["trigger"]
        )
        self.hot_last_success = self.gauge(
            "hot_value_last_success_timestamp_seconds", "When hot values were last computed for all nodes."
        )
        self.bindings_seen = self.counter("binding_notifications_total", "New bindings announced on the Redis stream.")
        self.node_watch_restarts = self.counter(
            "node_watch_restarts_total",
            "Node list/watch restarts, by reason (gone: re-listed; error, stalled: retried with backoff).",
            ["reason"],
        )
        self.is_leader = self.gauge("is_leader", "1 while this instance holds the lease and writes.")
        self.load_taint_changes = self.counter(
            "load_taint_changes_total",
            "crane.io/load-hot taint writes, by change (set, lifted), reason (hot, cooled, stale, opted-out, disabled, "
            "floor, unwatched: the node left the annotator's view) and outcome (ok, conflict: the node changed "
            "meanwhile, retried; missing; error).",
            ["change", "reason", "outcome"],
        )
        self.load_tainted_nodes = self.gauge(
            "load_tainted_nodes", "Nodes carrying the crane.io/load-hot taint after the last evaluation (leader)."
        )
        self.load_taint_held = self.gauge(
            "load_taint_held_nodes", "Nodes confirmed hot but left untainted by spec.loadTaint.minUntaintedNodes."
        )
        self.reclaim_nodes = self.gauge(
            "reclaim_nodes",
            "Nodes by the outcome of the last reclaimable-capacity computation (ok, stale: inputs older than "
            "degradeAfter, off / bad-override: the node's crane.io/batch-reclaim, unmeasured: no input yet this "
            "term, no-capacity: node status without cpu or memory).",
            ["why"],
        )
        self.policy_reloads = self.counter(
            "policy_reloads_total",
            "Changed policy files read for spec.reclaim, by result (applied; invalid: refused, the previous policy "
            "kept: a problem in the file, reclaim removed or naming metrics not synced, which need a restart).",
            ["result"],
        )
        self.pods_skipped = self.counter("pods_skipped_total", "Pods the pod informer could not read (skipped).")
        self.pod_watch_restarts = self.counter(
            "pod_watch_restarts_total", "Pod list/watch restarts (spec.reclaim only), by reason.", ["reason"]
        )


class AgeCollector(Collector):
    """``annotation_age_seconds{key}`` (oldest over nodes), ``nodes_missing_annotation{key}``, and
    ``metric_staleness_seconds{metric}`` (time since the last successful query) and ``node_hot_value{node}``,
    computed at scrape time."""

    def __init__(
        self,
        nodes: Callable[[], Mapping[str, NodeInfo]],
        keys: Iterable[str],
        last_success: Callable[[], Mapping[str, float]],
        started: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nodes = nodes
        self._keys = tuple(keys)
        self._last_success = last_success
        self._started = started
        self._clock = clock

    def collect(self) -> Iterable[Metric]:
        now = self._clock()
        age = GaugeMetricFamily(
            P + "annotation_age_seconds", "Age of the oldest annotation of this key over all nodes.", labels=["key"]
        )
        missing = GaugeMetricFamily(
            P + "nodes_missing_annotation", "Nodes without a readable annotation of this key.", labels=["key"]
        )
        nodes = list(self._nodes().values())
        for key in self._keys:
            stamps = [info.stamps[key] for info in nodes if key in info.stamps]
            if stamps:
                age.add_metric([key], max(0.0, now - min(stamps)))
            missing.add_metric([key], len(nodes) - len(stamps))
        staleness = GaugeMetricFamily(
            P + "metric_staleness_seconds",
            "Seconds since the metric was last queried successfully (since start when never).",
            labels=["metric"],
        )
        for metric, at in self._last_success().items():
            staleness.add_metric([metric], max(0.0, now - (at or self._started)))
        # The hot value of each node as written (the usage annotations are Prometheus's own recording rules):
        # what dashboards show next to the node's load; one series per node, as kube-state-metrics does.
        hot = GaugeMetricFamily(P + "node_hot_value", "The node_hot_value annotation of each node.", labels=["node"])
        for info in nodes:
            if HOT_VALUE_KEY in info.values:
                hot.add_metric([info.addresses.name], info.values[HOT_VALUE_KEY])
        # Batch capacity (spec.reclaim) as published in node status and the batch pods' usage as annotated, in
        # cores and bytes: the dashboards' "reclaimed" and "used by batch" next to real usage and requests.
        allocatable = GaugeMetricFamily(
            P + "node_batch_allocatable",
            "crane.io/batch-cpu (cores) and crane.io/batch-memory (bytes) in each node's status.allocatable.",
            labels=["node", "resource"],
        )
        batch_used = GaugeMetricFamily(
            P + "node_batch_usage",
            "The batch pods' measured usage on each node (cores, bytes), from its batch usage annotations.",
            labels=["node", "resource"],
        )
        for info in nodes:
            name = info.addresses.name
            if info.batch is not None:
                allocatable.add_metric([name, "cpu"], info.batch[0] / 1000)
                allocatable.add_metric([name, "memory"], info.batch[1])
            if info.capacity is not None:
                for resource, key, total in (
                    ("cpu", BATCH_CPU_USAGE_KEY, info.capacity.cpu),
                    ("memory", BATCH_MEMORY_USAGE_KEY, info.capacity.memory),
                ):
                    if key in info.values:
                        batch_used.add_metric([name, resource], info.values[key] * total)
        return [age, missing, staleness, hot, allocatable, batch_used]
