"""Redis Sentinel, against real sentinels: the one Redis client factory follows the promoted replica when the
primary is killed, and so does the scheduler served as an extender (the process with its Sentinel flags), whose
binding stream keeps lowering the score of the nodes pods are bound to. (The annotator's turn is in
tests/integration/annotator/test_annotator.py, the event-recorder's with writes lost in the failover in
tests/faults/test_event_recorder.py.)"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from crane_sandbox.procs import ManagedProcess, free_port
from crane_shared.binding_store import BindingStore
from crane_shared.bindings import BindingRecord
from crane_shared.redisconn import make_redis
from tests.support.extender import node, pod, usage
from tests.support.sentinel import SentinelGroup
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


async def test_the_client_follows_the_promoted_replica_when_the_primary_is_killed(run_dir: Path) -> None:
    async with SentinelGroup(run_dir / f"sentinel-{uuid.uuid4().hex[:6]}") as group:
        client = make_redis(group.settings())
        try:
            await client.set("before", "1")
            assert await client.wait(group.replicas, 5000) == group.replicas  # replicated before the kill
            killed = await group.kill_primary()
            started = time.monotonic()

            async def write_goes_through() -> bool:
                try:
                    await client.set("after", "2")
                except (aioredis.ConnectionError, aioredis.TimeoutError, aioredis.ReadOnlyError):
                    return False  # what every caller's retry loop sees during the failover
                return True

            await eventually(write_goes_through, timeout=60, what="a write after the failover", interval=0.2)
            failover = time.monotonic() - started
            promoted = await group.primary_port()
            assert promoted != killed
            assert await client.get("before") == b"1" and await client.get("after") == b"2"
            info = await client.info("replication")
            assert info["role"] == "master"
            print(f"\nfailover: writes resumed {failover:.1f}s after the primary was killed (promoted :{promoted})")
        finally:
            await client.aclose()


async def test_a_wrong_sentinel_password_fails_with_an_error_not_a_hang(run_dir: Path) -> None:
    async with SentinelGroup(run_dir / f"sentinel-{uuid.uuid4().hex[:6]}", replicas=1, sentinels=1) as group:
        settings = group.settings()
        assert settings.sentinel_password_file
        await asyncio.to_thread(Path(settings.sentinel_password_file).write_text, "wrong\n")
        client = make_redis(settings)
        try:
            with pytest.raises(aioredis.RedisError):
                await client.ping()
        finally:
            await client.aclose()


async def test_the_extender_follows_the_binding_stream_through_a_failover(run_dir: Path) -> None:
    async with SentinelGroup(run_dir / f"sentinel-{uuid.uuid4().hex[:6]}", replicas=1) as group:
        port = free_port()
        argv = [sys.executable, "-m", "crane_extender", "--port", str(port), "--listen-address", "127.0.0.1",
                *group.flags()]  # fmt: skip
        proc = ManagedProcess("crane-extender", argv, group.run_dir / "crane-extender.log")
        redis = make_redis(group.settings())
        store = BindingStore(redis)
        url = f"http://127.0.0.1:{port}"
        stamp = usage(0.2, age=timedelta(seconds=60), now=datetime.now(UTC))
        nodes = {"Nodes": {"items": [node("a", stamp), node("b", stamp)]}, "NodeNames": None}

        async def scores() -> dict[str, int]:
            body = {"Pod": pod(), **nodes}
            async with aiohttp.ClientSession() as s, s.post(f"{url}/extender/prioritize", json=body) as r:
                assert r.status == 200
                return {h["Host"]: h["Score"] for h in await r.json()}

        async def bind(node_name: str, count: int) -> bool:
            records = [
                BindingRecord(f"{node_name}-{i}", "default", f"{node_name}-{i}", node_name, time.time(), "crane")
                for i in range(count)
            ]
            try:
                await store.record(records, stream_maxlen=10_000)
            except (aioredis.ConnectionError, aioredis.TimeoutError, aioredis.ReadOnlyError):
                return False  # the failover under way
            return True

        async def lower(low: str, high: str) -> bool:
            s = await scores()
            return s[low] < s[high]

        await proc.start()
        try:
            await proc.wait_ready(lambda: _answers(f"{url}/readyz"), timeout=30)
            assert (await scores())["a"] == (await scores())["b"]
            await bind("a", 2)
            await eventually(lambda: lower("a", "b"), timeout=30, what="a's bindings lower its score")
            assert await redis.wait(1, 5000) == 1  # replicated before the kill
            await group.kill_primary()
            await eventually(lambda: bind("b", 4), timeout=60, interval=0.2, what="bindings written after the failover")
            await eventually(lambda: lower("b", "a"), timeout=30, what="b's bindings, read from the promoted replica")
            assert proc.running, "the extender died"
        finally:
            await proc.stop()
            await redis.aclose()


async def _answers(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
