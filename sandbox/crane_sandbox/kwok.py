"""Simulated kubelets: KWOK's controller, built from the pinned module, run against the sandbox's API server.

KWOK manages the nodes carrying ``kwok.x-k8s.io/node: fake`` and plays its default stages on them (see
``crane_sandbox.kubebin.KWOK_STAGES``): nodes turn Ready and renew a Lease every few seconds (so the node
lifecycle controller keeps them untainted), bound pods go Running with a pod IP, Job pods complete, deletions
are confirmed. It authenticates as ``kwok-controller`` with the permissions of KWOK's own ClusterRole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_sandbox.kubebin import KwokBinaries
from crane_sandbox.procs import ManagedProcess, free_port
from crane_shared.kube import raw_json

MANAGED_ANNOTATION = "kwok.x-k8s.io/node"
MANAGED_VALUE = "fake"
USER = "kwok-controller"
POD_CIDR = "10.244.0.0/16"
"""Pod IPs; disjoint from the simulated nodes' 10.0.x.y addresses."""
LEASE_SECONDS = 40
"""The kubelet's default Lease duration; KWOK renews at a quarter of it, like a kubelet."""
WARMUP_POD = "kwok-ip-pool-warmup"

CLUSTER_ROLE: dict[str, Any] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "kwok-controller"},
    # KWOK's kustomize/rbac/role.yaml without its CRDs (this sandbox configures stages by file).
    "rules": [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "update"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes/status", "pods/status"], "verbs": ["patch", "update"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete", "get", "list", "patch", "update", "watch"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["create", "get", "list", "patch", "update", "watch"],
        },
    ],
}
CLUSTER_ROLE_BINDING: dict[str, Any] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "kwok-controller"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kwok-controller"},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
}


async def grant(api_client: client.ApiClient) -> None:
    """Create KWOK's ClusterRole and its binding (idempotent)."""
    rbac = client.RbacAuthorizationV1Api(api_client)
    for create, body in (
        (rbac.create_cluster_role, CLUSTER_ROLE),
        (rbac.create_cluster_role_binding, CLUSTER_ROLE_BINDING),
    ):
        try:
            await raw_json(create(body, _preload_content=False, _request_timeout=30))
        except ApiException as e:
            if e.status != 409:
                raise


@dataclass
class KwokController:
    run_dir: Path
    binaries: KwokBinaries
    kubeconfig: Path
    port: int = field(default_factory=free_port)
    process: ManagedProcess | None = None

    async def start(self) -> None:
        self.process = ManagedProcess(
            "kwok",
            [
                str(self.binaries.kwok),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={self.binaries.stages}",
                f"--manage-nodes-with-annotation-selector={MANAGED_ANNOTATION}={MANAGED_VALUE}",
                f"--node-lease-duration-seconds={LEASE_SECONDS}",
                f"--cidr={POD_CIDR}",
                f"--server-address=127.0.0.1:{self.port}",
                "--v=INFO",
            ],
            self.run_dir / "logs" / "kwok.log",
        )
        await self.process.start()
        await self.process.wait_ready(self._ready, timeout=60)

    async def _ready(self) -> bool:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{self.port}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            return r.status == 200

    async def warm_ip_pool(self, api_client: client.ApiClient, node: str, namespace: str = "default") -> None:
        """Have KWOK hand out one pod IP, alone, before any workload runs; then delete that pod.

        KWOK v0.8.0 builds its per-CIDR IP pool on first use with a check-then-store (``PodController.ipPool``), so
        when several pods go Running at once on a fresh KWOK, two pools can be built and two pods get the same IP
        (seen in CI: 20 replicas, 19 distinct IPs). One pod first builds the one pool; its IP is recycled on
        delete."""
        assert self.process is not None, "start() first"
        v1 = client.CoreV1Api(api_client)
        name = WARMUP_POD

        async def has_ip() -> bool:
            pod = await raw_json(v1.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=30))
            return bool(pod.get("status", {}).get("podIP"))

        async def gone() -> bool:
            try:
                await raw_json(v1.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=30))
            except ApiException as e:
                return e.status == 404
            return False

        body = {
            "metadata": {"name": name},
            "spec": {
                "nodeName": node,
                "automountServiceAccountToken": False,
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
        await raw_json(v1.create_namespaced_pod(namespace, body, _preload_content=False, _request_timeout=30))
        await self.process.wait_ready(has_ip, timeout=60, interval=0.1)
        await raw_json(
            v1.delete_namespaced_pod(
                name, namespace, grace_period_seconds=0, _preload_content=False, _request_timeout=30
            )
        )
        await self.process.wait_ready(gone, timeout=60, interval=0.1)

    async def stop(self) -> None:
        if self.process:
            await self.process.stop()
