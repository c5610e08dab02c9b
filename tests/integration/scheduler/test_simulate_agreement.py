"""``cranectl snapshot`` then ``cranectl simulate`` agree with the live scheduler, across the process boundary.

Nodes of several sizes, zones, taints, GPUs (DRA) and real-load annotations; a snapshot taken by the ``cranectl``
command from the real API server; then seeded random pods (requests, node affinity, tolerations, topology spread,
claims of a GPU, a few that fit nowhere) placed by crane-scheduler running against that API server, one after
another, and the same pods simulated by ``cranectl simulate`` on the snapshot, in the same order with the same
seeded tie-break: every pod has the same feasible nodes and lands on the same node, or stays pending with the same
reason (the live message may add preemption's part). Not covered here: gangs (the live gang cycle orders its
members itself).
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import sys
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from tests.support.dra import claim, device, exactly, resource_slice
from tests.support.dra_cluster import devices, gpu_class
from tests.support.scheduler_cluster import (
    create_nodes,
    in_process,
    node,
    node_of,
    pod,
    read_pod,
    scheduled_condition,
    wait_for,
)
from tests.support.usage_cluster import annotate, dynamic_config

PODS = 300
NODES = 30
ZONES = ("a", "b", "c")
CLAIM_EVERY = 25
"""every 25th pod names a ResourceClaim of one GPU (4 nodes hold 2 each: 12 claims, 8 devices)"""
GPU_NODES = (0, 7, 14, 21)


def nodes_for(group: str, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(NODES):
        taints = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}] if i % 6 == 5 else []
        labels = {"topology.kubernetes.io/zone": ZONES[i % len(ZONES)]}
        cpu, memory = rng.choice([("4", "16Gi"), ("8", "32Gi"), ("16", "64Gi")])
        out.append(node(f"{group}-{i:02d}", group, cpu, memory, labels=labels, taints=taints))
    return out


def pods_for(scheduler: str, rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for i in range(PODS):
        cpu = rng.choice(["100m", "250m", "500m", "1", "2"])
        memory = rng.choice(["128Mi", "512Mi", "1Gi", "4Gi"])
        if i % 40 == 39:
            cpu = "64"  # fits nowhere
        spec: dict[str, Any] = {}
        app = f"app-{rng.randrange(4)}"
        shape = rng.random()
        if shape < 0.2:
            spec["affinity"] = {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "topology.kubernetes.io/zone",
                                        "operator": "In",
                                        "values": [rng.choice(ZONES)],
                                    }
                                ]
                            }
                        ]
                    }
                }
            }
        elif shape < 0.35:
            spec["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
        elif shape < 0.5:
            spec["topologySpreadConstraints"] = [
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": {"app": app}},
                }
            ]
        if i % CLAIM_EVERY == CLAIM_EVERY - 1:
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"gpu-{i:03d}"}]
        body = pod(f"p-{i:03d}", scheduler, cpu, memory, spec=spec)
        body["metadata"]["labels"] = {"app": app}
        out.append(body)
    return out


async def cranectl(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cranectl",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def outcome(kube: client.ApiClient, namespace: str, name: str) -> tuple[str, str] | None:
    """("node", name) once bound, ("pending", message) once reported unschedulable."""
    found = await read_pod(kube, namespace, name)
    if found and found["spec"].get("nodeName"):
        return "node", str(found["spec"]["nodeName"])
    cond = scheduled_condition(found)
    if cond and cond["status"] == "False" and cond.get("message"):
        return "pending", str(cond["message"])
    return None


async def test_simulate_on_a_snapshot_places_every_pod_where_the_live_scheduler_does(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
    tmp_path: Path,
) -> None:
    rng = random.Random(37)
    nodes = nodes_for(group, rng)
    await create_nodes(kube, nodes)
    for n in nodes:  # real load, stamped now: spread out so the load-aware score matters
        await annotate(
            kube, n["metadata"]["name"], round(rng.uniform(0.05, 0.6), 3), memory=round(rng.uniform(0.1, 0.5), 3)
        )
    driver = f"{group}.gpu.example.com"
    slices = [
        resource_slice(
            f"{group}-{i:02d}", [device(f"gpu-{d}", model="A100") for d in range(2)], node=f"{group}-{i:02d}"
        )
        for i in GPU_NODES
    ]
    await devices(kube, driver, [gpu_class(f"{group}-gpu", driver)], slices)
    dra = client.ResourceV1Api(kube)
    for i in range(CLAIM_EVERY - 1, PODS, CLAIM_EVERY):  # created before the snapshot: it has them unallocated
        body = claim(f"gpu-{i:03d}", exactly("gpu", f"{group}-gpu"), namespace=namespace)
        del body["metadata"]["uid"]
        await dra.create_namespaced_resource_claim(namespace, body)
    config = dynamic_config(scheduler_name)
    config_path, snap = tmp_path / "scheduler.yaml", tmp_path / "snapshot.json"
    config_path.write_text(yaml.safe_dump(config))
    kubeconfig = str(cluster.kubeconfig_path)
    said = await cranectl(
        "snapshot",
        "--kubeconfig",
        kubeconfig,
        "--node-selector",
        selector,
        "--config",
        str(config_path),
        "-o",
        str(snap),
    )
    assert f"{NODES} Node" in said, said
    assert f"{PODS // CLAIM_EVERY} ResourceClaim" in said, said
    pods = pods_for(scheduler_name, rng)
    manifests = tmp_path / "pods.yaml"
    as_manifests = [
        {"apiVersion": "v1", "kind": "Pod", **p, "metadata": {**p["metadata"], "namespace": namespace}} for p in pods
    ]
    manifests.write_text(yaml.safe_dump_all(as_manifests))

    live: dict[str, tuple[str, str]] = {}
    feasible: dict[str, set[str]] = {}  # the live decision's feasible nodes (its explain record)
    v1 = client.CoreV1Api(kube)
    async with in_process(cluster, config, selector, load_aware=True) as scheduler:
        scheduler.algorithm.rng = random.Random(0)  # the simulator's seeded tie-break, from the same start
        scheduler.algorithm.next_start = 0
        for p in pods:  # one at a time: each decision sees the ones before, as the simulation does
            name = p["metadata"]["name"]
            await v1.create_namespaced_pod(namespace, p)
            live[name] = await wait_for(functools.partial(outcome, kube, namespace, name), what=f"{name} decided")
            decision = scheduler.decisions.get(f"{namespace}/{name}")
            assert decision is not None, name
            feasible[name] = {n for n, v in decision.verdicts().items() if v["filter"] == "passed"}
            if live[name][0] == "pending":  # out of the way: no retry can change what came after
                await v1.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    simulated = json.loads(
        await cranectl("simulate", "--snapshot", str(snap), "-f", str(manifests), "-o", "json", "--feasible")
    )["runs"][0]["pods"]
    assert len(simulated) == PODS
    disagreements = []
    for s in simulated:
        name = s["pod"].split("/", 1)[1]
        kind, value = live[name]
        if kind == "node" and s["node"] != value:
            disagreements.append(f"{name}: live {value}, simulated {s['node'] or 'pending: ' + s['reason']}")
        if kind == "pending" and (s["node"] is not None or not value.startswith(s["reason"].rstrip("."))):
            disagreements.append(f"{name}: live pending ({value}), simulated {s['node'] or s['reason']}")
        if set(s["feasible"]) != feasible[name]:
            disagreements.append(f"{name}: feasible live {sorted(feasible[name])}, simulated {sorted(s['feasible'])}")
    assert disagreements == []
    pending = [v for k, v in live.values() if k == "pending"]
    print(f"{PODS - len(pending)} placed, {len(pending)} pending, 0 disagreements")
    assert len(pending) >= PODS // 40  # the ones that fit nowhere at least
    assert PODS - len(pending) >= PODS // 2  # a test of placements, not of refusals
    with_gpu = [f"p-{i:03d}" for i in range(CLAIM_EVERY - 1, PODS, CLAIM_EVERY)]
    assert 0 < sum(1 for n in with_gpu if live[n][0] == "node") <= 2 * len(GPU_NODES)  # devices allocated, once each
    assert await node_of(kube, namespace, "p-000") is not None

    # without --snapshot: the live cluster read once, nothing written to it (the placed pods count as they are)
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump({**as_manifests[0], "metadata": {"name": "what-if", "namespace": namespace}}))
    before = len((await v1.list_namespaced_pod(namespace)).items)
    said = await cranectl(
        "simulate",
        "--kubeconfig",
        kubeconfig,
        "--node-selector",
        selector,
        "--config",
        str(config_path),
        "-f",
        str(one),
    )
    assert f"{namespace}/what-if" in said
    assert len((await v1.list_namespaced_pod(namespace)).items) == before
