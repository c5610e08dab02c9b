"""Reading watch lines: a 410 in the stream must surface as Gone, never as an event or a generic failure."""

from __future__ import annotations

import json

import pytest

from crane_event_recorder.source import Gone, WatchBroken, parse_watch_line


def test_an_added_event_carries_its_resource_version() -> None:
    line = json.dumps({"type": "ADDED", "object": {"metadata": {"resourceVersion": "42"}, "reason": "x"}})
    event = parse_watch_line(line.encode())
    assert (event.type, event.resource_version, event.object["reason"]) == ("ADDED", "42", "x")


def test_a_410_status_in_the_stream_is_gone() -> None:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
    with pytest.raises(Gone, match="too old"):
        parse_watch_line(json.dumps({"type": "ERROR", "object": status}).encode())


@pytest.mark.parametrize(
    "line",
    [
        b'{"type":"ERROR","object":{"code":500,"message":"etcd down"}}',
        b"not json",
        b'{"type":"ADDED"}',
        b"[1, 2]",
    ],
)
def test_other_errors_and_garbage_break_the_watch(line: bytes) -> None:
    with pytest.raises(WatchBroken):
        parse_watch_line(line)
