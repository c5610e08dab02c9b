"""Node-annotation codec: ``"<value>,<timestamp>"`` per metric, plus the hot value.

Upstream writes local wall-clock time followed by a literal ``Z`` (Go layout ``2006-01-02T15:04:05Z``, zone
from ``TZ``, default Asia/Shanghai), which lies about the zone. We write real UTC with an explicit offset
(``2023-10-17T15:04:32+00:00``) and read any RFC 3339 offset. A bare ``...SSZ`` without a fraction is read as
upstream's legacy format, i.e. wall-clock time in ``legacy_zone``: keep the default Asia/Shanghai when the
writer is upstream's annotator with its default ``TZ``; set it to UTC when your writers emit genuine UTC
``Z``.
``Z`` *with* a fractional second is never written by upstream and always means UTC.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Literal
from zoneinfo import ZoneInfo

__all__ = [
    "DEFAULT_LEGACY_ZONE",
    "DEFAULT_MAX_SKEW",
    "HOT_VALUE_FRESHNESS",
    "HOT_VALUE_KEY",
    "METRIC_FRESHNESS_GRACE",
    "AnnotationError",
    "AnnotationKeyError",
    "Freshness",
    "Reason",
    "Sample",
    "TimestampStyle",
    "annotation_key",
    "decode",
    "encode_hot_value",
    "encode_usage",
    "format_timestamp",
    "freshness",
    "is_valid_annotation_key",
    "metric_freshness_window",
]

HOT_VALUE_KEY = "node_hot_value"
HOT_VALUE_FRESHNESS = timedelta(minutes=5)
METRIC_FRESHNESS_GRACE = timedelta(minutes=5)
"""Upstream keeps a metric annotation fresh for its sync period plus this grace."""
DEFAULT_LEGACY_ZONE = ZoneInfo("Asia/Shanghai")
DEFAULT_MAX_SKEW = timedelta(seconds=30)

Reason = Literal["format", "value", "non-finite", "negative", "timestamp"]

_MAX_QUOTED = 80
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_NON_FINITE = frozenset(sign + word for sign in ("", "+", "-") for word in ("nan", "inf", "infinity"))
_TIMESTAMP = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})[Tt]"
    r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
    r"(?:\.(?P<fraction>[0-9]{1,9}))?"
    r"(?:(?P<zulu>[Zz])|(?P<sign>[+-])(?P<off_hour>[0-9]{2}):(?P<off_minute>[0-9]{2}))",
    re.ASCII,
)
_KEY_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?", re.ASCII)
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_KEY_PREFIX = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*", re.ASCII)
_KEY_INVALID_CHAR = re.compile(r"[^-A-Za-z0-9_.]", re.ASCII)
_KEY_EDGES = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", re.ASCII)
_KEY_NAME_MAX = 63
_KEY_PREFIX_MAX = 253


class TimestampStyle(enum.Enum):
    """How a writer stamps annotations."""

    RFC3339 = "rfc3339"
    """Real UTC with an explicit offset: ``2023-10-17T15:04:32+00:00``. Use this unless upstream reads it."""
    LEGACY = "legacy"
    """Upstream's wall clock in a zone plus a literal ``Z``, for upstream's Go plugin to read."""


class Freshness(enum.Enum):
    FRESH = "fresh"
    STALE = "stale"
    FUTURE = "future"
    """Further ahead than the allowed clock skew: upstream would keep it fresh forever; we never do."""


@dataclass(frozen=True)
class Sample:
    """A decoded annotation: ``timestamp`` is always aware and in UTC."""

    value: float
    timestamp: datetime


class AnnotationError(ValueError):
    """An annotation value cannot be decoded; ``reason`` is short and stable enough to label metrics with."""

    def __init__(self, reason: Reason, text: str, detail: str) -> None:
        self.reason: Reason = reason
        self.text = text
        super().__init__(f"annotation value {_quote(text)}: {detail}")


class AnnotationKeyError(ValueError):
    """A metric name cannot be turned into a Kubernetes annotation key."""


def format_timestamp(
    at: datetime,
    style: TimestampStyle = TimestampStyle.RFC3339,
    legacy_zone: ZoneInfo = DEFAULT_LEGACY_ZONE,
) -> str:
    """Render ``at`` to the second (truncated) in the chosen style; ``at`` must be aware."""
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"timestamp {at!r} is naive; annotations need an aware datetime")
    if style is TimestampStyle.LEGACY:
        return _wall_clock(at.astimezone(legacy_zone)) + "Z"
    return _wall_clock(at.astimezone(UTC)) + "+00:00"


def encode_usage(
    value: float,
    at: datetime,
    *,
    style: TimestampStyle = TimestampStyle.RFC3339,
    legacy_zone: ZoneInfo = DEFAULT_LEGACY_ZONE,
) -> str:
    """Encode a usage fraction as ``"0.63012,<timestamp>"`` (5 decimals, as upstream)."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"usage must be a finite, non-negative number, got {value!r}")
    return f"{value:.5f},{format_timestamp(at, style, legacy_zone)}"


def encode_hot_value(
    value: int,
    at: datetime,
    *,
    style: TimestampStyle = TimestampStyle.RFC3339,
    legacy_zone: ZoneInfo = DEFAULT_LEGACY_ZONE,
) -> str:
    """Encode a hot value as ``"3,<timestamp>"``."""
    if isinstance(value, bool) or value < 0:
        raise ValueError(f"hot value must be a non-negative integer, got {value!r}")
    return f"{value},{format_timestamp(at, style, legacy_zone)}"


