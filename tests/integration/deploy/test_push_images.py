"""How a user gets the images into a cluster: ``scripts/push-images REGISTRY TAG`` builds every service target and
pushes it to a registry they name, and the chart with ``image.registry=REGISTRY`` (and ``image.tag``) pulls exactly
what was pushed. The registry here is a local one (Debian's docker-registry), the engine podman, the base image the
local Debian one (no public registry is reachable from CI)."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from crane_sandbox.procs import free_port
from tests.support.deploy import BUILD_LABEL, CHART, REPO, TARGETS, helm, podman

MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.index.v1+json",
    )
)


def _status(url: str) -> int:
    request = urllib.request.Request(url, method="HEAD", headers={"Accept": MANIFEST_TYPES})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def test_push_images_puts_in_a_named_registry_exactly_what_the_chart_pulls(base_image: str, tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "version": 0.1,
                "storage": {"filesystem": {"rootdirectory": str(tmp_path / "data")}},
                "http": {"addr": f"127.0.0.1:{port}"},
            }
        )
    )
    with open(tmp_path / "registry.log", "w") as log:
        registry = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while _status(f"http://127.0.0.1:{port}/v2/") != 200:
            assert time.monotonic() < deadline and registry.poll() is None, (tmp_path / "registry.log").read_text()
            time.sleep(0.2)
        name = f"127.0.0.1:{port}/team"
        env = {
            **os.environ,
            "ENGINE": f"{REPO / 'scripts' / 'container-engine'} podman",
            "BASE_IMAGE": base_image,
            # as the image tests build (``build_image``): their layers are reused
            "BUILD_FLAGS": f"--network=host --layers --label {BUILD_LABEL}",
            "PUSH_FLAGS": "--tls-verify=false",
        }
        pushed = subprocess.run(
            [str(REPO / "scripts" / "push-images"), name, "test"],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        assert pushed.returncode == 0, pushed.stderr[-3000:]
        refs = set(pushed.stdout.split())
        assert refs == {f"{name}/crane-{t}:test" for t in TARGETS}

        values = f"image.registry={name},image.tag=test,extender.enabled=true,policy.spec.reclaim.maxAge=5m"
        rendered = helm("template", "crane", str(CHART), "--set", values).stdout
        pulled = {
            c["image"]
            for o in yaml.safe_load_all(rendered)
            if o and o["kind"] in ("Deployment", "Job")
            for c in o["spec"]["template"]["spec"]["containers"]
            if "crane-" in c["image"]
        }
        assert pulled == refs  # every service, and the uninstall hook (the annotator's image)
        for ref in sorted(pulled):
            repository, tag = ref.removeprefix(f"127.0.0.1:{port}/").rsplit(":", 1)
            assert _status(f"http://127.0.0.1:{port}/v2/{repository}/manifests/{tag}") == 200, ref
    finally:
        registry.terminate()
        registry.wait(timeout=30)
        # The registry's port is new each run: tags left behind would keep each run's images forever.
        refs_here = [f"127.0.0.1:{port}/team/crane-{t}:test" for t in TARGETS]
        podman("image", "rm", "--ignore", *refs_here, check=False)
