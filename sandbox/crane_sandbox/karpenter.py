"""The sandbox's autoscaler: Karpenter core with its KWOK cloud provider, built from the pinned module
(``sandbox/karpenter``, ``crane_sandbox.kubebin.ensure_karpenter``), run against the sandbox's API server.

Karpenter watches pods that every scheduler refused (``PodScheduled=False``, reason ``Unschedulable``), simulates
their placement with requests, taints and the standard predicates, and when they fit nowhere creates a NodeClaim
from a NodePool. The KWOK provider "launches" it by creating the Node object (no instance, no kubelet; the node
carries ``kwok.x-k8s.io/node: fake``), so the sandbox's KWOK controller plays its kubelet like any other simulated
node's (Ready, Lease, pods Running), and ``crane_sandbox.node_follower`` gives it simulated load in the fleet.
Karpenter removes a node its NodePool's disruption policy lets it remove (here: empty for ``consolidateAfter``).

Karpenter authenticates as the ServiceAccount of the pinned release's own chart (``helm template`` of the chart
copied from the module at build time: its ServiceAccount, roles and bindings applied as rendered, a TokenRequest
token), as the sandbox's services run under theirs; it runs alone, without leader election. The KWOK provider has no
controller for its ``KWOKNodeClass``, and a NodePool whose node class is not Ready provisions nothing, so the
sandbox marks the class Ready itself, as a provider's node-class controller would.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.crds import install_crd_body
from crane_sandbox.kubebin import KarpenterBinaries
from crane_sandbox.procs import ManagedProcess, free_port
from crane_sandbox.rbac import RBAC_KINDS, account_token, apply_objects, helm_binary
from crane_shared.kube import raw_json

RELEASE = "karpenter"
NAMESPACE = "kube-system"
"""Karpenter's namespace (the chart's release namespace: its ServiceAccount and its Role on leases live there)."""
NODEPOOL = "crane-sandbox"
NODECLASS = "crane-sandbox"
GROUP = "karpenter.sh"
KWOK_GROUP = "karpenter.kwok.sh"
TIMEOUT = 10.0

INSTANCE_TYPE = "s-8x-amd64-linux"
"""The one instance type the sandbox's provider offers: the shape of the sandbox's own nodes (8 CPUs, 32 GiB,
110 pods), on demand, in one zone; Karpenter's simulation then weighs one type instead of the provider's 144."""
INSTANCE_CPU = 8
INSTANCE_MEMORY = "32Gi"
ZONE = "sandbox-a"
INSTANCE_TYPES: list[dict[str, Any]] = [
    {
        "name": INSTANCE_TYPE,
        "architecture": "amd64",
        "operatingSystems": ["linux"],
        "resources": {"cpu": str(INSTANCE_CPU), "memory": INSTANCE_MEMORY, "pods": "110", "ephemeral-storage": "100Gi"},
        "offerings": [
            {
                "Price": 0.40,
                "Available": True,
                "Requirements": [
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                ],
            }
        ],
    }
]
"""The KWOK provider's instance-types file format (``--instance-types-file-path``)."""


@dataclass(frozen=True)
class NodePoolSettings:
    """What the sandbox's NodePool allows: at most ``max_nodes`` nodes of ``INSTANCE_TYPE`` (its CPU limit); a node
    empty for ``consolidate_after`` is removed (``WhenEmpty``: Karpenter never evicts pods by requests to repack
    them, the load-aware descheduler decides which nodes to drain)."""

    max_nodes: int = 10
    consolidate_after: str = "30s"
    consolidation_policy: str = "WhenEmpty"

    def __post_init__(self) -> None:
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes must be at least 1, got {self.max_nodes}")
        if self.consolidation_policy not in ("WhenEmpty", "WhenEmptyOrUnderutilized"):
            raise ValueError(
                f"consolidation_policy: expected WhenEmpty or WhenEmptyOrUnderutilized, got "
                f"{self.consolidation_policy!r}"
            )


def node_class_manifest() -> dict[str, Any]:
    return {"apiVersion": f"{KWOK_GROUP}/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": NODECLASS}}


def nodepool_manifest(settings: NodePoolSettings) -> dict[str, Any]:
    """The sandbox's NodePool: nodes like the sandbox's own (``INSTANCE_TYPE``), a CPU limit of ``max_nodes``
    nodes, never expiring, every empty node removable at once."""
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "NodePool",
        "metadata": {"name": NODEPOOL},
        "spec": {
            "template": {
                "metadata": {"labels": {"sandbox.crane.io/pool": NODEPOOL}},
                "spec": {
                    "nodeClassRef": {"group": KWOK_GROUP, "kind": "KWOKNodeClass", "name": NODECLASS},
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [INSTANCE_TYPE]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    ],
                    "expireAfter": "Never",
                },
            },
            "limits": {"cpu": str(settings.max_nodes * INSTANCE_CPU)},
            "disruption": {
                "consolidationPolicy": settings.consolidation_policy,
                "consolidateAfter": settings.consolidate_after,
                "budgets": [{"nodes": "100%"}],
            },
        },
    }


