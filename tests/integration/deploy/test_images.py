"""The service images, built from deploy/Dockerfile and run as in production.

No registry is reachable here, so the images are built on a local base image made from Debian packages
(``scripts/container-engine base-image``: debootstrap, Debian's python3 3.11) passed as BASE_IMAGE. Each
container runs non-root (UID 65532), with a read-only root filesystem, host networking, its production flags, and
the credentials of its own ServiceAccount from the Helm chart (so the chart's RBAC is exercised by the real
services): the scheduler binds a pod, the event-recorder records that binding in Redis, the annotator writes the
node's hot value from it and its load from Prometheus, the extender answers a filter request from its node cache,
and the descheduler runs its rounds (dry run: the cluster is shared).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
import yaml
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.exporter import FleetExporter
from crane_sandbox.fleet import FleetState, make_fleet
from crane_sandbox.procs import free_port
from crane_sandbox.prometheus import PrometheusServer
from crane_shared.bindings import BindingSchema
from tests.support.deploy import CHART, REPO, TARGETS, helm, podman
from tests.support.scheduler_cluster import create_nodes, node, pod, wait_for

NS = "crane-images"
SCHEDULER = "crane-image-test"
GROUP = "crane.test/group=images"
NODE = "image-node-0001"


def _wheel_packages() -> set[str]:
    """The import packages the project's wheel declares (pyproject.toml)."""
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {Path(p).name for p in config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]}


def test_images_carry_only_the_product(images: dict[str, str]) -> None:
    """The runtime holds the installed wheel and its dependencies: no sources, tests, pip or development tools,
    and of this repository only the packages the wheel declares (the sandbox is not one of them)."""
    for target, image in images.items():
        script = "id -u; ls /opt/crane/bin; ls /opt/crane/lib/python3*/site-packages; ls / "
        listing = podman("run", "--rm", "--network=host", "--entrypoint", "sh", image, "-c", script).stdout.split()
        assert listing[0] == "65532", (target, "not running as UID 65532")
        for unwanted in ("pip", "pytest", "ruff", "mypy", "hypothesis", "src", "tests", "bench"):
            assert unwanted not in listing, (target, unwanted)
        ours = {n for n in listing if n.startswith(("crane_", "cranectl")) and not n.endswith(".dist-info")}
        assert ours == _wheel_packages(), (target, ours)


def _kubeconfig(cluster: LocalCluster, token: str, directory: Path, name: str) -> Path:
    """A kubeconfig with the CA embedded and a ServiceAccount token, readable by the container's user."""
    assert cluster.pki is not None
    import base64

    config = cluster.kubeconfig_dict(token, user=name)
    ca = base64.b64encode(Path(cluster.pki.ca_cert).read_bytes()).decode()
    config["clusters"][0]["cluster"] = {"server": cluster.api_url, "certificate-authority-data": ca}
    path = directory / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)
    return path


@contextlib.contextmanager
def container(name: str, image: str, mounts: dict[Path, str], *args: str) -> Iterator[str]:
    """A detached container as in production: non-root, read-only root, no capabilities, host network."""
    volumes = [f"--volume={host}:{inside}:ro" for host, inside in mounts.items()]
    podman("rm", "-f", name, check=False)
    podman(
        "run",
        "--detach",
        f"--name={name}",
        "--network=host",
        "--read-only",
        "--read-only-tmpfs=false",
        "--tmpfs=/tmp:rw,size=16m",
        "--user=65532:65532",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        *volumes,
        image,
        *args,
    )
    try:
        yield name
    finally:
        logs = podman("logs", name, check=False)
        print(f"--- {name} logs (tail)\n{(logs.stdout + logs.stderr)[-1500:]}")
        podman("rm", "-f", name, check=False)


