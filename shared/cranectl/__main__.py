"""cranectl: the operator's tool. ``cranectl sandbox`` runs the local cluster with the three services;
``cranectl explain NS/POD`` asks the scheduler why a pod landed where it did, or why it is still pending."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import urllib.error
import urllib.request
from typing import Any

from crane_shared.logs import configure_logging


def _sandbox(args: argparse.Namespace) -> int:
    from crane_sandbox.sandbox import Sandbox

    async def run() -> None:
        sandbox = Sandbox(nodes=args.nodes)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print("starting the sandbox (the first run builds kube-apiserver: minutes)...", flush=True)
        await sandbox.start()
        try:
            print(sandbox.describe(), flush=True)
            await stop.wait()
        finally:
            print("\nstopping...", flush=True)
            await sandbox.stop()

    asyncio.run(run())
    return 0


def _explain(args: argparse.Namespace) -> int:
    url = f"{args.scheduler.rstrip('/')}/debug/explain/{args.pod}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as err:
        print(f"{args.pod}: {err.read().decode(errors='replace').strip() or err}", file=sys.stderr)
        return 1
    except urllib.error.URLError as err:
        print(f"cannot reach the scheduler at {args.scheduler}: {err.reason}", file=sys.stderr)
        return 2
    print(json.dumps(body, indent=2) if args.output == "json" else render_explain(body))
    return 0


def render_explain(body: dict[str, Any]) -> str:
    """The decision as a person reads it: the outcome, then one line per node (best first, rejected last)."""
    result = body["result"]
    head = (
        f"{body['pod']}: scheduled to {result['node']}"
        if "node" in result
        else f"{body['pod']}: pending: {result['pending']}"
    )
    lines = [head]
    if result.get("numaZones"):
        zones = ", ".join(
            f"{z['name']} ({' '.join(f'{k}={v}' for k, v in z['capacity'].items())})" for z in result["numaZones"]
        )
        lines.append(f"NUMA zones: {zones}")
    lines.append(f"feasible nodes: {body['feasibleNodes']}")
    for n in body["nodes"]:
        load = n.get("load", {})
        metrics = load.get("metrics", {})
        usage = " ".join(
            f"{m}={v['usage']:.2f}" for m, v in metrics.items() if v.get("usage") is not None and m.endswith("avg_5m")
        )
        hot = load.get("hotValue", {})
        extra = f"  [{usage}{' hot=' + str(hot.get('total')) if hot else ''}]" if load else ""
        if n["filter"] == "passed":
            scores = ", ".join(f"{k} {v}" for k, v in n.get("scores", {}).items())
            lines.append(f"  {n['node']:24} total {n.get('total', 0):>5}  {scores}{extra}")
        else:
            lines.append(f"  {n['node']:24} refused by {n['filter']['plugin']}: {n['filter']['reason']}{extra}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="cranectl", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sb = sub.add_parser("sandbox", help="run a local cluster with the three services until Ctrl-C")
    sb.add_argument("--nodes", type=int, default=10, help="number of simulated nodes")
    sb.set_defaults(func=_sandbox)
    ex = sub.add_parser("explain", help="why a pod was placed where it is, or why it is still pending")
    ex.add_argument("pod", help="NAMESPACE/NAME")
    ex.add_argument("--scheduler", default="http://127.0.0.1:10261", help="base URL of the scheduler's HTTP server")
    ex.add_argument("-o", "--output", choices=["text", "json"], default="text")
    ex.set_defaults(func=_explain)
    args = parser.parse_args()
    configure_logging("warning")
    sys.exit(args.func(args))


if __name__ == "__main__":
    main()
