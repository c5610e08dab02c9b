"""A protobuf reader for tests, written apart from the writer's ``kubeproto`` so a test of one checks the other:
a Kubernetes protobuf body (``k8s\\0`` + runtime.Unknown) as nested dicts of field number -> values."""

from __future__ import annotations

from typing import Any


def fields(data: bytes) -> dict[int, list[Any]]:
    """Field number -> values (varints as int, length-delimited as bytes), in order."""
    out: dict[int, list[Any]] = {}
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        value: int | bytes
        if key & 7 == 0:
            value, i = _varint(data, i)
        elif key & 7 == 2:
            size, i = _varint(data, i)
            value, i = data[i : i + size], i + size
        else:
            raise AssertionError(f"wire type {key & 7} not expected here")
        out.setdefault(key >> 3, []).append(value)
    return out


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def unknown(body: bytes) -> tuple[str, str, bytes]:
    """(apiVersion, kind, raw message) of an enveloped body."""
    assert body[:4] == b"k8s\x00", body[:4]
    envelope = fields(body[4:])
    type_meta = fields(envelope[1][0])
    return type_meta[1][0].decode(), type_meta[2][0].decode(), envelope[2][0]


def binding(body: bytes) -> dict[str, Any]:
    """A protobuf v1 Binding as the JSON object it stands for."""
    api_version, kind, raw = unknown(body)
    msg = fields(raw)
    meta, target = fields(msg[1][0]), fields(msg[2][0])
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": meta[1][0].decode(), "namespace": meta[3][0].decode(), "uid": meta[5][0].decode()},
        "target": {"apiVersion": target[5][0].decode(), "kind": target[1][0].decode(), "name": target[3][0].decode()},
    }
