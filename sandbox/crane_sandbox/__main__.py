"""``python -m crane_sandbox`` (``make sandbox``): the development sandbox until Ctrl-C.

A real control plane (etcd, kube-apiserver, kube-controller-manager), KWOK's simulated kubelets, a simulated
node-exporter fleet with uneven base load (and each pod's cAdvisor series), Prometheus, and the services
(event-recorder, annotator, scheduler, descheduler). By default crane-scheduler serves
``default-scheduler`` ("replace" mode, so any Deployment is scheduled by it unchanged); ``--mode second`` runs it
as a second scheduler (``schedulerName: crane-scheduler``) beside the real kube-scheduler. ``--autoscaler
karpenter`` adds Karpenter with its KWOK provider and a NodePool (built on first use: many minutes), and turns on
what makes load visible to it: a hot node grows the cluster, an emptied one is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import time

from crane_sandbox.devices import parse_devices, parse_node_devices
from crane_sandbox.fleet import LoadShape
from crane_sandbox.karpenter import NodePoolSettings
from crane_sandbox.kubebin import kubectl_binary
from crane_sandbox.sandbox import Autoscaler, Mode, Sandbox
from crane_sandbox.topology import TopologySpec, parse_node_topology
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
    parser.add_argument(
        "--numa-zones",
        type=int,
        default=2,
        help="NUMA zones of every node's NodeResourceTopology, splitting its CPUs and memory (default 2; 0: no NRT)",
    )
    parser.add_argument(
        "--reserved-cpus",
        default="",
        metavar="CPUSET",
        help="reservedSystemCPUs of every node, e.g. 0-1 (default none)",
    )
    parser.add_argument(
        "--node-topology",
        action="append",
        default=[],
        metavar="NODE=SPEC",
        help="one node's topology: ZONES[:reserved=CPUSET] or off, e.g. node-0001=4:reserved=0 (repeatable)",
    )
    parser.add_argument(
        "--devices",
        default="gpu=0",
        metavar="gpu=COUNT",
        help="simulated GPUs of every node, published as DRA ResourceSlices with DeviceClass gpu (default none)",
    )
    parser.add_argument(
        "--node-devices",
        action="append",
        default=[],
        metavar="NODE=gpu=COUNT",
        help="one node's GPUs, e.g. node-0003=gpu=0 for a node without any (repeatable)",
    )
    parser.add_argument(
        "--autoscaler",
        choices=["none", "karpenter"],
        default="none",
        help="karpenter: Karpenter (KWOK provider) adds nodes from a NodePool for pods no node can take and removes "
        "empty ones; the policy turns the load taint and packing on (default none; first use builds it: minutes)",
    )
    parser.add_argument(
        "--autoscaler-max-nodes",
        type=int,
        default=10,
        metavar="N",
        help="the NodePool's limit: at most N nodes added (8 CPUs each, like the sandbox's own; default 10)",
    )
    args = parser.parse_args()
    if args.nodes < 1:
        parser.error("--nodes must be at least 1")
    if args.autoscaler_max_nodes < 1:
        parser.error("--autoscaler-max-nodes must be at least 1")
    try:
        topology = TopologySpec(args.numa_zones, args.reserved_cpus)
        per_node = dict(parse_node_topology(t) for t in args.node_topology)
        devices = parse_devices(args.devices)
        node_devices = dict(parse_node_devices(d) for d in args.node_devices)
    except ValueError as err:
        parser.error(str(err))
    configure_logging("warning")
    autoscaler = None if args.autoscaler == "none" else args.autoscaler
    nodepool = NodePoolSettings(max_nodes=args.autoscaler_max_nodes)
    asyncio.run(run(args.nodes, args.load, args.mode, topology, per_node, devices, node_devices, autoscaler, nodepool))
    sys.exit(0)


async def run(
    nodes: int,
    load: LoadShape,
    mode: Mode,
    topology: TopologySpec,
    per_node: dict[str, TopologySpec],
    devices: int = 0,
    node_devices: dict[str, int] | None = None,
    autoscaler: Autoscaler | None = None,
    nodepool: NodePoolSettings | None = None,
) -> None:
    sandbox = Sandbox(
        nodes=nodes,
        load=load,
        mode=mode,
        topology=topology,
        node_topologies=per_node,
        devices=devices,
        node_devices=dict(node_devices or {}),
        autoscaler=autoscaler,
        nodepool=nodepool or NodePoolSettings(),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    built = "Kubernetes, KWOK and Karpenter" if autoscaler else "Kubernetes and KWOK"
    print(f"starting the sandbox (the first run builds {built}: minutes)...", flush=True)
    started = time.monotonic()
    kubectl = asyncio.create_task(asyncio.to_thread(kubectl_binary))  # the banner's line names its folder
    await sandbox.start()
    try:
        try:
            sandbox.kubectl = await kubectl
        except (OSError, subprocess.SubprocessError) as err:
            print(f"kubectl could not be built ({err}); the line below lacks it", flush=True)
        print("waiting for the first load annotations (until then placement ignores node load)...", flush=True)
        waiting = asyncio.ensure_future(sandbox.wait_load_aware())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([waiting, stopped], return_when=asyncio.FIRST_COMPLETED)
        if stopped.done():
            waiting.cancel()
            return
        print(sandbox.describe(), flush=True)
        elapsed = time.monotonic() - started
        if waiting.result():
            print(f"(up in {elapsed:.1f}s; placement is load-aware: every node carries its load annotations)")
        else:
            print(f"(up in {elapsed:.1f}s; WARNING: nodes still lack load annotations, see logs/annotator.log)")
        sys.stdout.flush()
        await stopped
    finally:
        print("\nstopping...", flush=True)
        await sandbox.stop()


if __name__ == "__main__":
    main()
