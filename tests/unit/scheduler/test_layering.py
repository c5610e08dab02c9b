"""The scheduler package keeps its import direction: no cycles, plugins see only the framework API."""

from __future__ import annotations

import ast
from pathlib import Path

import crane_scheduler

ROOT = Path(crane_scheduler.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module imported, also under ``if TYPE_CHECKING:`` (a type-only cycle is still a cycle of design)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {name: {m for m in imports(path) if m in modules and m != name} for name, path in modules.items()}


def test_the_scheduler_package_has_no_import_cycles() -> None:
    g = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(g[node]):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(g):
        if name not in state:
            visit(name, [name])
    # A package importing its own submodules (``__init__`` re-exports) is not a cycle between modules.
    real = [c for c in cycles if not all(c[0].startswith(m) or m.startswith(c[0]) for m in c)]
    assert real == []


def test_plugins_and_the_framework_import_no_scheduler_internals() -> None:
    g = graph()
    inner = ("crane_scheduler.scheduler", "crane_scheduler.internal", "crane_scheduler.algorithm")
    for name, deps in g.items():
        if name.startswith(("crane_scheduler.plugins", "crane_scheduler.framework", "crane_scheduler.loadaware")):
            assert not [d for d in deps if d.startswith(inner)], name


def test_reporting_does_not_import_the_algorithm() -> None:
    assert not [d for d in graph()["crane_scheduler.reporting"] if d.startswith("crane_scheduler.algorithm")]


def test_the_public_module_imports_none_of_the_service_shell() -> None:
    """``simulate`` (the offline scheduler, the future decider workers' replica) runs no loop and calls no API: the
    queue, the cache, the cycle, the reporter and the API writer stay out of it."""
    shell = (
        "crane_scheduler.scheduler",
        "crane_scheduler.schedule_one",
        "crane_scheduler.gangcycle",
        "crane_scheduler.internal",
        "crane_scheduler.reporting",
        "crane_scheduler.writer",
        "crane_scheduler.metrics",
        "crane_scheduler.__main__",
    )
    assert [d for d in graph()["crane_scheduler.simulate"] if d.startswith(shell)] == []


def test_the_cycle_knows_neither_the_assembly_nor_the_gang_cycle() -> None:
    """``schedule_one`` (kube's ``schedule_one.go``) is the steps; ``scheduler`` assembles the service and hands gang
    members to ``gangcycle``, which runs on the steps' public interface (``CycleHost``)."""
    g = graph()
    assert not [
        d
        for d in g["crane_scheduler.schedule_one"]
        if d.startswith(("crane_scheduler.scheduler", "crane_scheduler.gangcycle"))
    ]
    assert not [d for d in g["crane_scheduler.gangcycle"] if d.startswith("crane_scheduler.scheduler")]
