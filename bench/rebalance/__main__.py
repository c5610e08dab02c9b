"""The drift scenario, live in the sandbox, run once per descheduler: ``python -m bench.rebalance``.

Ten simulated nodes (8 CPU, 20 % base CPU load), three Deployments of six replicas each with a
PodDisruptionBudget (``maxUnavailable: 1``), placed by crane-scheduler. Then the real usage of the workload pods on
two nodes is raised (their ``sandbox.crane.io/usage`` annotation: the first pod to 4 CPU, the others to 1 CPU) so
both nodes go over the 65 % threshold, and the bench watches, once a second, what the descheduler does about it:
minutes until no node is hot, evictions (against the minimum that cools both nodes), replacements bound to a node
that is hot at that moment, PodDisruptionBudget violations, pods left Pending. Two more phases follow: every node
made hot (a bare ballast pod on each node raised to 4 CPU: no node could take an evicted pod), then one node hot
and the fleet's exporter stopped as soon as Prometheus shows it (the metrics go stale): evictions there are wrong.

Backends, each in a fresh sandbox with the same fleet, workloads and drift:

- ``crane``: crane-descheduler as the sandbox runs it (5 s rounds, ``minPodAge: 20s``, 3 hot rounds to confirm);
- ``descheduler``: kubernetes-sigs/descheduler (``sandbox/descheduler``, built on demand into the kubebin cache)
  as a process against the sandbox's kubeconfig: LowNodeUtilization with ``metricsUtilization.source: Prometheus``
  over the same Prometheus, ``--descheduling-interval 5s``. Its query (``PROMETHEUS_QUERY``) is the per-node
  maximum of the fast recording rules ``cpu_usage_avg_5m`` and ``mem_usage_avg_5m`` scaled to [0, 1]; the
  ``instance`` label is the node name because the bench's fleet exports it so (what a scrape config relabelling
  node-exporter's ``instance`` to the node name gives). ``targetThresholds`` 65 (the scheduler's threshold),
  ``thresholds`` 35 (crane-descheduler's default low threshold, high - 30).

Both run with crane-scheduler, so only the descheduler differs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from bench.rebalance.score import Outcome, minimum_evictions, table
from crane_sandbox.fleet import GI, make_fleet
from crane_sandbox.kubebin import ensure_descheduler
from crane_sandbox.procs import ManagedProcess
from crane_sandbox.sandbox import Sandbox
from crane_shared.kube import api_client_from_dict, raw_json

THRESHOLD = 0.65
NODES = 10
CORES = 8.0
BASE_CPU = 0.2
NAMESPACE = "drift"
BALLAST_NAMESPACE = "ballast"
WORKLOADS = ("web", "api", "worker")
INTERVAL_S = 5.0
USAGE = "sandbox.crane.io/usage"
TEMPLATE_USAGE = "cpu=400m,memory=256Mi"
PROMETHEUS_QUERY = 'clamp(max by (instance) ({__name__=~"cpu_usage_avg_5m|mem_usage_avg_5m"}) / 100, 0, 1)'
TOKEN_SECRET = ("kube-system", "prometheus-token")


def descheduler_policy(prometheus_url: str) -> dict[str, Any]:
    """kubernetes-sigs/descheduler's policy: LowNodeUtilization over Prometheus (a token Secret is required to
    use a Prometheus URL outside a pod; the sandbox's Prometheus ignores it)."""
    namespace, name = TOKEN_SECRET
    args = {
        "thresholds": {"MetricResource": round((THRESHOLD - 0.3) * 100)},
        "targetThresholds": {"MetricResource": round(THRESHOLD * 100)},
        "metricsUtilization": {"source": "Prometheus", "prometheus": {"query": PROMETHEUS_QUERY}},
    }
    return {
        "apiVersion": "descheduler/v1alpha2",
        "kind": "DeschedulerPolicy",
        "metricsProviders": [
            {
                "source": "Prometheus",
                "prometheus": {
                    "url": prometheus_url,
                    "authToken": {"secretReference": {"namespace": namespace, "name": name}},
                },
            }
        ],
        "profiles": [
            {
                "name": "load-aware",
                "pluginConfig": [{"name": "DefaultEvictor", "args": {}}, {"name": "LowNodeUtilization", "args": args}],
                "plugins": {"balance": {"enabled": ["LowNodeUtilization"]}},
            }
        ],
    }


