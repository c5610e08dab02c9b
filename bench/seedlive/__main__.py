"""The seed experiment (seed 001) run live in the sandbox: ``python -m bench.seedlive [--replicas 10]``.

Two services whose replicas really use much less than they request: memory-heavy (uses 2 CPU / 20Gi, requests
5 / 40Gi) and CPU-heavy (uses 8 CPU / 8Gi, requests 12 / 12Gi). Each runs on its own three nodes of 48 CPU /
192Gi with the seed's uneven base load (10/15 %, 20/25 %, 35/45 % CPU/memory), where the busiest node in reality
carries the fewest requests (other pods request 16/64Gi on the first node, 8/32Gi on the second). The Deployment is
scaled one replica at a time, once per strategy, all in one sandbox (second-scheduler mode):

- ``crane``: crane-scheduler as shipped (kube-scheduler's plugins plus Dynamic);
- ``kube``: the real kube-scheduler binary (requests only);
- ``upstream``: crane-scheduler with upstream crane's Dynamic behaviour (hot value without its own bindings,
  no estimate of bound-but-unmeasured load).

Real load travels the production path: the simulated node-exporters serve each node's usage (base load plus its
Running pods), Prometheus computes the fast recording rules, the annotator writes annotations, the scheduler
reads them. The table reports each node's real usage of the service's main resource after the last step, the
number of nodes above the 65 % threshold, whether a node went over while another still had headroom, and the
spread (max - min) of real usage. A PNG plots node usage against replicas, one panel per strategy.

With ``--batch``, a batch phase follows (``bench.seedlive.batchphase``): batch pods per group ask for the
capacity the annotator reclaimed (``--reclaim``: the policy's reclaim thresholds, CPU and memory), then the
regular load rises on one node and crane-descheduler (running on the crane groups' nodes only) sheds its batch
pods; its table and plot are written next to the others (``seedlive-batch.md``, ``seedlive-batch.png``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from bench.seedlive import batchphase
from crane_sandbox.fleet import GI, SimNode, make_fleet
from crane_sandbox.sandbox import SANDBOX_POLICY, UPSTREAM_STYLE, Sandbox, comparison_config
from crane_shared.kube import api_client_from_dict, raw_json

THRESHOLD = 0.65
CPU_CORES = 48
MEMORY_GI = 192
NAMESPACE = "seed"
BASE = [(0.10, 0.15), (0.20, 0.25), (0.35, 0.45)]
OTHER_REQUESTS = [("16", "64Gi"), ("8", "32Gi"), (None, None)]


@dataclass(frozen=True)
class Service:
    key: str
    usage: str
    cpu: str
    memory: str
    main: int
    """0: CPU is the resource that runs out, 1: memory"""


SERVICES = (
    Service("mem", "cpu=2,memory=20Gi", "5", "40Gi", main=1),
    Service("cpu", "cpu=8,memory=8Gi", "12", "12Gi", main=0),
)
STRATEGIES = {"crane": "crane-scheduler", "kube": "default-scheduler", "upstream": UPSTREAM_STYLE}

# A just-bound pod's estimate lasts as long as the fast rules take to absorb it (10 s average, 5 s sync).
SCHEDULER_CONFIG = comparison_config(estimate={"window": "15s"})

SANDBOX_RECLAIM = "  reclaim:\n    podUsageWindow: 10s\n"
DESCHEDULED = ("crane-mem", "crane-cpu")
"""the groups crane-descheduler acts on (its node pools); the others show placement without it"""
# The sandbox's descheduler policy (a round every 5 s, pods may go once 20 s old, hot after 3 rounds), its pools
# limited to the crane groups' nodes; a workload may have half its pods unavailable: the batch Deployment keeps a
# pod pending by design (it asks one more than the loan), which the default budget (1) would count as the one.
DESCHEDULER_POLICY = (
    """\
apiVersion: descheduler.policy.crane.io/v1alpha1
kind: LoadAwareDeschedulerPolicy
spec:
  anomaly: {consecutiveAbnormalities: 3, consecutiveNormalities: 2}
  nodePools:
