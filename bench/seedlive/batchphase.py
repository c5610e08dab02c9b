"""The seed experiment's batch phase (``python -m bench.seedlive --batch``): idle capacity put to work.

After the regular services are placed, each group (strategy x service, three nodes) gets batch pods that
request the capacity the annotator reclaimed (``crane.io/batch-cpu`` / ``crane.io/batch-memory``, the sandbox
policy's ``spec.reclaim``) and really use what they request; one pod more than the published capacity holds, so
the bound shows. They come from a Deployment, not a Job: KWOK's stages complete a Job's pods the moment they
run, so a Job would put no load on the simulated nodes (the pod template is the example Job's, with the
service-shaped sizes below). Then the regular load rises on the group's busiest node (its regular pods' main
resource x 2) and the phase watches that node's loan shrink.

Reported per group: real utilisation of the main resource before and after the batch pods, regular pods placed
before and after (no fewer), batch pods placed and pending, nodes above the 65 % threshold by regular usage
(node usage without the batch pods), the hot node's published loan before and after the rise, and batch pods
still on it. Shedding batch pods from a node whose regular usage turned hot is the descheduler's (not run in
this experiment), so the time to shed and the batch pods lost are not measured here.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

from crane_sandbox.fleet import GI, FleetState, parse_usage
from crane_shared.batch import BATCH_CPU, BATCH_MEMORY
from crane_shared.kube import raw_json
from crane_shared.quantity import quantity

NAMESPACE = "seed"
THRESHOLD = 0.65


@dataclass(frozen=True)
class Chunk:
    """One batch pod: what it requests of the reclaimed capacity and really uses."""

    cpu_milli: int
    memory_gi: int

    @property
    def usage(self) -> str:
        return f"cpu={self.cpu_milli / 1000:g},memory={self.memory_gi}Gi"

    def fits(self, lent: tuple[int, int]) -> int:
        return min(lent[0] // self.cpu_milli, lent[1] // (self.memory_gi * GI))


CHUNKS = {"mem": Chunk(1000, 16), "cpu": Chunk(4000, 4)}
"""per service: batch pods shaped like the resource the service leaves idle"""


@dataclass
class BatchRun:
    group: str
    scheduler: str
    nodes: list[str]
    main: int
    chunk: Chunk
    utilisation_before: float = 0.0
    utilisation_after: float = 0.0
    regular_before: int = 0
    regular_after: int = 0
    lent_before: list[tuple[int, int]] = field(default_factory=list)
    asked: int = 0
    placed: int = 0
    pending: int = 0
    over_by_regular: int = 0
    hot_node: str = ""
    hot_lent_before: tuple[int, int] = (0, 0)
    hot_lent_after: tuple[int, int] = (0, 0)
    hot_batch_pods: int = 0
    shrink_seconds: float | None = None


async def lent(api: client.ApiClient, node: str) -> tuple[int, int]:
    body = await raw_json(client.CoreV1Api(api).read_node(node, _preload_content=False))
    allocatable = body["status"].get("allocatable", {})
    return quantity(allocatable.get(BATCH_CPU, 0)), quantity(allocatable.get(BATCH_MEMORY, 0))


async def pods(api: client.ApiClient, selector: str) -> list[dict[str, Any]]:
    body = await raw_json(
        client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=selector, _preload_content=False)
    )
    return list(body["items"])


def running_on(items: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pod in items:
        node = pod["spec"].get("nodeName")
        if node and pod.get("status", {}).get("phase") == "Running":
            counts[node] = counts.get(node, 0) + 1
    return counts


def utilisation(state: FleetState, nodes: list[str], main: int) -> float:
    return sum(state.usage(n)[main] for n in nodes) / len(nodes)


async def wait_lent(api: client.ApiClient, nodes: list[str], timeout: float = 120) -> list[tuple[int, int]]:
    deadline = time.monotonic() + timeout
    while True:
        values = [await lent(api, n) for n in nodes]
        if all(v[0] > 0 or v[1] > 0 for v in values) or time.monotonic() > deadline:
            return values
        await asyncio.sleep(1)


def workload(run: BatchRun, replicas: int) -> dict[str, Any]:
    asks = {BATCH_CPU: str(run.chunk.cpu_milli), BATCH_MEMORY: f"{run.chunk.memory_gi}Gi"}
    labels = {"batch": run.group}
    return {
        "metadata": {"name": f"batch-{run.group}"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {"sandbox.crane.io/usage": run.chunk.usage}},
                "spec": {
                    "schedulerName": run.scheduler,
                    "nodeSelector": {"seed": run.group},
                    "containers": [
                        {"name": "crunch", "image": "batch", "resources": {"requests": asks, "limits": asks}}
                    ],
                },
            },
        },
    }


async def start_batch(api: client.ApiClient, state: FleetState, runs: list[BatchRun]) -> None:
    apps = client.AppsV1Api(api)
    for run in runs:
        run.utilisation_before = utilisation(state, run.nodes, run.main)
        run.regular_before = sum(running_on(await pods(api, f"app={run.group}")).values())
        run.lent_before = await wait_lent(api, run.nodes)
        run.asked = sum(run.chunk.fits(v) for v in run.lent_before) + 1  # one more than the loan holds
        await apps.create_namespaced_deployment(NAMESPACE, workload(run, run.asked))


async def measure_batch(api: client.ApiClient, state: FleetState, runs: list[BatchRun]) -> None:
    for run in runs:
        items = await pods(api, f"batch={run.group}")
        on = running_on(items)
        run.placed = sum(on.values())
        run.pending = len(items) - run.placed
        run.utilisation_after = utilisation(state, run.nodes, run.main)
        regular = running_on(await pods(api, f"app={run.group}"))
        run.regular_after = sum(regular.values())
        run.over_by_regular = sum(
            regular_usage(state, n, on.get(n, 0), run.chunk, run.main) > THRESHOLD for n in run.nodes
        )
        run.hot_node = max(run.nodes, key=lambda n: (regular.get(n, 0), n))
        run.hot_batch_pods = on.get(run.hot_node, 0)


def regular_usage(state: FleetState, node: str, batch_pods: int, chunk: Chunk, main: int) -> float:
    """The node's usage without its batch pods (what a regular pod is judged by)."""
    spec = state.nodes[node]
    used = state.usage(node)[main]
    if main == 0:
        return used - batch_pods * chunk.cpu_milli / 1000 / spec.cpu_cores
    return used - batch_pods * chunk.memory_gi * GI / spec.memory_bytes


