"""Fixtures of the deployment tests: the service images built on the local Debian base image with podman."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.deploy import REPO, TARGETS, build_image, engine, podman, prefetch, tool
from tests.support.unavailable import unavailable

prefetch("container-engine", "base-image")


@pytest.fixture(scope="session")
def base_image() -> str:
    """The local Debian base image (built on first use). Skips, saying why, when no container can run here; fails
    in CI (``CI`` set), where scripts/setup installs podman and debootstrap."""
    base = engine("base-image")
    if base.returncode != 0:
        unavailable(f"no local base image (debootstrap/podman failed): {base.stderr[-2000:]}")
    check = engine("check")
    if check.returncode != 0:
        unavailable(f"podman cannot run a container on this machine: {check.stderr[-2000:]}")
    return base.stdout.strip()


@pytest.fixture(scope="session")
def images(base_image: str) -> Iterator[dict[str, str]]:
    """Build every service target on the local base image; {target: image}; sizes are printed."""
    built: dict[str, str] = {}
    sizes = []
    dockerfile, base = REPO / "deploy" / "Dockerfile", f"BASE_IMAGE={base_image}"
    # The build stage is tagged too: untagged, it would be pruned after the session, and its venv rebuilt next time.
    build_image("localhost/crane-build:test", dockerfile, REPO, "--target", "build", "--build-arg", base)
    for target in TARGETS:
        start = time.monotonic()
        tag = build_image(f"localhost/crane-{target}:test", dockerfile, REPO, "--target", target, "--build-arg", base)
        size = int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())
        sizes.append(f"{tag}: {size / 1e6:.0f} MB (built in {time.monotonic() - start:.0f} s)")
        built[target] = tag
    print("\nimage sizes:\n  " + "\n  ".join(sizes))
    yield built


@pytest.fixture(scope="session")
def standins(base_image: str) -> dict[str, str]:
    """Redis and Prometheus images from Debian packages, standing in for the public images compose names."""
    out = {}
    for target in ("redis", "prometheus"):
        out[target] = build_image(
            f"localhost/crane-standin-{target}:test",
            REPO / "deploy" / "compose" / "standins.Dockerfile",
            REPO / "deploy" / "compose",
            "--target",
            target,
            "--build-arg",
            f"BASE_IMAGE={base_image}",
        )
    return out


@pytest.fixture(scope="session")
def kwok_cluster(base_image: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The local equivalent of KWOK's cluster image (deploy/compose/kwok-cluster.Dockerfile): KWOK's recipe and
    entry point with the sandbox's pinned Kubernetes and KWOK binaries, kwokctl and kubectl from scripts/tools."""
    from crane_sandbox.kubebin import ensure_binaries, ensure_kwok

    kube, kwok = ensure_binaries(quiet=True), ensure_kwok(quiet=True)
    context = tmp_path_factory.mktemp("kwok-cluster")
    (context / "bin").mkdir()
    binaries = {
        "kube-apiserver": kube.apiserver,
        "kube-controller-manager": kube.controller_manager,
        "kube-scheduler": kube.scheduler,
        "kwok": kwok.kwok,
        "kwokctl": Path(tool("kwokctl")),
        "kubectl": Path(tool("kubectl")),
    }
    for name, path in binaries.items():
        shutil.copy(path, context / "bin" / name)
    module = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/kwok@{kwok.version}"],
        capture_output=True,
        text=True,
        check=True,
    )
    shutil.copy(Path(json.loads(module.stdout)["Dir"]) / "images" / "cluster" / "entrypoint.sh", context)
    start = time.monotonic()
    tag = build_image(
        "localhost/crane-kwok-cluster:test",
        REPO / "deploy" / "compose" / "kwok-cluster.Dockerfile",
        context,
        "--build-arg",
        f"BASE_IMAGE={base_image}",
        "--build-arg",
        f"KUBE_VERSION={kube.version}",
    )
    size = int(podman("image", "inspect", "--format", "{{.Size}}", tag).stdout.strip())
    print(f"\n{tag}: {size / 1e6:.0f} MB (built in {time.monotonic() - start:.0f} s)")
    return tag


@pytest.fixture(scope="session")
def fleet_image(base_image: str) -> str:
    """The docker-compose stack's simulated node-exporter fleet (deploy/compose/fleet.Dockerfile)."""
    return build_image(
        "localhost/crane-fleet:test",
        REPO / "deploy" / "compose" / "fleet.Dockerfile",
        REPO,
        "--build-arg",
        f"BASE_IMAGE={base_image}",
    )
