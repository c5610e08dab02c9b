from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crane_shared.durations import DurationError, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("300ms", timedelta(milliseconds=300)),
        ("30s", timedelta(seconds=30)),
        ("3m", timedelta(minutes=3)),
        ("1h30m", timedelta(minutes=90)),
        ("1.5h", timedelta(minutes=90)),
        ("3h", timedelta(hours=3)),
        ("1h0m0s", timedelta(hours=1)),
        (".5s", timedelta(milliseconds=500)),
        ("0", timedelta(0)),
        ("2us", timedelta(microseconds=2)),
        ("2µs", timedelta(microseconds=2)),
        ("1000ns", timedelta(microseconds=1)),
        ("+5m", timedelta(minutes=5)),
    ],
)
def test_parses_go_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-", "negative durations are not allowed"),
        ("-3m", "negative durations are not allowed"),
        ("1d", 'Go durations have no "d" unit'),
        ("30", "missing unit"),
        ("", "empty"),
        ("3x", "unknown unit 'x'"),
        ("1ns", "finer than a microsecond"),
        ("h", "expected a number"),
        ("1.5.5s", "missing unit"),
        ("3 m", "unknown unit ' m'"),
    ],
)
def test_rejects_invalid_durations_saying_why(text, message):
    with pytest.raises(DurationError, match=message) as caught:
        parse_duration(text)
    assert repr(text) in str(caught.value)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(minutes=3), "3m"),
        (timedelta(minutes=90), "1h30m"),
        (timedelta(hours=3), "3h"),
        (timedelta(hours=1, seconds=1), "1h1s"),
        (timedelta(seconds=1.5), "1.5s"),
        (timedelta(milliseconds=300), "300ms"),
        (timedelta(microseconds=1500), "1.5ms"),
        (timedelta(microseconds=7), "7us"),
        (timedelta(0), "0s"),
        (timedelta(days=1), "24h"),
        (-timedelta(minutes=3), "-3m"),
    ],
)
def test_formats_shortest_go_duration(value, text):
    assert format_duration(value) == text


@given(st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=100_000)))
def test_format_then_parse_is_identity(value):
    assert parse_duration(format_duration(value)) == value