async def raise_regular(api: client.ApiClient, runs: list[BatchRun], factor: float = 2.0) -> None:
    """The regular pods on each group's busiest node use ``factor`` times their main resource from now on."""
    core = client.CoreV1Api(api)
    for run in runs:
        run.hot_lent_before = await lent(api, run.hot_node)
        for pod in await pods(api, f"app={run.group}"):
            if pod["spec"].get("nodeName") != run.hot_node:
                continue
            cpu, memory = parse_usage(pod["metadata"]["annotations"]["sandbox.crane.io/usage"])
            cpu, memory = cpu or 0.0, memory or 0
            if run.main == 0:
                cpu *= factor
            else:
                memory = math.floor(memory * factor)
            body = {"metadata": {"annotations": {"sandbox.crane.io/usage": f"cpu={cpu:g},memory={memory}"}}}
            await core.patch_namespaced_pod(pod["metadata"]["name"], NAMESPACE, body)


async def watch_shrink(api: client.ApiClient, runs: list[BatchRun], timeout: float) -> None:
    """Until each hot node's loan of the main resource has shrunk (or ``timeout``)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        waiting = [r for r in runs if r.shrink_seconds is None]
        if not waiting:
            return
        for run in waiting:
            now = await lent(api, run.hot_node)
            run.hot_lent_after = now
            if now[run.main] < run.hot_lent_before[run.main]:
                run.shrink_seconds = time.monotonic() - started
        await asyncio.sleep(1)


def table(runs: list[BatchRun]) -> str:
    lines = [
        "| group | real use before / after batch | regular pods before / after | batch pods placed (asked) "
        "| pending | nodes > 65 % by regular use | hot node's loan before / after the rise (main) | shrank after "
        "| batch pods on the hot node |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        unit, scale = ("cores", 1000) if r.main == 0 else ("GiB", GI)
        shrank = "-" if r.shrink_seconds is None else f"{r.shrink_seconds:.0f} s"
        lines.append(
            f"| {r.group} | {r.utilisation_before:.0%} / {r.utilisation_after:.0%} | {r.regular_before} / "
            f"{r.regular_after} | {r.placed} ({r.asked}) | {r.pending} | {r.over_by_regular} "
            f"| {r.hot_lent_before[r.main] / scale:.1f} / {r.hot_lent_after[r.main] / scale:.1f} {unit} | {shrank} "
            f"| {r.hot_batch_pods} |"
        )
    return "\n".join(lines)