"""
    + "".join(f"    - {{name: {g}, nodeSelector: {{seed: {g}}}}}\n" for g in DESCHEDULED)
    + """\
  evictable: {minPodAge: 20s}
  limits: {maxPerNodePerRound: 1, maxPerNamespacePerRound: 2, maxUnavailablePerWorkload: "50%", maxPerMinute: 10}
"""
)


def policy_with_reclaim(cpu: float, memory: float) -> str:
    """The sandbox policy with the reclaim thresholds ``cpu`` and ``memory`` (fractions of capacity)."""
    assert SANDBOX_RECLAIM in SANDBOX_POLICY, "the sandbox policy's reclaim line moved"
    reclaim = (
        f"  reclaim:\n    cpu: {{reclaimThreshold: {cpu}}}\n    memory: {{reclaimThreshold: {memory}}}\n"
        "    podUsageWindow: 10s\n"
    )
    return SANDBOX_POLICY.replace(SANDBOX_RECLAIM, reclaim)


@dataclass
class Run:
    strategy: str
    service: Service
    nodes: list[str]
    steps: list[list[float]] = field(default_factory=list)
    """per step, each node's real usage of the main resource"""
    counts: list[int] = field(default_factory=list)
    pending: int = 0
    over_with_headroom: bool = False
    pending_with_headroom: bool = False
    """replicas left pending at the end although a node could still take one"""

    @property
    def group(self) -> str:
        return f"{self.strategy}-{self.service.key}"


def fleet() -> list[SimNode]:
    nodes: list[SimNode] = []
    for g, (strategy, service) in enumerate((s, v) for s in STRATEGIES for v in SERVICES):
        group = f"{strategy}-{service.key}"
        three = make_fleet(
            3,
            cpu_cores=CPU_CORES,
            memory_bytes=MEMORY_GI * GI,
            base_loads=BASE,
            prefix=f"{group}-",
            labels={"seed": group},
        )
        nodes += [replace(n, internal_ip=f"10.{g + 1}.0.{i + 1}") for i, n in enumerate(three)]
    return nodes


def pod_spec(scheduler: str, group: str, cpu: str, memory: str) -> dict[str, Any]:
    return {
        "schedulerName": scheduler,
        "nodeSelector": {"seed": group},
        "containers": [{"name": "app", "image": "stress", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
    }


async def prepare(api: client.ApiClient, runs: list[Run]) -> None:
    v1 = client.CoreV1Api(api)
    await v1.create_namespace({"metadata": {"name": NAMESPACE}})
    deadline = time.monotonic() + 60
    while not any(a.metadata.name == "default" for a in (await v1.list_namespaced_service_account(NAMESPACE)).items):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no default ServiceAccount in {NAMESPACE}")
        await asyncio.sleep(0.5)
    apps = client.AppsV1Api(api)
    for run in runs:
        for node, (cpu, memory) in zip(run.nodes, OTHER_REQUESTS, strict=True):
            if cpu is None or memory is None:
                continue
            spec = pod_spec("default-scheduler", run.group, cpu, memory) | {"nodeName": node}
            meta = {"name": f"other-{node}", "annotations": {"sandbox.crane.io/usage": "cpu=0,memory=0"}}
            await v1.create_namespaced_pod(NAMESPACE, {"metadata": meta, "spec": spec})
        labels = {"app": run.group}
        template = {
            "metadata": {"labels": labels, "annotations": {"sandbox.crane.io/usage": run.service.usage}},
            "spec": pod_spec(STRATEGIES[run.strategy], run.group, run.service.cpu, run.service.memory),
        }
        body = {
            "metadata": {"name": run.group},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels}, "template": template},
        }
        await apps.create_namespaced_deployment(NAMESPACE, body)


async def placed(api: client.ApiClient, group: str) -> tuple[dict[str, int], int]:
    body = await raw_json(
        client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=f"app={group}", _preload_content=False)
    )
    counts: dict[str, int] = {}
    pending = 0
    for pod in body["items"]:
        node = pod["spec"].get("nodeName")
        if node and pod.get("status", {}).get("phase") == "Running":
            counts[node] = counts.get(node, 0) + 1
        else:
            pending += 1
    return counts, pending


