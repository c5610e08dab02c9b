"""The layering rule of docs/architecture.md, checked on the source: a violation names the file and the import.

- the load domain (policy, annotations, hot value, bindings, quantities, durations, the event contract) does no
  I/O and imports no infrastructure (no Kubernetes, Redis, Prometheus or HTTP client, no service runtime);
- ``crane_shared`` imports no service; services import ``crane_shared``, never each other, with one exception:
  the descheduler's target check (``crane_descheduler/targets.py``, only that module) runs crane-scheduler's own
  Filter plugins, so it imports ``crane_scheduler``'s framework, plugins and node table (never its service shell:
  the scheduler loop, the API writer, the queue), rather than a copy of them (issue 26: "the same pure code, not a
  copy"; moving the framework and every plugin into ``crane_shared`` would move most of the scheduler);
- the product (``crane_shared``, the services) never imports the sandbox or the benchmarks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "shared" / "crane_shared"
SERVICES = {
    "crane_annotator": ROOT / "services" / "annotator" / "crane_annotator",
    "crane_event_recorder": ROOT / "services" / "event-recorder" / "crane_event_recorder",
    "crane_scheduler": ROOT / "services" / "scheduler" / "crane_scheduler",
}
SERVICES |= {"crane_extender": ROOT / "services" / "extender" / "crane_extender"}  # once it is its own service
SERVICES |= {"crane_descheduler": ROOT / "services" / "descheduler" / "crane_descheduler"}

DOMAIN = [
    "annotations",
    "bindings",
    "debounce",
    "durations",
    "events",
    "hotvalue",
    "labels",
    "loadtaintpolicy",
    "policy",
    "policyyaml",
    "quantity",
    "reclaimpolicy",
]
INFRASTRUCTURE = {
    "aiohttp",
    "kubernetes_asyncio",
    "prometheus_client",
    "redis",
    "socket",
    "crane_shared.binding_store",
    "crane_shared.informer",
    "crane_shared.kube",
    "crane_shared.leader",
    "crane_shared.metrics",
    "crane_shared.redisconn",
    "crane_shared.service",
    "crane_shared.settings",
}
DEV_TOOLS = {"crane_sandbox", "bench", "tests"}


def imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def under(module: str, packages: set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def sources(package: Path) -> list[Path]:
    return sorted(package.rglob("*.py")) if package.is_dir() else []


@pytest.mark.parametrize("module", DOMAIN)
def test_the_load_domain_imports_no_infrastructure(module: str) -> None:
    path = SHARED / f"{module}.py"
    assert [m for m in imports(path) if under(m, INFRASTRUCTURE)] == [], path


def test_shared_imports_no_service_and_no_development_tool() -> None:
    bad = {
        f"{path.relative_to(ROOT)}: {m}"
        for path in sources(SHARED)
        for m in imports(path)
        if under(m, set(SERVICES) | DEV_TOOLS)
    }
    assert bad == set()


# (importing module, relative to its service) -> the other service it may import
CROSS_SERVICE = {("crane_descheduler", "targets.py"): "crane_scheduler"}
SCHEDULER_SHELL = {
    "crane_scheduler.scheduler",
    "crane_scheduler.__main__",
    "crane_scheduler.writer",
    "crane_scheduler.internal",
    "crane_scheduler.reporting",
    "crane_scheduler.explain",
}


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_service_imports_shared_but_no_other_service_and_no_development_tool(service: str) -> None:
    if not SERVICES[service].is_dir():
        pytest.skip(f"{service} is not in this tree yet")
    others = set(SERVICES) - {service}
    bad = set()
    for path in sources(SERVICES[service]):
        forbidden = others - {CROSS_SERVICE.get((service, str(path.relative_to(SERVICES[service]))), "")}
        for m in imports(path):
            if under(m, forbidden | DEV_TOOLS) or (service != "crane_scheduler" and under(m, SCHEDULER_SHELL)):
                bad.add(f"{path.relative_to(ROOT)}: {m}")
    assert bad == set()
