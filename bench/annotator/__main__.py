"""The annotator at fleet scale: its patch budget, and one round next to upstream's algorithm, same servers, same run.

Setup: a local cluster (etcd + kube-apiserver) with N nodes, the simulated fleet's node-exporter series (instance
labels alternating IP, IP:port and node name) served by a separate process, and a real Prometheus recording the
six default-policy metrics for every node. Then:

0. patch budget (``bench.annotator.budget``): the real annotator leading at the default client QPS (50), no
   bindings, node PATCHes counted by the API server: the first round (start-up) and ``--budget-periods`` more
   periods; target exactly N per period and N before the first round completes;
1. ours against the bare node-patch ceiling (``bench.annotator.ceiling``): ``--rounds`` full rounds of the real
   annotator assembled in-process (node watch, Redis hot values with its hot-value pass, Prometheus client,
   patcher), every metric due, each timed from the first query to the last patch, interleaved with bare runs of
   the same patches (same client, concurrency, rate limit, keys and value formats; strict: no watch open,
   watched: the annotator's node watch open); each round is divided by the watched runs either side of it;
2. upstream-style (``bench.annotator.upstream``): one worker, per node and per metric up to three queries and two
   JSON patches, stopped after ``--upstream-seconds`` (it would take far longer) and projected to the full
   round from the keys it completed, which cycle over all three instance styles.

    .venv/bin/python -m bench.annotator                               # 5,000 nodes x 6 metrics
    .venv/bin/python -m bench.annotator --nodes 500 --upstream-seconds 20   # a quick run
    .venv/bin/python -m bench.annotator --nodes 1000 --budget-period 60   # budget on a 1m period (faster)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from bench.annotator.budget import Budget, patch_budget
from bench.annotator.ceiling import Measured, Run, Settings, measure
from bench.annotator.stack import METRICS, fleet, gather_setup, wait_for_series
from bench.annotator.upstream import UpstreamRun, upstream_round
from crane_annotator.rounds import RoundReport
from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_shared.kube import api_client_from_dict


async def existing_annotations(cluster: LocalCluster) -> dict[str, set[str]]:
    """What upstream's informer would know: the annotation keys each node has (add vs replace)."""
    api = await api_client_from_dict(cluster.kubeconfig_dict())
    try:
        resp = await client.CoreV1Api(api).list_node(_preload_content=False)
        items = json.loads(await resp.read())["items"]
    finally:
        await api.close()
    return {i["metadata"]["name"]: set(i["metadata"].get("annotations") or {}) for i in items}


def budget_report(b: Budget) -> list[str]:
    floor = b.nodes / b.qps if b.qps > 0 else 0.0
    lines = [
        f"patch budget: real annotator leading, {b.nodes} nodes, period {b.period:g} s, client QPS {b.qps:g}, "
        "no bindings; node PATCHes counted by kube-apiserver (apiserver_request_total)",
        f"  start-up: first round {b.first_round_seconds:.1f} s (QPS floor N/QPS = {floor:.1f} s), "
        f"{b.startup_patches} node patches before it completed = {b.startup_patches / b.nodes:.3f} per node, "
        f"most on one node {b.startup_max_per_node}",
    ]
    for i, count in enumerate(b.per_period, 1):
        lines.append(f"  period {i}: {count} node patches = {count / b.nodes:.3f} per node")
    if b.per_period:
        lines.append(f"  patches per period / N: {b.ratio:.3f} (target 1.0)")
    for i, r in enumerate(b.rounds, 1):
        lines.append(
            f"  round {i}: {r.duration:.1f} s ({r.query_seconds:.2f} s queries, {r.patches.sent} patches, "
            f"{len(r.patches.failed)} failed)"
        )
    return lines