async def _ok(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


@pytest.fixture
async def installed(cluster: LocalCluster, kube: client.ApiClient) -> AsyncIterator[dict[str, str]]:
    """The chart's RBAC and ServiceAccounts; {service: token of its account}."""
    args = ["--kubeconfig", str(cluster.kubeconfig_path), "--namespace", NS]
    await asyncio.to_thread(
        helm,
        "install",
        "img",
        str(CHART),
        *args,
        "--create-namespace",
        "--set",
        "fullnameOverride=crane,extender.enabled=true,redis.enabled=false,redis.external.url=redis://x:1/0",
    )
    core = client.CoreV1Api(kube)
    tokens = {}
    for svc in TARGETS:
        t = await core.create_namespaced_service_account_token(
            f"crane-{svc}", NS, {"spec": {"expirationSeconds": 3600}}
        )
        tokens[svc] = t.status.token
    yield tokens
    await asyncio.to_thread(helm, "uninstall", "img", *args, check=False)


async def test_each_image_does_its_job_against_the_api_server_and_redis(
    images: dict[str, str], installed: dict[str, str], cluster: LocalCluster, kube: client.ApiClient, tmp_path: Path
) -> None:
    tmp_path.chmod(0o755)  # noqa: ASYNC240 (the containers' user reads the files in it)
    kubeconfigs = {svc: _kubeconfig(cluster, token, tmp_path, svc) for svc, token in installed.items()}
    # The default policy with sync periods of seconds, so the annotator's rounds follow the test.
    policy = tmp_path / "policy.yaml"
    text = (REPO / "deploy" / "policy.yaml").read_text()
    for period in ("3m", "15m", "3h"):
        text = text.replace(f"period: {period}", "period: 2s")
    policy.write_text(text)
    policy.chmod(0o644)
    config = tmp_path / "scheduler.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "leaderElection": {"resourceNamespace": NS, "resourceName": "crane-scheduler"},
                "profiles": [
                    {
                        "schedulerName": SCHEDULER,
                        "pluginConfig": [{"name": "Dynamic", "args": {"policyConfigPath": "/etc/crane/policy.yaml"}}],
                    }
                ],
            }
        )
    )
    config.chmod(0o644)
    redis_url = cluster.redis_url.rsplit("/", 1)[0] + "/14"
    r = aioredis.from_url(redis_url)
    await r.flushdb()
    ports = {svc: free_port() for svc in TARGETS}
    common = ["--listen-address=127.0.0.1", "--kubeconfig=/etc/crane/kubeconfig", "--log-format=json"]

    def mounts(svc: str) -> dict[Path, str]:
        return {
            kubeconfigs[svc]: "/etc/crane/kubeconfig",
            policy: "/etc/crane/policy.yaml",
            config: "/etc/crane/scheduler.yaml",
        }

    await create_nodes(kube, [node(NODE, "images", cpu="8", memory="32Gi")])
    # node-exporter series for the node (labelled by its name) in a real Prometheus with crane's recording rules
    fleet = make_fleet(1, prefix="image-node-", instance_styles=("name",), base_cpu_fraction=0.3)
    exporter = FleetExporter(FleetState(fleet))
    await exporter.start()
    prometheus = PrometheusServer(cluster.run_dir / "images-prometheus", exporter.targets(), rules="fast")
    await prometheus.start()
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(
                container(
                    "crane-test-event-recorder",
                    images["event-recorder"],
                    mounts("event-recorder"),
                    *common,
                    f"--port={ports['event-recorder']}",
                    f"--redis-url={redis_url}",
                    "--policy=/etc/crane/policy.yaml",
                    f"--reporting-controllers={SCHEDULER}",  # only the schedulers it is told to believe
                )
            )
            stack.enter_context(
                container(
                    "crane-test-annotator",
                    images["annotator"],
                    mounts("annotator"),
                    *common,
                    f"--port={ports['annotator']}",
                    f"--redis-url={redis_url}",
                    "--policy=/etc/crane/policy.yaml",
                    f"--prometheus-url={prometheus.url}",
                    f"--lease-namespace={NS}",
                    "--lease-name=crane-annotator",
                    f"--node-selector={GROUP}",
                    "--hot-value-interval=1s",
                )
            )
            stack.enter_context(
                container(
                    "crane-test-scheduler",
                    images["scheduler"],
                    mounts("scheduler"),
                    *common,
                    f"--port={ports['scheduler']}",
                    "--config=/etc/crane/scheduler.yaml",
                    f"--node-selector={GROUP}",
                )
            )
            stack.enter_context(
                container(
                    "crane-test-extender",
                    images["extender"],
                    mounts("extender"),
                    *common,
                    f"--port={ports['extender']}",
                    "--policy=/etc/crane/policy.yaml",
                    "--node-cache",
                )
            )
            stack.enter_context(
                container(
                    "crane-test-descheduler",
                    images["descheduler"],
                    mounts("descheduler"),
                    *common,
                    f"--port={ports['descheduler']}",
                    "--policy=/etc/crane/policy.yaml",
                    f"--prometheus-url={prometheus.url}",
                    f"--lease-namespace={NS}",
                    "--lease-name=crane-descheduler",
                    "--interval=1s",
                    "--dry-run",  # the cluster is shared: plan, evict nothing
                )
            )
            for svc, port in ports.items():
                url = f"http://127.0.0.1:{port}/readyz"
                await wait_for(functools.partial(_ok, url), timeout=90, what=f"{svc} ready")

            # scheduler: a pod for it gets bound
            await client.CoreV1Api(kube).create_namespaced_pod(NS, pod("web", SCHEDULER))

            async def bound() -> str | None:
                p = await client.CoreV1Api(kube).read_namespaced_pod("web", NS)
                name: str | None = p.spec.node_name
                return name

            assert await wait_for(bound, timeout=60, what="the pod bound by the scheduler image") == NODE

            # event-recorder: the binding is recorded in Redis
            key = BindingSchema().node_key(NODE)
            assert await wait_for(lambda: r.zcard(key), timeout=60, what="the binding record in Redis") == 1

            # annotator: the node gets its hot value annotation
            async def hot() -> str | None:
                n = await client.CoreV1Api(kube).read_node(NODE)
                value: str | None = (n.metadata.annotations or {}).get("node_hot_value")
                return value

            assert await wait_for(hot, timeout=60, what="node_hot_value written by the annotator image")

            # annotator: and its load from Prometheus (the fleet's 30 % CPU through the recording rules)
            async def load() -> float | None:
                n = await client.CoreV1Api(kube).read_node(NODE)
                text = (n.metadata.annotations or {}).get("cpu_usage_avg_5m")
                return float(text.split(",")[0]) if text else None

            assert 0.2 < await wait_for(load, timeout=60, what="cpu_usage_avg_5m written by the annotator image") < 0.5

            # extender: a filter request answered from its node cache
            args: dict[str, Any] = {"Pod": pod("p", SCHEDULER), "NodeNames": [NODE]}
            args["Pod"]["metadata"]["namespace"] = NS
            async with (
                aiohttp.ClientSession() as s,
                s.post(f"http://127.0.0.1:{ports['extender']}/extender/filter", data=json.dumps(args)) as resp,
            ):
                body = await resp.json(content_type=None)
            assert resp.status == 200 and body.get("NodeNames") == [NODE], body

            # descheduler: rounds run with its token (nodes, pods, PDBs listed; its Lease; Prometheus queried)
            async def rounds() -> float | None:
                async with (
                    aiohttp.ClientSession() as s,
                    s.get(f"http://127.0.0.1:{ports['descheduler']}/metrics") as resp,
                ):
                    text = await resp.text()
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        if sample.name == "crane_descheduler_rounds_total" and sample.labels == {"result": "planned"}:
                            return sample.value or None
                return None

            assert await wait_for(rounds, timeout=60, what="a round of the descheduler image")
    finally:
        await r.aclose()
        await prometheus.stop()
        await exporter.stop()
