"""Node annotation patches: one JSON merge patch per node carrying everything due for it.

Upstream sends one JSON patch per metric with op ``add`` on ``/metadata/annotations/<key>``, which fails on a
node that has no annotations map at all, and multiplies API requests by the number of metrics. A merge patch
(``application/merge-patch+json``) creates the map when missing and touches only the keys it names.
Every due metric is written even when its value is unchanged: the timestamp is how readers judge freshness.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from crane_shared.annotations import (
    DEFAULT_LEGACY_ZONE,
    HOT_VALUE_KEY,
    TimestampStyle,
    encode_hot_value,
    format_timestamp,
)

MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class Stamp:
    """How timestamps are written: real UTC (default) or upstream's legacy wall clock + ``Z``."""

    style: TimestampStyle = TimestampStyle.RFC3339
    legacy_zone: ZoneInfo = DEFAULT_LEGACY_ZONE


DEFAULT_STAMP = Stamp()


def metric_annotations(
    values: Mapping[str, Mapping[str, float]], at: datetime, stamp: Stamp = DEFAULT_STAMP
) -> dict[str, dict[str, str]]:
    """``{annotation key: {node: fraction}}`` -> ``{node: {annotation key: "0.63012,<ts>"}}``.

    ``encode_usage``'s format, with the timestamp, the same for the whole round, formatted once rather than
    for each of the round's (nodes x metrics) values; the values were validated by ``values.convert``."""
    suffix = "," + format_timestamp(at, stamp.style, stamp.legacy_zone)
    per_node: dict[str, dict[str, str]] = {}
    for key, by_node in values.items():
        for node, fraction in by_node.items():
            if not (math.isfinite(fraction) and fraction >= 0):
                raise ValueError(f"usage must be a finite, non-negative number, got {fraction!r} for {node}")
            per_node.setdefault(node, {})[key] = f"{fraction:.5f}{suffix}"
    return per_node


def hot_value_annotation(value: int, at: datetime, stamp: Stamp = DEFAULT_STAMP) -> dict[str, str]:
    return {HOT_VALUE_KEY: encode_hot_value(value, at, style=stamp.style, legacy_zone=stamp.legacy_zone)}


def merge_patch(annotations: Mapping[str, str]) -> dict[str, object]:
    """The body of a merge patch setting ``annotations`` on a node (and creating the map when missing)."""
    return {"metadata": {"annotations": dict(annotations)}}
