"""The seed experiment's batch phase (``python -m bench.seedlive --batch``): idle capacity put to work.

After the regular services are placed, each group (strategy x service, three nodes) gets batch pods that
request the capacity the annotator reclaimed (``crane.io/batch-cpu`` / ``crane.io/batch-memory``, the policy's
``spec.reclaim`` with the bench's ``--reclaim`` thresholds) and really use what they request; one pod more than the
published capacity holds, so the bound shows. They come from a Deployment, not a Job: KWOK's stages complete a
Job's pods the moment they run, so a Job would put no load on the simulated nodes (the pod template is the example
Job's, with the service-shaped sizes below). Then the regular load rises on the group's busiest node (its regular
pods' main resource x 2) and the phase watches that node: its loan shrinking, its batch pods leaving (crane-descheduler
runs on the crane groups' nodes only: the other groups show what happens without it) and where they go.

Reported per group: real utilisation of the main resource before and after the batch pods, regular pods placed
before and after (no fewer), batch pods placed and pending, nodes above the 65 % threshold by regular usage
(node usage without the batch pods) before the rise and at the end, the hot node's published loan before and after
the rise, the time from the rise until the hot node has shed its batch pods (none left there, or its whole usage
of the main resource back under the threshold), the batch pods evicted and those lost (running at the rise and not
running anywhere at the end: evicted without a new place).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
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
    descheduled: bool = False
    """crane-descheduler acts on this group's nodes"""
    running_at_rise: set[str] = field(default_factory=set)
    """uids of the group's batch pods running when the regular load rose"""
    shed_seconds: float | None = None
    hot_batch_end: int = 0
    evicted: int = 0
    lost: int = 0
    over_by_regular_end: int = 0
    regular_end: int = 0
    utilisation_end: float = 0.0
    trace: list[tuple[float, float, float, int]] = field(default_factory=list)
    """after the rise: (seconds, hot node's whole usage, its regular usage, its batch pods) of the main resource"""


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
        run.over_by_regular = sum(regular_usage(state, n, run.main) > THRESHOLD for n in run.nodes)
        run.hot_node = max(run.nodes, key=lambda n: (regular.get(n, 0), n))
        run.hot_batch_pods = on.get(run.hot_node, 0)


def regular_usage(state: FleetState, node: str, main: int) -> float:
    """The node's usage without its batch pods (what a regular pod is judged by): its base load plus its regular
    pods, not clamped at the node's capacity as the whole usage is."""
    spec = state.nodes[node]
    pods = [p for p in state.pods.values() if p.node == node and not p.name.startswith(f"{NAMESPACE}/batch-")]
    if main == 0:
        return spec.base_cpu_fraction + sum(p.cpu_cores for p in pods) / spec.cpu_cores
    return spec.base_mem_fraction + sum(p.memory_bytes for p in pods) / spec.memory_bytes


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


def batch_running(items: list[dict[str, Any]]) -> dict[str, str]:
    """uid -> node of the Running batch pods."""
    return {
        pod["metadata"]["uid"]: pod["spec"]["nodeName"]
        for pod in items
        if pod["spec"].get("nodeName") and pod.get("status", {}).get("phase") == "Running"
    }


async def mark_rise(api: client.ApiClient, runs: list[BatchRun]) -> None:
    for run in runs:
        run.running_at_rise = set(batch_running(await pods(api, f"batch={run.group}")))


