"""BindingStore against a real redis-server, with both reply protocols redis-py speaks (RESP2 and RESP3)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import redis.asyncio as aioredis

from crane_shared.binding_store import BindingStore
from crane_shared.bindings import STREAM_FIELD, BindingRecord, BindingSchema, pack

NOW = 1_700_000_000.0
MINUTE = timedelta(minutes=1)
FIVE_MINUTES = timedelta(minutes=5)


@pytest.fixture(params=[2, 3], ids=["resp2", "resp3"])
async def redis(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url, protocol=request.param)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
def store(redis: aioredis.Redis) -> BindingStore:
    return BindingStore(redis, BindingSchema("test"))


def binding(uid: str, node: str = "node-1", at: float = NOW - 10, name: str = "web-0") -> BindingRecord:
    return BindingRecord(uid=uid, namespace="default", name=name, node=node, bound_at=at, scheduler="crane")


async def test_redelivered_binding_counts_once_and_notifies_once(store: BindingStore) -> None:
    first = binding("uid-1")
    assert await store.record([first, first], stream_maxlen=1000) == [True, False]
    assert await store.record([first], stream_maxlen=1000) == [False]

    counts = await store.count_in_windows(["node-1"], [FIVE_MINUTES], NOW)
    assert counts == {"node-1": {FIVE_MINUTES: 1}}
    batch = await store.read_stream("0", block_ms=None, count=100)
    assert batch.records == (first,)


async def test_redelivery_with_a_later_time_keeps_the_first_binding_time(store: BindingStore) -> None:
    await store.record([binding("uid-1", at=NOW - 400)], stream_maxlen=1000)
    assert await store.record([binding("uid-1", at=NOW - 10)], stream_maxlen=1000) == [False]

    counts = await store.count_in_windows(["node-1"], [MINUTE, timedelta(hours=1)], NOW)
    assert counts == {"node-1": {MINUTE: 0, timedelta(hours=1): 1}}


async def test_recreated_pod_has_a_new_uid_and_counts_again(store: BindingStore) -> None:
    old, new = binding("uid-old", at=NOW - 20), binding("uid-new", at=NOW - 5)
    assert await store.record([old], stream_maxlen=1000) == [True]
    assert await store.record([new], stream_maxlen=1000) == [True]

    assert await store.count_in_windows(["node-1"], [MINUTE], NOW) == {"node-1": {MINUTE: 2}}
    assert (await store.read_stream("0", block_ms=None, count=100)).records == (old, new)


async def test_windows_count_bindings_strictly_inside_per_node(store: BindingStore) -> None:
    await store.record(
        [
            binding("a1", "node-a", NOW - 30),
            binding("a2", "node-a", NOW - 60),  # exactly on the 1m edge: outside, as upstream
            binding("a3", "node-a", NOW - 90),
            binding("a4", "node-a", NOW - 400),
            binding("b1", "node-b", NOW - 10),
            binding("b2", "node-b", NOW + 5),  # clock skew ahead still counts, as upstream
        ],
        stream_maxlen=1000,
    )

    counts = await store.count_in_windows(["node-a", "node-b", "node-c"], [MINUTE, FIVE_MINUTES], NOW)

    assert counts == {
        "node-a": {MINUTE: 1, FIVE_MINUTES: 3},
        "node-b": {MINUTE: 2, FIVE_MINUTES: 2},
        "node-c": {MINUTE: 0, FIVE_MINUTES: 0},
    }
    assert await store.nodes() == ["node-a", "node-b"]


async def test_trim_removes_old_records_and_forgets_emptied_nodes(store: BindingStore) -> None:
    await store.record(
        [
            binding("old-1", "node-a", NOW - 1000),
            binding("new-1", "node-a", NOW - 10),
            binding("old-2", "node-b", NOW - 900),
        ],
        stream_maxlen=1000,
    )

    assert await store.trim(before=NOW - 500) == 2

    counts = await store.count_in_windows(["node-a", "node-b"], [timedelta(hours=1)], NOW)
    assert counts == {"node-a": {timedelta(hours=1): 1}, "node-b": {timedelta(hours=1): 0}}
    assert await store.nodes() == ["node-a"]
    assert await store.trim(before=NOW - 500) == 0


async def test_old_uid_trimmed_then_redelivered_counts_again(store: BindingStore) -> None:
    record = binding("uid-1", at=NOW - 1000)
    await store.record([record], stream_maxlen=1000)
    await store.trim(before=NOW)
    assert await store.nodes() == []
    assert await store.record([record], stream_maxlen=1000) == [True]
    assert await store.nodes() == ["node-1"]


async def test_stream_delivers_records_in_order_from_the_last_id(store: BindingStore) -> None:
    first_batch = [binding(f"uid-{i}", name=f"web-{i}", node=f"node-{i % 2}") for i in range(3)]
    await store.record(first_batch, stream_maxlen=1000)

    batch = await store.read_stream("0", block_ms=None, count=100)
    assert batch.records == tuple(first_batch)
    assert batch.skipped == ()

    empty = await store.read_stream(batch.last_id, block_ms=20, count=100)
    assert empty.records == ()
    assert empty.last_id == batch.last_id

    later = binding("uid-later")
    await store.record([later], stream_maxlen=1000)
    assert (await store.read_stream(batch.last_id, block_ms=None, count=100)).records == (later,)


async def test_stream_reads_are_bounded_by_count(store: BindingStore) -> None:
    records = [binding(f"uid-{i}") for i in range(5)]
    await store.record(records, stream_maxlen=1000)

    first = await store.read_stream("0", block_ms=None, count=2)
    rest = await store.read_stream(first.last_id, block_ms=None, count=10)

    assert first.records + rest.records == tuple(records)
    assert len(first.records) == 2


async def test_malformed_stream_entries_are_skipped_and_reported(store: BindingStore, redis: aioredis.Redis) -> None:
    good_before, good_after = binding("uid-1"), binding("uid-2")
    stream = store.schema.stream_key
    await store.record([good_before], stream_maxlen=1000)
    garbage_id = await redis.xadd(stream, {STREAM_FIELD: b"\xc1 not msgpack"})
    no_field_id = await redis.xadd(stream, {"other": pack(good_before)})
    await store.record([good_after], stream_maxlen=1000)

    batch = await store.read_stream("0", block_ms=None, count=100)

    assert batch.records == (good_before, good_after)
    assert [entry.entry_id for entry in batch.skipped] == [_text(garbage_id), _text(no_field_id)]
    assert "not msgpack" in batch.skipped[0].reason
    assert STREAM_FIELD in batch.skipped[1].reason


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def test_stream_is_capped(store: BindingStore, redis: aioredis.Redis) -> None:
    await store.record([binding(f"uid-{i}") for i in range(500)], stream_maxlen=10)
    # MAXLEN ~ trims whole macro nodes (100 entries by default), so the cap is approximate but effective.
    assert await redis.xlen(store.schema.stream_key) < 500
    assert await store.count_in_windows(["node-1"], [MINUTE], NOW) == {"node-1": {MINUTE: 500}}


async def test_client_decoding_responses_is_refused(redis_url: str) -> None:
    client = aioredis.from_url(redis_url, decode_responses=True)
    with pytest.raises(ValueError, match="decode_responses=False"):
        BindingStore(client)
    await client.aclose()
