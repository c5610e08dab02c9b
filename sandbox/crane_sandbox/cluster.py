"""The local cluster: etcd, a real kube-apiserver with RBAC, redis-server and, on request, a real
kube-controller-manager, on free loopback ports.

One piece of code serves the pytest fixtures, the benchmarks and the sandbox. Servers start in parallel where they
can (etcd and Redis together, then the API server, then the controller manager), every process logs to its own
file under the run directory, and ``stop()`` reaps everything even after a failed start.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from crane_sandbox.kubebin import KubeBinaries, ensure_binaries
from crane_sandbox.pki import Pki, make_pki
from crane_sandbox.procs import ManagedProcess, Server, free_port, start_on_free_ports, tcp_open

REPO_ROOT = Path(__file__).resolve().parents[2]


def runs_root() -> Path:
    """Where run directories go: $CRANE_RUN_DIR, else .sandbox/runs in a source checkout, else ~/.cache."""
    if env := os.environ.get("CRANE_RUN_DIR"):
        return Path(env)
    if (REPO_ROOT / "pyproject.toml").exists():
        return REPO_ROOT / ".sandbox" / "runs"
    return Path.home() / ".cache" / "crane" / "runs"


def _owner_alive(run: Path) -> bool:
    """Whether the process that made ``run`` (its name ends in the pid) still runs: its servers may be using it."""
    try:
        pid = int(run.name.rsplit("-", 1)[-1])
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def new_run_dir(label: str, keep: int = 10) -> Path:
    """A fresh directory for one run's logs and data; only the newest ``keep`` finished runs are kept.

    A run whose process is still alive is never pruned: a test session makes many runs, and removing its first
    one (the shared cluster's) took etcd's data directory from under a live API server.
    """
    root = runs_root()
    root.mkdir(parents=True, exist_ok=True)
    runs = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    finished = [p for p in runs if not _owner_alive(p)]
    for old in finished[: max(0, len(runs) - keep + 1)]:
        shutil.rmtree(old, ignore_errors=True)
    path = root / f"{time.strftime('%Y%m%d-%H%M%S')}-{label}-{os.getpid()}"
    path.mkdir()
    return path


def require(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise RuntimeError(f"'{binary}' not found: install the Debian package '{package}' (scripts/setup does)")
    return path


@dataclass
class RedisServer:
    """redis-server on loopback without persistence; restartable on the same port (tests restart it)."""

    run_dir: Path
    port: int = field(default_factory=free_port)
    process: ManagedProcess | None = None
    movable: bool = True
    """its first start may move to another port on a bind conflict (False: clients were given this one)"""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        await start_on_free_ports(self._start, self._new_port if self.movable and self.process is None else None)

    def _new_port(self) -> None:
        self.port = free_port()

    async def _start(self) -> None:
        data = self.run_dir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        self.process = ManagedProcess(
            "redis",
            [
                require("redis-server", "redis-server"),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(data),
            ],
            self.run_dir / "logs" / "redis.log",
        )
        await self.process.start()
        await self.process.wait_ready(lambda: tcp_open("127.0.0.1", self.port), timeout=10)

    async def stop(self) -> None:
        if self.process:
            await self.process.stop()


@dataclass
class Etcd:
    run_dir: Path
    port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    process: ManagedProcess | None = None
    movable: bool = True
    """its first start may move to other ports on a bind conflict (a restart keeps them: the API server's
    ``--etcd-servers`` names them)"""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        await start_on_free_ports(self._start, self._new_ports if self.movable and self.process is None else None)

    def _new_ports(self) -> None:
        self.port, self.peer_port = free_port(), free_port()
        shutil.rmtree(self.run_dir / "etcd", ignore_errors=True)  # a member of the old ports, if one was made

    async def _start(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.process = ManagedProcess(
            "etcd",
            [
                require("etcd", "etcd-server"),
                "--name",
                "sandbox",
                "--data-dir",
                str(self.run_dir / "etcd"),
                "--listen-client-urls",
                self.url,
                "--advertise-client-urls",
                self.url,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"sandbox={peer}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes",
                str(8 * 1024**3),
                "--log-level",
                "warn",
            ],
            self.run_dir / "logs" / "etcd.log",
            env={"ETCD_UNSUPPORTED_ARCH": "", "ETCD_LOGGER": "zap"},
        )
        await self.process.start()
        await self.process.wait_ready(lambda: tcp_open("127.0.0.1", self.port), timeout=20)

    async def stop(self) -> None:
        if self.process:
            await self.process.stop()


def minor_release(version: str) -> int:
    """The minor release of a ``k8s.io/kubernetes`` version (``v1.37.2`` -> 37)."""
    parts = version.lstrip("v").split(".")
    if len(parts) < 2 or parts[0] != "1" or not parts[1].isdigit():
        raise ValueError(f"not a Kubernetes 1.x release: {version!r}")
    return int(parts[1])


def workload_api_version(version: str) -> str:
    """The ``scheduling.k8s.io`` version that serves the Workload API at this release: 1.35's ``v1alpha1``
    (Workload, pods' ``spec.workloadRef``), 1.36's ``v1alpha2``, 1.37's ``v1beta1`` (Workload and PodGroup, pods'
    ``spec.schedulingGroup``). kube-apiserver refuses a ``--runtime-config`` naming a version it does not have."""
    minor = minor_release(version)
    if minor <= 35:
        return "v1alpha1"
    return "v1alpha2" if minor == 36 else "v1beta1"


@dataclass
class KubeApiServer:
    """A real kube-apiserver: TLS with a verified CA, static admin token, RBAC, service-account token signing."""

    run_dir: Path
    etcd_url: str
    binaries: KubeBinaries
    pki: Pki
    service_account_admission: bool = False
    """on only when a controller manager creates each namespace's ``default`` ServiceAccount; without one the
    admission plugin would refuse every pod"""
    port: int = field(default_factory=free_port)
    process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    async def start(self) -> None:
        # a first start may move to another port on a bind conflict; a restart keeps it (kubeconfigs name it)
        await start_on_free_ports(self._start, self._new_port if self.process is None else None)

    def _new_port(self) -> None:
        self.port = free_port()

    async def _start(self) -> None:
        self.process = ManagedProcess(
            "kube-apiserver",
            [
                str(self.binaries.apiserver),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # Kubernetes 1.37 refuses a loopback advertise address for the `kubernetes` Service's endpoints
                # (the lease reconciler validates it); nothing here reaches the API server through that Service
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.port}",
                f"--tls-cert-file={self.pki.serving_cert}",
                f"--tls-private-key-file={self.pki.serving_key}",
                f"--client-ca-file={self.pki.ca_cert}",
                f"--token-auth-file={self.pki.token_file}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={self.pki.sa_pub}",
                f"--service-account-signing-key-file={self.pki.sa_key}",
                "--service-cluster-ip-range=10.96.0.0/16",
                *([] if self.service_account_admission else ["--disable-admission-plugins=ServiceAccount"]),
                # Watch-list streams need etcd's watch progress requests (etcd >= 3.4.31), which Debian's etcd 3.4
                # lacks; with the gate on, the server turns every watch from resourceVersion 0 into one (KWOK's
                # watches are such) and fails it, and KWOK confirmed deletions only after re-listing, 20 s late.
                # GenericWorkload + the Workload API's version of this release (off by default in 1.35 and 1.37),
                # which crane-scheduler's GangScheduling plugin reads
                "--feature-gates=WatchList=false,GenericWorkload=true",
                f"--runtime-config=scheduling.k8s.io/{workload_api_version(self.binaries.version)}=true",
                "--max-requests-inflight=3000",
                "--max-mutating-requests-inflight=1000",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                "--v=1",
            ],
            self.run_dir / "logs" / "kube-apiserver.log",
        )
        await self.process.start()
        await self.process.wait_ready(self._ready, timeout=90)

    async def _ready(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        headers = {"Authorization": f"Bearer {self.pki.admin_token}"}
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"{self.url}/readyz", ssl=ctx, headers=headers, timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            return r.status == 200

    async def stop(self) -> None:
        if self.process:
            await self.process.stop()


CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "daemonset-controller",
    "garbage-collector-controller",
    "pod-garbage-collector-controller",
    "disruption-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "endpointslice-controller",
    "resourcequota-controller",
    "resourceclaim-controller",
)
"""The controllers a scheduler relies on: workload controllers that create pods, the ones that clean up after
them, volume binding, DRA's ResourceClaims from templates (and their release), namespaces and service accounts,
and node lifecycle (taints for unhealthy nodes)."""


@dataclass
class ControllerManager:
    """The real kube-controller-manager, authenticating as ``system:kube-controller-manager`` (bound by the
    bootstrap RBAC policy), each controller with its own service-account credentials, signing service-account
    tokens with the API server's key."""

    run_dir: Path
    binaries: KubeBinaries
    pki: Pki
    kubeconfig: Path
    controllers: tuple[str, ...] = CONTROLLERS
    qps: float = 200
    """its client's QPS and burst (``--kube-api-qps``/``--kube-api-burst``; kube's defaults are 20/30)"""
    burst: int = 400
    port: int = field(default_factory=free_port)
    process: ManagedProcess | None = None

    async def start(self) -> None:
        # a first start may move to another port on a bind conflict; a restart keeps it (kubeconfigs name it)
        await start_on_free_ports(self._start, self._new_port if self.process is None else None)

    def _new_port(self) -> None:
        self.port = free_port()

    async def _start(self) -> None:
        self.process = ManagedProcess(
            "kube-controller-manager",
            [
                str(self.binaries.controller_manager),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                # The API server's serving certificate names 127.0.0.1, so the health probe verifies it too.
                f"--tls-cert-file={self.pki.serving_cert}",
                f"--tls-private-key-file={self.pki.serving_key}",
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_cert}",
                "--use-service-account-credentials=true",
                f"--controllers={','.join(self.controllers)}",
                "--leader-elect=false",
                f"--kube-api-qps={self.qps:g}",
                f"--kube-api-burst={self.burst}",
                "--profiling=false",
                "--v=1",
            ],
            self.run_dir / "logs" / "kube-controller-manager.log",
        )
        await self.process.start()
        await self.process.wait_ready(self._ready, timeout=60)

    async def _ready(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"https://127.0.0.1:{self.port}/healthz", ssl=ctx, timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            return r.status == 200

    async def stop(self) -> None:
        if self.process:
            await self.process.stop()


class LocalCluster(Server):
    """etcd + kube-apiserver + redis-server, plus kube-controller-manager when ``controllers`` is set (True:
    ``CONTROLLERS``; or the names of the controllers to run, e.g. only the resourceclaim controller for a benchmark
    whose nodes have no kubelet the node lifecycle controller would wait for). ``controller_qps``: the controller
    manager's client (QPS, burst), when not the sandbox's 200/400 (a benchmark gives its controllers the
    schedulers' own, as scheduler_perf does). Extra components (KWOK, Prometheus, fleet, services) attach to it."""

    def __init__(
        self,
        run_dir: Path | None = None,
        *,
        binaries: KubeBinaries | None = None,
        controllers: bool | tuple[str, ...] = False,
        controller_qps: tuple[float, int] = (200, 400),
    ) -> None:
        self.run_dir = run_dir or new_run_dir("cluster")
        self.controller_qps = controller_qps
        self.binaries = binaries
        self.controllers = CONTROLLERS if controllers is True else tuple(controllers or ())
        self.etcd = Etcd(self.run_dir)
        self.redis = RedisServer(self.run_dir)
        self.apiserver: KubeApiServer | None = None
        self.controller_manager: ControllerManager | None = None
        self.pki: Pki | None = None

    async def start(self) -> None:
        try:
            if self.binaries is None:
                self.binaries = await asyncio.to_thread(ensure_binaries)
            binaries = self.binaries
            pki, _, _ = await asyncio.gather(
                asyncio.to_thread(make_pki, self.run_dir / "pki"), self.etcd.start(), self.redis.start()
            )
            self.pki = pki
            self.apiserver = KubeApiServer(
                self.run_dir,
                self.etcd.url,
                binaries,
                pki,
                service_account_admission="serviceaccount-controller" in self.controllers,
            )
            await self.apiserver.start()
            self.write_kubeconfig(self.kubeconfig_path, self.kubeconfig_dict())
            if self.controllers:
                self.controller_manager = ControllerManager(
                    self.run_dir,
                    binaries,
                    pki,
                    self.component_kubeconfig("system:kube-controller-manager"),
                    self.controllers,
                    *self.controller_qps,
                )
                await self.controller_manager.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop in reverse order; never raises, so teardown always reaps every process."""
        for component in (self.controller_manager, self.apiserver, self.etcd, self.redis):
            if component is not None:
                with contextlib.suppress(Exception):
                    await component.stop()

    @property
    def api_url(self) -> str:
        assert self.apiserver is not None, "cluster not started"
        return self.apiserver.url

    @property
    def kubeconfig_path(self) -> Path:
        return self.run_dir / "kubeconfig"

    @property
    def redis_url(self) -> str:
        return self.redis.url

    @staticmethod
    def write_kubeconfig(path: Path, config: dict[str, Any]) -> Path:
        """Write a kubeconfig readable by its owner only (it holds a bearer token)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(config))
        return path

    def component_kubeconfig(self, user: str) -> Path:
        """A kubeconfig file for one of the static-token component users of ``crane_sandbox.pki.USERS``."""
        assert self.pki is not None, "cluster not started"
        name = user.removeprefix("system:")
        return self.write_kubeconfig(
            self.run_dir / "kubeconfigs" / f"{name}.yaml", self.kubeconfig_dict(self.pki.tokens[user], user)
        )

    def kubeconfig_dict(self, token: str | None = None, user: str = "admin") -> dict[str, Any]:
        """A kubeconfig for the admin, or for any bearer token (e.g. a service account's)."""
        assert self.pki is not None, "cluster not started"
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "sandbox", "cluster": {"server": self.api_url, "certificate-authority": str(self.pki.ca_cert)}}
            ],
            "users": [{"name": user, "user": {"token": token or self.pki.admin_token}}],
            "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": user}}],
            "current-context": "sandbox",
        }
