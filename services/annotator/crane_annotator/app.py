"""The annotator process: flags in, servers and leader election up, loops running until SIGTERM.

Serves ``/healthz``, ``/readyz`` (ready once the node list is synced), ``/metrics`` and ``/debug/nodes[/{name}]``.
The Kubernetes client is built without its shared rate limiter: ``--kube-api-qps``/``--kube-api-burst`` limit
node patches (see ``limiter``); the Lease has a client of its own (``make_lease_client``: own connection pool,
rate limiter and request timeout), so renewals never queue behind a round's patches.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Coroutine
from typing import Any

from prometheus_client import CollectorRegistry

from crane_annotator import debug
from crane_annotator.annotator import Annotator
from crane_annotator.config import AnnotatorConfig
from crane_shared.kube import make_api_client
from crane_shared.leader import LeaderElector, make_lease_client
from crane_shared.logs import get_logger
from crane_shared.prometheus import PrometheusClient
from crane_shared.redisconn import make_redis, redacted
from crane_shared.service import Access, ServiceRuntime

log = get_logger("crane.annotator")


async def run(config: AnnotatorConfig) -> int:
    common = config.common
    registry = CollectorRegistry()
    runtime = ServiceRuntime("crane-annotator", common.listen_host, common.listen_port, registry)
    runtime.configure_access(Access(common.metrics_access), Access(common.debug_access), common.kube)
    api = await make_api_client(dataclasses.replace(common.kube, qps=0))
    redis = make_redis(config.redis)
    prometheus = PrometheusClient(config.prometheus)
    annotator: Annotator | None = None
    lease_api = None
    try:
        annotator = Annotator(
            policy=config.policy,
            policy_path=config.policy_path,
            api=api,
            redis=redis,
            prometheus=prometheus,
            registry=registry,
            instance_label=config.instance_label,
            node_selector=config.node_selector,
            stamp=config.stamp,
            redis_prefix=config.redis.prefix,
            patch_qps=common.kube.qps,
            patch_burst=common.kube.burst,
            patch_concurrency=config.patch_concurrency,
            hot_value_interval=config.hot_value_interval,
            hot_value_debounce=config.hot_value_debounce,
            hot_value_max_age=config.hot_value_max_age,
            retry_base=config.retry_base,
            partial_response=config.prometheus.partial_response,
            latency_offset=config.prometheus.latency_offset,
            identity=config.lease.identity,
            load_taint_interval=config.load_taint_interval,
        )
        lease_api = await make_lease_client(common.kube, config.lease)
        elector = LeaderElector(lease_api, config.lease)
        annotator.patcher.may_write = lambda: elector.is_leader  # no PATCH leaves once the term has ended

        def on_change(leading: bool) -> None:
            annotator.on_leadership(leading)
            runtime.leadership = "leader" if leading else "standby"

        elector.on_change = on_change

        def lead() -> Coroutine[Any, Any, None]:
            """Called by the elector as a term begins: the writing workers stop when that term ends."""
            term = elector.term
            assert term is not None, "the elector begins the term before it calls lead"
            return annotator.lead(term.lost)

        runtime.leadership = "standby"
        runtime.add_readiness_check("nodes-synced", annotator.synced)
        debug.add_routes(
            runtime.app,
            lambda: annotator.cache.nodes,
            annotator.rounds,
            annotator.hot,
            annotator.written,
            lambda: annotator.leading,
            annotator.taints,
        )
        log.info(
            "starting",
            policy=config.policy_source,
            metrics={s.name: s.period_label for s in annotator.specs},
            prometheus=redacted(config.prometheus.url),
            prometheus_client=prometheus.describe(),
            redis=redacted(config.redis.url),
            lease=f"{config.lease.namespace}/{config.lease.name}",
            identity=config.lease.identity,
        )
        annotator.cache.informer.on_restart = lambda reason: annotator.metrics.node_watch_restarts.labels(reason).inc()
        return await runtime.run(
            annotator.watch(runtime.stopping),
            elector.run(lead, runtime.stopping),
        )
    finally:
        if annotator is not None:
            await annotator.close()
        with contextlib.suppress(Exception):
            await prometheus.close()
        with contextlib.suppress(Exception):
            await redis.aclose()
        with contextlib.suppress(Exception):
            await api.close()
        if lease_api is not None:
            with contextlib.suppress(Exception):
                await lease_api.close()
