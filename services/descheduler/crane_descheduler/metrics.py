"""The descheduler's own metrics, all prefixed ``crane_descheduler_``, in the registry it is given."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from crane_shared.metrics import MetricSet

_ROUND_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
CLASSES = ("hot", "normal", "idle", "unknown")


class DeschedulerMetrics(MetricSet):
    prefix = "crane_descheduler_"

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.evictions = self.counter(
            "evictions_total",
            "Planned evictions by reason (the metric over its threshold, or drain) and result (evicted, dry_run, "
            "pdb: refused with 429 and retried in a later round, gone, lost_lease, error).",
            ["reason", "result"],
        )
        self.skipped = self.counter(
            "skipped_pods_total",
            "Pods of hot nodes passed over, by reason (eligibility, budget, no target).",
            ["reason"],
        )
        self.nodes = self.gauge(
            "nodes", "Nodes per class in the last round (hot: confirmed by the debounce).", ["class"]
        )
        self.unusable_nodes = self.counter(
            "unusable_nodes_total", "Node-rounds skipped because their load data was missing, stale or malformed."
        )
        self.malformed = self.counter("malformed_objects_total", "Objects skipped as unreadable, by kind.", ["kind"])
        self.round_duration = self.histogram(
            "round_duration_seconds",
            "Wall time of a round, Prometheus queries and evictions included.",
            [],
            buckets=_ROUND_BUCKETS,
        )
        self.rounds = self.counter(
            "rounds_total", "Rounds by outcome (planned, no_usage: Prometheus failed).", ["result"]
        )
        self.prometheus_errors = self.counter(
            "prometheus_errors_total", "Failed per-pod usage queries, by kind.", ["metric", "kind"]
        )
        self.usage_dropped = self.counter(
            "usage_values_dropped_total", "Per-pod usage samples refused (unlabelled, non-finite, negative)."
        )
        self.reloads = self.counter("policy_reloads_total", "Policy file reloads by result.", ["result"])
        self.draining = self.gauge(
            "draining_nodes", "Nodes being emptied by spec.drain (every pod on them has a place elsewhere)."
        )