async def watch_rise(
    api: client.ApiClient, state: FleetState, runs: list[BatchRun], timeout: float, threshold: float = THRESHOLD
) -> None:
    """For ``timeout`` seconds after the rise: each hot node's loan (until it shrinks), its batch pods and usage
    (until shed: no batch pod left, or whole usage of the main resource at or under ``threshold``); then the end
    state: batch pods evicted and lost, nodes hot by regular usage, regular pods placed."""
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < timeout:
        for run in runs:
            if run.shrink_seconds is None:
                now = await lent(api, run.hot_node)
                run.hot_lent_after = now
                if now[run.main] < run.hot_lent_before[run.main]:
                    run.shrink_seconds = elapsed
            here = running_on(await pods(api, f"batch={run.group}")).get(run.hot_node, 0)
            whole = state.usage(run.hot_node)[run.main]
            run.trace.append((elapsed, whole, regular_usage(state, run.hot_node, run.main), here))
            if run.shed_seconds is None and (here == 0 or whole <= threshold):
                run.shed_seconds = elapsed
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started - elapsed)))
    for run in runs:
        items = await pods(api, f"batch={run.group}")
        running = batch_running(items)
        present = {pod["metadata"]["uid"] for pod in items}
        run.evicted = len(run.running_at_rise - present)
        run.lost = max(0, len(run.running_at_rise) - len(running))
        on = running_on(items)
        run.hot_batch_end = on.get(run.hot_node, 0)
        regular = running_on(await pods(api, f"app={run.group}"))
        run.regular_end = sum(regular.values())
        run.utilisation_end = utilisation(state, run.nodes, run.main)
        run.over_by_regular_end = sum(regular_usage(state, n, run.main) > threshold for n in run.nodes)


def table(runs: list[BatchRun]) -> str:
    lines = [
        "| group | real use before / after batch / end | regular pods before / after batch / end "
        "| batch pods placed (asked) | pending | nodes > 65 % by regular use: before rise / end "
        "| hot node's loan before / after the rise (main) | loan shrank after | time to shed "
        "| batch pods on the hot node: at rise / end | batch pods evicted | lost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        unit, scale = ("cores", 1000) if r.main == 0 else ("GiB", GI)
        shrank = "-" if r.shrink_seconds is None else f"{r.shrink_seconds:.0f} s"
        if r.hot_batch_pods == 0:
            shed = "- (none there)"
        elif r.shed_seconds is not None:
            shed = f"{r.shed_seconds:.0f} s"
        else:
            shed = "not shed" if r.descheduled else "not shed (no descheduler)"
        evicted = str(r.evicted) if r.descheduled else f"{r.evicted} (no descheduler)"
        lines.append(
            f"| {r.group} | {r.utilisation_before:.0%} / {r.utilisation_after:.0%} / {r.utilisation_end:.0%} "
            f"| {r.regular_before} / {r.regular_after} / {r.regular_end} | {r.placed} ({r.asked}) | {r.pending} "
            f"| {r.over_by_regular} / {r.over_by_regular_end} "
            f"| {r.hot_lent_before[r.main] / scale:.1f} / {r.hot_lent_after[r.main] / scale:.1f} {unit} | {shrank} "
            f"| {shed} | {r.hot_batch_pods} / {r.hot_batch_end} | {evicted} | {r.lost} |"
        )
    return "\n".join(lines)


def plot(runs: list[BatchRun], path: Path, threshold: float = THRESHOLD) -> None:
    """Per group, the hot node after the rise: whole and regular usage of the main resource, its batch pods."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = math.ceil(len(runs) / 2)
    fig, axes = plt.subplots(2, columns, figsize=(13, 7), sharey=True, squeeze=False)
    for i, run in enumerate(runs):
        ax = axes[i % 2][i // 2]
        seconds = [t[0] for t in run.trace]
        ax.plot(seconds, [t[1] * 100 for t in run.trace], label="whole usage")
        ax.plot(seconds, [t[2] * 100 for t in run.trace], label="regular usage")
        ax.axhline(threshold * 100, color="red", linestyle="--", linewidth=1)
        pods_axis = ax.twinx()
        pods_axis.step(seconds, [t[3] for t in run.trace], where="post", color="grey", label="batch pods")
        pods_axis.set_ylim(bottom=0, top=max([t[3] for t in run.trace] + [1]) + 1)
        ax.set_title(f"{run.group}: {run.hot_node.rsplit('-', 1)[1]}" + (", descheduler" if run.descheduled else ""))
        ax.set_xlabel("seconds after the rise")
        if i // 2 == 0:
            ax.set_ylabel("real usage % (main resource)")
        ax.legend(fontsize=7, loc="lower left")
        pods_axis.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
