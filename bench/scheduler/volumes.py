"""SchedulingCSIPVs (scheduler_perf), scaled to this machine: crane-scheduler against kube-scheduler.

A fresh local cluster, N nodes (4 cpu, 32Gi, 110 pods) each with a CSINode allowing 39 volumes of one CSI
driver; for each contender, in a fresh namespace, P pods each mounting its own claim, bound beforehand to its own
CSI PersistentVolume (claim ``volumeName`` and ``pv.kubernetes.io/bind-completed``, PV ``claimRef``, as the PV
controller leaves them). Every pod goes through VolumeBinding (bound claims, PV lookup), NodeVolumeLimits (the
per-node CSI count), VolumeZone and VolumeRestrictions. Throughput is pods / (last bind - first bind). The
default size is scheduler_perf's ``500Nodes`` (500 nodes, 1,000 measured pods; its 500 pods bound beforehand are
left out); at 100 nodes / 500 pods a burst lasts about a second, mostly start-up.

    .venv/bin/python -m bench.scheduler.volumes --nodes 500 --pods 1000
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from bench.scheduler.__main__ import Run, create_nodes, fresh_namespace, gather_limited
from bench.scheduler.preemption import add_py_spy, measure_spied, print_runs, scheduler_process
from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_shared.kube import api_client_from_dict

DRIVER = "csi.bench.example.com"


async def create_csinodes(api: client.ApiClient, nodes: int) -> None:
    storage = client.StorageV1Api(api)

    async def one(i: int) -> None:
        name = f"node-{i:05d}"
        body = {
            "metadata": {"name": name},
            "spec": {"drivers": [{"name": DRIVER, "nodeID": name, "allocatable": {"count": 39}}]},
        }
        (await storage.create_csi_node(body, _preload_content=False)).release()

    await gather_limited([one(i) for i in range(nodes)], 100)


def workload_objects(namespace: str, i: int, scheduler: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The i-th PV, its claim (bound to it, as the PV controller leaves them) and the pod mounting it."""
    claim, volume = f"data-{i:05d}", f"{namespace}-pv-{i:05d}"
    pv = {
        "metadata": {"name": volume},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": DRIVER, "volumeHandle": volume},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    pvc = {
        "metadata": {"name": claim, "annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "volumeName": volume,
            "storageClassName": "",
        },
    }
    pod = {
        "metadata": {"name": f"pod-{i:05d}"},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "pause",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "100m", "memory": "500Mi"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }
    return pv, pvc, pod


async def create_workload(api: client.ApiClient, namespace: str, pods: int, scheduler: str) -> None:
    core = client.CoreV1Api(api)

    async def one(i: int) -> None:
        pv, pvc, pod = workload_objects(namespace, i, scheduler)
        (await core.create_persistent_volume(pv, _preload_content=False)).release()
        (await core.create_namespaced_persistent_volume_claim(namespace, pvc, _preload_content=False)).release()
        (await core.create_namespaced_pod(namespace, pod, _preload_content=False)).release()

    await gather_limited([one(i) for i in range(pods)], 100)


async def contender(
    label: str, cluster: LocalCluster, api: client.ApiClient, run_dir: Path, args: argparse.Namespace
) -> Run:
    proc = scheduler_process(label, cluster, run_dir, args)
    namespace = await fresh_namespace(api, f"pv-{label}")
    await create_workload(api, namespace, args.pods, f"{label}-bench")
    try:
        return await measure_spied(label, proc, api, namespace, run_dir, args)
    finally:
        await proc.stop()
        (
            await client.CoreV1Api(api).delete_collection_namespaced_pod(
                namespace, grace_period_seconds=0, _preload_content=False
            )
        ).release()


async def run(args: argparse.Namespace) -> list[Run]:
    run_dir = new_run_dir("bench-volumes")
    async with LocalCluster(run_dir) as cluster:
        api = await api_client_from_dict(cluster.kubeconfig_dict())
        try:
            await create_nodes(api, args.nodes)
            await create_csinodes(api, args.nodes)
            return [await contender(label, cluster, api, run_dir, args) for label in ("crane", "kube")]
        finally:
            await api.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.scheduler.volumes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--qps", type=float, default=5000)
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--timeout", type=float, default=600)
    add_py_spy(parser)
    args = parser.parse_args()
    results = asyncio.run(run(args))
    print(f"SchedulingCSIPVs: {args.nodes} nodes, {args.pods} pods with bound CSI volumes")
    print_runs(results)


if __name__ == "__main__":
    main()