async def experiment(
    replicas: int,
    interval: float,
    batch: bool = False,
    reclaim: tuple[float, float] = (0.85, 0.85),
    shed_window: float = 180.0,
) -> tuple[list[Run], list[batchphase.BatchRun]]:
    # placement only, except with the batch phase: then crane-descheduler runs on the crane groups' nodes (its
    # pools), where crane-scheduler keeps every node under the threshold until the rise
    services: tuple[str, ...] = ("event-recorder", "annotator", "scheduler")
    if batch:
        services += ("descheduler",)
    sandbox = Sandbox(
        fleet=fleet(),
        mode="second",
        scheduler_config=SCHEDULER_CONFIG,
        services=services,
        policy=policy_with_reclaim(*reclaim),
        descheduler_policy=DESCHEDULER_POLICY,
    )
    print("starting the sandbox...", flush=True)
    await sandbox.start()
    assert sandbox.cluster is not None and sandbox.state is not None
    state = sandbox.state
    api = await api_client_from_dict(sandbox.cluster.kubeconfig_dict())
    try:
        runs = [Run(s, svc, [f"{s}-{svc.key}-{i:04d}" for i in range(1, 4)]) for s in STRATEGIES for svc in SERVICES]
        await prepare(api, runs)
        print(f"sandbox up ({sandbox.run_dir}); warming up Prometheus and the annotations...", flush=True)
        await asyncio.sleep(interval)
        apps = client.AppsV1Api(api)
        for step in range(1, replicas + 1):
            started = time.monotonic()
            await asyncio.gather(
                *(
                    apps.patch_namespaced_deployment_scale(r.group, NAMESPACE, {"spec": {"replicas": step}})
                    for r in runs
                )
            )
            # One replica per interval, as the experiment did: the interval lets the load reach Prometheus and
            # the annotations before the next decision.
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
            for r in runs:
                counts, r.pending = await placed(api, r.group)
                usage = [state.usage(n)[r.service.main] for n in r.nodes]
                r.steps.append(usage)
                r.counts = [counts.get(n, 0) for n in r.nodes]
                if max(usage) > THRESHOLD and any(
                    has_headroom(r.service, i, r.counts[i], state.usage(n)) for i, n in enumerate(r.nodes)
                ):
                    r.over_with_headroom = True
                r.pending_with_headroom = r.pending > 0 and any(
                    has_headroom(r.service, i, r.counts[i], state.usage(n)) for i, n in enumerate(r.nodes)
                )
            print(f"step {step}: " + "  ".join(f"{r.group} {r.counts}" for r in runs), flush=True)
        batch_runs: list[batchphase.BatchRun] = []
        if batch:
            batch_runs = [
                batchphase.BatchRun(
                    r.group,
                    STRATEGIES[r.strategy],
                    r.nodes,
                    r.service.main,
                    batchphase.CHUNKS[r.service.key],
                    descheduled=r.group in DESCHEDULED,
                )
                for r in runs
            ]
            print("batch phase: batch pods per group ask for the reclaimed capacity...", flush=True)
            await batchphase.start_batch(api, state, batch_runs)
            await asyncio.sleep(3 * interval)  # placed, Running, and their load in Prometheus and the annotations
            await batchphase.measure_batch(api, state, batch_runs)
            print("batch phase: the regular load rises on each group's busiest node...", flush=True)
            await batchphase.mark_rise(api, batch_runs)
            await batchphase.raise_regular(api, batch_runs)
            await batchphase.watch_rise(api, state, batch_runs, timeout=shed_window)
        return runs, batch_runs
    finally:
        await api.close()
        await sandbox.stop()


def _quantity(text: str | None) -> float:
    return 0.0 if text is None else float(text.removesuffix("Gi"))


def has_headroom(service: Service, index: int, replicas: int, usage: tuple[float, float]) -> bool:
    """Whether node ``index`` could take one more replica: its requests still fit (as any scheduler requires)
    and its real usage of both resources stays at or under the threshold."""
    usage_cpu, usage_mem = (float(x.split("=")[1].removesuffix("Gi")) for x in service.usage.split(","))
    other_cpu, other_mem = (_quantity(x) for x in OTHER_REQUESTS[index])
    fits = (
        other_cpu + (replicas + 1) * _quantity(service.cpu) <= CPU_CORES
        and other_mem + (replicas + 1) * _quantity(service.memory) <= MEMORY_GI
    )
    return fits and usage[0] + usage_cpu / CPU_CORES <= THRESHOLD and usage[1] + usage_mem / MEMORY_GI <= THRESHOLD


