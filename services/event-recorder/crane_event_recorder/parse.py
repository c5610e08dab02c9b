"""Pure parsing of one Event object (as JSON from the API server) into a binding record.

Works on plain dicts, not kubernetes-asyncio models: deserialising models costs more than everything else on the
hot path, and reading both shapes by field name lets one function serve events.k8s.io/v1 (``regarding``,
``note``, ``deprecated*Timestamp``, ``reportingController``) and core/v1 (``involvedObject``, ``message``,
``lastTimestamp``, ``reportingComponent``/``source``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from crane_shared.bindings import BindingRecord
from crane_shared.events import SCHEDULED_REASON, parse_scheduled_note

__all__ = ["Malformed", "MalformedReason", "parse_event", "parse_time"]

# A note that says who was assigned but not where ("... to " with nothing after it).
_NO_NODE = re.compile(r"^Successfully assigned \S+/\S+ to\s*$")


class MalformedReason:
    """Label values of the ``malformed`` metric: one per way a ``Scheduled`` event can be unusable."""

    UNPARSEABLE_NOTE = "unparseable_note"
    MISSING_NODE = "missing_node"
    MISSING_UID = "missing_uid"
    NOT_A_POD = "not_a_pod"
    NOTE_MISMATCH = "note_mismatch"
    MISSING_TIME = "missing_time"
    BAD_TIME = "bad_time"
    FUTURE_TIME = "future_time"


# A binding stamped further ahead than this (a scheduler with a wrong clock) would stay "hot" until real time
# catches up with it, and outlive the retention: refuse it.
MAX_CLOCK_SKEW = 300.0


@dataclass(frozen=True)
class Malformed:
    """A ``Scheduled`` event that cannot be recorded; ``reason`` is a ``MalformedReason`` value."""

    reason: str
    detail: str


def parse_event(obj: Mapping[str, Any], now: float | None = None) -> BindingRecord | Malformed | None:
    """The binding an Event reports; None when it does not report one (other reason, type Warning).

    ``now`` (unix seconds) enables the check against bindings stamped more than ``MAX_CLOCK_SKEW`` ahead.
    """
    if obj.get("reason") != SCHEDULED_REASON or obj.get("type", "Normal") != "Normal":
        return None
    note = obj.get("note") or obj.get("message") or ""
    parsed = parse_scheduled_note(note) if isinstance(note, str) else None
    if parsed is None:
        reason = MalformedReason.MISSING_NODE if _NO_NODE.match(str(note).strip()) else MalformedReason.UNPARSEABLE_NOTE
        return Malformed(reason, f"note {str(note)[:120]!r}")
    note_ns, note_pod, node = parsed

    target = obj.get("regarding") or obj.get("involvedObject") or {}
    kind = target.get("kind")
    if kind not in (None, "", "Pod"):
        return Malformed(MalformedReason.NOT_A_POD, f"regarding a {kind}")
    uid = target.get("uid")
    if not uid:
        return Malformed(MalformedReason.MISSING_UID, f"no pod UID for {note_ns}/{note_pod}")
    namespace = target.get("namespace") or note_ns
    name = target.get("name") or note_pod
    if (namespace, name) != (note_ns, note_pod):
        return Malformed(MalformedReason.NOTE_MISMATCH, f"regarding {namespace}/{name}, note {note_ns}/{note_pod}")

    raw_time = binding_time_field(obj)
    if raw_time is None:
        return Malformed(MalformedReason.MISSING_TIME, f"no timestamp for {namespace}/{name}")
    bound_at = parse_time(raw_time)
    if bound_at is None:
        return Malformed(MalformedReason.BAD_TIME, f"timestamp {str(raw_time)[:40]!r}")
    if now is not None and bound_at > now + MAX_CLOCK_SKEW:
        return Malformed(MalformedReason.FUTURE_TIME, f"timestamp {raw_time} is {bound_at - now:.0f}s ahead")
    return BindingRecord(
        uid=str(uid),
        namespace=str(namespace),
        name=str(name),
        node=node,
        bound_at=bound_at,
        scheduler=_scheduler(obj),
    )


def binding_time_field(obj: Mapping[str, Any]) -> Any:
    """eventTime, else series.lastObservedTime / lastTimestamp, else firstTimestamp (the issue's order)."""
    series = obj.get("series") or {}
    for value in (
        obj.get("eventTime"),
        series.get("lastObservedTime") if isinstance(series, Mapping) else None,
        obj.get("lastTimestamp"),
        obj.get("deprecatedLastTimestamp"),
        obj.get("firstTimestamp"),
        obj.get("deprecatedFirstTimestamp"),
    ):
        if value:
            return value
    return None


def parse_time(value: Any) -> float | None:
    """Unix seconds from an RFC 3339 Time or MicroTime string; None when it is not one."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:  # the API always writes UTC with "Z"; a naive time would be read as local
        return None
    seconds = parsed.timestamp()
    return seconds if math.isfinite(seconds) else None


def _scheduler(obj: Mapping[str, Any]) -> str:
    source = obj.get("deprecatedSource") or obj.get("source") or {}
    name = obj.get("reportingController") or obj.get("reportingComponent") or source.get("component") or ""
    return str(name)
