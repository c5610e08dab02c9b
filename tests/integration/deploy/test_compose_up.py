"""docker-compose for real: Debian's docker-compose drives podman (its Docker-compatible API) to start
docker-compose.cluster.yml, the "against your own cluster" file, against the sandbox's API server.

The public images it names (redis, prom/prometheus) cannot be pulled here: an override file swaps in stand-ins
built from Debian's packages and the service images built from deploy/Dockerfile. The whole local stack
(docker-compose.yml) is started by test_compose_stack.py.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import os
import subprocess
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis
import yaml
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.procs import ManagedProcess, tcp_open
from crane_shared.bindings import BindingSchema
from tests.support.deploy import REPO, podman
from tests.support.scheduler_cluster import create_nodes, node, pod, wait_for

PROJECT = "cranecomposetest"
ENDPOINTS = {
    "event-recorder": "http://127.0.0.1:8081/readyz",
    "annotator": "http://127.0.0.1:8082/healthz",
    "scheduler": "http://127.0.0.1:10261/readyz",
    "descheduler": "http://127.0.0.1:8084/healthz",
    "prometheus": "http://127.0.0.1:9090/-/ready",
}


async def _ok(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


def _flat_kubeconfig(cluster: LocalCluster, path: Path) -> Path:
    """The admin kubeconfig with the CA embedded (the container cannot see the host's CA file)."""
    assert cluster.pki is not None
    config = cluster.kubeconfig_dict()
    ca = base64.b64encode(Path(cluster.pki.ca_cert).read_bytes()).decode()
    config["clusters"][0]["cluster"] = {"server": cluster.api_url, "certificate-authority-data": ca}
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)
    return path


async def test_compose_cluster_file_comes_up_and_schedules(
    images: dict[str, str], standins: dict[str, str], cluster: LocalCluster, kube: client.ApiClient, tmp_path: Path
) -> None:
    socket = tmp_path / "podman.sock"
    api = ManagedProcess(
        "podman-api",
        [str(REPO / "scripts" / "container-engine"), "docker-api", str(socket)],
        cluster.run_dir / "logs" / "podman-api.log",
    )
    await api.start()
    override = tmp_path / "override.yml"
    services = {"redis": standins["redis"], "prometheus": standins["prometheus"]}
    services |= {name: images[name] for name in ("event-recorder", "annotator", "scheduler", "descheduler")}
    override.write_text(yaml.safe_dump({"services": {k: {"image": v} for k, v in services.items()}}))
    env = {
        **os.environ,
        "DOCKER_HOST": f"unix://{socket}",
        "KUBECONFIG": str(_flat_kubeconfig(cluster, tmp_path / "kubeconfig")),
        "UID": "65532",
        "GID": "65532",
    }
    files = ["-p", PROJECT, "-f", str(REPO / "docker-compose.cluster.yml"), "-f", str(override)]

    def compose(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(REPO / "scripts" / "container-engine"), "compose", *files, *args],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=REPO,
            check=False,
        )

    try:
        await wait_for(lambda: asyncio.to_thread(socket.exists), timeout=30, what="podman's API socket")
        up = await asyncio.to_thread(compose, "up", "-d", "--no-build")
        assert up.returncode == 0, up.stdout + up.stderr
        for name, url in ENDPOINTS.items():
            await wait_for(functools.partial(_ok, url), timeout=90, what=f"{name} from docker-compose")
        assert await tcp_open("127.0.0.1", 6379)
        ps = podman("ps", "--filter", f"label=com.docker.compose.project={PROJECT}", "--format", "{{.Names}}")
        running = sorted(ps.stdout.split())
        print("compose services up:", running)
        assert len(running) == 6, running

        # the stack does its job: crane-scheduler binds a pod, the event-recorder records the binding in Redis
        # the pod is pinned to a node tainted for this test alone: the cluster is shared with other tests, and a
        # pending pod one of them leaves for "crane-scheduler" would otherwise be bound here too (and stay recorded
        # after its test deletes it)
        taint = {"key": "crane.test/compose", "value": "only", "effect": "NoSchedule"}
        await create_nodes(kube, [node("compose-node", "compose", cpu="8", memory="32Gi", taints=[taint])])
        await client.CoreV1Api(kube).create_namespace({"metadata": {"name": "compose"}})
        toleration = {"key": "crane.test/compose", "operator": "Equal", "value": "only", "effect": "NoSchedule"}
        await client.CoreV1Api(kube).create_namespaced_pod(
            "compose",
            pod(
                "web",
                "crane-scheduler",
                spec={"tolerations": [toleration], "nodeSelector": {"kubernetes.io/hostname": "compose-node"}},
            ),
        )

        async def bound() -> tuple[str, str] | None:
            p = await client.CoreV1Api(kube).read_namespaced_pod("web", "compose")
            return (p.spec.node_name, p.metadata.uid) if p.spec.node_name else None

        placed, uid = await wait_for(bound, timeout=60, what="the pod bound by compose's crane-scheduler")
        assert placed == "compose-node"
        r = aioredis.from_url("redis://127.0.0.1:6379/0")
        try:
            key = BindingSchema().node_key(placed)
            await wait_for(lambda: r.zscore(key, uid), timeout=60, what="the binding in compose's Redis")

            # every pod on the node recorded, nothing else (a pod that tolerates every taint could still land here)
            async def all_recorded() -> bool:
                on_node = await client.CoreV1Api(kube).list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={placed}"
                )
                uids = {p.metadata.uid for p in on_node.items}
                members = {m.decode() if isinstance(m, bytes) else str(m) for m in await r.zrange(key, 0, -1)}
                return members == uids

            await wait_for(all_recorded, timeout=30, what="exactly the pods on the node recorded in compose's Redis")
        finally:
            await r.aclose()
    finally:
        down = await asyncio.to_thread(compose, "down", "-v")
        print(down.stdout[-2000:], down.stderr[-2000:])
        await api.stop()
