"""Fixtures of the fault suite: Toxiproxy between a service and the API server, Redis or Prometheus; an HTTP
proxy that answers 429/503 (Toxiproxy works on TCP and cannot make status codes); an API server restart; and the
report each fault test files for ``python -m bench.faults``.

Tests marked ``slow_fault`` run only with ``CRANE_FAULTS=all`` (what ``python -m bench.faults`` sets); the rest
are the fast subset ``make test`` runs.
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
    REPORT_ENV,
    FaultReport,
    StatusProxy,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow_fault: part of the full fault suite only (CRANE_FAULTS=all)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    full = os.environ.get("CRANE_FAULTS") == "all"
    for item in items:
        if "/faults/" not in str(item.fspath):
            continue
        item.add_marker(pytest.mark.integration)
        if not full and item.get_closest_marker("slow_fault"):
            item.add_marker(pytest.mark.skip(reason="full fault suite only: python -m bench.faults"))


@pytest.fixture
def fault_report(request: pytest.FixtureRequest) -> Any:
    """Rows filed here are appended (JSON lines) to $CRANE_FAULT_REPORT when the test passed."""
    report = FaultReport()
    yield report
    path = os.environ.get(REPORT_ENV)
    failed = getattr(request.node, "rep_call", None)
    if path and report.rows:
        outcome = "failed" if failed is not None and failed.failed else "passed"
        with open(path, "a") as f:
            for r in report.rows:
                f.write(json.dumps({**asdict(r), "test": request.node.nodeid, "outcome": outcome}) + "\n")


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
