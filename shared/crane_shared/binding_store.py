"""Async Redis adapter for binding records (schema in ``crane_shared.bindings``).

Every operation is one round trip whatever the number of records or nodes (pipelined), and each record is
written atomically by a Lua script (a batch of records per call), so a crash can never leave a counted
binding without its notification or the other way round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis

from crane_shared.bindings import STREAM_FIELD, BindingRecord, BindingSchema, RecordError, pack, unpack

__all__ = ["BindingStore", "SkippedEntry", "StreamBatch"]

# KEYS: nodes set, stream, then one node set per record. ARGV: stream maxlen, stream field, then per record
# (uid, bound_at, node, payload). Notifies and registers the node only when the UID is new, so a re-delivered
# event is a no-op. A whole batch is one script call: Redis-side call overhead dominates per-record scripts.
_RECORD = """
local added = {}
for i = 3, #KEYS do
  local a = 3 + (i - 3) * 4
  if redis.call('ZADD', KEYS[i], 'NX', ARGV[a + 1], ARGV[a]) == 1 then
    redis.call('SADD', KEYS[1], ARGV[a + 2])
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', ARGV[2], ARGV[a + 3])
    added[#added + 1] = 1
  else
    added[#added + 1] = 0
  end
end
return added
"""
RECORD_BATCH = 256
"""Records per script call: large enough to amortise the call, small enough not to stall Redis."""

# KEYS: node set, nodes set. ARGV: exclusive upper bound, node.
# Drops the node from the nodes set in the same step as its last record, so a concurrent write cannot
# leave records behind on a node nobody trims.
_TRIM = """
local removed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[1])
if redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[2], ARGV[2])
end
return removed
"""


@dataclass(frozen=True)
class SkippedEntry:
    """A stream entry that could not be decoded: the consumer logs it and moves on."""

    entry_id: str
    reason: str


@dataclass(frozen=True)
class StreamBatch:
    """What one ``read_stream`` call got; pass ``last_id`` to the next call."""

    last_id: str
    records: tuple[BindingRecord, ...]
    skipped: tuple[SkippedEntry, ...] = ()


class BindingStore:
    """Binding records in Redis. The client must not decode responses: payloads are binary msgpack."""

    def __init__(self, redis: aioredis.Redis, schema: BindingSchema | None = None) -> None:
        if redis.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("BindingStore needs a Redis client with decode_responses=False (binary payloads)")
        self._redis = redis
        self.schema = schema or BindingSchema()
        self._record_script = redis.register_script(_RECORD)
        self._trim_script = redis.register_script(_TRIM)

    async def record(self, records: Sequence[BindingRecord], stream_maxlen: int) -> list[bool]:
        """Store bindings in one round trip; returns, per record, whether it was new (and so notified)."""
        if stream_maxlen <= 0:
            raise ValueError(f"stream_maxlen must be > 0, got {stream_maxlen}")
        for record in records:
            if not math.isfinite(record.bound_at):
                raise ValueError(f"binding of pod {record.uid} has a non-finite time {record.bound_at!r}")
        if not records:
            return []
        schema = self.schema
        async with self._redis.pipeline(transaction=False) as pipe:
            for start in range(0, len(records), RECORD_BATCH):
                batch = records[start : start + RECORD_BATCH]
                args: list[Any] = [stream_maxlen, STREAM_FIELD]
                for record in batch:
                    args += [record.uid, repr(record.bound_at), record.node, pack(record)]
                await self._record_script(
                    keys=[schema.nodes_key, schema.stream_key, *(schema.node_key(r.node) for r in batch)],
                    args=args,
                    client=pipe,
                )
            results = await pipe.execute()
        return [bool(added) for batch in results for added in batch]

    async def count_in_windows(
        self, nodes: Sequence[str], windows: Sequence[timedelta], now: float
    ) -> dict[str, dict[timedelta, int]]:
        """Bindings per node bound strictly after ``now - window`` (later times count too, as upstream)."""
        pairs = [(node, window) for node in dict.fromkeys(nodes) for window in dict.fromkeys(windows)]
        counts: dict[str, dict[timedelta, int]] = {node: {} for node in nodes}
        if not pairs:
            return counts
        async with self._redis.pipeline(transaction=False) as pipe:
            for node, window in pairs:
                pipe.zcount(self.schema.node_key(node), f"({now - window.total_seconds()!r}", "+inf")
            results = await pipe.execute()
        for (node, window), count in zip(pairs, results, strict=True):
            counts[node][window] = int(count)
        return counts

    async def nodes(self) -> list[str]:
        """Nodes that currently have binding records, sorted."""
        members = await self._redis.smembers(self.schema.nodes_key)
        return sorted(_text(member) for member in members)

    async def trim(self, before: float) -> int:
        """Delete records bound strictly before ``before`` on every node; returns how many were deleted."""
        nodes = await self.nodes()
        if not nodes:
            return 0
        async with self._redis.pipeline(transaction=False) as pipe:
            for node in nodes:
                await self._trim_script(
                    keys=[self.schema.node_key(node), self.schema.nodes_key],
                    args=[repr(float(before)), node],
                    client=pipe,
                )
            results = await pipe.execute()
        return sum(int(removed) for removed in results)

    async def read_stream(self, last_id: str, block_ms: int | None, count: int) -> StreamBatch:
        """Records appended after ``last_id`` (``"0"`` for all kept, ``"$"`` for only new ones).

        ``block_ms`` waits for new entries (``None``: do not wait; 0: forever) and must stay below the
        client's socket timeout. Undecodable entries are skipped and reported, never raised, so one bad
        writer cannot wedge the consumer.
        """
        if count <= 0:
            raise ValueError(f"count must be > 0, got {count}")
        response = await self._redis.xread({self.schema.stream_key: last_id}, count=count, block=block_ms)
        records: list[BindingRecord] = []
        skipped: list[SkippedEntry] = []
        for raw_id, fields in _stream_entries(response):
            if raw_id is None:  # deleted while being read
                continue
            entry_id = _text(raw_id)
            last_id = entry_id
            payload = _field(fields, STREAM_FIELD)
            if payload is None:
                skipped.append(SkippedEntry(entry_id, f'no "{STREAM_FIELD}" field'))
                continue
            try:
                records.append(unpack(payload))
            except RecordError as exc:
                skipped.append(SkippedEntry(entry_id, str(exc)))
        return StreamBatch(last_id, tuple(records), tuple(skipped))


def _stream_entries(response: Any) -> list[tuple[Any, Any]]:
    """Entries of the single stream read, whatever reply shape redis-py produced.

    RESP2 gives ``[[stream, entries]]``; RESP3 ``{stream: [entries]}`` (legacy) or ``{stream: entries}``.
    """
    if not response:
        return []
    chunks = list(response.values()) if isinstance(response, dict) else [chunk[1] for chunk in response]
    entries: list[tuple[Any, Any]] = []
    for chunk in chunks:
        if chunk and isinstance(chunk[0], list):  # RESP3 legacy wraps the entry list once more
            chunk = chunk[0]
        entries.extend((entry[0], entry[1]) for entry in chunk or ())
    return entries


def _field(fields: Any, name: str) -> bytes | None:
    if not isinstance(fields, dict):
        return None
    value = fields.get(name.encode(), fields.get(name))
    if isinstance(value, str):
        return value.encode()
    return value if isinstance(value, bytes) else None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
