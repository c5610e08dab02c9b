"""The sandbox: the local cluster with kube-controller-manager, KWOK's simulated kubelets, a simulated
node-exporter fleet with uneven base load, Prometheus and the services; on request an autoscaler (Karpenter with
its KWOK provider) whose nodes join the simulated fleet.

Composition only: every part lives in its own module (cluster, kwok, fleet, exporter, prometheus, pod_follower)
and each service runs as its own process with its real command line, exactly as in a container, logging to the run
directory. Services whose package has no entry point yet are skipped with a note.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import yaml
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_sandbox.crds import PODGROUP_CRD
from crane_sandbox.crds import install_crd as install_crd_file
from crane_sandbox.devices import DEVICE_CLASS, publish_devices
from crane_sandbox.exporter import FleetExporter
from crane_sandbox.fleet import FleetState, LoadShape, SimNode, base_loads, make_fleet
from crane_sandbox.karpenter import NODEPOOL, KarpenterController, NodePoolSettings
from crane_sandbox.kubebin import KarpenterBinaries, ensure_binaries, ensure_karpenter, ensure_kwok
from crane_sandbox.kwok import USER as KWOK_USER
from crane_sandbox.kwok import KwokController
from crane_sandbox.kwok import grant as grant_kwok
from crane_sandbox.node_follower import NodeFollower
from crane_sandbox.pod_follower import PodFollower, create_nodes
from crane_sandbox.procs import ManagedProcess, free_port, service_argv
from crane_sandbox.prometheus import PrometheusServer
from crane_sandbox.rbac import ServiceIdentity, install_identities
from crane_sandbox.topology import TopologySpec, install_crd, publish_fleet
from crane_shared.annotations import annotation_key
from crane_shared.kube import api_client_from_dict, raw_json
from crane_shared.policy import parse_policy

SANDBOX_POLICY = """\
# The upstream default policy with sync periods short enough to watch the sandbox react (the fast recording
# rules average over 10 s instead of 5 min).
apiVersion: scheduler.policy.crane.io/v1alpha1
kind: DynamicSchedulerPolicy
spec:
  syncPolicy:
    - {name: cpu_usage_avg_5m, period: 5s}
    - {name: cpu_usage_max_avg_1h, period: 15s}
    - {name: cpu_usage_max_avg_1d, period: 30s}
    - {name: mem_usage_avg_5m, period: 5s}
    - {name: mem_usage_max_avg_1h, period: 15s}
    - {name: mem_usage_max_avg_1d, period: 30s}
  predicate:
    - {name: cpu_usage_avg_5m, maxLimitPecent: 0.65}
    - {name: cpu_usage_max_avg_1h, maxLimitPecent: 0.75}
    - {name: mem_usage_avg_5m, maxLimitPecent: 0.65}
    - {name: mem_usage_max_avg_1h, maxLimitPecent: 0.75}
  priority:
    - {name: cpu_usage_avg_5m, weight: 0.2}
    - {name: cpu_usage_max_avg_1h, weight: 0.3}
    - {name: cpu_usage_max_avg_1d, weight: 0.5}
    - {name: mem_usage_avg_5m, weight: 0.2}
    - {name: mem_usage_max_avg_1h, weight: 0.3}
    - {name: mem_usage_max_avg_1d, weight: 0.5}
  hotValue:
    - {timeRange: 5m, count: 5}
    - {timeRange: 1m, count: 2}
  # Batch capacity (crane.io/batch-cpu, crane.io/batch-memory) with koordinator's defaults; the pods' CPU rate over
  # the fast rules' 10 s window, stale inputs degrading within 2 minutes; each metric's batch share from the fast
  # rules' batch_* recording rules (what a regular pod's reading of the metric takes out).
  reclaim:
    podUsageWindow: 10s
    degradeAfter: 2m
    batchMetrics:
      cpu_usage_avg_5m: batch_cpu_usage_avg_5m
      cpu_usage_max_avg_1h: batch_cpu_usage_max_avg_1h
      cpu_usage_max_avg_1d: batch_cpu_usage_max_avg_1d
      mem_usage_avg_5m: batch_mem_usage_avg_5m
      mem_usage_max_avg_1h: batch_mem_usage_max_avg_1h
      mem_usage_max_avg_1d: batch_mem_usage_max_avg_1d
