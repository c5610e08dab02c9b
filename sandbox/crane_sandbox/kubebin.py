"""kube-apiserver and kube-scheduler, built from the pinned ``k8s.io/kubernetes`` Go module and cached, with the
judge (``cmd/judge``: kube-scheduler's own plugins as a JSON oracle for tests/differential) next to them.

No registry ships these binaries, so the sandbox builds them from ``sandbox/kube`` (a tiny Go module pinning
one Kubernetes release). The cache key hashes that module's files, so binaries are rebuilt only when the pin (or
the build) changes; a fresh clone on the same machine reuses them. The first build takes several minutes.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MODULE_DIR = Path(__file__).resolve().parent.parent / "kube"
BINARIES = ("kube-apiserver", "kube-scheduler", "judge")  # judge: kube-scheduler's plugins as a JSON oracle


@dataclass(frozen=True)
class KubeBinaries:
    version: str
    apiserver: Path
    scheduler: Path


def pinned_version(module_dir: Path = MODULE_DIR) -> str:
    """The ``k8s.io/kubernetes`` release required by the Go module."""
    for line in (module_dir / "go.mod").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["require"]:
            parts = parts[1:]
        if len(parts) >= 2 and parts[0] == "k8s.io/kubernetes":
            return parts[1]
    raise RuntimeError(f"{module_dir / 'go.mod'}: no 'require k8s.io/kubernetes <version>' line")


def cache_root() -> Path:
    return Path(os.environ.get("CRANE_KUBEBIN_CACHE", Path.home() / ".cache" / "crane-kubebin"))


def _build_key(module_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(module_dir.rglob("*")):
        if path.is_file() and path.suffix in {".go", ".mod", ".sum"}:
            digest.update(path.relative_to(module_dir).as_posix().encode())
            digest.update(path.read_bytes())
    return f"{pinned_version(module_dir)}-{digest.hexdigest()[:12]}"


def ensure_binaries(module_dir: Path = MODULE_DIR, *, quiet: bool = False) -> KubeBinaries:
    """Return cached binaries, building them first if this pin was never built on this machine."""
    key = _build_key(module_dir)
    target = cache_root() / key
    result = KubeBinaries(pinned_version(module_dir), target / BINARIES[0], target / BINARIES[1])
    if all((target / b).exists() for b in BINARIES):
        return result
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("Go is needed to build kube-apiserver (https://go.dev/doc/install); 'go' is not on PATH")
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel callers wait for one build
        if all((target / b).exists() for b in BINARIES):
            return result
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_root()))
        if not quiet:
            print(
                f"building kube-apiserver and kube-scheduler {result.version} (first time: minutes)...",
                file=sys.stderr,
                flush=True,
            )
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod -buildvcs=false"}
        subprocess.run(
            [go, "build", "-trimpath", "-ldflags=-s -w", "-o", str(staging) + "/", "./cmd/..."],
            cwd=module_dir,
            env=env,
            check=True,
        )
        staging.rename(target)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args()
    bins = ensure_binaries()
    print(f"{bins.version}\n{bins.apiserver}\n{bins.scheduler}")


if __name__ == "__main__":
    main()
