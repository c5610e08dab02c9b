"""Fixtures of the fault suite: Toxiproxy between a service and the API server, Redis or Prometheus; an HTTP
proxy that answers 429/503 (Toxiproxy works on TCP and cannot make status codes); an API server restart; and the
row each fault test files in the table of faults survived.

The whole suite runs in every ``make test`` (CI's command), and the table is printed at the end of the run, so a
stop's CI log shows it; a row whose test failed is marked FAILED there, and the failed test fails the run.
``CRANE_FAULTS=fast`` skips the tests marked ``slow_fault`` (a developer's quick loop; never CI's).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from crane_sandbox.cluster import LocalCluster
from crane_sandbox.toxiproxy import Proxy, Toxiproxy
from tests.support.faults import (
    FAULT_ROWS,
    REPORT_ENV,
    FaultReport,
    FaultRow,
    StatusProxy,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow_fault: skipped with CRANE_FAULTS=fast (a developer's quick loop)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    fast = os.environ.get("CRANE_FAULTS") == "fast"
    for item in items:
        if "/faults/" not in str(item.fspath):
            continue
        item.add_marker(pytest.mark.integration)
        if fast and item.get_closest_marker("slow_fault"):
            item.add_marker(pytest.mark.skip(reason="CRANE_FAULTS=fast"))


@pytest.fixture
def fault_report(request: pytest.FixtureRequest) -> Any:
    """Rows filed here go to the run's table (with the test's outcome), and are appended as JSON lines to
    $CRANE_FAULT_REPORT when it is set (``python -m bench.faults``). A test that failed before filing its row
    still gets one, so the table never hides a failed fault."""
    report = FaultReport()
    yield report
    call = getattr(request.node, "rep_call", None)
    outcome = "failed" if call is None or call.failed else "passed"
    rows = [asdict(r) for r in report.rows] or [asdict(FaultRow(request.node.name))]
    rows = [{**r, "test": request.node.nodeid, "outcome": outcome} for r in rows]
    request.node.user_properties.append((FAULT_ROWS, rows))  # to the run's table by its teardown report
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]


@pytest_asyncio.fixture(scope="session")
async def toxiproxy(run_dir: Path) -> AsyncIterator[Toxiproxy]:
    async with Toxiproxy(run_dir / "logs" / "toxiproxy.log") as server:
        yield server


_proxy_names = iter(range(1, 1_000_000))


@pytest_asyncio.fixture
async def proxy_to(toxiproxy: Toxiproxy) -> AsyncIterator[Callable[[str], Any]]:
    """``await proxy_to("127.0.0.1:6379")``: a fresh proxy to that upstream, healed and deleted afterwards."""
    made: list[Proxy] = []

    async def make(upstream: str) -> Proxy:
        proxy = await toxiproxy.proxy(f"p{next(_proxy_names)}", upstream)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        with contextlib.suppress(Exception):
            await toxiproxy.delete(proxy)


@pytest_asyncio.fixture
async def status_proxy(cluster: LocalCluster) -> AsyncIterator[StatusProxy]:
    proxy = StatusProxy(cluster)
    await proxy.start()
    yield proxy
    await proxy.stop()
