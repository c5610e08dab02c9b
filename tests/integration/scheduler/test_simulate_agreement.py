"""``cranectl snapshot`` then ``cranectl simulate`` agree with the live scheduler, across the process boundary.

Nodes of several sizes, zones, taints, GPUs (DRA) and real-load annotations; a snapshot taken by the ``cranectl``
command from the real API server; then seeded random pods (requests, node affinity, tolerations, topology spread,
claims of a GPU, a few that fit nowhere) placed by crane-scheduler running against that API server, one after
another, and the same pods simulated by ``cranectl simulate`` on the snapshot, in the same order with the same
seeded tie-break: every pod has the same feasible nodes and lands on the same node, or stays pending with the same
message, preemption's part included (the simulation dry-runs DefaultPreemption). Gangs in their own test:
PodGroups placed whole or not at all by the live gang cycle and by the simulation alike. And a preemption: the node
and the victim the simulation names are those the live scheduler nominates and evicts.
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
from crane_sandbox.rbac import service_identity
from tests.support.dra import claim, device, exactly, resource_slice
from tests.support.dra_cluster import devices, gpu_class
from tests.support.gangs import COSCHEDULING, create_group, members
from tests.support.scheduler_cluster import (
    create_nodes,
    create_pods,
    in_process,
    node,
    node_of,
    pod,
    read_pod,
    scheduled_condition,
    victim,
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


def apart(gang: str, hosts: list[str]) -> dict[str, Any]:
    """On ``hosts`` only, one member of ``gang`` per node."""
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": hosts}]}
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}},
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"scheduling.x-k8s.io/pod-group": gang}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        },
    }


async def gang_decided(kube: client.ApiClient, namespace: str, gang: str, names: list[str]) -> bool:
    """Every member bound, or the gang rejected because a member fits nowhere (Coscheduling's words on a member;
    not a rejection for siblings still arriving)."""
    found = await asyncio.gather(*(read_pod(kube, namespace, n) for n in names))
    if all(p and p["spec"].get("nodeName") for p in found):
        return True
    messages = [str((scheduled_condition(p) or {}).get("message", "")) for p in found]
    rejected = f"PodGroup {namespace}/{gang} gets rejected"
    return any(m.startswith(rejected) and m.endswith("unschedulable even after PostFilter") for m in messages)


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
    # the cluster is shared with other tests: their claims are in the snapshot too, this test's are all there
    taken = json.loads(snap.read_text())["objects"]
    ours = [
        o for o in taken if o.get("kind") == "ResourceClaim" and o.get("metadata", {}).get("namespace") == namespace
    ]
    assert len(ours) == PODS // CLAIM_EVERY, said
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
        if kind == "pending" and (s["node"] is not None or value != s["reason"]):
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


GANGS = [("a", 3, "1"), ("b", 4, "3"), ("c", 3, "1"), ("d", 3, "1"), ("e", 4, "1")]
"""(PodGroup, members = minMember, each member's CPU) on 6 nodes of 8 cores; c's members keep apart from each
other on two nodes: 2 of 3 find a node, so none may stay; d and e are placed after it, on the nodes c's two
members held for a moment (the simulation gives them back at once, as the live gang cycle does)."""


async def test_gangs_simulated_all_or_nothing_where_the_live_gang_cycle_places_them(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
    tmp_path: Path,
) -> None:
    rng = random.Random(38)
    nodes = [node(f"{group}-{i}", group, "8", "32Gi") for i in range(6)]
    await create_nodes(kube, nodes)
    for n in nodes:
        await annotate(kube, n["metadata"]["name"], round(rng.uniform(0.05, 0.3), 3))
    config = dynamic_config(scheduler_name)
    config["profiles"][0].update(COSCHEDULING)
    config_path, snap = tmp_path / "scheduler.yaml", tmp_path / "snapshot.json"
    config_path.write_text(yaml.safe_dump(config))
    await cranectl(
        "snapshot", "--kubeconfig", str(cluster.kubeconfig_path), "--node-selector", selector,
        "--config", str(config_path), "-o", str(snap),
    )  # fmt: skip
    manifests: list[dict[str, Any]] = []
    live: dict[str, str | None] = {}
    v1 = client.CoreV1Api(kube)
    async with in_process(cluster, config, selector, load_aware=True) as scheduler:
        scheduler.algorithm.rng = random.Random(0)
        scheduler.algorithm.next_start = 0
        for name, count, cpu in GANGS:  # one gang at a time, each whole before the next
            await create_group(kube, namespace, name, count)
            pods = members(name, scheduler_name, count, cpu)
            if name == "c":
                for p in pods:
                    p["spec"]["affinity"] = apart(name, [f"{group}-0", f"{group}-1"])
            await create_pods(kube, namespace, pods)
            manifests.append(
                {
                    "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                    "kind": "PodGroup",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"minMember": count},
                }
            )
            manifests += [
                {"apiVersion": "v1", "kind": "Pod", **p, "metadata": {**p["metadata"], "namespace": namespace}}
                for p in pods
            ]
            names = [p["metadata"]["name"] for p in pods]
            # decided: every member bound, or the gang rejected (a member may be reported unschedulable before its
            # siblings arrive: that is not the gang's answer)
            await wait_for(functools.partial(gang_decided, kube, namespace, name, names), timeout=60, what=name)
            for n in names:
                found = await read_pod(kube, namespace, n)
                live[n] = str(found["spec"]["nodeName"]) if found and found["spec"].get("nodeName") else None
            if any(live[p["metadata"]["name"]] is None for p in pods):
                for p in pods:
                    await v1.delete_namespaced_pod(p["metadata"]["name"], namespace, grace_period_seconds=0)
    path = tmp_path / "gangs.yaml"
    path.write_text(yaml.safe_dump_all(manifests))
    simulated = json.loads(await cranectl("simulate", "--snapshot", str(snap), "-f", str(path), "-o", "json"))
    placed = {s["pod"].split("/", 1)[1]: s["node"] for s in simulated["runs"][0]["pods"]}
    assert placed == live
    assert [live[f"c-{i}"] for i in range(3)] == [None, None, None]  # all or nothing, live and simulated
    assert all(live[f"{g}-{i}"] for g, count, _ in GANGS if g != "c" for i in range(count)), live


async def test_a_preemption_simulated_on_a_snapshot_is_the_one_the_live_scheduler_makes(
    cluster: LocalCluster,
    kube: client.ApiClient,
    namespace: str,
    group: str,
    selector: str,
    scheduler_name: str,
    priorities: dict[str, str],
    tmp_path: Path,
) -> None:
    """Two full nodes, each holding one low-priority pod, the one on a started later: between equal candidates kube
    picks the node whose victim started last (pickOneNodeForPreemption's last rule), so a high-priority pod
    preempts on a. The simulation, on a snapshot taken by the chart's read-only snapshot account, names the node
    and the victim the live scheduler nominates and evicts (and evicts nothing itself)."""
    a, b = f"{group}-a", f"{group}-b"
    await create_nodes(kube, [node(a, group, cpu="8"), node(b, group, cpu="8")])
    for n in (a, b):
        await annotate(kube, n, 0.1)
    victims = [victim("new", scheduler_name, a, priorities["low"]), victim("old", scheduler_name, b, priorities["low"])]
    for body in victims:  # 6 of the 8 cores: a pod of 3 fits only without it (and stays under Dynamic's 0.65)
        body["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "6"
    await create_pods(kube, namespace, victims)
    v1 = client.CoreV1Api(kube)
    for name, started in (("new", "2026-01-01T09:00:00Z"), ("old", "2026-01-01T08:00:00Z")):
        await v1.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Running", "startTime": started}})
    config = dynamic_config(scheduler_name)
    config_path, snap, path = tmp_path / "scheduler.yaml", tmp_path / "snapshot.json", tmp_path / "vip.yaml"
    config_path.write_text(yaml.safe_dump(config))
    account = await service_identity(cluster, "snapshot")
    await cranectl(
        "snapshot", "--kubeconfig", str(account.kubeconfig), "--node-selector", selector,
        "--config", str(config_path), "-o", str(snap),
    )  # fmt: skip
    vip = pod("vip", scheduler_name, cpu="3", spec={"priorityClassName": priorities["high"]})
    path.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", **vip, "metadata": {"name": "vip", "namespace": namespace}})
    )
    [simulated] = json.loads(await cranectl("simulate", "--snapshot", str(snap), "-f", str(path), "-o", "json"))[
        "runs"
    ][0]["pods"]
    assert simulated["node"] is None, simulated
    assert simulated["preemption"] == {"node": a, "victims": [f"{namespace}/new"]}, simulated
    assert await read_pod(kube, namespace, "new") is not None  # nothing evicted by the simulation

    async with in_process(cluster, config, selector, load_aware=True):
        await create_pods(kube, namespace, [vip])
        bound = functools.partial(node_of, kube, namespace, "vip")
        assert await wait_for(bound, timeout=30, what="the preemptor bound") == a
    assert await read_pod(kube, namespace, "new") is None
    assert await read_pod(kube, namespace, "old") is not None