"""


Mode = Literal["replace", "second"]
Autoscaler = Literal["karpenter"]


AUTOSCALING_POLICY = """\
  # --autoscaler (README, "With an autoscaler"): a node hot for 2 samples in a row carries
  # crane.io/load-hot:NoSchedule, so the autoscaler's simulation sees it full and adds a node for the pods refused
  # there; lifted after 2 cool samples. The 5-minute averages taint at 0.6, five points under the predicates: the
  # Filter also refuses a node that the incoming pod would push over 0.65, and a node refusing every pod without
  # the taint hides the pending pods from the autoscaler (above the uneven fleet's highest base load, 0.55 CPU and
  # 0.6 memory, so no idle node is tainted); the 1-hour maxima at 0.7, five points under their predicates' 0.75 for
  # the same reason. The score packs toward 50 % real usage, leaving the emptiest nodes empty. A node Karpenter
  # just added, before the annotator's first round, is judged by the estimates of the pods bound to it
  # (newNodes.estimate), not passed whatever its load: it fills to the thresholds, not to its whole capacity by
  # requests; each binding counts there for up to 2 minutes (newNodes.window), longer than a new node waits for its
  # first reading (scraped, averaged, annotated), where the 15 s estimate window would let it fill by requests.
  loadTaint:
    hotRounds: 2
    coolRounds: 2
    thresholds:
      cpu_usage_avg_5m: 0.6
      mem_usage_avg_5m: 0.6
      cpu_usage_max_avg_1h: 0.7
      mem_usage_max_avg_1h: 0.7
  scoring: {strategy: pack, targetUtilization: 0.5}
  newNodes: {estimate: true, window: 2m}
"""

AUTOSCALING_DESCHEDULER_POLICY = """\
  # --autoscaler: nodes whose real usage (under the low thresholds) and requests (under half) are low for 3 rounds
  # are emptied, two at a time, when every pod has a place elsewhere by the scheduler's Filter, so the autoscaler
  # removes them.
  drain: {consecutiveRounds: 3, maxNodes: 2}
"""


def autoscaling_policy(policy: str) -> str:
    """The sandbox policy as ``--autoscaler`` runs it (``AUTOSCALING_POLICY`` added to its spec): the load taint,
    so an autoscaler's simulation sees a hot node as full and adds nodes for the pods crane-scheduler refuses
    there, the packing score, and new nodes judged by their bindings' estimates."""
    return policy.rstrip("\n") + "\n" + AUTOSCALING_POLICY


def autoscaling_descheduler_policy(policy: str) -> str:
    """The descheduler policy under ``--autoscaler`` (``AUTOSCALING_DESCHEDULER_POLICY`` added to its spec): the
    drain, which empties idle nodes so the autoscaler can remove them."""
    return policy.rstrip("\n") + "\n" + AUTOSCALING_DESCHEDULER_POLICY


SCHEDULER_CONFIG_HEADER = """\
# crane-scheduler's configuration in the sandbox: kube-scheduler's default plugins plus Dynamic, reading the
# sandbox policy, NodeResourceTopologyMatch (the simulated nodes publish NRTs; upstream's weight 2) and the gang
# plugins (Coscheduling: PodGroups, in place of PrioritySort; GangScheduling: 1.35's Workload API; pods of no
# group are placed as before), in the profile {scheduler_name} (in mode "replace" the same profile also as
# crane-scheduler, so pods that name it are placed too). The lease lives in the sandbox's default namespace. The
# estimate of a just-bound pod lasts as long as the fast rules take to absorb it (a 10 s average, 5 s sync),
# not the 5 minutes of the upstream rules.
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  resourceNamespace: default
profiles:
"""

