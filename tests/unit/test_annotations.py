import math
import re
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crane_shared.annotations import (
    HOT_VALUE_FRESHNESS,
    HOT_VALUE_KEY,
    AnnotationError,
    AnnotationKeyError,
    Freshness,
    TimestampStyle,
    annotation_key,
    decode,
    encode_hot_value,
    encode_usage,
    freshness,
    is_valid_annotation_key,
    metric_freshness_window,
)
from crane_shared.policy import default_policy

SHANGHAI = ZoneInfo("Asia/Shanghai")
AT = datetime(2023, 10, 17, 15, 4, 32, 987654, tzinfo=UTC)
QUALIFIED_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)


def test_usage_is_written_with_five_decimals_and_utc_offset():
    assert encode_usage(0.630119, AT) == "0.63012,2023-10-17T15:04:32+00:00"


def test_timestamps_are_converted_to_utc():
    at = datetime(2023, 10, 17, 23, 4, 32, tzinfo=SHANGHAI)
    assert encode_usage(0.5, at) == "0.50000,2023-10-17T15:04:32+00:00"


def test_legacy_style_writes_upstream_wall_clock_with_literal_z():
    text = encode_usage(0.630119, AT, style=TimestampStyle.LEGACY, legacy_zone=SHANGHAI)
    assert text == "0.63012,2023-10-17T23:04:32Z"


def test_hot_value_is_an_integer():
    assert encode_hot_value(3, AT) == "3,2023-10-17T15:04:32+00:00"


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf])
def test_encode_refuses_values_readers_would_reject(bad):
    with pytest.raises(ValueError, match="finite, non-negative"):
        encode_usage(bad, AT)


def test_encode_refuses_naive_time():
    with pytest.raises(ValueError, match="naive"):
        encode_usage(0.5, datetime(2023, 10, 17, 15, 4, 32))


@pytest.mark.parametrize(
    ("text", "value", "timestamp"),
    [
        ("0.63012,2023-10-17T15:04:32+00:00", 0.63012, datetime(2023, 10, 17, 15, 4, 32, tzinfo=UTC)),
        ("0.5,2023-10-17T23:04:32+08:00", 0.5, datetime(2023, 10, 17, 15, 4, 32, tzinfo=UTC)),
        ("0.5,2023-10-17T10:04:32-05:00", 0.5, datetime(2023, 10, 17, 15, 4, 32, tzinfo=UTC)),
        ("0.5,2023-10-17T15:04:32.5Z", 0.5, datetime(2023, 10, 17, 15, 4, 32, 500000, tzinfo=UTC)),
        ("1,2023-10-17T15:04:32.123456789Z", 1.0, datetime(2023, 10, 17, 15, 4, 32, 123456, tzinfo=UTC)),
        ("0.5,2023-10-17T23:04:32.25+08:00", 0.5, datetime(2023, 10, 17, 15, 4, 32, 250000, tzinfo=UTC)),
        # upstream's legacy bare Z: Asia/Shanghai wall clock by default
        ("0.63012,2023-10-17T23:04:32Z", 0.63012, datetime(2023, 10, 17, 15, 4, 32, tzinfo=UTC)),
        ("3,2023-10-17T23:04:32Z", 3.0, datetime(2023, 10, 17, 15, 4, 32, tzinfo=UTC)),
        ("-0,2023-10-17T15:04:32+00:00", 0.0, datetime(2023, 10, 17, 15, 4, 32, tzinfo=UTC)),
        ("1.2e-1,2023-10-17T15:04:32+00:00", 0.12, datetime(2023, 10, 17, 15, 4, 32, tzinfo=UTC)),
    ],
)
def test_decodes_rfc3339_and_legacy_timestamps_to_utc(text, value, timestamp):
    sample = decode(text)
    assert sample.value == value
    assert sample.timestamp == timestamp
    assert sample.timestamp.utcoffset() == timedelta(0)


