"""The annotator's writing workers keep the worker contract: ``lead(stopping)`` returns once its term ends
(``stopping``), without being cancelled, whatever its loops were waiting on (here: Redis down, so the stream
follower is backing off, and the next metric round minutes away)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from crane_annotator.annotator import Annotator
from crane_sandbox.procs import free_port
from crane_shared.policy import default_policy
from crane_shared.prometheus import QueryResult
from crane_shared.redisconn import make_redis
from tests.support.fakeapi import FakeApiServer, fake_api


class NoSeries:
    """A Prometheus that answers every query with no series."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    async def query(self, promql: str) -> QueryResult:
        self.queries.append(promql)
        return QueryResult([], 1)


async def test_lead_and_the_node_cache_return_when_stopping_is_set() -> None:
    node = {"kind": "Node", "metadata": {"name": "n1", "resourceVersion": "5"}, "status": {"addresses": []}}
    server = FakeApiServer(objects=[node], rv="5")
    # the service's own client (a bare ``redis.asyncio.Redis`` would retry each failed call ten times: ~4 s)
    redis_down = make_redis(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2, socket_timeout=0.2)
    prometheus = NoSeries()
    async with fake_api(server) as api:
        annotator = Annotator(
            policy=default_policy(),
            api=api,
            redis=redis_down,
            prometheus=prometheus,  # type: ignore[arg-type]
            registry=CollectorRegistry(),
            hot_value_interval=0.05,
        )
        stopping = asyncio.Event()
        cache = asyncio.create_task(annotator.cache.run(stopping))
        lead = asyncio.create_task(annotator.lead(stopping))
        try:
            await asyncio.wait_for(annotator.rounds.first_round_done.wait(), 10)
            await asyncio.sleep(0.2)  # the periodic pass and the followers are running (and failing on Redis)
            assert not lead.done()
            stopping.set()
            # A loop sees ``stopping`` once its Redis call in flight gives up: at once against a refused port
            await asyncio.wait_for(asyncio.gather(lead, cache), 5)
        finally:
            stopping.set()
            await annotator.close()
            await redis_down.aclose()
    assert not lead.cancelled() and lead.exception() is None
    assert sorted(prometheus.queries) == sorted(s.name for s in default_policy().sync_policy)  # one round only
