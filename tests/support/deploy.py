"""Helpers the deployment tests share: the chart, helm (built from its Go module by scripts/tools), rendering."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "crane-scheduler"
DASHBOARDS = CHART / "files" / "dashboards"
ALERTS = CHART / "files" / "alerts.yml"


def prefetch(*command: str) -> None:
    """Start a slow, cached preparation (``scripts/tools NAME``, ``scripts/container-engine base-image``) in the
    background when a test module is collected, so the builds of several modules overlap each other and the tests
    that run before them; the test that needs the result runs the same command, which waits on the build's lock.
    Output goes to ~/.cache/crane-tools/prefetch-*.log. Not with ``CRANE_NO_PREFETCH`` set (`make test`: scripts/setup
    has queued every build, in the order the suite needs them, behind the Kubernetes build)."""
    if os.environ.get("CRANE_NO_PREFETCH"):
        return
    log_dir = Path.home() / ".cache" / "crane-tools"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"prefetch-{'-'.join(Path(c).name for c in command)}.log"
    with log.open("w") as out:
        subprocess.Popen(
            [str(REPO / "scripts" / command[0]), *command[1:]], stdout=out, stderr=out, start_new_session=True
        )


BUILD_LABEL = "io.crane.test-build=1"
"""On every image (and each of its cached layers) the tests build: what ``prune_builds`` may remove."""


def build_image(tag: str, dockerfile: Path, context: Path, *args: str) -> str:
    """``podman build`` of ``tag`` with cached layers (a rebuild of an unchanged tree takes seconds), labelled
    ``BUILD_LABEL``; returns the tag."""
    podman("build", "--network=host", "--layers", "--label", BUILD_LABEL, "-f", str(dockerfile), *args, "-t", tag,
           str(context))  # fmt: skip
    return tag


def prune_builds() -> None:
    """Remove what the tests' earlier builds left untagged: a tree that changed gets new layers and the tags move
    to them, leaving ~400 MB a run behind (a CI machine that runs the suite on each commit ran out of disk). Only
    images the tests built (``BUILD_LABEL``) and that no tag still needs go; the current ones keep their layer
    cache. Images made in the last 30 minutes stay: another test run's build may be making them right now (its
    layers are untagged until its last step). Quiet, never fails, installs nothing and asks for no password
    (``scripts/container-engine prune``): it runs after every test session, unit tests alone included."""
    if shutil.which("podman") is not None:
        engine("prune", BUILD_LABEL, timeout=300)


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


TARGETS = ("event-recorder", "annotator", "scheduler", "extender", "descheduler")


def engine(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "scripts" / "container-engine"), *args], capture_output=True, text=True, timeout=timeout
    )


def podman(*args: str, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = engine("podman", *args, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args[:3])}... failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result
