"""Prometheus metrics of the recorder, on a registry passed in (so tests can run several recorders at once)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["RecorderMetrics"]

_PREFIX = "crane_event_recorder_"
# Binding time -> in Redis. Watch delivery is milliseconds; seconds mean Redis was down or the list was old.
_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)


class RecorderMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.events_seen = Counter(
            _PREFIX + "events_seen", "Event objects received from lists and watches", registry=registry
        )
        self.bindings_recorded = Counter(
            _PREFIX + "bindings_recorded", "Bindings newly written to Redis", registry=registry
        )
        self.duplicates = Counter(
            _PREFIX + "duplicates",
            "Bindings already in Redis (re-delivered, updated or re-listed events)",
            registry=registry,
        )
        self.malformed = Counter(
            _PREFIX + "malformed_events",
            "Scheduled events skipped as unusable, by reason",
            ["reason"],
            registry=registry,
        )
        self.untrusted = Counter(
            _PREFIX + "untrusted_events",
            "Scheduled events skipped because their reporting controller is not in --reporting-controllers",
            registry=registry,
        )
        self.expired = Counter(
            _PREFIX + "expired_bindings",
            "Bindings older than the retention when seen (e.g. re-listed): not recorded",
            registry=registry,
        )
        self.redis_errors = Counter(_PREFIX + "redis_errors", "Failed Redis operations", registry=registry)
        self.buffer_depth = Gauge(
            _PREFIX + "buffer_depth", "Bindings waiting to be written to Redis", registry=registry
        )
        self.buffer_dropped = Counter(
            _PREFIX + "buffer_dropped",
            "Oldest buffered bindings dropped because the buffer was full (recovered by a re-list)",
            registry=registry,
        )
        self.watch_restarts = Counter(
            _PREFIX + "watch_restarts",
            "Watches restarted with a re-list, by reason",
            ["reason"],
            registry=registry,
        )
        self.lists = Counter(_PREFIX + "lists", "Complete lists of events recorded", registry=registry)
        self.trimmed = Counter(
            _PREFIX + "trimmed", "Binding records deleted for being older than the retention", registry=registry
        )
        self.lag = Histogram(
            _PREFIX + "record_lag_seconds",
            "Time from binding to its record being in Redis",
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
