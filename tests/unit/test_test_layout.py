"""The test tree keeps one helper convention (see ``tests/support/__init__.py``): helpers in ``tests/support``,
``conftest.py`` never imported, no test module importing another."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


def test_every_helper_module_lives_in_tests_support() -> None:
    strays = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("*.py")
        if path.relative_to(TESTS).parts[0] != "support"
        and path.name not in ("conftest.py", "__init__.py")
        and not path.name.startswith("test_")
    ]
    assert strays == [], "helper modules outside tests/support"
    packages_with_code = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("__init__.py")
        if path.parent != TESTS / "support" and ast.parse(path.read_text()).body
    ]
    assert packages_with_code == [], "code in a test package's __init__.py"


def _imported_modules(path: Path) -> list[str]:
    package = ".".join(path.parent.relative_to(REPO).parts)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                out.append(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names)
    return out


def test_no_module_imports_a_conftest_or_a_test_module() -> None:
    offenders = [
        f"{path.relative_to(REPO)}: {module}"
        for root in (TESTS, REPO / "bench")
        for path in root.rglob("*.py")
        for module in _imported_modules(path)
        if module.startswith("tests.")
        and (module.rsplit(".", 1)[-1] == "conftest" or module.rsplit(".", 1)[-1].startswith("test_"))
    ]
    assert offenders == []
