"""Helpers the deployment tests share: the chart, helm (built from its Go module by scripts/tools), rendering."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "crane-scheduler"
DASHBOARDS = CHART / "files" / "dashboards"
ALERTS = CHART / "files" / "alerts.yml"


@functools.cache
def tool(name: str) -> str:
    """Path of a tool built from its Go module (first use builds it into ~/.cache/crane-tools)."""
    out = subprocess.run([str(REPO / "scripts" / "tools"), name], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def helm(*args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm; on failure the error names the command and helm's output."""
    result = subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=300, env=env, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def render(*set_args: str, namespace: str = "crane-system", release: str = "crane") -> list[dict[str, Any]]:
    """``helm template`` of the chart: its objects (documents that are not empty)."""
    out = helm("template", release, str(CHART), "--namespace", namespace, *set_args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}
