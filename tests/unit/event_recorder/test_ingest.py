"""From event to buffered record: what is queued, what is skipped and counted."""

from __future__ import annotations

import time

from crane_event_recorder.buffer import RecordBuffer
from crane_event_recorder.ingest import Ingest
from crane_shared.events import micro_time
from tests.support.event_recorder import Metrics, scheduled


def test_bindings_older_than_the_retention_are_not_recorded_again(metrics: Metrics) -> None:
    buffer = RecordBuffer(10)
    ingest = Ingest(buffer, metrics, retention=600)
    old, recent, other = scheduled(1), scheduled(2), scheduled(3)
    old["eventTime"] = micro_time(time.time() - 3000)  # a re-listed event from 50 minutes ago
    other["reason"] = "Pulled"
    for event in (old, recent, other):
        ingest.accept(event)
    assert [r.uid for r in buffer.take(10)] == ["u2"]
    assert metrics.value("events_seen_total") == 3
    assert metrics.value("expired_bindings_total") == 1


def test_a_full_buffer_counts_what_it_drops(metrics: Metrics) -> None:
    buffer = RecordBuffer(2)
    ingest = Ingest(buffer, metrics)
    for i in range(5):
        ingest.accept(scheduled(i))
    assert metrics.value("buffer_dropped_total") == 3
    assert [r.uid for r in buffer.take(10)] == ["u3", "u4"]


def test_only_configured_reporting_controllers_are_believed(metrics: Metrics) -> None:
    buffer = RecordBuffer(10)
    ingest = Ingest(buffer, metrics)  # default: default-scheduler and crane-scheduler
    ours, kube, forged, legacy, legacy_forged = (scheduled(i) for i in range(5))
    kube["reportingController"] = "default-scheduler"
    forged["reportingController"] = "evil-controller"
    for legacy_event, component in ((legacy, "default-scheduler"), (legacy_forged, "kubectl")):
        del legacy_event["reportingController"]
        legacy_event["source"] = {"component": component}  # core/v1 events name the reporter here
    for event in (ours, kube, forged, legacy, legacy_forged):
        ingest.accept(event)
    assert [r.uid for r in buffer.take(10)] == ["u0", "u1", "u3"]
    assert metrics.value("untrusted_events_total") == 2


def test_the_reporting_controllers_are_configurable(metrics: Metrics) -> None:
    buffer = RecordBuffer(10)
    ingest = Ingest(buffer, metrics, reporting_controllers=("my-scheduler",))
    mine, default = scheduled(1), scheduled(2)
    mine["reportingController"] = "my-scheduler"
    default["reportingController"] = "default-scheduler"
    ingest.accept(mine)
    ingest.accept(default)
    assert [r.uid for r in buffer.take(10)] == ["u1"]
    assert metrics.value("untrusted_events_total") == 1