@dataclass
class Watch:
    """What the bench has seen of the workload pods (polled once a second)."""

    sandbox: Sandbox
    api: client.ApiClient
    nodes: dict[str, str] = field(default_factory=dict)
    """uid -> node of every bound workload pod seen"""
    gone: set[str] = field(default_factory=set)
    labels: dict[str, str] = field(default_factory=dict)
    """uid -> ``name (its usage annotation)``, as last seen"""
    evictions: list[tuple[float, str]] = field(default_factory=list)
    """(when, ``node: name (usage)``) of every workload pod that went away"""
    returns: int = 0
    pdb_violations: int = 0
    pending: int = 0
    replicas: int = 6

    def hot(self, node: str) -> bool:
        assert self.sandbox.state is not None
        return max(self.sandbox.state.usage(node)) > THRESHOLD

    def hot_nodes(self) -> list[str]:
        return sorted(n for n in self.sandbox.fleet_names() if self.hot(n))

    async def poll(self) -> None:
        body = await raw_json(
            client.CoreV1Api(self.api).list_namespaced_pod(NAMESPACE, _preload_content=False, _request_timeout=30)
        )
        live: set[str] = set()
        available: dict[str, int] = dict.fromkeys(WORKLOADS, 0)
        self.pending = 0
        for pod in body["items"]:
            uid = pod["metadata"]["uid"]
            node = pod["spec"].get("nodeName")
            usage = (pod["metadata"].get("annotations") or {}).get(USAGE, "")
            self.labels[uid] = f"{pod['metadata']['name']} ({usage})"
            terminating = pod["metadata"].get("deletionTimestamp") is not None
            if terminating:
                if uid not in self.gone:
                    self.gone.add(uid)
                    self.evictions.append((time.monotonic(), self.describe(uid)))
                continue
            live.add(uid)
            running = pod.get("status", {}).get("phase") == "Running"
            if not running:
                self.pending += 1
            if node and uid not in self.nodes:
                if self.nodes and self.hot(node):  # a replacement (not the first placement) onto a hot node
                    self.returns += 1
                self.nodes[uid] = node
            if running:
                available[pod["metadata"]["labels"]["app"]] += 1
        for uid in set(self.nodes) - live - self.gone:
            self.gone.add(uid)
            self.evictions.append((time.monotonic(), self.describe(uid)))
        self.pdb_violations += sum(1 for n in available.values() if n < self.replicas - 1)

    def describe(self, uid: str) -> str:
        return f"{self.nodes.get(uid, '?')}: {self.labels.get(uid, uid)}"

    def evicted_since(self, t: float) -> int:
        return sum(1 for at, _ in self.evictions if at >= t)


def workload(name: str, replicas: int) -> dict[str, Any]:
    labels = {"app": name}
    container = {"name": "app", "image": "app", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}
    template = {
        "metadata": {"labels": labels, "annotations": {USAGE: TEMPLATE_USAGE}},
        "spec": {"containers": [container]},
    }
    return {
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": template},
    }


async def set_usage(v1: client.CoreV1Api, namespace: str, pod: str, usage: str) -> None:
    await v1.patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": {USAGE: usage}}})


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str, step: float = 1.0) -> float:
    """Await ``predicate()`` (async) true; returns the seconds it took. Raises on timeout."""
    started = time.monotonic()
    while not await predicate():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"after {timeout:.0f}s: {what}")
        await asyncio.sleep(step)
    return time.monotonic() - started


