"""Fixtures shared by all tests: the real local cluster (API server, etcd, Redis), started once per session.

Unit tests (tests/unit) never touch these. Integration tests get real servers; logs of every process are kept
under the run directory printed at the end of the session.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_sandbox.crds import install_crds
from crane_sandbox.rbac import DEFAULT_NAMESPACE, install_identities, service_identity
from crane_shared.kube import api_client_from_dict

_db_numbers = itertools.cycle(range(1, 16))


GO_BUILT = frozenset({"cluster", "judge", "toxiproxy"})
"""Fixtures that need a binary built from a Go module (kube-apiserver and the rest of scripts/setup's Kubernetes
build, the judge, Toxiproxy): a test using none of them can run while that build is still going."""

KWOK = ("tests/integration/sandbox/", "tests/integration/endtoend/")
BENCH_SMOKE = "tests/integration/test_bench_smoke.py"
"""the benchmarks' smoke runs: child processes that start kube's servers (no fixture says so)"""
LATE = ("tests/unit/deploy/", "tests/integration/deploy/", "tests/integration/annotator/test_thanos.py")
"""Tests of the tools scripts/setup builds last (helm, kube-state-metrics, grafanaquery, thanos, kwokctl, kubectl,
the base image): they run at the end, so those builds have the rest of the suite's time."""


def _stage(item: pytest.Item) -> int:
    path = Path(str(item.fspath)).resolve().relative_to(Path(__file__).resolve().parent.parent).as_posix()
    if path.startswith(LATE):
        return 4
    if path.startswith(KWOK):
        return 3
    if path.startswith("tests/unit/"):
        return 0
    if path.startswith(("tests/differential/", "tests/faults/", BENCH_SMOKE)):  # the judge, Toxiproxy, Kubernetes
        return 2
    return 2 if GO_BUILT & set(getattr(item, "fixturenames", ())) else 1


def ci_order(items: list[pytest.Item]) -> None:
    """CI's order (docs/ci.md): `make test` starts the Kubernetes build in the background (``scripts/setup --ci``),
    so the unit tests run first, then the modules that need no Go-built binary, then those that need Kubernetes
    (the first waits on the build's lock), then KWOK's sandboxes, then the tests of the tools built last. Whole
    modules move (their module fixtures start once); only the order changes, every test still runs."""
    stage: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        stage[module] = max(stage.get(module, 0), _stage(item))
    items.sort(key=lambda item: stage[item.nodeid.split("::")[0]])  # stable: the order within a stage stays


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
    ci_order(items)


@pytest.fixture(scope="session")
def run_dir() -> Iterator[Path]:
    path = new_run_dir("tests")
    yield path
    print(f"\nlogs of this test run: {path}")


SERVICE_NAMESPACE = DEFAULT_NAMESPACE
"""where the session's service identities live (``crane_sandbox.rbac.identity(cluster, service)``)"""


@pytest.fixture(scope="session")
async def cluster(run_dir: Path) -> AsyncIterator[LocalCluster]:
    """The session's cluster, with each service's ServiceAccount under the Helm chart's RBAC (tests run the
    services with those identities, never the admin's, so they prove the shipped RBAC suffices) and the CRDs
    the product ships (NodeResourceTopology, PodGroup)."""
    async with LocalCluster(run_dir) as c:
        api = await api_client_from_dict(c.kubeconfig_dict())
        try:
            await asyncio.gather(install_identities(c, api, SERVICE_NAMESPACE), install_crds(api))
        finally:
            await api.close()
        yield c


@pytest.fixture(scope="session")
async def kube(cluster: LocalCluster) -> AsyncIterator[client.ApiClient]:
    """An admin ApiClient (no client-side rate limit)."""
    api = await api_client_from_dict(cluster.kubeconfig_dict())
    yield api
    await api.close()


@pytest.fixture
async def recorder_kube(cluster: LocalCluster) -> AsyncIterator[client.ApiClient]:
    """An ApiClient as the chart's event-recorder ServiceAccount (for the recorder run in the test's process)."""
    api = await api_client_from_dict((await service_identity(cluster, "event-recorder")).kubeconfig_dict())
    yield api
    await api.close()


@pytest.fixture
async def namespace(kube: client.ApiClient, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh namespace per test, so tests never see each other's pods and events."""
    name = f"t-{next(_ns_counter)}-{request.node.name[:30].lower().replace('_', '-').strip('-')}"
    name = "".join(ch for ch in name if ch.isalnum() or ch == "-").strip("-")[:60]
    await client.CoreV1Api(kube).create_namespace({"metadata": {"name": name}})
    yield name


_ns_counter = itertools.count(1)


@pytest.fixture
async def redis_url(cluster: LocalCluster) -> AsyncIterator[str]:
    """A URL to an empty Redis database of the session's redis-server (database 1..15, flushed first)."""
    url = cluster.redis_url.rsplit("/", 1)[0] + f"/{next(_db_numbers)}"
    r = aioredis.from_url(url)
    await r.flushdb()
    await r.aclose()
    yield url


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    r = aioredis.from_url(redis_url)
    yield r
    await r.aclose()
