"""The one Redis client factory with Redis Sentinel, against real sentinels: the primary is killed, a replica is
promoted, and the same client follows it."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from crane_shared.redisconn import make_redis
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
