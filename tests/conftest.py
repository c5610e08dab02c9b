"""Fixtures shared by all tests: the real local cluster (API server, etcd, Redis), started once per session.

Unit tests (tests/unit) never touch these. Integration tests get real servers; logs of every process are kept
under the run directory printed at the end of the session (one per xdist worker under ``make test``, each its own
session: ``.sandbox/runs/<time>-tests-<pid>/``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import redis.asyncio as aioredis
import structlog
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster, new_run_dir
from crane_sandbox.crds import install_crds
from crane_sandbox.rbac import DEFAULT_NAMESPACE, install_identities, service_identity
from crane_shared.kube import api_client_from_dict
from tests.support.deploy import prune_builds
from tests.support.faults import FAULT_ROWS, fault_table

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


WHOLE_FOLDERS = ("tests/integration/deploy/",)
"""Folders whose modules share one worker under ``make test``'s workers: the deploy tests share the session's
images and the compose stack's fixed host ports (podman), so two of them must never run at once."""


def worker_group(module: str) -> str:
    """The unit of ``module`` (a path from the repository root) under ``make test``'s workers: a whole module runs
    in one worker (its module fixtures start once), a folder of ``WHOLE_FOLDERS`` too."""
    return next((folder for folder in WHOLE_FOLDERS if module.startswith(folder)), module)


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


def pytest_report_header() -> str:
    """Which Kubernetes release the session's servers run (``CRANE_KUBE_RELEASE``, docs/ci.md)."""
    from crane_sandbox.kubebin import RELEASE_ENV, RELEASES, pinned_version, selected_release

    release = selected_release()
    return f"kubernetes: {pinned_version(RELEASES[release])} servers ({RELEASE_ENV}={release}); judge: the newest"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
    ci_order(items)


if importlib.util.find_spec("xdist") is not None:  # a dev dependency; the hook is only known with it
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class ByWorkerGroup(LoadScopeScheduling):  # type: ignore[misc]
        """``worker_group``'s units, in CI's order: a worker takes a whole module (or folder) at a time."""

        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid.split("::")[0])

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling:
        """Every ``-n`` run is scheduled by ``worker_group`` (pytest-xdist's own ``--dist loadgroup`` reads its
        groups into node ids, which pytest 9 no longer lets a plugin rewrite)."""
        return ByWorkerGroup(config, log)


_fault_rows: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collects the fault rows (``FAULT_ROWS``): a report is what reaches the controller from an xdist worker, so
    the table of faults survived is built from the reports, here, and not in tests/faults (the controller
    collects nothing, so that folder's conftest never loads there)."""
    if report.when == "teardown":
        for name, rows in report.user_properties:
            if name == FAULT_ROWS:
                _fault_rows.extend(cast(list[dict[str, Any]], rows))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Once the whole run is over (on xdist's controller, after every worker), the images the deployment tests'
    earlier runs left untagged are removed (``prune_builds``): a worker's own teardown could remove an image layer
    another worker's build has just made and not yet tagged."""
    if not hasattr(session.config, "workerinput"):
        prune_builds()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The skipped tests, counted by reason, in a section of their own: ``-q`` hides the reasons, and a skip must
    never pass unseen (in CI a test whose tool cannot run fails instead: ``tests.support.unavailable``). Then the
    table of faults survived, when fault tests ran."""
    if _fault_rows:
        terminalreporter.write_sep("=", "faults survived (audited from the API server and Redis)")
        terminalreporter.write_line(fault_table(_fault_rows))
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: Counter[str] = Counter()
    for report in skipped:
        longrepr = report.longrepr
        reasons[str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)] += 1
    terminalreporter.write_sep("=", f"{len(skipped)} SKIPPED", yellow=True, bold=True)
    for reason, count in reasons.most_common():
        terminalreporter.write_line(f"{count:5d}  {reason[:300]}")


@pytest.fixture(autouse=True)
def _logging_left_as_the_session_has_it() -> Iterator[None]:
    """A test that runs a service's ``main`` in process must not let it configure logging: that caches every
    module's logger on first use, with a handler on the test's captured stderr, and a later test's log capture in
    the same worker then sees nothing (the failure shows up far from its cause, in whichever test runs later)."""
    yield
    configured = structlog.get_config().get("cache_logger_on_first_use")
    if configured:
        structlog.reset_defaults()  # the next tests start clean (the loggers cached meanwhile stay so)
    assert not configured, "this test configured logging in the test process (configure_logging): patch it out"


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
