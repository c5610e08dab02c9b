"""``cranectl sandbox``: the local cluster plus a simulated fleet, Prometheus and the three services.

Composition only: every part lives in its own module (cluster, fleet, exporter, prometheus, pod_follower) and
each service runs as its own process with its real command line, exactly as in a container, logging to the run
directory. Services whose package has no entry point yet are skipped with a note.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_sandbox.exporter import FleetExporter
from crane_sandbox.fleet import FleetState, SimNode, make_fleet
from crane_sandbox.pod_follower import PodFollower, create_nodes
from crane_sandbox.procs import ManagedProcess, free_port
from crane_sandbox.prometheus import PrometheusServer
from crane_shared.kube import api_client_from_dict

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
"""


SCHEDULER_CONFIG = """\
# crane-scheduler's configuration in the sandbox: kube-scheduler's default plugins plus Dynamic (the default
# profile), reading the sandbox policy. The lease lives in the sandbox's default namespace.
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  resourceNamespace: default
profiles:
  - schedulerName: crane-scheduler
    pluginConfig:
      - name: Dynamic
        args:
          policyConfigPath: {policy}
"""


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    module: str
    args: list[str]
    port: int


@dataclass
class Sandbox:
    nodes: int = 10
    run_dir: Path = field(default_factory=lambda: new_run_dir("sandbox"))
    fleet: list[SimNode] | None = None
    """the simulated nodes; default: ``nodes`` identical ones, instance labels cycling through every style"""
    scheduler_config: str | None = None
    """KubeSchedulerConfiguration text; ``{policy}`` is replaced by the policy file's path"""
    services: tuple[str, ...] = ("event-recorder", "annotator", "scheduler")
    cluster: LocalCluster | None = None
    prometheus: PrometheusServer | None = None
    exporter: FleetExporter | None = None
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    _api: client.ApiClient | None = None
    _follower: PodFollower | None = None
    state: FleetState | None = None

    @property
    def policy_path(self) -> Path:
        return self.run_dir / "policy.yaml"

    @property
    def scheduler_config_path(self) -> Path:
        return self.run_dir / "scheduler-config.yaml"

    async def start(self) -> None:
        try:
            self.cluster = LocalCluster(self.run_dir)
            await self.cluster.start()
            self._api = await api_client_from_dict(self.cluster.kubeconfig_dict())
            fleet = self.fleet or make_fleet(self.nodes, instance_styles=("ip:port", "ip", "name"))
            self.nodes = len(fleet)
            state = FleetState(fleet)
            self.state = state
            self.exporter = FleetExporter(state)
            await self.exporter.start()
            self.prometheus = PrometheusServer(self.run_dir, self.exporter.targets(), rules="fast")
            await asyncio.gather(create_nodes(self._api, fleet), self.prometheus.start())
            self._follower = PodFollower(self._api, state)
            self._follower.start()
            self.policy_path.write_text(SANDBOX_POLICY)
            config = (self.scheduler_config or SCHEDULER_CONFIG).replace("{policy}", str(self.policy_path))
            self.scheduler_config_path.write_text(config)
            await asyncio.gather(*(self._start_service(spec) for spec in self._service_specs()))
        except BaseException:
            await self.stop()
            raise

    def _service_specs(self) -> list[ServiceSpec]:
        assert self.cluster is not None and self.prometheus is not None
        kube = ["--kubeconfig", str(self.cluster.kubeconfig_path), "--listen-address", "127.0.0.1"]
        redis = ["--redis-url", self.cluster.redis_url]
        specs = {
            "event-recorder": ("crane_event_recorder", [*kube, *redis]),
            "annotator": (
                "crane_annotator",
                [
                    *kube,
                    *redis,
                    "--prometheus-url",
                    self.prometheus.url,
                    "--policy",
                    str(self.policy_path),
                    "--lease-namespace",
                    "default",
                ],
            ),
            "scheduler": ("crane_scheduler", [*kube, "--config", str(self.scheduler_config_path)]),
        }
        out = []
        for name in self.services:
            module, args = specs[name]
            port = free_port()
            out.append(ServiceSpec(name, module, [*args, "--port", str(port)], port))
        return out

    async def _start_service(self, spec: ServiceSpec) -> None:
        if importlib.util.find_spec(f"{spec.module}.__main__") is None:
            self.skipped.append(spec.name)
            return
        process = ManagedProcess(
            spec.name, [sys.executable, "-m", spec.module, *spec.args], self.run_dir / "logs" / f"{spec.name}.log"
        )
        self.processes[spec.name] = process
        self.ports[spec.name] = spec.port
        await process.start()
        await process.wait_ready(lambda: _healthy(spec.port), timeout=60)

    async def stop(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(Exception):
                await process.stop()
        if self._follower is not None:
            with contextlib.suppress(Exception):
                await self._follower.stop()
        for part in (self.prometheus, self.exporter):
            if part is not None:
                with contextlib.suppress(Exception):
                    await part.stop()
        if self._api is not None:
            await self._api.close()
        if self.cluster is not None:
            await self.cluster.stop()

    def describe(self) -> str:
        assert self.cluster is not None and self.prometheus is not None
        kubeconfig = self.cluster.kubeconfig_path
        lines = [
            f"crane sandbox is up: {self.nodes} simulated nodes, run directory {self.run_dir}",
            "",
            f"  export KUBECONFIG={kubeconfig}",
            "  kubectl get nodes -o custom-columns=NAME:.metadata.name,CPU5M:.metadata.annotations.cpu_usage_avg_5m,"
            "HOT:.metadata.annotations.node_hot_value",
            "  kubectl run demo --image=pause --restart=Never "
            '--overrides=\'{"spec":{"schedulerName":"crane-scheduler"}}\'',
            "  kubectl get pods -o wide; kubectl get events --field-selector reason=Scheduled",
        ]
        if "scheduler" in self.ports:
            lines.append(f"  cranectl explain default/demo --scheduler http://127.0.0.1:{self.ports['scheduler']}")
        lines += [
            "",
            f"  Prometheus:  {self.prometheus.url}",
        ]
        for name, port in self.ports.items():
            lines.append(f"  {name + ':':14} http://127.0.0.1:{port}/metrics   (log: logs/{name}.log)")
        for name in self.skipped:
            lines.append(f"  {name + ':':14} not started (no entry point yet)")
        lines += ["", "Press Ctrl-C to stop; everything started here stops with it."]
        return "\n".join(lines)


async def _healthy(port: int) -> bool:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/healthz") as r:
        return r.status == 200
