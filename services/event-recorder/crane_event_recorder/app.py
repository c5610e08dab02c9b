"""The service shell: real Kubernetes and Redis clients, the HTTP runtime, and the recorder's workers."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from crane_event_recorder.metrics import RecorderMetrics
from crane_event_recorder.recorder import Recorder
from crane_event_recorder.settings import RecorderSettings
from crane_event_recorder.source import event_list_function, scope_name
from crane_shared.binding_store import BindingStore
from crane_shared.bindings import BindingSchema
from crane_shared.kube import make_api_client
from crane_shared.logs import get_logger
from crane_shared.redisconn import make_redis, redacted
from crane_shared.service import Access, ServiceRuntime
from crane_shared.settings import CommonSettings, RedisSettings

__all__ = ["redis_run_id", "serve"]

log = get_logger("crane.event_recorder")


async def serve(common: CommonSettings, redis_section: RedisSettings, settings: RecorderSettings) -> int:
    registry = CollectorRegistry()
    runtime = ServiceRuntime("event-recorder", common.listen_host, common.listen_port, registry)
    runtime.configure_access(Access(common.metrics_access), Access(common.debug_access), common.kube)
    api = await make_api_client(common.kube)
    redis = make_redis(redis_section)
    try:
        store = BindingStore(redis, BindingSchema(redis_section.prefix))
        namespaces: list[str | None] = list(settings.namespaces) or [None]
        scopes = {
            scope_name(settings.event_api, ns): event_list_function(api, settings.event_api, ns) for ns in namespaces
        }
        recorder = Recorder(
            store,
            scopes,
            RecorderMetrics(registry),
            settings,
            redis_server_id=lambda: redis_run_id(redis, redis_section.prefix),
        )
        runtime.add_readiness_check("first-list-recorded", recorder.ready)
        log.info(
            "starting",
            redis=redacted(redis_section.url),
            prefix=redis_section.prefix,
            event_api=settings.event_api.value,
            namespaces=list(settings.namespaces) or "all",
            retention_seconds=settings.retention,
        )
        return await runtime.run_workers(*recorder.parts())
    finally:
        await api.close()
        await redis.aclose()


async def redis_run_id(redis: aioredis.Redis, prefix: str = "crane") -> str:
    """Identity of the data we wrote: the Redis server process (changes on every restart and on failover) plus an
    epoch marker key, which disappears with the records when they are lost without a restart (FLUSHALL, FLUSHDB,
    eviction). ``SET NX`` makes every replica adopt the same new epoch, so each re-lists once."""
    info = await redis.info("server")
    run_id = info["run_id"]
    run = run_id.decode() if isinstance(run_id, bytes) else str(run_id)
    key = f"{prefix}:recorder-epoch"
    await redis.set(key, uuid.uuid4().hex, nx=True)
    epoch = await redis.get(key)
    return f"{run}/{epoch.decode() if isinstance(epoch, bytes) else epoch}"