async def prepare(api: client.ApiClient, replicas: int) -> None:
    v1 = client.CoreV1Api(api)
    for ns in (NAMESPACE, BALLAST_NAMESPACE):
        await v1.create_namespace({"metadata": {"name": ns}})

    async def has_accounts() -> bool:
        names = [
            a.metadata.name
            for ns in (NAMESPACE, BALLAST_NAMESPACE)
            for a in (await v1.list_namespaced_service_account(ns)).items
        ]
        return names.count("default") == 2

    await until(has_accounts, 60, "default ServiceAccounts")
    for i in range(1, NODES + 1):  # bare pods (no controller: neither descheduler may evict them)
        node = f"node-{i:04d}"
        spec = {"nodeName": node, "containers": [{"name": "ballast", "image": "ballast"}]}
        meta = {"name": f"ballast-{node}", "annotations": {USAGE: "cpu=0,memory=0"}}
        await v1.create_namespaced_pod(BALLAST_NAMESPACE, {"metadata": meta, "spec": spec})
    apps = client.AppsV1Api(api)
    policy = client.PolicyV1Api(api)
    for name in WORKLOADS:
        await apps.create_namespaced_deployment(NAMESPACE, workload(name, replicas))
        pdb = {"metadata": {"name": name}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": name}}}}
        await policy.create_namespaced_pod_disruption_budget(NAMESPACE, pdb)


async def start_real_descheduler(sandbox: Sandbox, api: client.ApiClient) -> ManagedProcess:
    assert sandbox.cluster is not None and sandbox.cluster.pki is not None and sandbox.prometheus is not None
    binary = (await asyncio.to_thread(ensure_descheduler)).descheduler
    namespace, name = TOKEN_SECRET
    secret = {"prometheusAuthToken": base64.b64encode(b"unused").decode()}
    await client.CoreV1Api(api).create_namespaced_secret(namespace, {"metadata": {"name": name}, "data": secret})
    policy = sandbox.run_dir / "kubernetes-descheduler-policy.yaml"
    policy.write_text(yaml.safe_dump(descheduler_policy(sandbox.prometheus.url), sort_keys=False))
    process = ManagedProcess(
        "kubernetes-descheduler",
        [
            str(binary),
            f"--client-connection-kubeconfig={sandbox.cluster.kubeconfig_path}",
            f"--policy-config-file={policy}",
            f"--descheduling-interval={INTERVAL_S:.0f}s",
            "--secure-port=0",
            "--v=3",
        ],
        sandbox.run_dir / "logs" / "kubernetes-descheduler.log",
        env={"DESCHEDULER_POD_CA_FILE": str(sandbox.cluster.pki.ca_cert)},
    )
    await process.start()
    return process


async def run(backend: str, replicas: int, drift_timeout: float, phase_s: float, same_workload: str = "") -> Outcome:
    fleet = make_fleet(
        NODES, cpu_cores=CORES, memory_bytes=32 * GI, base_cpu_fraction=BASE_CPU, instance_styles=("name",)
    )
    services = ("event-recorder", "annotator", "scheduler") + (("descheduler",) if backend == "crane" else ())
    sandbox = Sandbox(fleet=fleet, services=services)
    print(f"[{backend}] starting the sandbox...", flush=True)
    await sandbox.start()
    assert sandbox.cluster is not None and sandbox.state is not None and sandbox.prometheus is not None
    state = sandbox.state
    api = await api_client_from_dict(sandbox.cluster.kubeconfig_dict())
    outcome = Outcome(backend, INTERVAL_S)
    extra: ManagedProcess | None = None
    try:
        if not await sandbox.wait_load_aware():
            raise TimeoutError("the nodes never got their load annotations")
        await prepare(api, replicas)
        watch = Watch(sandbox, api, replicas=replicas)
        v1 = client.CoreV1Api(api)

        async def placed() -> bool:
            await watch.poll()
            return len(watch.nodes) == replicas * len(WORKLOADS) and watch.pending == 0

        await until(placed, 120, "every workload pod Running")
        if backend == "descheduler":
            extra = await start_real_descheduler(sandbox, api)
        await asyncio.sleep(25)  # older than crane-descheduler's minPodAge (20 s)
        await watch.poll()
        watch.pdb_violations = 0  # counted from here: the first placement is not a disruption

        # --- drift: the workload pods on the two nodes with most of them use much more
        by_node: dict[str, list[str]] = {}
        for pod in state.pods.values():
            if pod.name.startswith(f"{NAMESPACE}/"):
                by_node.setdefault(pod.node, []).append(pod.name.split("/", 1)[1])
        marked = f"{same_workload}-"
        candidates = [n for n in by_node if not same_workload or any(p.startswith(marked) for p in by_node[n])]
        drifted = sorted(candidates, key=lambda n: (-len(by_node[n]), n))[:2]
        for node in drifted:
            # the big pod first: the first by name, or the named workload's (both hot nodes then need the same
            # Deployment to lose a pod, which its budget allows one at a time)
            names = sorted(by_node[node], key=lambda p: (not (same_workload and p.startswith(marked)), p))
            cores = [4.0] + [1.0] * (len(names) - 1)
            outcome.minimum += minimum_evictions(BASE_CPU, cores, CORES, THRESHOLD)
            for name, c in zip(names, cores, strict=True):
                await set_usage(v1, NAMESPACE, name, f"cpu={c:g},memory=256Mi")
        drift = time.monotonic()
        print(f"[{backend}] drift on {drifted}: {dict((n, len(by_node[n])) for n in drifted)} pods", flush=True)
        while time.monotonic() - drift < drift_timeout:
            await watch.poll()
            now = time.monotonic() - drift
            hot = watch.hot_nodes()
            if outcome.hot_at is None and set(drifted) <= set(hot):
                outcome.hot_at = now
            if watch.evictions and outcome.first_eviction_at is None:
                outcome.first_eviction_at = watch.evictions[0][0] - drift
            if outcome.hot_at is not None and not hot and outcome.cool_at is None:
                outcome.cool_at = now
                print(f"[{backend}] no node hot after {now:.0f}s", flush=True)
            if outcome.cool_at is not None and now > outcome.cool_at + 4 * INTERVAL_S and watch.pending == 0:
                break
            await asyncio.sleep(1)
        outcome.evictions = len(watch.evictions)
        outcome.notes += [f"drift: evicted at {at - drift:.0f} s {what}" for at, what in watch.evictions]
        outcome.returns_to_hot = watch.returns
        outcome.pdb_violations = watch.pdb_violations
        outcome.pending = watch.pending
        print(f"[{backend}] drift phase: {outcome}", flush=True)

        # --- every node hot: nowhere to put an evicted pod
        for i in range(1, NODES + 1):
            await set_usage(v1, BALLAST_NAMESPACE, f"ballast-node-{i:04d}", f"cpu={CORES * 0.5:g},memory=0")
        started = time.monotonic()
        while time.monotonic() - started < phase_s:
            await watch.poll()
            await asyncio.sleep(1)
        outcome.evictions_all_hot = watch.evicted_since(started)
        outcome.notes += [f"every node hot: evicted {what}" for at, what in watch.evictions if at >= started]
        print(f"[{backend}] every node hot ({len(watch.hot_nodes())}): {outcome.evictions_all_hot} evictions")
        for i in range(1, NODES + 1):
            await set_usage(v1, BALLAST_NAMESPACE, f"ballast-node-{i:04d}", "cpu=0,memory=0")

        # --- one node hot, then its metrics go stale (the exporter stops)
        async def nothing_hot() -> bool:
            return not watch.hot_nodes()

        await until(nothing_hot, 60, "the ballast's load gone")
        await asyncio.sleep(15)  # the 10 s averages follow
        target, victim = min(
            (p.node, p.name.split("/", 1)[1])
            for p in state.pods.values()
            if p.name.startswith(f"{NAMESPACE}/") and p.node not in drifted
        )
        await set_usage(v1, NAMESPACE, victim, "cpu=5,memory=256Mi")

        async def shows_hot() -> bool:
            assert sandbox.prometheus is not None
            samples = await sandbox.prometheus.query(f'cpu_usage_avg_5m{{instance="{target}"}}')
            return any(s.value > THRESHOLD * 100 for s in samples)

        await until(shows_hot, 60, f"Prometheus showing {target} hot", step=0.5)
        assert sandbox.exporter is not None
        stopped = time.monotonic()
        await sandbox.exporter.stop()
        stale_from = stopped + 15  # the 5 s rate and 10 s average windows have passed
        while time.monotonic() - stopped < 15 + phase_s:
            await watch.poll()
            await asyncio.sleep(1)
        outcome.evictions_stale = watch.evicted_since(stale_from)
        outcome.notes += [
            f"stale phase: evicted {at - stopped:.0f} s after the exporter stopped {what}"
            for at, what in watch.evictions
            if at >= stopped
        ]
        fresh = watch.evicted_since(stopped) - outcome.evictions_stale
        outcome.notes.append(f"{fresh} eviction(s) in the 15 s after the exporter stopped (data not yet stale)")
        print(f"[{backend}] stale: {outcome.evictions_stale} evictions ({fresh} before the data went stale)")
        return outcome
    finally:
        if extra is not None:
            await extra.stop()
        await api.close()
        print(f"[{backend}] logs: {sandbox.run_dir}", flush=True)
        await sandbox.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rebalance", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", default="crane,descheduler", help="comma-separated: crane, descheduler")
    parser.add_argument("--replicas", type=int, default=6, help="replicas of each of the three Deployments")
    parser.add_argument("--drift-timeout", type=float, default=240.0, help="seconds to wait for the hot nodes to cool")
    parser.add_argument("--phase", type=float, default=45.0, help="seconds of the every-node-hot and stale phases")
    parser.add_argument(
        "--same-workload",
        default="",
        choices=("", *WORKLOADS),
        help="drift the two nodes holding a pod of this Deployment, that pod being the 4-CPU one on both",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/rebalance/results/rebalance.md"))
    args = parser.parse_args()
    outcomes = []
    for backend in args.backends.split(","):
        if backend not in ("crane", "descheduler"):
            parser.error(f"--backends: unknown backend {backend!r} (crane, descheduler)")
        outcomes.append(asyncio.run(run(backend, args.replicas, args.drift_timeout, args.phase, args.same_workload)))
    text = table(outcomes)
    notes = [f"- {o.backend}: {n}" for o in outcomes for n in o.notes]
    print(text + "\n" + "\n".join(notes))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n\n" + "\n".join(notes) + "\n")


if __name__ == "__main__":
    main()