def decode(text: str, legacy_zone: ZoneInfo = DEFAULT_LEGACY_ZONE) -> Sample:
    """Decode ``"<value>,<timestamp>"``, raising only ``AnnotationError``; timestamps as in the module doc."""
    if text == "":
        raise AnnotationError("format", text, 'empty; expected "<value>,<timestamp>"')
    fields = text.split(",")
    if len(fields) != 2:
        raise AnnotationError(
            "format", text, f'expected "<value>,<timestamp>" (2 comma-separated fields), got {len(fields)}'
        )
    return Sample(_parse_value(fields[0], text), _parse_timestamp(fields[1], text, legacy_zone))


def freshness(ts: datetime, now: datetime, window: timedelta, max_skew: timedelta = DEFAULT_MAX_SKEW) -> Freshness:
    """Fresh while ``now < ts + window`` (strict, as upstream); FUTURE beyond ``now + max_skew``."""
    if ts > now + max_skew:
        return Freshness.FUTURE
    return Freshness.FRESH if now < ts + window else Freshness.STALE


def metric_freshness_window(sync_period: timedelta) -> timedelta:
    """How long a metric annotation stays usable: its sync period plus upstream's 5-minute grace."""
    return sync_period + METRIC_FRESHNESS_GRACE


def is_valid_annotation_key(key: str) -> bool:
    """Kubernetes qualified-name rule: ``[prefix/]name``, DNS-subdomain prefix, name up to 63 characters."""
    parts = key.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2:
        prefix = parts[0]
        if not (0 < len(prefix) <= _KEY_PREFIX_MAX and _KEY_PREFIX.fullmatch(prefix)):
            return False
    name = parts[-1]
    return len(name) <= _KEY_NAME_MAX and _KEY_NAME.fullmatch(name) is not None


def annotation_key(metric_name: str) -> str:
    """Map a metric name to the node-annotation key it is stored under.

    A name that already is a valid key (all of upstream's) is returned unchanged. Otherwise every character
    outside ``[-A-Za-z0-9_.]`` (e.g. the ``:`` of recording-rule names, or ``/``) becomes ``_`` and leading
    or trailing non-alphanumerics are dropped: ``instance:cpu_usage:avg5m`` -> ``instance_cpu_usage_avg5m``.
    Names that still do not fit (nothing alphanumeric, or longer than 63 characters) are refused rather than
    truncated, so two metrics never silently share a key by truncation.
    """
    if is_valid_annotation_key(metric_name):
        return metric_name
    key = _KEY_EDGES.sub("", _KEY_INVALID_CHAR.sub("_", metric_name))
    if not key:
        raise AnnotationKeyError(f"metric name {metric_name!r} has no letters or digits to form a key")
    if len(key) > _KEY_NAME_MAX:
        raise AnnotationKeyError(
            f"metric name {metric_name!r} is too long for an annotation key ({len(key)} > {_KEY_NAME_MAX})"
        )
    return key


def _wall_clock(at: datetime) -> str:
    return f"{at.year:04d}-{at.month:02d}-{at.day:02d}T{at.hour:02d}:{at.minute:02d}:{at.second:02d}"


def _parse_value(field: str, text: str) -> float:
    if _NUMBER.fullmatch(field) is None:
        if field.lower() in _NON_FINITE:
            raise AnnotationError("non-finite", text, f"value {field!r} is not a finite number")
        raise AnnotationError("value", text, f"value {_quote(field)} is not a decimal number")
    value = float(field)
    if not math.isfinite(value):
        raise AnnotationError("non-finite", text, f"value {_quote(field)} overflows a float")
    if value < 0:
        raise AnnotationError("negative", text, f"value {field!r} is negative")
    return value + 0.0  # turns -0.0 into 0.0


def _parse_timestamp(field: str, text: str, legacy_zone: ZoneInfo) -> datetime:
    match = _TIMESTAMP.fullmatch(field)
    if match is None:
        raise AnnotationError(
            "timestamp", text, f"timestamp {_quote(field)} is not RFC 3339 (e.g. 2023-10-17T15:04:32+00:00)"
        )
    fraction = match["fraction"]
    if match["zulu"] and fraction is None:
        zone: ZoneInfo | timezone = legacy_zone  # upstream's legacy "wall clock + literal Z"
    elif match["zulu"]:
        zone = UTC
    else:
        zone = _offset(match["sign"], int(match["off_hour"]), int(match["off_minute"]), text)
    try:
        local = datetime(
            int(match["year"]),
            int(match["month"]),
            int(match["day"]),
            int(match["hour"]),
            int(match["minute"]),
            int(match["second"]),
            int((fraction or "0")[:6].ljust(6, "0")),
            tzinfo=zone,
        )
        return local.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise AnnotationError("timestamp", text, f"timestamp {field!r} is not a valid time: {exc}") from None


def _offset(sign: str, hours: int, minutes: int, text: str) -> timezone:
    if hours > 23 or minutes > 59:
        raise AnnotationError("timestamp", text, f"offset {sign}{hours:02d}:{minutes:02d} is out of range")
    delta = timedelta(hours=hours, minutes=minutes)
    return timezone(-delta if sign == "-" else delta)


def _quote(text: str) -> str:
    if len(text) <= _MAX_QUOTED:
        return repr(text)
    return repr(text[:_MAX_QUOTED]) + f"... ({len(text)} characters)"