def test_legacy_zone_is_configurable_for_writers_emitting_real_utc_z():
    sample = decode("0.5,2023-10-17T15:04:32Z", legacy_zone=ZoneInfo("UTC"))
    assert sample.timestamp == datetime(2023, 10, 17, 15, 4, 32, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "format"),
        ("0.5", "format"),
        ("0.5,2023-10-17T15:04:32Z,extra", "format"),
        ("0.5;2023-10-17T15:04:32Z", "format"),
        ("abc,2023-10-17T15:04:32Z", "value"),
        (",2023-10-17T15:04:32Z", "value"),
        (" 0.5,2023-10-17T15:04:32Z", "value"),
        ("0x1p-1,2023-10-17T15:04:32Z", "value"),
        ("1_0,2023-10-17T15:04:32Z", "value"),
        ("NaN,2023-10-17T15:04:32Z", "non-finite"),
        ("+Inf,2023-10-17T15:04:32Z", "non-finite"),
        ("1e999,2023-10-17T15:04:32Z", "non-finite"),
        ("-0.1,2023-10-17T15:04:32Z", "negative"),
        ("0.5,", "timestamp"),
        ("0.5,1697555072", "timestamp"),
        ("0.5,2023-10-17 15:04:32Z", "timestamp"),
        ("0.5,2023-10-17T15:04:32", "timestamp"),
        ("0.5,2023-13-17T15:04:32Z", "timestamp"),
        ("0.5,2023-10-17T15:04:60Z", "timestamp"),
        ("0.5,2023-10-17T15:04:32+24:00", "timestamp"),
        ("0.5,2023-10-17T15:04:32.1234567890Z", "timestamp"),
        ("0.5,0001-01-01T00:00:00+01:00", "timestamp"),
    ],
)
def test_decode_rejects_with_machine_reason_and_quotes_input(text, reason):
    with pytest.raises(AnnotationError) as caught:
        decode(text)
    assert caught.value.reason == reason
    assert repr(text) in str(caught.value)


def test_error_message_of_huge_input_is_bounded():
    with pytest.raises(AnnotationError) as caught:
        decode("x" * 100_000)
    assert len(str(caught.value)) < 300


NOW = datetime(2023, 10, 17, 15, 0, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=8)


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        (NOW, Freshness.FRESH),
        (NOW - WINDOW + timedelta(microseconds=1), Freshness.FRESH),
        (NOW - WINDOW, Freshness.STALE),  # strict, as upstream
        (NOW - timedelta(days=1), Freshness.STALE),
        (NOW + timedelta(seconds=30), Freshness.FRESH),  # within clock skew
        (NOW + timedelta(seconds=31), Freshness.FUTURE),
        (NOW + timedelta(days=365), Freshness.FUTURE),
    ],
)
def test_freshness(ts, expected):
    assert freshness(ts, NOW, WINDOW) == expected


def test_future_tolerance_is_configurable():
    assert freshness(NOW + timedelta(minutes=2), NOW, WINDOW, max_skew=timedelta(minutes=5)) == Freshness.FRESH


def test_freshness_windows_match_upstream():
    assert metric_freshness_window(timedelta(minutes=3)) == timedelta(minutes=8)
    assert timedelta(minutes=5) == HOT_VALUE_FRESHNESS


def test_upstream_metric_names_are_their_own_keys():
    for name in (*default_policy().metrics(), HOT_VALUE_KEY):
        assert annotation_key(name) == name


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("instance:cpu_usage:avg5m", "instance_cpu_usage_avg5m"),
        ("node:mem_usage_active:max_avg_1h", "node_mem_usage_active_max_avg_1h"),
        (":cpu_usage:", "cpu_usage"),
        ("_private", "private"),
        ("crane.io/cpu_usage_avg_5m", "crane.io/cpu_usage_avg_5m"),
        ("Crane.io/cpu", "Crane.io_cpu"),
        ("a/b/c", "a_b_c"),
        ("cpü", "cp"),
    ],
)
def test_invalid_key_characters_become_underscores(name, key):
    assert annotation_key(name) == key
    assert is_valid_annotation_key(key)