def report(
    args: argparse.Namespace, m: Measured, up: UpstreamRun, load: tuple[float, float], budget: Budget | None
) -> str:
    n, k = args.nodes, len(METRICS)
    qps_note = "unlimited" if m.settings.qps <= 0 else f"{m.settings.qps:g} (burst {m.settings.burst})"
    lines = [
        *([*budget_report(budget), ""] if budget else []),
        f"annotator round: {n} nodes x {k} metrics; {os.cpu_count()} CPUs shared with etcd, kube-apiserver, "
        f"Prometheus, the exporter (load average {load[0]:.1f} at start, {load[1]:.1f} at the end); ours and "
        f"the bare patches alike: patch QPS {qps_note}, concurrency {m.settings.concurrency}, same client "
        f"(NodePatcher), same seven annotation keys; node list + watch synced in {m.synced:.2f} s",
        "",
        f"{'in run order':34}{'wall s':>9}{'CPU s':>8}{'CPU ms/node':>13}{'query s':>9}{'patch s':>9}{'queries':>9}",
    ]

    def row(label: str, run: Run, r: RoundReport | None = None) -> str:
        extra = f"{r.query_seconds:>9.2f}{r.patch_seconds:>9.2f}{r.queries:>9}" if r else ""
        return f"{label:34}{run.seconds:>9.2f}{run.cpu:>8.2f}{1000 * run.cpu / n:>13.2f}{extra}"

    lines.append(row("bare, no watch (strict)", m.strict[0]))
    lines.append(row("bare, watch open", m.watched[0]))
    for i, (ours, r) in enumerate(zip(m.ours, m.rounds, strict=True), 1):
        lines.append(row(f"ours, round {i}", ours, r))
        lines.append(row("bare, watch open", m.watched[i]))
    lines.append(row("bare, no watch (strict)", m.strict[-1]))
    paired = m.paired()
    prepare = min(r.duration - r.patch_seconds for r in m.rounds)
    lines += [
        "",
        "round / bare ceiling, same run:",
        f"  each round / mean of the watched bare runs either side: {', '.join(f'{x:.2f}' for x in paired)} "
        f"(median {m.paired_median():.2f})",
        f"  best round / best strict bare run (no watch): {m.strict_ratio():.2f}",
        f"  queries + matching + hot values before the first patch: {prepare:.2f} s (best round)",
        "",
        f"{'upstream-style':34}{'wall s':>9}{'queries':>9}{'patches':>9}",
        f"{'measured' + (' (capped)' if up.capped else ''):34}{up.seconds:>9.1f}{up.queries:>9}{up.patches:>9}",
    ]
    if up.capped:
        lines.append(
            f"{'full round (projected)':34}{up.projected(up.seconds):>9.0f}"
            f"{up.projected(up.queries):>9.0f}{up.projected(up.patches):>9.0f}"
        )
        lines.append(
            f"  projected linearly from {up.keys_done} of {up.keys_total} (node, metric) keys done in "
            f"{up.seconds:.0f} s; the keys done cycle over the IP, IP:port and name instance styles"
        )
    if up.failed_keys:
        lines.append(f"  upstream-style: {up.failed_keys} keys found no series")
    if m.settings.qps <= 0:
        lines.append(f"at the default --kube-api-qps 50 the {n} patches take >= {n / 50:.0f} s (inside the 3m period)")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> None:
    run_dir = new_run_dir("bench-annotator")
    nodes = fleet(args.nodes)
    print(f"run directory: {run_dir}", flush=True)
    async with LocalCluster(run_dir) as cluster:
        kube = await api_client_from_dict(cluster.kubeconfig_dict(), burst=64)
        exporter = prometheus = None
        try:
            t0 = time.monotonic()
            exporter, prometheus = await gather_setup(kube, nodes, run_dir)
            print(
                f"{args.nodes} nodes created, Prometheus up in {time.monotonic() - t0:.0f} s; waiting for series",
                flush=True,
            )
            await wait_for_series(prometheus, args.nodes)
            print("every metric has a series for every node; measuring", flush=True)
            load_start = os.getloadavg()[0]
            budget = None
            if args.budget_periods > 0:
                print("patch budget: the annotator leading, no bindings", flush=True)
                budget = await patch_budget(
                    cluster,
                    prometheus.url,
                    period=args.budget_period,
                    periods=args.budget_periods,
                    qps=args.budget_qps,
                    nodes=args.nodes,
                )
            names = [n.name for n in nodes]
            settings = Settings(args.patch_concurrency, args.kube_api_qps, max(100, args.patch_concurrency))
            print(f"our rounds against bare patches, {settings}", flush=True)
            profile = str(run_dir / "ours.prof") if args.profile else None
            measured = await measure(cluster, prometheus.url, names, METRICS, args.rounds, settings, profile)
            load = (load_start, os.getloadavg()[0])
            existing = await existing_annotations(cluster)
            up = await upstream_round(prometheus.url, kube, nodes, METRICS, existing, time_cap=args.upstream_seconds)
            text = report(args, measured, up, load, budget)
            print("\n" + text)
            results: dict[str, Any] = {
                "nodes": args.nodes,
                "metrics": list(METRICS),
                "load_average": {"start": load[0], "end": load[1]},
                "settings": asdict(measured.settings),
                "ours": [
                    {
                        "seconds": r.duration,
                        "query_seconds": r.query_seconds,
                        "patch_seconds": r.patch_seconds,
                        "cpu_seconds": run.cpu,
                        "queries": r.queries,
                        "patches": r.patches.sent,
                        "patch_errors": len(r.patches.failed),
                    }
                    for r, run in zip(measured.rounds, measured.ours, strict=True)
                ],
                "bare_strict": [asdict(r) for r in measured.strict],
                "bare_watched": [asdict(r) for r in measured.watched],
                "round_over_watched_bare": measured.paired(),
                "round_over_watched_bare_median": measured.paired_median(),
                "best_round_over_best_strict_bare": measured.strict_ratio(),
                "budget": None
                if budget is None
                else {
                    "period": budget.period,
                    "qps": budget.qps,
                    "first_round_seconds": budget.first_round_seconds,
                    "startup_patches": budget.startup_patches,
                    "startup_max_per_node": budget.startup_max_per_node,
                    "per_period": budget.per_period,
                    "patches_per_period_per_node": budget.ratio,
                    "round_seconds": [r.duration for r in budget.rounds],
                },
                "upstream": asdict(up)
                | {
                    "projected_seconds": up.projected(up.seconds),
                    "projected_queries": up.projected(up.queries),
                    "projected_patches": up.projected(up.patches),
                },
            }
            (run_dir / "annotator-bench.json").write_text(json.dumps(results, indent=2))
            if args.json is not None:
                args.json.write_text(json.dumps(results, indent=2))
            (run_dir / "annotator-bench.txt").write_text(text + "\n")
        finally:
            if prometheus is not None:
                await prometheus.stop()
            if exporter is not None:
                await exporter.stop()
            await kube.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.annotator", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000, help="fleet size")
    parser.add_argument("--rounds", type=int, default=3, help="full rounds of ours to time")
    parser.add_argument(
        "--upstream-seconds",
        type=float,
        default=60.0,
        help="stop the upstream-style round after this long and project the rest",
    )
    parser.add_argument(
        "--kube-api-qps",
        type=float,
        default=0.0,
        help="patch rate limit of our rounds and of the bare runs alike (0: unlimited, to measure the round)",
    )
    parser.add_argument(
        "--patch-concurrency", type=int, default=64, help="patches in flight, ours and the bare runs alike"
    )
    parser.add_argument(
        "--budget-periods", type=int, default=2, help="periods to count after the first round (0: skip the budget)"
    )
    parser.add_argument(
        "--budget-period",
        type=float,
        default=None,
        help="put every metric on this period (seconds) for the budget; default: the default policy (3m)",
    )
    parser.add_argument("--budget-qps", type=float, default=50.0, help="client QPS of the budget run (default 50)")
    parser.add_argument("--profile", action="store_true", help="cProfile our rounds into <run dir>/ours.prof")
    parser.add_argument("--json", type=Path, help="also write the figures to this file (for bench.check)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
