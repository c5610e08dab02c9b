"""The bench's server process: the real extender handlers with a synced node cache, and a JSON-only reference.

A module of its own so that a spawned process can import it (``__main__`` cannot be re-imported).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from bench.extender.workload import fleet
from crane_extender.recent import RecentBindings
from crane_extender.server import Extender, ExtenderMetrics, make_app
from crane_shared.bindings import BindingRecord
from crane_shared.informer import Informer
from crane_shared.loadaware.dynamic import DynamicArgs, binding_horizon
from crane_shared.policy import default_policy


async def _no_list(**kw: Any) -> Any:
    raise RuntimeError("the bench fills the cache itself")


def serve(port: int, cached_nodes: int, ready: Any) -> None:
    """Child process: the extender with a synced node cache and recent bindings, plus a JSON-only reference."""

    async def echo(request: web.Request) -> web.Response:
        json.loads(await request.content.read())
        return web.json_response({})

    async def main() -> None:
        args = DynamicArgs(default_policy())
        informer = Informer("nodes", _no_list)
        informer.cache.update({n["metadata"]["name"]: n for n in fleet(cached_nodes)})
        informer.synced.set()
        recent = RecentBindings(binding_horizon(args))
        now = time.time()
        for k in range(1000):
            recent.add(
                BindingRecord(
                    f"b{k}", "shop", f"p{k}", f"node-{k * 7 % cached_nodes + 1:05d}", now - k * 0.2, "default-scheduler"
                ),
                now,
            )
        extender = Extender(args, informer=informer, recent=recent, metrics=ExtenderMetrics.create(CollectorRegistry()))
        app = web.Application()
        app.add_subapp("/extender", make_app(extender))
        app.router.add_post("/echo", echo)

        async def clear_memo(request: web.Request) -> web.Response:
            extender.memo.clear()  # the next request computes every node's load: the cold case
            return web.json_response({})

        app.router.add_post("/clear-memo", clear_memo)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())
