"""Parsing Event JSON (both APIs, as the API server returns it) into binding records."""

from __future__ import annotations

from typing import Any

import pytest

from crane_event_recorder.parse import Malformed, MalformedReason, parse_event, parse_time
from crane_shared.bindings import BindingRecord

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def new_api(**over: Any) -> dict[str, Any]:
    """An events.k8s.io/v1 Event as kube-scheduler writes it (and as list items come back)."""
    event: dict[str, Any] = {
        "metadata": {"name": "web-0.abc", "namespace": "shop"},
        "eventTime": "2023-11-14T22:13:20.250000Z",
        "reportingController": "default-scheduler",
        "reason": "Scheduled",
        "type": "Normal",
        "note": "Successfully assigned shop/web-0 to node-7",
        "regarding": {"kind": "Pod", "namespace": "shop", "name": "web-0", "uid": "uid-1", "apiVersion": "v1"},
        "deprecatedFirstTimestamp": None,
        "deprecatedLastTimestamp": None,
    }
    event.update(over)
    return event


def core_api(**over: Any) -> dict[str, Any]:
    """A core/v1 Event written by an older recorder: no eventTime, timestamps only."""
    event: dict[str, Any] = {
        "metadata": {"name": "web-0.abc", "namespace": "shop"},
        "eventTime": None,
        "involvedObject": {"kind": "Pod", "namespace": "shop", "name": "web-0", "uid": "uid-1"},
        "reason": "Scheduled",
        "type": "Normal",
        "message": "Successfully assigned shop/web-0 to node-7",
        "firstTimestamp": "2023-11-14T22:13:20Z",
        "lastTimestamp": "2023-11-14T22:13:25Z",
        "source": {"component": "my-scheduler"},
    }
    event.update(over)
    return event


def test_events_v1_binding_uses_regarding_note_and_event_time() -> None:
    assert parse_event(new_api()) == BindingRecord(
        uid="uid-1", namespace="shop", name="web-0", node="node-7", bound_at=T0 + 0.25, scheduler="default-scheduler"
    )


def test_core_v1_binding_uses_involved_object_message_and_last_timestamp() -> None:
    assert parse_event(core_api()) == BindingRecord(
        uid="uid-1", namespace="shop", name="web-0", node="node-7", bound_at=T0 + 5, scheduler="my-scheduler"
    )


def test_time_falls_back_from_event_time_to_series_then_last_then_first() -> None:
    series = {"count": 3, "lastObservedTime": "2023-11-14T22:13:21.000000Z"}
    assert _time(new_api(series=series)) == T0 + 0.25  # eventTime wins
    assert _time(core_api(series=series)) == T0 + 1  # then the series
    assert _time(core_api()) == T0 + 5  # then lastTimestamp
    assert _time(core_api(lastTimestamp=None)) == T0  # then firstTimestamp
    assert _time(new_api(eventTime=None, deprecatedFirstTimestamp="2023-11-14T22:13:20Z")) == T0


def test_events_that_are_not_bindings_are_ignored_not_counted_as_malformed() -> None:
    assert parse_event(new_api(reason="Pulled", note="Pulled image")) is None
    assert parse_event(new_api(type="Warning")) is None
    assert parse_event(new_api(reason="FailedScheduling", note="0/3 nodes are available")) is None


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (new_api(note="assigned somewhere"), MalformedReason.UNPARSEABLE_NOTE),
        (new_api(note=None), MalformedReason.UNPARSEABLE_NOTE),
        (new_api(note="Successfully assigned shop/web-0 to "), MalformedReason.MISSING_NODE),
        (new_api(regarding={"kind": "Pod", "namespace": "shop", "name": "web-0"}), MalformedReason.MISSING_UID),
        (core_api(involvedObject=None), MalformedReason.MISSING_UID),
        (new_api(regarding={"kind": "Node", "name": "web-0", "uid": "u"}), MalformedReason.NOT_A_POD),
        (
            new_api(regarding={"kind": "Pod", "namespace": "shop", "name": "db-0", "uid": "u"}),
            MalformedReason.NOTE_MISMATCH,
        ),
        (new_api(eventTime=None), MalformedReason.MISSING_TIME),
        (new_api(eventTime="yesterday"), MalformedReason.BAD_TIME),
        (new_api(eventTime="2023-11-14T22:13:20"), MalformedReason.BAD_TIME),  # no zone: ambiguous
    ],
)
def test_malformed_scheduled_events_name_their_reason(event: dict[str, Any], reason: str) -> None:
    result = parse_event(event)
    assert isinstance(result, Malformed)
    assert result.reason == reason


def test_bindings_stamped_far_ahead_of_now_are_refused() -> None:
    assert isinstance(parse_event(new_api(), now=T0 - 60), BindingRecord)  # a little skew is normal
    result = parse_event(new_api(), now=T0 - 3600)
    assert isinstance(result, Malformed) and result.reason == MalformedReason.FUTURE_TIME


def test_regarding_without_namespace_takes_it_from_the_note() -> None:
    result = parse_event(new_api(regarding={"uid": "uid-9", "name": "web-0"}))
    assert isinstance(result, BindingRecord)
    assert (result.namespace, result.name, result.uid) == ("shop", "web-0", "uid-9")


def test_parse_time_reads_offsets_and_rejects_non_strings() -> None:
    assert parse_time("2023-11-14T23:13:20+01:00") == T0
    assert parse_time(T0) is None
    assert parse_time("") is None


def _time(event: dict[str, Any]) -> float:
    result = parse_event(event)
    assert isinstance(result, BindingRecord), result
    return result.bound_at
