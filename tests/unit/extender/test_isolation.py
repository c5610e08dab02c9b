"""The extender is its own service: it imports the shared layer only, never the scheduler or numpy, and the
shared load domain it uses imports no infrastructure (no I/O clients)."""

from __future__ import annotations

import subprocess
import sys


def loaded_after_importing(packages: list[str]) -> set[str]:
    code = (
        "import importlib, pkgutil, sys\n"
        f"for name in {packages!r}:\n"
        "    pkg = importlib.import_module(name)\n"
        "    for m in pkgutil.walk_packages(getattr(pkg, '__path__', []), name + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {line.split(".")[0] for line in out.split()}


def test_the_extender_imports_neither_the_scheduler_nor_numpy() -> None:
    loaded = loaded_after_importing(["crane_extender"])
    assert "crane_extender" in loaded
    assert not loaded & {"crane_scheduler", "numpy", "crane_sandbox"}


def test_the_load_domain_imports_no_infrastructure() -> None:
    loaded = loaded_after_importing(["crane_shared.loadaware", "crane_shared.podresources"])
    assert "crane_shared" in loaded
    assert not loaded & {"aiohttp", "kubernetes_asyncio", "redis", "prometheus_client", "numpy", "crane_scheduler"}
