"""``python -m crane_sandbox`` (``make sandbox``): the development sandbox until Ctrl-C.

A real control plane (etcd, kube-apiserver, kube-controller-manager), KWOK's simulated kubelets, a simulated
node-exporter fleet with uneven base load, Prometheus, and the three services. By default crane-scheduler serves
``default-scheduler`` ("replace" mode, so any Deployment is scheduled by it unchanged); ``--mode second`` runs it
as a second scheduler (``schedulerName: crane-scheduler``) beside the real kube-scheduler.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time

from crane_sandbox.fleet import LoadShape
from crane_sandbox.sandbox import Mode, Sandbox
from crane_shared.logs import configure_logging


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m crane_sandbox", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=10, help="number of simulated nodes (default 10)")
    parser.add_argument(
        "--load",
        choices=["uneven", "even"],
        default="uneven",
        help="base load of the nodes: spread from 10%% to 55%% CPU (default), or 10%% on every node",
    )
    parser.add_argument(
        "--mode",
        choices=["replace", "second"],
        default="replace",
        help="replace: crane-scheduler serves default-scheduler (default); second: beside the real kube-scheduler",
    )
    args = parser.parse_args()
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    configure_logging("warning")
    asyncio.run(run(args.nodes, args.load, args.mode))
    sys.exit(0)


async def run(nodes: int, load: LoadShape, mode: Mode) -> None:
    sandbox = Sandbox(nodes=nodes, load=load, mode=mode)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print("starting the sandbox (the first run builds Kubernetes and KWOK: minutes)...", flush=True)
    started = time.monotonic()
    await sandbox.start()
    try:
        print(f"{sandbox.describe()}\n(started in {time.monotonic() - started:.1f}s)", flush=True)
        await stop.wait()
    finally:
        print("\nstopping...", flush=True)
        await sandbox.stop()


if __name__ == "__main__":
    main()
