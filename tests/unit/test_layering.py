"""The layering rule of docs/architecture.md, checked on the source: a violation names the file and the import.

- the load domain (policy, annotations, hot value, bindings, quantities, durations, the event contract) does no
  I/O and imports no infrastructure (no Kubernetes, Redis, Prometheus or HTTP client, no service runtime);
- ``crane_shared`` imports no service; services import ``crane_shared``, never each other, with one exception:
  crane-scheduler's public module ``crane_scheduler.simulate`` (the scheduler as an offline library: the
  descheduler's target check runs the scheduler's own Filter and Score through it, never a copy of them);
- outside crane-scheduler (the other services, the sandbox, the benchmarks, the tests' shared fixtures) nothing
  imports more of it than that module, except the modules ``INTERNALS`` names, each a test or benchmark of
  crane-scheduler's own internals or a harness of its running service; and none of those assembles a scheduler
  by hand (``ASSEMBLY``: the profile runtime, the registries, the algorithm, the service's entry point): that is
  the public module's job, written once;
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
    "managedfields",
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


def imports(path: Path, names: bool = False) -> Iterator[str]:
    """Every module imported (``names``: and every name imported from one, as ``module.name``)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            if names:
                yield from (f"{node.module}.{alias.name}" for alias in node.names)


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


PUBLIC = "crane_scheduler.simulate"
"""crane-scheduler's one public module"""
SCHEDULER = "crane_scheduler"
OUTSIDE = [ROOT / "bench", ROOT / "sandbox", ROOT / "tests", ROOT / "shared", ROOT / "deploy"]
"""where modules outside crane-scheduler live, besides the other services"""
INTERNALS: dict[str, str] = {
    # crane-scheduler's own tests: the package itself under test
    "tests/unit/scheduler/": "the scheduler package's unit tests",
    "tests/unit/loadaware/": "the Dynamic plugin's unit tests",
    "tests/unit/nrt/": "the NUMA plugin's and agent's unit tests",
    "tests/unit/test_query_validation.py": "the explain endpoint's query parameters",
    "tests/integration/scheduler/": "the scheduler service against the real API server",
    "tests/integration/test_kube_contract.py": "DefaultBinder's bind call against the real API server",
    "tests/integration/sandbox/test_modes.py": "the NUMA agent's objects in the sandbox",
    "tests/differential/": "each plugin's verdicts against kube-scheduler's own plugins",
    # the shared fixtures of those tests: the algorithm's own answers, single plugins, the service harness
    "tests/support/scheduler.py": "decisions as the algorithm answers them; the service loop with fake binds",
    "tests/support/scheduler_cluster.py": "the scheduler service in process against the real API server",
    "tests/support/volumes.py": "the volume plugins' listers and decisions",
    "tests/support/loadaware.py": "the Dynamic plugin and its Diagnosis",
    "tests/support/nrt.py": "the NUMA plugin alone and in a profile",
    "tests/support/judge.py": "each plugin's verdicts for the differential judge",
    "tests/support/dra_plugin.py": "DynamicResources alone for its unit tests",
    "tests/support/judge_node_cases.py": "NodeDeclaredFeatures' feature names in generated cases",
    "tests/unit/test_sandbox_devices.py": "the sandbox's devices as DRA's allocator reads them",
    # benchmarks of internals and of the running service
    "bench/scheduler/loop.py": "the service's scheduling loop in process",
    "bench/scheduler/pod_memory.py": "the service cache's memory per pod",
    "bench/scheduler/writer_cost.py": "the API writer process",
    "bench/scheduler/__main__.py": "DefaultBinder's bind call (pods bound before the run)",
    "bench/scheduler/preemption_cost.py": "DefaultPreemption's phases",
    "bench/scheduler/dynamic_cost.py": "the Dynamic plugin's Filter and Score alone",
    "bench/gangs/__main__.py": "the gang cycle in the service's loop",
    # the sandbox runs crane's NUMA agent, a node-side component that lives beside its plugin
    "sandbox/crane_sandbox/topology.py": "the NUMA agent",
}
ASSEMBLY = {
    "crane_scheduler.__main__",
    "crane_scheduler.algorithm.Algorithm",
    "crane_scheduler.framework.Registry",
    "crane_scheduler.framework.registry.Registry",
    "crane_scheduler.framework.runtime.build_profiles",
    "crane_scheduler.plugins.builtin_registry",
    "crane_scheduler.plugins.plugin_registry",
}
ASSEMBLY_TESTS = {
    "tests/unit/scheduler/test_config.py": "the profile runtime's own tests (plugin sets, weights, args)",
    "tests/unit/scheduler/test_profiles_built_once.py": "the service's start-up (its entry point)",
}


def outside_scheduler() -> Iterator[tuple[str, Path]]:
    """(path relative to the repository, path) of every Python module that is not crane-scheduler's."""
    for root in [*OUTSIDE, *(path for name, path in SERVICES.items() if name != SCHEDULER)]:
        for path in sources(root):
            if ".venv" not in path.parts and "node_modules" not in path.parts:
                yield str(path.relative_to(ROOT)), path


def allowed_internals(relative: str) -> bool:
    return any(relative == key or (key.endswith("/") and relative.startswith(key)) for key in INTERNALS)


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_a_service_imports_shared_but_no_other_service_and_no_development_tool(service: str) -> None:
    if not SERVICES[service].is_dir():
        pytest.skip(f"{service} is not in this tree yet")
    others = set(SERVICES) - {service}
    bad = set()
    for path in sources(SERVICES[service]):
        for m in imports(path):
            if under(m, DEV_TOOLS) or (under(m, others) and not under(m, {PUBLIC})):
                bad.add(f"{path.relative_to(ROOT)}: {m}")
    assert bad == set()


def test_outside_crane_scheduler_only_its_public_module_is_imported() -> None:
    """Other services, the sandbox, the benchmarks and the tests' shared fixtures reach crane-scheduler through
    ``crane_scheduler.simulate`` only (``INTERNALS``: the tests and benchmarks of its internals)."""
    bad = {
        f"{relative}: {m}"
        for relative, path in outside_scheduler()
        if not allowed_internals(relative)
        for m in imports(path)
        if under(m, {SCHEDULER}) and not under(m, {PUBLIC})
    }
    assert bad == set()


def test_no_scheduler_is_assembled_by_hand_outside_crane_scheduler() -> None:
    """Profiles, registries and the algorithm are built by the public module (or the service), once."""
    bad = {
        f"{relative}: {m}"
        for relative, path in outside_scheduler()
        if relative not in ASSEMBLY_TESTS
        for m in imports(path, names=True)
        if m in ASSEMBLY
    }
    assert bad == set()


def test_every_named_exception_still_exists() -> None:
    """An exception for a module that is gone or no longer needs it is dropped, so the lists stay true."""
    stale = [key for key in INTERNALS if not (ROOT / key).exists()]
    stale += [key for key in ASSEMBLY_TESTS if not (ROOT / key).exists()]
    assert stale == []


DESCHEDULER_SEAMS = {"crane_descheduler.rounds", "crane_descheduler.policy"}
"""what ``cranectl replay`` may use of the descheduler: its rounds (``RoundState``) and its policy reader"""


def test_cranectl_drives_the_descheduler_through_its_rounds_and_policy_only() -> None:
    bad = {
        f"{path.relative_to(ROOT)}: {m}"
        for path in sources(ROOT / "shared" / "cranectl")
        for m in imports(path)
        if under(m, {"crane_descheduler"}) and m not in DESCHEDULER_SEAMS
    }
    assert bad == set()
