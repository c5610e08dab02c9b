"""The simulated node-exporter fleet of the docker-compose stack: N nodes registered in the KWOK cluster (KWOK
plays their kubelets) and one exporter serving their node-exporter series, whose usage follows the pods bound to
them. Development tool, built from the sandbox's parts; never part of the service images.

    python deploy/compose/fleet.py --kubeconfig deploy/compose/kubeconfig --nodes 10 --port 9100
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from kubernetes_asyncio.client import ApiClient

from crane_sandbox.exporter import FleetExporter
from crane_sandbox.fleet import FleetState, base_loads, make_fleet
from crane_sandbox.pod_follower import PodFollower, create_nodes
from crane_shared.kube import KubeSettings, make_api_client
from crane_shared.retry import Backoff, retry

STARTUP_ATTEMPTS = 30
"""the cluster may still be starting when the fleet does (compose starts them together): ~2 minutes of retries"""


async def run(args: argparse.Namespace) -> None:
    api = await make_api_client(KubeSettings(args.kubeconfig, None, 0.0, 100))
    try:
        await serve(args, api)
    finally:
        await api.close()


async def serve(args: argparse.Namespace, api: ApiClient) -> None:
    fleet = make_fleet(
        args.nodes, instance_styles=("ip:port", "ip", "name"), base_loads=base_loads("uneven", args.nodes)
    )
    await retry(
        lambda: create_nodes(api, fleet, kwok=True),
        attempts=STARTUP_ATTEMPTS,
        backoff=Backoff(initial=0.5, maximum=5.0),
        on_retry=lambda err, delay: print(f"fleet: cluster not ready ({err!s:.200}); retrying", flush=True),
    )
    state = FleetState(fleet)
    exporter = FleetExporter(state, host=args.host, port=args.port, shards=1)
    follower = PodFollower(api, state)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await exporter.start()
    follower.start()
    print(f"fleet: {len(fleet)} nodes, node-exporter series on http://{args.host}:{args.port}/metrics", flush=True)
    try:
        await stop.wait()
    finally:
        await follower.stop()
        await exporter.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