@pytest.mark.parametrize("name", ["", ":::", "x" * 64, "a:" + "b" * 62])
def test_names_that_cannot_become_keys_are_refused(name):
    with pytest.raises(AnnotationKeyError):
        annotation_key(name)


@given(st.text())
def test_annotation_key_is_always_a_valid_qualified_name(name):
    try:
        key = annotation_key(name)
    except AnnotationKeyError:
        return
    assert QUALIFIED_NAME.fullmatch(key)
    assert len(key.rsplit("/", 1)[-1]) <= 63


@given(st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", fullmatch=True))
def test_valid_keys_pass_unchanged(name):
    assert annotation_key(name) == name


aware_datetimes = st.datetimes(min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31), timezones=st.timezones())
usages = st.floats(min_value=0, allow_nan=False, allow_infinity=False)


@given(usages, aware_datetimes)
def test_encode_decode_round_trips_to_5_decimals_and_the_second(value, at):
    sample = decode(encode_usage(value, at))
    assert sample.value == float(f"{value:.5f}")
    assert abs(sample.value - value) <= 5e-6 * max(1.0, value)
    assert sample.timestamp == at.astimezone(UTC).replace(microsecond=0)


@given(st.integers(min_value=0, max_value=10**6), aware_datetimes)
def test_hot_value_round_trips(value, at):
    sample = decode(encode_hot_value(value, at))
    assert sample.value == value
    assert sample.timestamp == at.astimezone(UTC).replace(microsecond=0)


@given(usages, st.datetimes(min_value=datetime(1992, 1, 1), max_value=datetime(9998, 1, 1), timezones=st.just(UTC)))
def test_legacy_round_trips_in_the_same_zone(value, at):
    text = encode_usage(value, at, style=TimestampStyle.LEGACY, legacy_zone=SHANGHAI)
    assert decode(text, legacy_zone=SHANGHAI).timestamp == at.replace(microsecond=0)


@given(
    st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(9998, 1, 1)),
    st.sampled_from(["UTC", "Asia/Shanghai", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]),
)
def test_legacy_reading_in_two_zones_differs_by_their_offsets(local, zone_name):
    zone = ZoneInfo(zone_name)
    text = f"0.5,{local.replace(microsecond=0).isoformat()}Z"
    in_shanghai = decode(text, legacy_zone=SHANGHAI).timestamp
    in_zone = decode(text, legacy_zone=zone).timestamp
    offset_shanghai = local.replace(tzinfo=SHANGHAI).utcoffset()
    offset_zone = local.replace(tzinfo=zone).utcoffset()
    assert offset_shanghai is not None and offset_zone is not None
    assert in_zone - in_shanghai == offset_shanghai - offset_zone


annotation_like = st.from_regex(
    r"[-+0-9.eEnaifNIF_ x]{0,12},[0-9]{0,5}-?[0-9]{0,3}-?[0-9]{0,3}[Tt ]?[0-9:]{0,9}(\.[0-9]{0,12})?[Zz+-]?[0-9:]{0,6}",
    fullmatch=True,
)


@given(st.one_of(st.text(), annotation_like))
def test_decode_raises_only_annotation_error(text):
    try:
        sample = decode(text)
    except AnnotationError as err:
        assert err.reason in {"format", "value", "non-finite", "negative", "timestamp"}
    else:
        assert math.isfinite(sample.value) and sample.value >= 0
        assert sample.timestamp.tzinfo is not None


def test_offset_minus_zero_is_utc():
    assert decode("0.5,2023-10-17T15:04:32-00:00").timestamp == datetime(2023, 10, 17, 15, 4, 32, tzinfo=UTC)
