"""Prometheus metrics of the recorder, on a registry passed in (so tests can run several recorders at once)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from crane_shared.metrics import MetricSet

__all__ = ["RecorderMetrics"]

# Binding time -> in Redis. Watch delivery is milliseconds; seconds mean Redis was down or the list was old.
_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)


class RecorderMetrics(MetricSet):
    prefix = "crane_event_recorder_"

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.events_seen = self.counter("events_seen", "Event objects received from lists and watches")
        self.bindings_recorded = self.counter("bindings_recorded", "Bindings newly written to Redis")
        self.duplicates = self.counter(
            "duplicates", "Bindings already in Redis (re-delivered, updated or re-listed events)"
        )
        self.malformed = self.counter("malformed_events", "Scheduled events skipped as unusable, by reason", ["reason"])
        self.expired = self.counter(
            "expired_bindings", "Bindings older than the retention when seen (e.g. re-listed): not recorded"
        )
        self.redis_errors = self.counter("redis_errors", "Failed Redis operations")
        self.buffer_depth = self.gauge("buffer_depth", "Bindings waiting to be written to Redis")
        self.buffer_dropped = self.counter(
            "buffer_dropped", "Oldest buffered bindings dropped because the buffer was full (recovered by a re-list)"
        )
        self.watch_restarts = self.counter(
            "watch_restarts",
            "List/watch restarts, by reason: gone (re-list), error, stalled, or why a re-list was asked for",
            ["reason"],
        )
        self.untrusted = self.counter(
            "untrusted_events",
            "Scheduled events skipped because their reporting controller is not in --reporting-controllers",
        )
        self.lists = self.counter("lists", "Complete lists of events recorded")
        self.trimmed = self.counter("trimmed", "Binding records deleted for being older than the retention")
        self.lag = self.histogram(
            "record_lag_seconds", "Time from binding to its record being in Redis", buckets=_LAG_BUCKETS
        )
