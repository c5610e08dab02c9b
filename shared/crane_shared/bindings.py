"""Redis schema for binding records: key names and the msgpack payload, shared by writer and readers.

Upstream keeps bindings in an in-memory heap of 1024 that forgets on restart and drops records under load.
Here every binding is a member of a per-node sorted set (member = pod UID, score = binding time), so a
re-delivered event is idempotent while a recreated pod (new UID) counts again, and counting a window is one
``ZCOUNT``. New records are also appended to a stream so other processes can react without polling.

Keys, for prefix ``crane``::

    crane:bindings:<node>   sorted set  pod UID -> bound_at (unix seconds)
    crane:nodes             set         nodes that have records (to trim and list them)
    crane:stream:bindings   stream      field "record" = packed BindingRecord, for each new binding

The stream lives outside ``crane:bindings:`` so that no node name can collide with it. For Redis Cluster,
use a hash-tagged prefix such as ``{crane}`` so that a record's keys share a slot (the write is one script).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

__all__ = [
    "DEFAULT_PREFIX",
    "PAYLOAD_VERSION",
    "STREAM_FIELD",
    "BindingRecord",
    "BindingSchema",
    "RecordError",
    "pack",
    "unpack",
]

DEFAULT_PREFIX = "crane"
PAYLOAD_VERSION = 1
STREAM_FIELD = "record"

_STRING_FIELDS = ("uid", "namespace", "name", "node", "scheduler")


@dataclass(frozen=True)
class BindingSchema:
    """Key names under one prefix, so several installations can share a Redis database."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not self.prefix:
            raise ValueError("binding schema prefix must not be empty")

    def node_key(self, node: str) -> str:
        if not node:
            raise ValueError("node name must not be empty")
        return f"{self.prefix}:bindings:{node}"

    @property
    def nodes_key(self) -> str:
        return f"{self.prefix}:nodes"

    @property
    def stream_key(self) -> str:
        return f"{self.prefix}:stream:bindings"


@dataclass(frozen=True)
class BindingRecord:
    """A pod reported bound to ``node`` at ``bound_at`` (unix seconds) by ``scheduler``."""

    uid: str
    namespace: str
    name: str
    node: str
    bound_at: float
    scheduler: str


class RecordError(ValueError):
    """A payload is not a valid binding record; ``field`` names what is wrong (``payload`` for the whole)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"binding record {field}: {message}")


def pack(record: BindingRecord) -> bytes:
    """Versioned msgpack map, so readers refuse a future writer's payloads instead of misreading them."""
    payload: dict[str, Any] = {
        "v": PAYLOAD_VERSION,
        "uid": record.uid,
        "namespace": record.namespace,
        "name": record.name,
        "node": record.node,
        "bound_at": float(record.bound_at),
        "scheduler": record.scheduler,
    }
    packed: bytes = msgpack.packb(payload, use_bin_type=True)
    return packed


def unpack(data: bytes) -> BindingRecord:
    """Decode a payload written by ``pack``; raises only ``RecordError``. Unknown extra fields are ignored."""
    try:
        payload = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises a variety (ValueError, TypeError, StackError, ...)
        raise RecordError("payload", f"not msgpack: {exc}") from None
    if not isinstance(payload, Mapping):
        raise RecordError("payload", f"must be a map, got {type(payload).__name__}")
    version = payload.get("v")
    if "v" not in payload:
        raise RecordError("v", "missing (no payload version)")
    if version != PAYLOAD_VERSION or isinstance(version, bool):
        raise RecordError("v", f"unsupported payload version {version!r} (this reader knows {PAYLOAD_VERSION})")
    strings = {field: _string(payload, field) for field in _STRING_FIELDS}
    return BindingRecord(bound_at=_time(payload), **strings)


def _string(payload: Mapping[str, Any], field: str) -> str:
    if field not in payload:
        raise RecordError(field, "missing")
    value = payload[field]
    if not isinstance(value, str):
        raise RecordError(field, f"must be a string, got {type(value).__name__}")
    if not value and field != "scheduler":
        raise RecordError(field, "must not be empty")
    return value


def _time(payload: Mapping[str, Any]) -> float:
    if "bound_at" not in payload:
        raise RecordError("bound_at", "missing")
    value = payload["bound_at"]
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise RecordError("bound_at", f"must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise RecordError("bound_at", f"must be finite, got {value!r}")
    return float(value)