def render_chart(chart: Path, namespace: str = NAMESPACE) -> str:
    """``helm template`` of Karpenter's KWOK chart as release ``karpenter`` in ``namespace`` (the chart's defaults)."""
    out = subprocess.run(
        [helm_binary(), "template", RELEASE, str(chart), "--namespace", namespace],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout


def chart_rbac(rendered: str) -> list[dict[str, Any]]:
    """The rendered chart's ServiceAccount, (Cluster)Roles and bindings, as the chart ships them."""
    objects = [d for d in yaml.safe_load_all(rendered) if d and d.get("kind") in RBAC_KINDS]
    if sum(o["kind"] == "ServiceAccount" for o in objects) != 1 or not any(o["kind"] == "ClusterRole" for o in objects):
        raise ValueError("Karpenter's chart must render one ServiceAccount and its ClusterRoles: its templates changed")
    return objects


async def identity(cluster: LocalCluster, api_client: client.ApiClient, chart: Path) -> Path:
    """Apply the chart's RBAC and return a kubeconfig with a token of the chart's ServiceAccount."""
    objects = chart_rbac(await asyncio.to_thread(render_chart, chart))
    await apply_objects(api_client, objects)
    account = next(o["metadata"] for o in objects if o["kind"] == "ServiceAccount")
    namespace, name = account.get("namespace", NAMESPACE), account["name"]
    token = await account_token(api_client, namespace, name, seconds=24 * 3600)
    config = cluster.kubeconfig_dict(token, f"system:serviceaccount:{namespace}:{name}")
    return cluster.write_kubeconfig(cluster.run_dir / "kubeconfigs" / "karpenter.yaml", config)


async def install_crds(api_client: client.ApiClient, crds_text: str) -> None:
    """Karpenter's CRDs (``KarpenterBinaries.crds``), each Established before this returns."""
    docs = [d for d in yaml.safe_load_all(crds_text) if d]
    await asyncio.gather(*(install_crd_body(api_client, d) for d in docs))


async def apply_nodepool(api_client: client.ApiClient, settings: NodePoolSettings) -> None:
    """Create the KWOKNodeClass, mark it Ready, and create (or replace) the NodePool."""
    custom = client.CustomObjectsApi(api_client)
    try:
        await raw_json(
            custom.create_cluster_custom_object(
                KWOK_GROUP,
                "v1alpha1",
                "kwoknodeclasses",
                node_class_manifest(),
                _preload_content=False,
                _request_timeout=TIMEOUT,
            )
        )
    except ApiException as e:
        if e.status != 409:
            raise
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "marked Ready by crane_sandbox",
        "lastTransitionTime": stamp,
    }
    await raw_json(
        custom.patch_cluster_custom_object_status(
            KWOK_GROUP,
            "v1alpha1",
            "kwoknodeclasses",
            NODECLASS,
            {"status": {"conditions": [ready]}},
            _preload_content=False,
            _content_type="application/merge-patch+json",
            _request_timeout=TIMEOUT,
        )
    )
    body = nodepool_manifest(settings)
    try:
        await raw_json(
            custom.create_cluster_custom_object(
                GROUP, "v1", "nodepools", body, _preload_content=False, _request_timeout=TIMEOUT
            )
        )
    except ApiException as e:
        if e.status != 409:
            raise
        await raw_json(
            custom.patch_cluster_custom_object(
                GROUP,
                "v1",
                "nodepools",
                NODEPOOL,
                {"spec": body["spec"]},
                _preload_content=False,
                _content_type="application/merge-patch+json",
                _request_timeout=TIMEOUT,
            )
        )


async def nodepool_ready(api_client: client.ApiClient) -> bool:
    """The NodePool's Ready condition is True (its node class Ready and its spec validated): it provisions."""
    custom = client.CustomObjectsApi(api_client)
    pool = await raw_json(
        custom.get_cluster_custom_object(
            GROUP, "v1", "nodepools", NODEPOOL, _preload_content=False, _request_timeout=TIMEOUT
        )
    )
    conditions = (pool.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass
class KarpenterController:
    """Karpenter as a process: its CRDs and RBAC installed, the NodePool applied, ready once the NodePool is."""

    cluster: LocalCluster
    binaries: KarpenterBinaries
    settings: NodePoolSettings = field(default_factory=NodePoolSettings)
    metrics_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    process: ManagedProcess | None = None
    env: dict[str, str] = field(default_factory=dict)
    """further settings (Karpenter reads them from the environment, e.g. ``BATCH_MAX_DURATION``)"""

    @property
    def instance_types_path(self) -> Path:
        return self.cluster.run_dir / "karpenter-instance-types.json"

    async def start(self, api_client: client.ApiClient) -> None:
        crds = await asyncio.to_thread(self.binaries.crds.read_text)
        _, kubeconfig = await asyncio.gather(
            install_crds(api_client, crds), identity(self.cluster, api_client, self.binaries.chart)
        )
        self.instance_types_path.write_text(json.dumps(INSTANCE_TYPES, indent=1))
        self.process = ManagedProcess(
            "karpenter",
            [str(self.binaries.karpenter)],
            self.cluster.run_dir / "logs" / "karpenter.log",
            env={
                "KUBECONFIG": str(kubeconfig),
                "DISABLE_LEADER_ELECTION": "true",
                "METRICS_PORT": str(self.metrics_port),
                "HEALTH_PROBE_PORT": str(self.health_port),
                "INSTANCE_TYPES_FILE_PATH": str(self.instance_types_path),
                "LOG_LEVEL": "info",
                "KUBE_CLIENT_QPS": "50",
                "KUBE_CLIENT_BURST": "100",
                **self.env,
            },
        )
        await self.process.start()
        await self.process.wait_ready(self._ready, timeout=120)
        await apply_nodepool(api_client, self.settings)
        await self.process.wait_ready(lambda: nodepool_ready(api_client), timeout=60)

    async def _ready(self) -> bool:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{self.health_port}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            return r.status == 200

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    async def stop(self) -> None:
        if self.process:
            await self.process.stop()
