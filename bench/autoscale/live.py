"""One variant of the autoscaling bench, live: a fresh sandbox with Karpenter, the scenario played, every tick
recorded (``bench.autoscale.score.Record``).

The bench plays the service's HPA (``bench.autoscale.scenario.Hpa``: it scales the Deployment) and its load (each
running replica's ``sandbox.crane.io/usage`` annotation, the demand shared by the replicas that run), and samples,
every tick: the nodes (the sandbox's own and Karpenter's, Ready or not, being removed or not: a node costs from
its creation to its deletion), their real usage from the simulated fleet (the ground truth the exporter serves),
the NodeClaims, and the service's pods. Times are the bench's own clock, to the tick.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

from bench.autoscale.scenario import Hpa, Scenario, pod_usage, usage_annotation
from bench.autoscale.score import NodeLife, NodeUsage, PodLife, Record, Tick
from crane_sandbox.fleet import USAGE_ANNOTATION
from crane_sandbox.karpenter import GROUP, NodePoolSettings
from crane_sandbox.sandbox import SANDBOX_POLICY, Mode, Sandbox
from crane_sandbox.topology import TopologySpec
from crane_shared.kube import api_client_from_dict, raw_json
from crane_shared.policy import parse_policy

NAMESPACE = "autoscale"
APP = "app"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
LOAD_TAINT = "crane.io/load-hot"
TIMEOUT = 30.0
PATCH_CONCURRENCY = 8
ALL_SERVICES = ("event-recorder", "annotator", "scheduler", "descheduler")


@dataclass(frozen=True)
class Variant:
    key: str
    title: str
    mode: Mode
    services: tuple[str, ...]
    load_signals: bool


VARIANTS: dict[str, Variant] = {
    "a": Variant("a", "kube-scheduler alone (requests only)", "second", (), False),
    "b": Variant("b", "crane-scheduler without the taint", "replace", ALL_SERVICES, False),
    "c": Variant("c", "crane-scheduler with the taint, packing and the drain", "replace", ALL_SERVICES, True),
}
"""(a) the real kube-scheduler serves the service (``--mode second``; none of crane's services run); (b) the
product as it is beside an autoscaler (crane-scheduler replacing the default scheduler, the annotator, the
load-aware descheduler); (c) the same with the sandbox's ``--autoscaler`` policies: the load taint, packing, the
drain strategy."""


def threshold_and_round(policy: str = SANDBOX_POLICY) -> tuple[float, float]:
    """The policy's CPU threshold (``cpu_usage_avg_5m``'s limit; memory's is the same in the sandbox) and its sync
    period: one load round."""
    parsed = parse_policy(policy)
    limit = next(p.max_limit_percent for p in parsed.predicate if p.name == "cpu_usage_avg_5m")
    return limit, parsed.period_of("cpu_usage_avg_5m").total_seconds()


def deployment(scenario: Scenario) -> dict[str, Any]:
    labels = {"app": APP}
    usage = usage_annotation(
        pod_usage(scenario.base_work, scenario.initial_replicas, scenario.pod_cpu_limit), scenario.pod_memory_usage
    )
    container = {
        "name": APP,
        "image": APP,
        "resources": {
            "requests": {"cpu": f"{round(scenario.pod_cpu_request * 1000)}m", "memory": scenario.pod_memory_request},
            "limits": {"cpu": f"{round(scenario.pod_cpu_limit * 1000)}m"},
        },
    }
    return {
        "metadata": {"name": APP},
        "spec": {
            "replicas": scenario.initial_replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {USAGE_ANNOTATION: usage}},
                "spec": {"containers": [container], "terminationGracePeriodSeconds": 0},
            },
        },
    }


class Driver:
    """Plays the scenario against one sandbox and records it."""

    def __init__(self, sandbox: Sandbox, api: client.ApiClient, record: Record) -> None:
        self.sandbox = sandbox
        self.api = api
        self.record = record
        self.scenario = record.scenario
        self.v1 = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.hpa = Hpa(self.scenario)
        self.replicas = self.scenario.initial_replicas
        self.claims: dict[str, float] = {}
        self._surge_end_seen = False
        self._gate = asyncio.Semaphore(PATCH_CONCURRENCY)

    async def prepare(self) -> None:
        await raw_json(self.v1.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False))
        await self._until(self._has_account, 60, "the namespace's default ServiceAccount")
        await raw_json(
            self.apps.create_namespaced_deployment(NAMESPACE, deployment(self.scenario), _preload_content=False)
        )
        await self._until(self._all_running, 180, "the service's first replicas Running")

    async def _has_account(self) -> bool:
        body = await raw_json(self.v1.list_namespaced_service_account(NAMESPACE, _preload_content=False))
        return any(a["metadata"]["name"] == "default" for a in body["items"])

    async def _all_running(self) -> bool:
        pods = await self._pods()
        running = [p for p in pods if _running(p)]
        return len(running) == self.scenario.initial_replicas

    @staticmethod
    async def _until(predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not await predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"after {timeout:.0f}s: {what}")
            await asyncio.sleep(0.5)

    async def _pods(self) -> list[dict[str, Any]]:
        body = await raw_json(self.v1.list_namespaced_pod(NAMESPACE, _preload_content=False, _request_timeout=TIMEOUT))
        return list(body["items"])

    async def play(self) -> Record:
        started = time.monotonic()
        tick = 0
        while True:
            t = time.monotonic() - started
            if t > self.scenario.duration_s:
                break
            await self.step(t)
            tick += 1
            next_at = started + tick * self.scenario.tick_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        return self.record

    async def step(self, t: float) -> None:
        desired = self.hpa.desired(t)
        if desired != self.replicas:
            await raw_json(
                self.apps.patch_namespaced_deployment_scale(
                    APP, NAMESPACE, {"spec": {"replicas": desired}}, _preload_content=False, _request_timeout=TIMEOUT
                )
            )
            self.replicas = desired
        pods, nodes, claims = await asyncio.gather(self._pods(), self._nodes(), self._claims())
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        running = sum(_running(p) for p in live)
        cpu = pod_usage(self.scenario.work(t), running, self.scenario.pod_cpu_limit)
        wanted = usage_annotation(cpu, self.scenario.pod_memory_usage)
        await asyncio.gather(*(self._set_usage(p, wanted) for p in live if _usage(p) != wanted))
        self._observe_pods(t, pods)
        if not self._surge_end_seen and t >= self.scenario.fall_start:
            self._surge_end_seen = True
            self.record.notes += pending_reasons(live)
        self._observe_claims(t, claims)
        usages = self._observe_nodes(t, nodes)
        self.record.ticks.append(
            Tick(t, usages, replicas=self.replicas, running=running, pending=len(live) - running, pod_cpu=cpu)
        )

    async def _set_usage(self, pod: dict[str, Any], usage: str) -> None:
        async with self._gate:
            try:
                await raw_json(
                    self.v1.patch_namespaced_pod(
                        pod["metadata"]["name"],
                        NAMESPACE,
                        {"metadata": {"annotations": {USAGE_ANNOTATION: usage}}},
                        _preload_content=False,
                        _request_timeout=TIMEOUT,
                    )
                )
            except client.exceptions.ApiException as e:
                if e.status != 404:  # deleted meanwhile (scaled in, evicted)
                    raise

    async def _nodes(self) -> list[dict[str, Any]]:
        body = await raw_json(self.v1.list_node(_preload_content=False, _request_timeout=TIMEOUT))
        return list(body["items"])

    async def _claims(self) -> list[dict[str, Any]]:
        body = await raw_json(
            self.custom.list_cluster_custom_object(
                GROUP, "v1", "nodeclaims", _preload_content=False, _request_timeout=TIMEOUT
            )
        )
        return list(body["items"])

    def _observe_pods(self, t: float, pods: list[dict[str, Any]]) -> None:
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            life = self.record.pods.setdefault(uid, PodLife(created=t))
            if life.running is None and _running(pod):
                life.running = t
            if life.gone is None and pod["metadata"].get("deletionTimestamp"):
                life.gone = t
        for uid, life in self.record.pods.items():
            if uid not in seen and life.gone is None:
                life.gone = t

    def _observe_claims(self, t: float, claims: list[dict[str, Any]]) -> None:
        for claim in claims:
            name = claim["metadata"]["name"]
            first = self.claims.setdefault(name, t)
            node = (claim.get("status") or {}).get("nodeName")
            if node and node in self.record.nodes:
                life = self.record.nodes[node]
                life.claimed = first if life.claimed is None else min(life.claimed, first)

    def _observe_nodes(self, t: float, nodes: list[dict[str, Any]]) -> tuple[NodeUsage, ...]:
        state = self.sandbox.state
        assert state is not None
        seen = set()
        out = []
        for node in nodes:
            name = node["metadata"]["name"]
            seen.add(name)
            added = NODEPOOL_LABEL in (node["metadata"].get("labels") or {})
            life = self.record.nodes.setdefault(name, NodeLife(added=added, first_seen=t))
            ready = _schedulable(node)
            if ready and life.ready is None:
                life.ready = t
            cpu, memory = state.usage(name) if name in state.nodes else (0.0, 0.0)
            tainted = LOAD_TAINT in {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
            out.append(NodeUsage(name, cpu, memory, added, ready, tainted))
        for name, life in self.record.nodes.items():
            if name not in seen and life.gone is None:
                life.gone = t
        return tuple(out)


def pending_reasons(pods: list[dict[str, Any]]) -> list[str]:
    """Why the pods not Running were pending (their ``PodScheduled`` condition), counted by reason."""
    counts: dict[str, int] = {}
    for pod in pods:
        if _running(pod):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        scheduled: dict[str, Any] = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
        reason = scheduled.get("message") or ("bound, not yet Running" if pod["spec"].get("nodeName") else "none")
        counts[reason] = counts.get(reason, 0) + 1
    return [f"pending at the surge's end, {n} x: {reason}" for reason, n in sorted(counts.items(), key=lambda x: -x[1])]


def _running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def _usage(pod: dict[str, Any]) -> str:
    return str((pod["metadata"].get("annotations") or {}).get(USAGE_ANNOTATION, ""))


STARTUP_TAINTS = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable", "karpenter.sh/unregistered"}


def _schedulable(node: dict[str, Any]) -> bool:
    """Ready, and rid of the taints of a node still starting (not-ready, Karpenter's unregistered)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
    return ready and not taints & STARTUP_TAINTS


async def run_variant(variant: Variant, scenario: Scenario, log: Any = print) -> Record:
    """A fresh sandbox for ``variant``, the scenario played on it, the sandbox stopped."""
    threshold, round_s = threshold_and_round()
    sandbox = Sandbox(
        nodes=scenario.nodes,
        load="even",
        mode=variant.mode,
        services=variant.services,
        autoscaler="karpenter",
        load_signals=variant.load_signals,
        nodepool=NodePoolSettings(
            max_nodes=scenario.max_nodes,
            consolidate_after=scenario.consolidate_after,
            consolidation_policy=scenario.consolidation_policy,
        ),
        topology=TopologySpec(0),  # no NRT: Karpenter's nodes publish none, so neither do the sandbox's
    )
    record = Record(variant.key, scenario, threshold, round_s)
    log(f"[{variant.key}] starting the sandbox ({variant.title})...")
    await sandbox.start()
    assert sandbox.cluster is not None
    api = await api_client_from_dict(sandbox.cluster.kubeconfig_dict())
    try:
        if variant.services and not await sandbox.wait_load_aware():
            record.notes.append("the nodes lacked their load annotations when the run began")
        driver = Driver(sandbox, api, record)
        await driver.prepare()
        log(f"[{variant.key}] playing {scenario.duration_s:.0f}s (run directory {sandbox.run_dir})")
        await driver.play()
        record.notes.append(f"run directory {sandbox.run_dir}")
    finally:
        await api.close()
        await sandbox.stop()
    return record
