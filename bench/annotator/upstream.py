"""Upstream's annotator round, reproduced request for request, to measure it against the same servers.

gocrane/crane-scheduler (pkg/controller/annotator/node.go, pkg/controller/prometheus/prometheus.go): for every
sync policy, every node is queued with the metric name; ONE worker takes the keys one by one and, per key:

1. ``QueryByNodeIP``: ``<metric>{instance=~"<InternalIP>"} /100``, and if that is empty
   ``<metric>{instance=~"<InternalIP>:.+"} /100``;
2. if still nothing, ``QueryByNodeName``: ``<metric>{instance=~"<node name>"} /100``;
3. a JSON patch (op ``add``, or ``replace`` when the key exists) of that one annotation;
4. a second JSON patch of ``node_hot_value`` (``annotateNodeHotValue`` runs after every metric that synced).

Each query has a 10 s timeout; the client POSTs to /api/v1/query like client_golang. Nothing runs in parallel.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
from kubernetes_asyncio import client

from crane_sandbox.fleet import SimNode

JSON_PATCH = "application/json-patch+json"
QUERY_TIMEOUT = 10.0


@dataclass
class UpstreamRun:
    keys_total: int
    keys_done: int = 0
    queries: int = 0
    patches: int = 0
    failed_keys: int = 0
    seconds: float = 0.0

    @property
    def capped(self) -> bool:
        return self.keys_done < self.keys_total

    def projected(self, amount: float) -> float:
        """``amount`` measured over the keys done, scaled to the full round."""
        return amount * self.keys_total / self.keys_done if self.keys_done else float("nan")


async def _query(session: aiohttp.ClientSession, url: str, promql: str, run: UpstreamRun) -> str:
    """upstream ``promClient.query``: the last element's value with 5 decimals, "" when the vector is empty."""
    run.queries += 1
    data = {"query": promql, "time": f"{time.time():.3f}"}
    async with session.post(f"{url}/api/v1/query", data=data) as resp:
        body = await resp.json(content_type=None)
    value = ""
    for element in body["data"]["result"]:
        number = float(element["value"][1])
        if number < 0 or number != number:
            number = 0.0
        value = f"{number:.5f}"
    return value


async def _patch(core: client.CoreV1Api, node: str, key: str, value: str, existing: set[str]) -> None:
    op = "replace" if key in existing else "add"
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = [{"op": op, "path": f"/metadata/annotations/{key}", "value": f"{value},{stamp}"}]
    resp = await core.patch_node(node, body, _content_type=JSON_PATCH, _preload_content=False)
    resp.release()
    existing.add(key)


async def upstream_round(
    prometheus_url: str,
    kube: client.ApiClient,
    nodes: Sequence[SimNode],
    metrics: Iterable[str],
    existing: dict[str, set[str]],
    *,
    time_cap: float,
) -> UpstreamRun:
    """Process the keys of one full round in upstream's order until done or ``time_cap`` seconds passed."""
    metrics = list(metrics)
    run = UpstreamRun(keys_total=len(nodes) * len(metrics))
    core = client.CoreV1Api(kube)
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=QUERY_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for metric in metrics:
            for node in nodes:
                if time.monotonic() - started >= time_cap:
                    run.seconds = time.monotonic() - started
                    return run
                have = existing.setdefault(node.name, set())
                value = await _query(session, prometheus_url, f'{metric}{{instance=~"{node.internal_ip}"}} /100', run)
                if not value:
                    value = await _query(
                        session, prometheus_url, f'{metric}{{instance=~"{node.internal_ip}:.+"}} /100', run
                    )
                if not value:
                    value = await _query(session, prometheus_url, f'{metric}{{instance=~"{node.name}"}} /100', run)
                if value:  # syncNode returns early (and requeues the key) when the load query failed
                    await _patch(core, node.name, metric, value, have)
                    await _patch(core, node.name, "node_hot_value", "0", have)
                    run.patches += 2
                else:
                    run.failed_keys += 1
                run.keys_done += 1
    run.seconds = time.monotonic() - started
    return run
