"""Prometheus metrics, named as kube-scheduler's where one exists, so existing dashboards keep working.

One ``SchedulerMetrics`` per scheduler, in the registry it is given (the process registry in production, a fresh
one in tests): nothing is registered at import time. Plugins register theirs through the framework ``Handle``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from crane_shared.metrics import Counter, Gauge, Histogram

_ATTEMPT_BUCKETS = tuple(0.001 * 2**i for i in range(15))  # 1 ms .. 16 s, as kube-scheduler
_POINT_BUCKETS = tuple(0.0001 * 2**i for i in range(12))  # 0.1 ms .. 0.2 s
_DECISION_BUCKETS = tuple(0.00002 * 1.25**i for i in range(40))  # 20 µs .. ~150 ms, fine enough for percentiles


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.child: Callable[..., Any] = functools.cache(lambda metric, *values: metric.labels(*values))
        """``child(metric, *label_values)``: ``metric.labels(*label_values)``, looked up once: the per-pod paths
        call it several times a pod, and ``labels`` (validation, a lock, a tuple) costs more than the update."""
        self.schedule_attempts = Counter(
            "scheduler_schedule_attempts_total",
            "Number of attempts to schedule pods, by the result: scheduled, unschedulable, error.",
            ["result", "profile"],
            registry=r,
        )
        self.attempt_duration = Histogram(
            "scheduler_scheduling_attempt_duration_seconds",
            "Scheduling attempt latency in seconds (scheduling algorithm + binding).",
            ["result", "profile"],
            buckets=_ATTEMPT_BUCKETS,
            registry=r,
        )
        self.extension_point_duration = Histogram(
            "scheduler_framework_extension_point_duration_seconds",
            "Latency for running all plugins of a specific extension point.",
            ["extension_point", "status", "profile"],
            buckets=_POINT_BUCKETS,
            registry=r,
        )
        self.pending_pods = Gauge(
            "scheduler_pending_pods",
            "Number of pending pods, by the queue type: active, backoff, unschedulable, gated.",
            ["queue"],
            registry=r,
        )
        self.cache_size = Gauge(
            "scheduler_scheduler_cache_size",
            "Number of nodes, pods, and assumed pods in the cache.",
            ["type"],
            registry=r,
        )
        self.bind_duration = Histogram(
            "crane_scheduler_bind_duration_seconds",
            "Latency of the binding cycle (Permit, PreBind, Bind) by result: bound, conflict, error.",
            ["result"],
            buckets=_ATTEMPT_BUCKETS,
            registry=r,
        )
        self.binds_in_flight = Gauge("crane_scheduler_binds_in_flight", "Binding cycles running now.", registry=r)
        self.binds_dropped = Counter(
            "crane_scheduler_binds_dropped",
            "Binding cycles dropped before their bind because the lease was lost.",
            registry=r,
        )
        self.writer_restarts = Counter(
            "crane_scheduler_api_writer_restarts",
            "Times the API writer process (binds, events) exited unexpectedly and was restarted.",
            registry=r,
        )
        self.decider_results = Counter(
            "crane_scheduler_decider_results",
            "Decisions made by decider workers, by what the scheduling process did with the node: taken (its row "
            "unchanged since), checked (filtered alone, fits), refused (no longer fits: decided again), none (no "
            "node fit on the worker: decided again), lost (the worker died: decided again).",
            ["result"],
            registry=r,
        )
        self.decider_restarts = Counter(
            "crane_scheduler_decider_restarts",
            "Times a decider worker process exited unexpectedly and was restarted.",
            registry=r,
        )
        self.decider_workers = Gauge(
            "crane_scheduler_decider_workers_ready", "Decider worker processes answering now.", registry=r
        )
        self.reports = Counter(
            "crane_scheduler_api_writes_total",
            "Events and pod status patches the scheduler wrote, by kind and result.",
            ["kind", "result"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "crane_scheduler_watch_restarts_total",
            "Watches re-opened, by resource and cause.",
            ["resource", "cause"],
            registry=r,
        )
        self.queue_incoming = Counter(
            "scheduler_queue_incoming_pods_total",
            "Unschedulable pods a cluster event moved to the active or backoff queue, by event and queue.",
            ["event", "queue"],
            registry=r,
        )
        self.queue_hint_skips = Counter(
            "crane_scheduler_queue_hint_skips_total",
            "Pairs of an unschedulable pod and a cluster change that a plugin's queueing hint found irrelevant.",
            ["plugin"],
            registry=r,
        )
        self.queue_hint_errors = Counter(
            "crane_scheduler_queue_hint_errors_total",
            "Queueing hints that raised (the pod was requeued, as kube does).",
            ["plugin"],
            registry=r,
        )
        self.algorithm_duration = Histogram(
            "scheduler_scheduling_algorithm_duration_seconds",
            "Decision latency: PreFilter to node selection for one pod, without binding.",
            ["profile"],
            buckets=_DECISION_BUCKETS,
            registry=r,
        )
        # The decision's own cost, apart from the machine: a decision the OS preempted (another process ran on the
        # core meanwhile) takes longer in wall time than it used in CPU time.
        self.algorithm_cpu = Histogram(
            "crane_scheduler_scheduling_algorithm_cpu_seconds",
            "CPU time of the decision thread during one decision (the wall-clock latency minus time it waited).",
            ["profile"],
            buckets=_DECISION_BUCKETS,
            registry=r,
        )
        self.algorithm_preempted = Counter(
            "crane_scheduler_scheduling_algorithm_preempted",
            "Decisions during which the OS preempted the decision thread (involuntary context switches).",
            ["profile"],
            registry=r,
        )
