"""``python -m bench.event_recorder``: recording rate from a real watch and from a synthetic feed, next to
``redis-benchmark`` ZADD on the same Redis, plus an optional sustained run that checks the windows stay exact.

Defaults take about a minute; scale with the flags (the issue's sustained run is ``--sustain-seconds 300``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from crane_sandbox.cluster import LocalCluster, new_run_dir

from . import phases
from .redisbench import zadd_rate


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.event_recorder",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--synthetic-events", type=int, default=100_000, help="events in the synthetic-feed phase")
    p.add_argument("--watch-events", type=int, default=10_000, help="events created through the API server")
    p.add_argument("--concurrency", type=int, default=64, help="event creates in flight against the API server")
    p.add_argument("--nodes", type=int, default=100, help="nodes the bindings are spread over")
    p.add_argument("--zadd-requests", type=int, default=200_000, help="redis-benchmark -n")
    p.add_argument("--sustain-seconds", type=float, default=30.0, help="sustained phase length (0 skips it)")
    p.add_argument("--sustain-rate", type=float, default=1000.0, help="bindings per second in the sustained phase")
    p.add_argument(
        "--sustain-source",
        choices=["synthetic", "watch"],
        default="synthetic",
        help="feed the sustained phase from the synthetic feed or through the API server",
    )
    p.add_argument("--check-every", type=float, default=10.0, help="seconds between window checks")
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["synthetic", "watch", "zadd"],
        help="phases to leave out (repeatable)",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    async with LocalCluster(new_run_dir("bench-event-recorder")) as cluster:
        redis_url = cluster.redis_url.rsplit("/", 1)[0] + "/1"
        if "zadd" not in args.skip:
            single = await zadd_rate(cluster.redis.port, args.zadd_requests)
            piped = await zadd_rate(cluster.redis.port, args.zadd_requests, pipeline=16)
            results["redis_benchmark_zadd"] = {"per_second": single, "pipelined_16_per_second": piped}
            print(f"redis-benchmark ZADD: {single:,.0f}/s (50 clients), {piped:,.0f}/s (-P 16)")
        if "synthetic" not in args.skip:
            syn = await phases.synthetic(redis_url, args.synthetic_events, args.nodes)
            results["synthetic"] = asdict(syn)
            print(
                f"synthetic feed: parse only {syn.parse_per_second:,.0f} events/s; into Redis "
                f"{syn.record_per_second:,.0f} events/s over {syn.events:,} events"
            )
        if "watch" not in args.skip:
            w = await phases.real_watch(cluster, redis_url, args.watch_events, args.nodes, args.concurrency)
            results["watch"] = asdict(w)
            print(
                f"real watch: API server accepted {w.create_per_second:,.0f} events/s; recorded "
                f"{w.record_per_second:,.0f} events/s; last binding in Redis {w.tail_seconds * 1000:.0f} ms "
                f"after the last create; lag p50 <= {w.lag_p50 * 1000:.0f} ms, p99 <= {w.lag_p99 * 1000:.0f} ms"
            )
        zadd = results.get("redis_benchmark_zadd", {}).get("per_second")
        if zadd:
            for name in ("synthetic", "watch"):
                if name in results:
                    ratio = results[name]["record_per_second"] / zadd
                    results[name]["ratio_to_zadd"] = ratio
                    print(f"  {name}: {ratio:.2f} x redis-benchmark ZADD")
        if args.sustain_seconds > 0:
            s = await phases.sustain(
                cluster,
                redis_url,
                seconds=args.sustain_seconds,
                rate=args.sustain_rate,
                node_count=args.nodes,
                check_every=args.check_every,
                use_watch=args.sustain_source == "watch",
                concurrency=args.concurrency,
            )
            results["sustain"] = asdict(s)
            print(
                f"sustained ({s.source}): {s.achieved_per_second:,.0f}/s for {s.seconds:.0f} s, {s.bindings:,} "
                f"bindings; window checks {s.checks - s.mismatches}/{s.checks} exact; 5m window held "
                f"{s.max_window_count:,} bindings (upstream's heap keeps at most {s.upstream_kept:,})"
            )
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    sustain = results.get("sustain")
    return 1 if sustain and sustain["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