SCHEDULER_PROFILE = """\
  - schedulerName: {scheduler_name}
    plugins:
      queueSort:
        enabled: [{name: Coscheduling}]
        disabled: [{name: "*"}]
      multiPoint:
        enabled: [{name: NodeResourceTopologyMatch, weight: 2}, {name: Coscheduling}, {name: GangScheduling}]
    pluginConfig:
      - name: Dynamic
        args:
          policyConfigPath: {policy}
          estimate: {window: 15s}
      - name: NodeResourceTopologyMatch
        args: {topologyAwareResources: [cpu]}
"""


PACKING_PLUGIN_CONFIG = """\
      # --autoscaler: kube's own scores pack too (its documented bin-packing set-up: MostAllocated, no default
      # spreading), beside Dynamic's pack: otherwise least-allocated and the default hostname spreading favour the
      # node the drain is emptying, and the scheduler would send the pods back (the drain then refuses it)
      - name: NodeResourcesFit
        args:
          scoringStrategy:
            type: MostAllocated
            resources: [{name: cpu, weight: 1}, {name: memory, weight: 1}]
      - name: PodTopologySpread
        args: {defaultingType: List, defaultConstraints: []}
"""


def sandbox_scheduler_config(names: tuple[str, ...], packing: bool = False) -> str:
    """The sandbox's configuration with the same profile under each of ``names``; ``packing`` (``--autoscaler``):
    kube's scores pack as Dynamic's does (``PACKING_PLUGIN_CONFIG``)."""
    profile = SCHEDULER_PROFILE + (PACKING_PLUGIN_CONFIG if packing else "")
    return SCHEDULER_CONFIG_HEADER.replace("{scheduler_name}", names[0]) + "".join(
        profile.replace("{scheduler_name}", name) for name in names
    )


UPSTREAM_STYLE = "crane-upstream-style"

SANDBOX_DESCHEDULER_POLICY = """\
# crane-descheduler's defaults, faster: a round every 5 s (--interval), pods may go once 20 s old, a node is hot
# after 3 hot rounds in a row; thresholds are the scheduler policy's (the file above).
apiVersion: descheduler.policy.crane.io/v1alpha1
kind: LoadAwareDeschedulerPolicy
spec:
  anomaly: {consecutiveAbnormalities: 3, consecutiveNormalities: 2}
  evictable: {minPodAge: 20s}
  limits: {maxPerNodePerRound: 1, maxPerNamespacePerRound: 2, maxUnavailablePerWorkload: 1, maxPerMinute: 10}
"""


def comparison_config(**ours: Any) -> str:
    """crane-scheduler's configuration for comparing it with upstream's behaviour on one cluster (the seed
    experiment): profile ``crane-scheduler`` runs Dynamic on the sandbox policy with ``ours`` as further args,
    profile ``crane-upstream-style`` the same policy as upstream does, without this scheduler's own bindings in the
    hot value and without the estimate of just-bound pods. The lease lives in the sandbox's default namespace."""
    policy = {"policyConfigPath": "{policy}"}
    upstream = {**policy, "ownBindingsInHotValue": False, "estimate": {"enabled": False}}
    profiles = [
        {"schedulerName": "crane-scheduler", "pluginConfig": [{"name": "Dynamic", "args": {**policy, **ours}}]},
        {"schedulerName": UPSTREAM_STYLE, "pluginConfig": [{"name": "Dynamic", "args": upstream}]},
    ]
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"resourceNamespace": "default"},
        "profiles": profiles,
    }
    return yaml.safe_dump(config, sort_keys=False)


KUBE_SCHEDULER_CONFIG = """\
# The real kube-scheduler beside crane-scheduler ("second scheduler" mode): it serves default-scheduler.
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
leaderElection:
  leaderElect: false
profiles:
  - schedulerName: default-scheduler
"""


