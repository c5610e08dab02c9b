"""The descheduler process: flags in, servers and leader election up, rounds on the leader until SIGTERM.

Serves ``/healthz``, ``/readyz`` (ready once nodes and pods are listed), ``/metrics`` and ``/debug/plan`` (the
last round: node classes, evictions and their results, pods passed over by reason). The Lease has a client of
its own (``make_lease_client``), so renewals never queue behind evictions.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from crane_descheduler.config import DeschedulerConfig
from crane_descheduler.descheduler import Descheduler, Options
from crane_shared.kube import make_api_client
from crane_shared.leader import LeaderElector, make_lease_client
from crane_shared.loadaware.dynamic import DynamicArgs, EstimateArgs
from crane_shared.logs import get_logger
from crane_shared.policy import default_policy
from crane_shared.prometheus import PrometheusClient
from crane_shared.redisconn import redacted
from crane_shared.service import Access, ServiceRuntime

log = get_logger("crane.descheduler")


async def run(config: DeschedulerConfig) -> int:
    common = config.common
    registry = CollectorRegistry()
    runtime = ServiceRuntime("crane-descheduler", common.listen_host, common.listen_port, registry)
    runtime.configure_access(Access(common.metrics_access), Access(common.debug_access), common.kube)
    api = await make_api_client(common.kube)
    prometheus = PrometheusClient(config.prometheus)
    lease_api = None
    try:
        descheduler = Descheduler(
            api,
            prometheus,
            registry,
            Options(config.interval, config.usage_window, config.dry_run, config.lease.identity),
            config.scheduler_policy,
            config.policy,
            DynamicArgs(
                default_policy(),
                legacy_zone=config.legacy_zone,
                estimate=EstimateArgs(window=timedelta(seconds=config.estimate_window)),
            ),
            Path(config.scheduler_config) if config.scheduler_config else None,
        )
        lease_api = await make_lease_client(common.kube, config.lease)
        elector = LeaderElector(lease_api, config.lease, registry=runtime.registry)

        def on_change(leading: bool) -> None:
            runtime.leadership = "leader" if leading else "standby"

        elector.on_change = on_change

        def lead() -> Coroutine[Any, Any, None]:
            term = elector.term
            assert term is not None, "the elector begins the term before it calls lead"
            return descheduler.lead(term)

        async def plan(request: web.Request) -> web.Response:
            last = descheduler.last
            body = dataclasses.asdict(last) if last else {"leading": elector.is_leader, "rounds": 0}
            return web.json_response(body)

        runtime.app.router.add_get("/debug/plan", plan)
        runtime.leadership = "standby"
        runtime.add_readiness_check("caches-synced", lambda: descheduler.synced)
        log.info(
            "starting",
            policy=config.scheduler_policy or "default",
            descheduler_policy=config.policy or "default",
            prometheus=redacted(config.prometheus.url),
            interval=config.interval,
            dry_run=config.dry_run,
            lease=f"{config.lease.namespace}/{config.lease.name}",
            identity=config.lease.identity,
        )
        return await runtime.run(descheduler.run_caches(runtime.stopping), elector.run(lead, runtime.stopping))
    finally:
        with contextlib.suppress(Exception):
            await prometheus.close()
        with contextlib.suppress(Exception):
            await api.close()
        if lease_api is not None:
            with contextlib.suppress(Exception):
                await lease_api.close()