def table(runs: list[Run]) -> str:
    lines = [
        "| service | strategy | replicas per node | real usage per node (main resource) | nodes > 65 % "
        "| over while another had headroom | pending while a node had headroom | spread |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for svc in SERVICES:
        for r in (r for r in runs if r.service == svc):
            final = r.steps[-1]
            usage = " / ".join(f"{u:.0%}" for u in final)
            over = sum(u > THRESHOLD for u in final)
            pending = f" (+{r.pending} pending)" if r.pending else ""
            lines.append(
                f"| {svc.key}-heavy | {r.strategy} | {r.counts}{pending} | {usage} | {over} "
                f"| {'yes' if r.over_with_headroom else 'no'} | {'yes' if r.pending_with_headroom else 'no'} "
                f"| {max(final) - min(final):.0%} |"
            )
    return "\n".join(lines)


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(SERVICES), len(STRATEGIES), figsize=(13, 7), sharey=True, squeeze=False)
    for row, svc in enumerate(SERVICES):
        for col, strategy in enumerate(STRATEGIES):
            ax = axes[row][col]
            r = next(r for r in runs if r.strategy == strategy and r.service == svc)
            steps = list(range(1, len(r.steps) + 1))
            for i, node in enumerate(r.nodes):
                ax.plot(steps, [s[i] * 100 for s in r.steps], marker="o", label=node.rsplit("-", 1)[1])
            ax.axhline(THRESHOLD * 100, color="red", linestyle="--", linewidth=1)
            ax.set_title(f"{svc.key}-heavy, {strategy}")
            ax.set_xlabel("replicas")
            if col == 0:
                ax.set_ylabel(f"real {'memory' if svc.main else 'CPU'} usage %")
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def fractions(text: str) -> tuple[float, float]:
    """``CPU,MEMORY`` as two fractions in (0, 1]."""
    try:
        cpu, memory = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected CPU,MEMORY fractions such as 0.85,0.85, got {text!r}") from None
    if not (0 < cpu <= 1 and 0 < memory <= 1):
        raise argparse.ArgumentTypeError(f"fractions must be in (0, 1], got {text!r}")
    return cpu, memory


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.seedlive", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=10, help="scale each Deployment up to this (default 10)")
    parser.add_argument("--interval", type=float, default=20.0, help="seconds between replicas (default 20)")
    parser.add_argument("--plot", type=Path, default=Path("bench/seedlive/results/seedlive.png"))
    parser.add_argument("--batch", action="store_true", help="then a batch Job on the reclaimed capacity")
    parser.add_argument(
        "--reclaim",
        type=fractions,
        default=(0.85, 0.85),
        help="the policy's reclaim thresholds CPU,MEMORY (fractions of capacity; default 0.85,0.85)",
    )
    parser.add_argument(
        "--shed-window", type=float, default=180.0, help="seconds watched after the regular load rises (default 180)"
    )
    args = parser.parse_args()
    runs, batch_runs = asyncio.run(experiment(args.replicas, args.interval, args.batch, args.reclaim, args.shed_window))
    text = table(runs)
    print(text)
    if batch_runs:
        batch_text = batchphase.table(batch_runs)
        print(batch_text)
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        args.plot.with_name(args.plot.stem + "-batch.md").write_text(batch_text + "\n")
        batchphase.plot(batch_runs, args.plot.with_name(args.plot.stem + "-batch.png"))
    plot(runs, args.plot)
    args.plot.with_suffix(".md").write_text(text + "\n")
    args.plot.with_suffix(".json").write_text(
        json.dumps(
            [
                {"strategy": r.strategy, "service": r.service.key, "nodes": r.nodes, "steps": r.steps}
                | {"replicas": r.counts, "pending": r.pending, "overWithHeadroom": r.over_with_headroom}
                | {"pendingWithHeadroom": r.pending_with_headroom}
                for r in runs
            ],
            indent=1,
        )
    )
    print(f"plot: {args.plot}; table and per-step data next to it (.md, .json)")


if __name__ == "__main__":
    main()