def crane_scheduler_name(mode: Mode) -> str:
    """The schedulerName crane-scheduler serves: all pods in mode "replace" (the seed documents' "replace the
    default scheduler"), only pods that ask for it in mode "second" (beside the real kube-scheduler)."""
    return "default-scheduler" if mode == "replace" else "crane-scheduler"


def crane_scheduler_names(mode: Mode) -> tuple[str, ...]:
    """Every schedulerName crane-scheduler serves: in mode "replace" also ``crane-scheduler``, so a pod written for
    mode "second" (or for a cluster where it runs beside kube-scheduler) is placed, not left Pending unnoticed."""
    return ("default-scheduler", "crane-scheduler") if mode == "replace" else ("crane-scheduler",)


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    module: str
    argv: list[str]
    port: int


@dataclass
class Sandbox:
    nodes: int = 10
    run_dir: Path = field(default_factory=lambda: new_run_dir("sandbox"))
    fleet: list[SimNode] | None = None
    """the simulated nodes; default: ``nodes`` nodes with uneven base load (``load``), instance labels cycling
    through every style"""
    load: LoadShape = "uneven"
    mode: Mode = "replace"
    scheduler_config: str | None = None
    policy: str = SANDBOX_POLICY
    """the DynamicSchedulerPolicy text the annotator, the scheduler and the descheduler read"""
    descheduler_policy: str = SANDBOX_DESCHEDULER_POLICY
    """the LoadAwareDeschedulerPolicy text"""
    topology: TopologySpec = field(default_factory=TopologySpec)
    """the NUMA layout of every simulated node's NRT (default 2 zones); zones 0: no NRT"""
    node_topologies: dict[str, TopologySpec] = field(default_factory=dict)
    """per-node overrides of ``topology``, by node name"""
    topologies: int = 0
    """NRT objects published"""
    devices: int = 0
    """simulated GPUs of every node, published as ResourceSlices (DRA) with the DeviceClass ``gpu``; 0: none"""
    node_devices: dict[str, int] = field(default_factory=dict)
    """per-node overrides of ``devices``, by node name"""
    gpus: int = 0
    """GPUs published"""
    """KubeSchedulerConfiguration text; ``{policy}`` is replaced by the policy file's path"""
    services: tuple[str, ...] = ("event-recorder", "annotator", "scheduler", "descheduler")
    kubectl: Path | None = None
    """kubectl at the Kubernetes pin (``kubebin.kubectl_binary``), named by the banner's line; None: not built"""
    autoscaler: Autoscaler | None = None
    """``karpenter``: Karpenter with its KWOK provider and the sandbox's NodePool (``nodepool``); its nodes join
    the simulated fleet (``NodeFollower``); the policies turn on what lets an autoscaler see load (the hooks
    ``autoscaling_*`` apply to the default policies only: a caller's own policy text is taken as it is)"""
    load_signals: bool = True
    """with an autoscaler, whether the policies turn on the load taint, packing and the drain strategy (False: the
    product's defaults beside the autoscaler, bench.autoscale's variant (b))"""
    nodepool: NodePoolSettings = field(default_factory=NodePoolSettings)
    karpenter_env: dict[str, str] = field(default_factory=dict)
    """further Karpenter settings, e.g. ``BATCH_MAX_DURATION``"""
    karpenter: KarpenterController | None = None
    cluster: LocalCluster | None = None
    kwok: KwokController | None = None
    kube_scheduler: ManagedProcess | None = None
    prometheus: PrometheusServer | None = None
    exporter: FleetExporter | None = None
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    identities: dict[str, ServiceIdentity] = field(default_factory=dict)
    """each service's ServiceAccount under the chart's RBAC, in the scheduler's lease namespace"""
    _api: client.ApiClient | None = None
    _follower: PodFollower | None = None
    _node_follower: NodeFollower | None = None
    state: FleetState | None = None

    def __post_init__(self) -> None:
        if self.packs:
            if self.policy == SANDBOX_POLICY:
                self.policy = autoscaling_policy(self.policy)
            if self.descheduler_policy == SANDBOX_DESCHEDULER_POLICY:
                self.descheduler_policy = autoscaling_descheduler_policy(self.descheduler_policy)

    @property
    def packs(self) -> bool:
        """With an autoscaler and its load signals: the policies taint, pack and drain, and kube's scores pack too."""
        return self.autoscaler is not None and self.load_signals

    @property
    def policy_path(self) -> Path:
        return self.run_dir / "policy.yaml"

    @property
    def descheduler_policy_path(self) -> Path:
        return self.run_dir / "descheduler-policy.yaml"

    @property
    def scheduler_config_path(self) -> Path:
        return self.run_dir / "scheduler-config.yaml"

    @property
    def scheduler_name(self) -> str:
        return crane_scheduler_name(self.mode)

    def reporting_controllers(self) -> list[str]:
        """The schedulers whose Scheduled events the event-recorder believes: kube-scheduler and every profile of the
        sandbox's crane-scheduler (the seed experiment runs an upstream-style profile beside ours)."""
        config = yaml.safe_load(self.scheduler_config_path.read_text()) or {}
        names = [p.get("schedulerName", "default-scheduler") for p in config.get("profiles") or []]
        return list(dict.fromkeys(["default-scheduler", *names]))

    def lease_namespace(self) -> str:
        """Where the scheduler's Lease lives (its configuration's ``leaderElection.resourceNamespace``); the
        services' ServiceAccounts and the annotator's Lease go there too, as the chart puts them in one namespace."""
        config = yaml.safe_load(self.scheduler_config_path.read_text()) or {}
        return str((config.get("leaderElection") or {}).get("resourceNamespace", "kube-system"))

    async def start(self) -> None:
        try:
            kwok_bins, kube_bins, karpenter_bins = await asyncio.gather(
                asyncio.to_thread(ensure_kwok), asyncio.to_thread(ensure_binaries), self._autoscaler_binaries()
            )
            self.cluster = LocalCluster(self.run_dir, binaries=kube_bins, controllers=True)
            await self.cluster.start()
            self._api = await api_client_from_dict(self.cluster.kubeconfig_dict())
            fleet = self.fleet or make_fleet(
                self.nodes, instance_styles=("ip:port", "ip", "name"), base_loads=base_loads(self.load, self.nodes)
            )
            self.nodes = len(fleet)
            state = FleetState(fleet)
            self.state = state
            self.exporter = FleetExporter(state)
            await self.exporter.start()
            self.prometheus = PrometheusServer(self.run_dir, self.exporter.targets(), rules="fast")
            await grant_kwok(self._api)
            self.kwok = KwokController(self.run_dir, kwok_bins, self.cluster.component_kubeconfig(KWOK_USER))
            await asyncio.gather(
                create_nodes(self._api, fleet, kwok=True),
                install_crd(self._api),
                install_crd_file(self._api, PODGROUP_CRD),
                self.prometheus.start(),
                self.kwok.start(),
            )
            self.topologies = await publish_fleet(self._api, fleet, self.topology, self.node_topologies)
            self.gpus = await publish_devices(
                self._api, fleet, self.devices, self.node_devices, zones=self.topology.zones
            )
            self._follower = PodFollower(self._api, state)
            self._follower.start()
            if self.autoscaler is not None:
                self._node_follower = NodeFollower(self._api, state)
                self._node_follower.start()
            self.policy_path.write_text(self.policy)
            self.descheduler_policy_path.write_text(self.descheduler_policy)
            if self.scheduler_config is None:
                config = sandbox_scheduler_config(crane_scheduler_names(self.mode), packing=self.packs)
            else:
                config = self.scheduler_config.replace("{scheduler_name}", self.scheduler_name)
            self.scheduler_config_path.write_text(config.replace("{policy}", str(self.policy_path)))
            if self.services:
                self.identities = await install_identities(
                    self.cluster, self._api, self.lease_namespace(), prefix="crane"
                )
            starts = [self._start_service(spec) for spec in self._service_specs()]
            if self.mode == "second":
                starts.append(self._start_kube_scheduler())
            if karpenter_bins is not None:
                starts.append(self._start_karpenter(karpenter_bins))
            await asyncio.gather(*starts, wait_ready(self._api, fleet))
            if fleet:
                await self.kwok.warm_ip_pool(self._api, fleet[0].name)
        except BaseException:
            await self.stop()
            raise

    async def _autoscaler_binaries(self) -> KarpenterBinaries | None:
        if self.autoscaler is None:
            return None
        return await asyncio.to_thread(ensure_karpenter)

    async def _start_karpenter(self, binaries: KarpenterBinaries) -> None:
        assert self.cluster is not None and self._api is not None
        self.karpenter = KarpenterController(
            self.cluster, binaries, settings=self.nodepool, env=dict(self.karpenter_env)
        )
        await self.karpenter.start(self._api)

    async def _start_kube_scheduler(self) -> None:
        assert self.cluster is not None and self.cluster.binaries is not None and self.cluster.pki is not None
        pki = self.cluster.pki
        kubeconfig = self.cluster.component_kubeconfig("system:kube-scheduler")
        config = self.run_dir / "kube-scheduler-config.yaml"
        config.write_text(KUBE_SCHEDULER_CONFIG.replace("{kubeconfig}", str(kubeconfig)))
        port = free_port()
        self.kube_scheduler = ManagedProcess(
            "kube-scheduler",
            [
                str(self.cluster.binaries.scheduler),
                f"--config={config}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                "--v=1",
            ],
            self.run_dir / "logs" / "kube-scheduler.log",
        )
        await self.kube_scheduler.start()
        await self.kube_scheduler.wait_ready(lambda: _healthy_tls(port, pki.ca_cert), timeout=60)

    def _service_specs(self) -> list[ServiceSpec]:
        assert self.cluster is not None and self.prometheus is not None
        if not self.services:  # a bare cluster (e.g. for a helm install): no identities were made
            return []
        redis = ["--redis-url", self.cluster.redis_url]
        annotator = self.identities["annotator"]
        specs = {
            "event-recorder": (
                "crane_event_recorder",
                [*redis, "--reporting-controllers", ",".join(self.reporting_controllers())],
            ),
            "annotator": (
                "crane_annotator",
                [
                    *redis,
                    "--prometheus-url",
                    self.prometheus.url,
                    "--policy",
                    str(self.policy_path),
                    "--lease-namespace",
                    annotator.namespace,
                    "--lease-name",
                    annotator.lease_name,
                ],
            ),
            "scheduler": ("crane_scheduler", ["--config", str(self.scheduler_config_path)]),
            "descheduler": ("crane_descheduler", self.descheduler_args()),
        }
        out = []
        for name in self.services:
            module, args = specs[name]
            port = free_port()
            # each service as its own ServiceAccount, under the chart's RBAC
            out.append(
                ServiceSpec(name, module, service_argv(module, self.identities[name].kubeconfig, port, *args), port)
            )
        return out

    def descheduler_args(self) -> list[str]:
        """crane-descheduler's flags in the sandbox: the sandbox's Prometheus and policies, a round every 5 s."""
        assert self.prometheus is not None
        identity = self.identities["descheduler"]
        # --autoscaler: the drain places replacements by the scheduler's own profile (its packing scores)
        profile = ["--scheduler-config", str(self.scheduler_config_path)] if self.packs else []
        return [
            *profile,
            "--prometheus-url",
            self.prometheus.url,
            "--policy",
            str(self.policy_path),
            "--descheduler-policy",
            str(self.descheduler_policy_path),
            "--interval",
            "5s",
            "--usage-window",
            "10s",
            "--estimate-window",
            "15s",  # the scheduler profile's estimate window above: the fast recording rules' averaging window
            "--lease-namespace",
            identity.namespace,
            "--lease-name",
            identity.lease_name,
        ]

    async def _start_service(self, spec: ServiceSpec) -> None:
        if importlib.util.find_spec(f"{spec.module}.__main__") is None:
            self.skipped.append(spec.name)
            return
        process = ManagedProcess(spec.name, spec.argv, self.run_dir / "logs" / f"{spec.name}.log")
        self.processes[spec.name] = process
        self.ports[spec.name] = spec.port
        await process.start()
        await process.wait_ready(lambda: _healthy(spec.port), timeout=60)

    async def stop(self) -> None:
        for process in [*self.processes.values(), self.kube_scheduler, self.karpenter]:
            if process is not None:
                with contextlib.suppress(Exception):
                    await process.stop()
        for follower in (self._follower, self._node_follower):
            if follower is not None:
                with contextlib.suppress(Exception):
                    await follower.stop()
        for part in (self.kwok, self.prometheus, self.exporter):
            if part is not None:
                with contextlib.suppress(Exception):
                    await part.stop()
        if self._api is not None:
            await self._api.close()
        if self.cluster is not None:
            await self.cluster.stop()

    async def wait_load_aware(self, timeout: float = 180.0) -> bool:
        """Until every simulated node carries every metric annotation of the sandbox policy: before the annotator's
        first round lands, Dynamic has no load to read and placement is by requests alone. False on timeout (or
        without an annotator)."""
        if "annotator" not in self.processes or self._api is None or not self.fleet_names():
            return False
        keys = [annotation_key(m) for m in parse_policy(self.policy).metrics()]
        v1 = client.CoreV1Api(self._api)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = await raw_json(v1.list_node(_preload_content=False, _request_timeout=30))
            annotated = {
                n["metadata"]["name"]
                for n in nodes.get("items", [])
                if all(k in (n["metadata"].get("annotations") or {}) for k in keys)
            }
            if self.fleet_names() <= annotated:
                return True
            await asyncio.sleep(0.5)
        return False

    def fleet_names(self) -> set[str]:
        return set(self.state.nodes) if self.state is not None else set()

    def describe(self) -> str:
        assert self.cluster is not None and self.prometheus is not None
        kubeconfig = self.cluster.kubeconfig_path
        mode = (
            "crane-scheduler serves default-scheduler (every pod) and crane-scheduler"
            if self.mode == "replace"
            else "crane-scheduler serves schedulerName crane-scheduler; kube-scheduler serves default-scheduler"
        )
        lines = [
            f"crane sandbox is up: {self.nodes} simulated nodes (KWOK), {mode}",
            f"{self.topologies} nodes publish a NodeResourceTopology (kubectl get nrt)",
        ]
        if self.gpus:
            lines.append(
                f"{self.gpus} simulated GPUs in ResourceSlices, DeviceClass {DEVICE_CLASS} (kubectl get resourceslices)"
            )
        if self.karpenter is not None:
            lines.append(
                f"Karpenter {self.karpenter.binaries.version} (KWOK provider) adds up to {self.nodepool.max_nodes} "
                f"nodes from NodePool {NODEPOOL} and removes them once empty for {self.nodepool.consolidate_after} "
                "(kubectl get nodepools,nodeclaims)"
            )
        lines += [
            f"run directory {self.run_dir}",
            "",
            "In another shell, paste this line first (kubectl, cranectl and python on PATH, the sandbox's kubeconfig):",
            "",
            f"  {env_line(kubeconfig, self.kubectl)}",
            "",
            "  kubectl create deployment web --image=nginx --replicas=6"
            + ("" if self.mode == "replace" else "   # placed by kube-scheduler"),
        ]
        if self.mode == "second":
            lines.append(
                '  kubectl run demo --image=nginx --overrides=\'{"spec":{"schedulerName":"crane-scheduler"}}\''
            )
        lines.append("  kubectl get pods -o wide")
        scheduler = f" --scheduler http://127.0.0.1:{self.ports['scheduler']}" if "scheduler" in self.ports else ""
        lines.append(f"  cranectl nodes --policy {self.policy_path}")
        if "descheduler" in self.ports:
            lines += [
                "  kubectl annotate pod <pod> --overwrite sandbox.crane.io/usage=cpu=6   # make its node hot",
                f"  cranectl plan --descheduler http://127.0.0.1:{self.ports['descheduler']}   # its last round",
            ]
        if scheduler:
            lines.append(f"  cranectl explain default/<pod>{scheduler}")
        lines += ["", f"  Prometheus:  {self.prometheus.url}"]
        for name, port in self.ports.items():
            lines.append(f"  {name + ':':14} http://127.0.0.1:{port}/metrics   (log: logs/{name}.log)")
        if self.karpenter is not None:
            lines.append(f"  {'karpenter:':14} {self.karpenter.metrics_url}   (log: logs/karpenter.log)")
        for name in self.skipped:
            lines.append(f"  {name + ':':14} not started (no entry point yet)")
        lines += ["", "Press Ctrl-C to stop; everything started here stops with it."]
        return "\n".join(lines)


