"""Percent -> fraction conversion, refused values, and the merge patch a node receives."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from crane_annotator.matching import Match, MatchKind
from crane_annotator.patches import Stamp, hot_value_annotation, merge_patch, metric_annotations
from crane_annotator.values import convert, percent_to_fraction
from crane_shared.annotations import TimestampStyle, decode, encode_usage

AT = datetime(2023, 10, 17, 7, 4, 32, 900_000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("63.012", 0.63012), ("0", 0.0), ("-0", 0.0), ("100", 1.0), ("1e2", 1.0), ("120.5", 1.205)],
)
def test_percent_becomes_fraction(raw: str, expected: float) -> None:
    assert percent_to_fraction(raw) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("NaN", "non-finite"),
        ("+Inf", "non-finite"),
        ("-Inf", "non-finite"),
        ("-0.5", "negative"),
        ("", "unparseable"),
        ("fifty", "unparseable"),
    ],
)
def test_values_a_scheduler_must_not_see_are_refused_with_a_reason(raw: str, reason: str) -> None:
    assert percent_to_fraction(raw) == reason


def test_convert_splits_kept_and_refused_per_node() -> None:
    chosen = {"a": Match("a", MatchKind.IP, "50"), "b": Match("b", MatchKind.IP, "NaN")}
    converted = convert(chosen)
    assert converted.fractions == {"a": 0.5}
    assert converted.dropped == {"b": "non-finite"}


def test_one_patch_per_node_with_every_metric_at_five_decimals_in_utc() -> None:
    values = {"cpu_usage_avg_5m": {"a": 0.630123456, "b": 0.1}, "mem_usage_avg_5m": {"a": 0.25}}
    per_node = metric_annotations(values, AT)
    assert per_node == {
        "a": {
            "cpu_usage_avg_5m": "0.63012,2023-10-17T07:04:32+00:00",
            "mem_usage_avg_5m": "0.25000,2023-10-17T07:04:32+00:00",
        },
        "b": {"cpu_usage_avg_5m": "0.10000,2023-10-17T07:04:32+00:00"},
    }
    assert decode(per_node["a"]["cpu_usage_avg_5m"]).value == 0.63012


@pytest.mark.parametrize("style", list(TimestampStyle))
def test_round_annotations_are_exactly_what_encode_usage_writes(style: TimestampStyle) -> None:
    stamp = Stamp(style, ZoneInfo("Asia/Shanghai"))
    fractions = [0.0, 1e-7, 0.000005, 0.123455, 0.630123456, 0.999999, 1.0, 1.205, 37.0]
    values = {"k": {f"n{i}": f for i, f in enumerate(fractions)}}
    per_node = metric_annotations(values, AT, stamp)
    assert per_node == {
        f"n{i}": {"k": encode_usage(f, AT, style=style, legacy_zone=stamp.legacy_zone)} for i, f in enumerate(fractions)
    }


@pytest.mark.parametrize("bad", [math.nan, math.inf, -0.5])
def test_round_annotations_refuse_what_encode_usage_refuses(bad: float) -> None:
    with pytest.raises(ValueError, match="finite, non-negative"):
        metric_annotations({"k": {"a": 0.5, "b": bad}}, AT)


def test_legacy_stamp_writes_upstreams_wall_clock_with_z() -> None:
    stamp = Stamp(TimestampStyle.LEGACY, ZoneInfo("Asia/Shanghai"))
    assert metric_annotations({"k": {"a": 0.5}}, AT, stamp) == {"a": {"k": "0.50000,2023-10-17T15:04:32Z"}}
    assert hot_value_annotation(3, AT, stamp) == {"node_hot_value": "3,2023-10-17T15:04:32Z"}


def test_merge_patch_names_only_the_annotations_it_sets() -> None:
    assert merge_patch({"node_hot_value": "1,2023-10-17T07:04:32+00:00"}) == {
        "metadata": {"annotations": {"node_hot_value": "1,2023-10-17T07:04:32+00:00"}}
    }
