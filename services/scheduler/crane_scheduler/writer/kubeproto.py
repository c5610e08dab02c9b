"""The two Kubernetes protobuf messages the writer speaks: the ``Binding`` it sends and the ``Status`` of an error.

Why protobuf for binds: the API server decodes a protobuf ``Binding`` and encodes its ``Status`` reply in protobuf
for less CPU than JSON (kube-scheduler's client talks protobuf too); a bind is the one write per pod the API
server must take during a burst, and its CPU is the machine's bottleneck there (``bench/scheduler``: the API server
and etcd use more CPU per pod than both of crane's processes). Events stay JSON: their replies in protobuf saved
nothing measurable.

Wire format (``k8s.io/apimachinery/pkg/runtime/serializer/protobuf``): the magic ``k8s\\0``, then a
``runtime.Unknown`` {1: typeMeta {1: apiVersion, 2: kind}, 2: raw (the object's message), 3: contentEncoding,
4: contentType}. Field numbers from the pinned module's ``generated.proto``: Binding {1: metadata, 2: target},
ObjectMeta {1: name, 3: namespace, 5: uid}, ObjectReference {1: kind, 3: name, 5: apiVersion}, Status
{2: status, 3: message, 4: reason, 5: details, 6: code}, StatusDetails {1: name, 2: group, 3: kind, 4: causes,
5: retryAfterSeconds, 6: uid}, StatusCause {1: type, 2: message, 3: field}.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

PROTOBUF = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    """A length-delimited field (strings, bytes, messages)."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


_BINDING_TYPE = _field(1, _field(1, b"v1") + _field(2, b"Binding"))
_TARGET_KIND = _field(1, b"Node")
_TARGET_API_VERSION = _field(5, b"v1")
_NO_ENCODING = _field(3, b"") + _field(4, b"")


def binding(namespace: str, name: str, uid: str, node: str) -> bytes:
    """A v1 ``Binding`` of pod ``namespace/name`` (UID precondition ``uid``) to ``node``, protobuf-encoded."""
    meta = _field(1, name.encode()) + _field(3, namespace.encode()) + _field(5, uid.encode())
    target = _TARGET_KIND + _field(3, node.encode()) + _TARGET_API_VERSION
    return MAGIC + _BINDING_TYPE + _field(2, _field(1, meta) + _field(2, target)) + _NO_ENCODING


class DecodeError(ValueError):
    pass


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a message: varints as int, length-delimited fields as bytes; fixed-size fields
    are skipped."""
    i, end = 0, len(data)

    def varint() -> int:
        nonlocal i
        shift = value = 0
        while True:
            if i >= end:
                raise DecodeError("truncated varint")
            b = data[i]
            i += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    while i < end:
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            yield number, varint()
        elif wire == 2:
            size = varint()
            if i + size > end:
                raise DecodeError("truncated field")
            yield number, data[i : i + size]
            i += size
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise DecodeError(f"unsupported wire type {wire}")


def _text(value: int | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def status_json(body: bytes) -> str | None:
    """A protobuf ``Status`` (an error reply to a protobuf request) as the JSON the API server would have sent;
    None when ``body`` is not one (e.g. a proxy's plain text): the caller then keeps the body as it is."""
    if not body.startswith(MAGIC):
        return None
    try:
        raw = b""
        kind = ""
        for number, value in _fields(body[len(MAGIC) :]):
            if number == 1 and isinstance(value, bytes):
                kind = next((_text(v) for n, v in _fields(value) if n == 2), "")
            elif number == 2 and isinstance(value, bytes):
                raw = value
        if kind != "Status":
            return None
        out: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
        names = {2: "status", 3: "message", 4: "reason"}
        for number, value in _fields(raw):
            if number in names:
                out[names[number]] = _text(value)
            elif number == 6 and isinstance(value, int):
                out["code"] = value - (1 << 64) if value >= 1 << 63 else value
            elif number == 5 and isinstance(value, bytes):
                out["details"] = _details(value)
        return json.dumps(out, separators=(",", ":"))
    except DecodeError:
        return None


def _details(data: bytes) -> dict[str, Any]:
    names = {1: "name", 2: "group", 3: "kind", 6: "uid"}
    out: dict[str, Any] = {}
    for number, value in _fields(data):
        if number in names:
            out[names[number]] = _text(value)
        elif number == 5 and isinstance(value, int):
            out["retryAfterSeconds"] = value
        elif number == 4 and isinstance(value, bytes):
            cause_names = {1: "reason", 2: "message", 3: "field"}
            out.setdefault("causes", []).append(
                {cause_names[n]: _text(v) for n, v in _fields(value) if n in cause_names}
            )
    return out
