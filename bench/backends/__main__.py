"""The annotator's round on each metrics backend, same fleet, same API server, same run.

Setup as ``bench.annotator`` (a local cluster with N nodes, the fleet exporter in its own process, crane's rules at
a 5 s scrape and evaluation), scraped by:

- Prometheus (the reference), also reached through a gateway that enforces a bearer token
  (``tests.support.promauth``) to price the auth hop;
- VictoriaMetrics single-node with vmalert evaluating the same rules (Debian's ``victoria-metrics``), queried under
  its ``/prometheus`` prefix with its default 30 s latency offset and ``--prometheus-latency-offset 30s``
  (``--vm-latency-offset``: both, another value);
- with ``--thanos``: Thanos Query over two Prometheus replicas with sidecars (``scripts/tools thanos`` builds it on
  first use), deduplicating on ``replica``; then one replica's Prometheus is stopped (its sidecar stays, as when a
  replica dies) and a round runs with ``--prometheus-partial-response`` reject and accept.

Each backend gets ``--rounds`` full rounds of the real annotator assembled in-process (every metric due, each timed
from the first query to the last patch: ``bench.annotator.ceiling``'s assembly), and the values it wrote are
compared with Prometheus's: a node's value equal within 0.001 (a tenth of a percentage point) counts as equal.

    .venv/bin/python -m bench.backends --nodes 1000
    .venv/bin/python -m bench.backends --nodes 1000 --thanos
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from bench.annotator.stack import METRICS, fleet, gather_setup, wait_for_series
from crane_annotator.annotator import Annotator
from crane_annotator.rounds import RoundReport
from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_sandbox.pki import make_pki
from crane_sandbox.prometheus import PrometheusServer
from crane_sandbox.thanos import REPLICA_LABEL, Query, Sidecar
from crane_sandbox.victoria import VictoriaMetrics, Vmalert
from crane_shared.annotations import annotation_key
from crane_shared.kube import api_client_from_dict
from crane_shared.policy import default_policy
from crane_shared.prometheus import PrometheusClient, PrometheusSettings
from crane_shared.redisconn import make_redis
from tests.support.promauth import AuthProxy

TOLERANCE = 0.001


@dataclass
class Backend:
    name: str
    settings: PrometheusSettings
    rounds: list[RoundReport] = field(default_factory=list)
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    """node -> annotation key -> value written by the last round"""
    note: str = ""


async def rounds_on(cluster: LocalCluster, backend: Backend, rounds: int) -> None:
    """``rounds`` full rounds of the annotator on ``backend`` (patches unlimited, 32 at once)."""
    api = await api_client_from_dict(cluster.kubeconfig_dict(), qps=0, burst=32)
    redis = make_redis(cluster.redis_url)
    prometheus = PrometheusClient(backend.settings)
    annotator = Annotator(
        policy=default_policy(),
        api=api,
        redis=redis,
        prometheus=prometheus,
        registry=CollectorRegistry(),
        patch_qps=0,
        patch_burst=100,
        patch_concurrency=32,
        partial_response=backend.settings.partial_response,
        latency_offset=backend.settings.latency_offset,
    )
    stopping = asyncio.Event()
    watch = asyncio.create_task(annotator.cache.run(stopping))
    try:
        await annotator.cache.synced.wait()
        for _ in range(rounds):
            report = await annotator.rounds.run_round(METRICS)
            backend.rounds.append(report)
            print(
                f"  {backend.name}: {report.duration:.2f} s (queries {report.query_seconds:.2f} s), "
                f"failed {report.failed or '-'}",
                flush=True,
            )
        for node, row in annotator.written.entries.items():
            backend.values[node] = {k: float(v.split(",")[0]) for k, (v, _) in row.items() if k in KEYS}
    finally:
        stopping.set()
        await asyncio.gather(watch, return_exceptions=True)
        await annotator.close()
        await prometheus.close()
        await redis.aclose()
        await api.close()


KEYS = tuple(annotation_key(m) for m in METRICS)


def equal_share(reference: Backend, other: Backend) -> tuple[int, int, float]:
    """(values equal within TOLERANCE, values compared, largest difference) over every node and key."""
    equal = compared = 0
    worst = 0.0
    for node, row in reference.values.items():
        for key, value in row.items():
            theirs = other.values.get(node, {}).get(key)
            if theirs is None:
                continue
            compared += 1
            worst = max(worst, abs(theirs - value))
            equal += abs(theirs - value) <= TOLERANCE
    return equal, compared, worst


@contextlib.asynccontextmanager
async def thanos_pair(
    run_dir: Path, targets: list[tuple[str, str]], rules: Path
) -> AsyncIterator[tuple[Query, list[PrometheusServer]]]:
    replicas = [
        PrometheusServer(
            run_dir,
            targets,
            rules=rules,
            scrape_interval="5s",
            evaluation_interval="5s",
            external_labels={REPLICA_LABEL: name},
            name=f"prometheus-{name}",
        )
        for name in ("a", "b")
    ]
    sidecars: list[Sidecar] = []
    query: Query | None = None
    try:
        for r in replicas:
            await r.start(timeout=60)
        # hourly heartbeats: a stopped replica's sidecar stays in Query's fan-out, so the partial rounds below see
        # partial answers however long the earlier rounds took (Query drops a sidecar that reports its Prometheus
        # down, within a minute at the default 30 s)
        sidecars = [Sidecar(run_dir, n, r.url, r.data_dir, heartbeat="1h") for n, r in zip("ab", replicas, strict=True)]
        for s in sidecars:
            await s.start()
        query = Query(run_dir, [s.grpc for s in sidecars])
        await query.start()
        yield query, replicas
    finally:
        for server in [query, *sidecars, *replicas]:
            if server is not None:
                with contextlib.suppress(Exception):
                    await server.stop()


async def wait_backend(url: str, n: int, timeout: float = 300) -> None:
    """Until every metric has a series for every node on the backend at ``url``."""
    client = PrometheusClient(PrometheusSettings(url, retries=0))
    deadline = time.monotonic() + timeout
    try:
        for metric in METRICS:
            while True:
                with contextlib.suppress(Exception):
                    result = await client.query(f"count({metric})")
                    if result.series and float(result.series[0].value) >= n:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{url}: {metric} not complete within {timeout:.0f}s")
                await asyncio.sleep(2)
    finally:
        await client.close()


def table(backends: Sequence[Backend], reference: Backend, nodes: int) -> str:
    lines = [
        f"annotator round at {nodes} nodes x {len(METRICS)} metrics, median of the rounds "
        f"(load average {os.getloadavg()[0]:.1f} at the end)",
        "",
        "backend                                   | round s | queries s | rounds ok | values equal to Prometheus's",
        "------------------------------------------|---------|-----------|-----------|-----------------------------",
    ]
    for b in backends:
        ok = sum(1 for r in b.rounds if not r.failed)
        equal, compared, worst = equal_share(reference, b)
        share = f"{equal}/{compared} (max diff {worst:.5f})" if compared else "- (nothing written)"
        lines.append(
            f"{b.name:42}| {statistics.median(r.duration for r in b.rounds):7.2f} | "
            f"{statistics.median(r.query_seconds for r in b.rounds):9.2f} | {ok:>4}/{len(b.rounds):<4} | {share}"
        )
        if b.note:
            lines.append(f"{'':42}  {b.note}")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    run_dir = new_run_dir("bench-backends")
    nodes = fleet(args.nodes)
    print(f"run directory: {run_dir}", flush=True)
    async with LocalCluster(run_dir) as cluster:
        kube = await api_client_from_dict(cluster.kubeconfig_dict(), burst=64)
        exporter, prometheus = await gather_setup(kube, nodes, run_dir)
        rules = run_dir / "bench-rules.yml"
        targets = prometheus.targets
        try:
            async with contextlib.AsyncExitStack() as stack:
                offset = args.vm_latency_offset
                vm = VictoriaMetrics(run_dir, targets, scrape_interval="5s", latency_offset=f"{offset:g}s")
                await stack.enter_async_context(vm)
                await stack.enter_async_context(Vmalert(run_dir, vm.url, rules, interval="5s"))
                pki = await asyncio.to_thread(make_pki, run_dir / "pki")
                token = run_dir / "token"
                token.write_text("bench-token\n")
                gateway = await stack.enter_async_context(AuthProxy(prometheus.url, "bearer", pki, token="bench-token"))
                thanos: tuple[Query, list[PrometheusServer]] | None = None
                if args.thanos:
                    thanos = await stack.enter_async_context(thanos_pair(run_dir, targets, rules))
                print("waiting for every series on every backend", flush=True)
                started = time.monotonic()
                await wait_for_series(prometheus, args.nodes)
                print(f"  Prometheus complete after {time.monotonic() - started:.0f} s", flush=True)
                await wait_backend(f"{vm.url}/prometheus", args.nodes)
                print(f"  VictoriaMetrics complete after {time.monotonic() - started:.0f} s", flush=True)
                if thanos is not None:
                    await wait_backend(thanos[0].url, args.nodes)
                    print(f"  Thanos complete after {time.monotonic() - started:.0f} s", flush=True)
                reference = Backend("Prometheus", PrometheusSettings(prometheus.url))
                backends = [
                    reference,
                    Backend(
                        "Prometheus via bearer-token gateway",
                        PrometheusSettings(gateway.url, bearer_token_file=str(token)),
                    ),
                    Backend(
                        f"VictoriaMetrics + vmalert (offset {offset:g}s)",
                        PrometheusSettings(f"{vm.url}/prometheus", latency_offset=offset),
                    ),
                ]
                if thanos is not None:
                    backends.append(Backend("Thanos Query, 2 replicas (dedup)", PrometheusSettings(thanos[0].url)))
                for b in backends:
                    await rounds_on(cluster, b, args.rounds)
                if thanos is not None:
                    await thanos[1][1].stop()  # replica b's Prometheus dies; its sidecar stays
                    base = PrometheusSettings(thanos[0].url)
                    for mode in ("reject", "accept"):
                        b = Backend(f"Thanos, replica b down, partial={mode}", replace(base, partial_response=mode))
                        await rounds_on(cluster, b, args.rounds)
                        b.note = "partial answers: every metric" if b.rounds[-1].failed else ""
                        backends.append(b)
                text = table(backends, reference, args.nodes)
                print("\n" + text)
                (run_dir / "backends-bench.txt").write_text(text + "\n")
        finally:
            await prometheus.stop()
            await exporter.stop()
            await kube.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.backends", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000, help="fleet size")
    parser.add_argument("--rounds", type=int, default=3, help="full rounds per backend")
    parser.add_argument("--thanos", action="store_true", help="also Thanos Query over two replicas (builds thanos)")
    parser.add_argument(
        "--vm-latency-offset",
        type=float,
        default=30.0,
        help="VictoriaMetrics' -search.latencyOffset and the annotator's --prometheus-latency-offset, seconds "
        "(default 30: VictoriaMetrics' own; the smoke run takes less to wait less)",
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