def env_line(kubeconfig: Path, kubectl: Path | None) -> str:
    """The banner's one line to paste: PATH with kubectl's folder (~/.cache/crane-tools/...) and this interpreter's
    (the project's .venv/bin: cranectl, python with the project), and KUBECONFIG."""
    folders = [] if kubectl is None else [str(kubectl.parent)]
    folders.append(str(Path(sys.executable).parent))
    return f"export PATH={':'.join(dict.fromkeys(folders))}:$PATH KUBECONFIG={kubeconfig}"


async def wait_ready(api_client: client.ApiClient, fleet: list[SimNode], timeout: float = 120.0) -> None:
    """Until every simulated node is Ready without a taint (KWOK's heartbeat seen by the node lifecycle
    controller) and the ``default`` namespace has its ServiceAccount (pods can be created)."""
    v1 = client.CoreV1Api(api_client)
    names = {n.name for n in fleet}
    deadline = time.monotonic() + timeout
    while True:
        nodes = await raw_json(v1.list_node(_preload_content=False, _request_timeout=30))
        ready = {n["metadata"]["name"] for n in nodes.get("items", []) if node_is_ready(n)}
        accounts = await raw_json(
            v1.list_namespaced_service_account("default", _preload_content=False, _request_timeout=30)
        )
        has_default = any(a["metadata"]["name"] == "default" for a in accounts.get("items", []))
        if names <= ready and has_default:
            return
        if time.monotonic() > deadline:
            missing = sorted(names - ready)
            raise TimeoutError(
                f"after {timeout:.0f}s: nodes not Ready/untainted: {missing[:5]}{'...' if len(missing) > 5 else ''}; "
                f"default ServiceAccount present: {has_default}"
            )
        await asyncio.sleep(0.5)


def node_is_ready(node: dict[str, Any]) -> bool:
    """Ready=True and no taint (a fresh node carries node.kubernetes.io/not-ready until the controller lifts it)."""
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and not node.get("spec", {}).get("taints")


async def _healthy_tls(port: int, ca: Path) -> bool:
    ctx = ssl.create_default_context(cafile=str(ca))
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"https://127.0.0.1:{port}/healthz", ssl=ctx, timeout=aiohttp.ClientTimeout(total=2)) as r,
    ):
        return r.status == 200


async def _healthy(port: int) -> bool:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{port}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r,
    ):
        return r.status == 200
