"""Kubernetes and KWOK binaries, built from pinned Go modules and cached outside the work tree.

No registry ships these binaries, so the sandbox builds them: kube-apiserver, kube-scheduler and
kube-controller-manager from ``sandbox/kube`` (a tiny Go module pinning one ``k8s.io/kubernetes`` release, the
newest supported: 1.37), the same three from ``sandbox/kube135`` (the oldest supported, 1.35) on demand, and
KWOK's controller from ``sandbox/kwok`` (a separate module pinning ``sigs.k8s.io/kwok``, so KWOK's dependency
versions never move the Kubernetes pin), and, on demand only, kubernetes-sigs/descheduler from
``sandbox/descheduler`` (bench/rebalance) and kubernetes-sigs/scheduler-plugins' scheduler with Coscheduling from
``sandbox/schedplugins`` (bench/gangs), and Karpenter with its KWOK cloud provider from ``sandbox/karpenter``
(``--autoscaler karpenter``, bench/autoscale), each its own module too. Each module is one ``go build`` invocation. The
cache key hashes the module's files, so binaries are rebuilt only when a pin (or a build file) changes; a fresh
clone on the same machine reuses them. The first build takes several minutes. The judge (``cmd/judge``:
kube-scheduler's own plugins as a JSON oracle for tests/differential) is built next to them.
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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

SANDBOX_DIR = Path(__file__).resolve().parent.parent
MODULE_DIR = SANDBOX_DIR / "kube"
"""the newest supported release: the servers of the sandbox, the tests and the benchmarks, and the judge"""
RELEASES: dict[str, Path] = {"1.37": MODULE_DIR, "1.35": SANDBOX_DIR / "kube135"}
"""Each supported Kubernetes release (the oldest and the newest: what the scheduler is tested against) and the
module pinning it. The oldest module builds the three servers only (the judge is the newest's)."""
NEWEST, OLDEST = "1.37", "1.35"
RELEASE_ENV = "CRANE_KUBE_RELEASE"
"""which release's servers ``ensure_binaries()`` returns (default the newest): ``CRANE_KUBE_RELEASE=1.35 pytest
...`` runs the test clusters (and the reference kube-scheduler) on Kubernetes 1.35 (docs/ci.md)."""
KWOK_MODULE_DIR = SANDBOX_DIR / "kwok"
DESCHEDULER_MODULE_DIR = SANDBOX_DIR / "descheduler"
COSCHEDULER_MODULE_DIR = SANDBOX_DIR / "schedplugins"
KARPENTER_MODULE_DIR = SANDBOX_DIR / "karpenter"
BINARIES = (
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "judge",
)  # judge: kube's plugins as a JSON oracle
KWOK_BINARIES = ("kwok",)
DESCHEDULER_BINARIES = ("descheduler",)
COSCHEDULER_BINARIES = ("coscheduler",)
KARPENTER_BINARIES = ("karpenter",)
GO_BUILD_FLAGS = ("-trimpath", "-ldflags=-s -w", "-gcflags=all=-dwarf=false")
"""No symbol table or debug information: the linker drops DWARF anyway (-w), and not generating it saves ~8% of
the compile's CPU. scripts/tools and scripts/build-toxiproxy use the same flags, so packages they share with these
builds (same module versions) compile once in Go's build cache."""

KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
"""KWOK's default stages as ``kwokctl`` configures them (node-fast, heartbeat with Lease, pod-fast), copied from
the pinned module at build time: nodes become Ready and renew their Lease, bound pods go Running with an IP, Job
pods complete, deletions are confirmed."""

KARPENTER_CRDS = (
    "kwok/charts/crds/karpenter.sh_nodepools.yaml",
    "kwok/charts/crds/karpenter.sh_nodeclaims.yaml",
    "kwok/charts/crds/karpenter.sh_nodeoverlays.yaml",
    "kwok/charts/crds/autoscaling.x-k8s.io_capacitybuffers.yaml",
    "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml",
)
"""The CRDs of Karpenter's KWOK chart (NodePool, NodeClaim, NodeOverlay, CapacityBuffer; the chart's NodePool
variant reserves the ``karpenter.kwok.sh`` label domain) and the provider's KWOKNodeClass, copied from the pinned
module at build time."""

KARPENTER_CHART = "kwok/charts"
"""Karpenter's KWOK Helm chart, copied from the pinned module at build time: ``crane_sandbox.karpenter`` renders it
(``helm template``) and applies its ServiceAccount, roles and bindings, so the sandbox's Karpenter runs with exactly
the permissions of the pinned release's chart."""

ExtraWriter = Callable[[str, Path, dict[str, str], Path], None]
"""Writes one extra file of a build from the pinned module's sources: (go, module_dir, env, out)."""


@dataclass(frozen=True)
class KubeBinaries:
    version: str
    apiserver: Path
    scheduler: Path
    controller_manager: Path
    judge: Path | None
    """None for a release built without it (the oldest: the judge is the newest release's, ``ensure_judge``)"""


@dataclass(frozen=True)
class KwokBinaries:
    version: str
    kwok: Path
    stages: Path
    """one YAML stream with the stages of ``KWOK_STAGES`` (``kwok --config``)"""


def pinned_version(module_dir: Path = MODULE_DIR, module: str = "k8s.io/kubernetes") -> str:
    """The release of ``module`` required by the Go module in ``module_dir``."""
    for line in (module_dir / "go.mod").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["require"]:
            parts = parts[1:]
        if len(parts) >= 2 and parts[0] == module:
            return parts[1]
    raise RuntimeError(f"{module_dir / 'go.mod'}: no 'require {module} <version>' line")


def cache_root() -> Path:
    return Path(os.environ.get("CRANE_KUBEBIN_CACHE", Path.home() / ".cache" / "crane-kubebin"))


def _build_key(module_dir: Path, version: str, prefix: str = "") -> str:
    digest = hashlib.sha256()
    for path in sorted(module_dir.rglob("*")):
        if path.is_file() and path.suffix in {".go", ".mod", ".sum"}:
            digest.update(path.relative_to(module_dir).as_posix().encode())
            digest.update(path.read_bytes())
    return f"{prefix}{version}-{digest.hexdigest()[:12]}"


def _ensure_built(
    module_dir: Path,
    key: str,
    binaries: tuple[str, ...],
    what: str,
    *,
    quiet: bool,
    extra: Mapping[str, ExtraWriter] | None = None,
    env: Mapping[str, str] | None = None,
    packages: tuple[str, ...] = ("./cmd/...",),
) -> Path:
    """The cache directory holding ``binaries`` (and the ``extra`` files, each written by its writer), after one
    ``go build`` of ``packages`` (the module's own commands, or upstream's by import path) if needed; ``env`` adds
    to the build's environment."""
    extra = extra or {}
    target = cache_root() / key
    wanted = (*binaries, *extra)
    if all((target / b).exists() for b in wanted):
        return target
    go = shutil.which("go")
    if go is None:
        raise RuntimeError(f"Go is needed to build {what} (https://go.dev/doc/install); 'go' is not on PATH")
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / f".{key}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # parallel callers of one pin wait for one build (scripts/setup's, in the background)
            if not quiet:
                print(f"waiting for another build of {what} (first time: minutes)...", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if all((target / b).exists() for b in wanted):
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_root()))
        if not quiet:
            print(f"building {what} (first time: minutes)...", file=sys.stderr, flush=True)
        build_env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod -buildvcs=false", **(env or {})}
        started = time.monotonic()
        subprocess.run(
            [go, "build", *GO_BUILD_FLAGS, "-o", str(staging) + "/", *packages],
            cwd=module_dir,
            env=build_env,
            check=True,
        )
        for name, write in extra.items():
            write(go, module_dir, build_env, staging / name)
        if target.exists():  # an older build of this key, without an output added since: replaced whole
            shutil.rmtree(target)
        staging.rename(target)
        if not quiet:
            print(f"built {what} in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
    return target


def _module_dir(go: str, module_dir: Path, env: dict[str, str], module: str) -> Path:
    """Where the pinned ``module``'s source tree is (Go's module cache)."""
    out = subprocess.run(
        [go, "list", "-m", "-f", "{{.Dir}}", module],
        cwd=module_dir,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def _module_files_writer(module: str, files: tuple[str, ...]) -> ExtraWriter:
    """A writer of one YAML stream made of ``files`` from the pinned ``module``'s source tree."""

    def write(go: str, module_dir: Path, env: dict[str, str], out: Path) -> None:
        source = _module_dir(go, module_dir, env, module)
        docs = [(source / rel).read_text().strip().removeprefix("---").strip() for rel in files]
        out.write_text("\n---\n".join(docs) + "\n")

    return write


def _module_tree_writer(module: str, tree: str) -> ExtraWriter:
    """A writer of a copy of the directory ``tree`` of the pinned ``module``'s source tree (writable, unlike the
    module cache's read-only files)."""

    def write(go: str, module_dir: Path, env: dict[str, str], out: Path) -> None:
        source = _module_dir(go, module_dir, env, module) / tree
        for path in sorted(source.rglob("*")):
            if path.is_file():
                target = out / path.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(path.read_bytes())

    return write


def selected_release() -> str:
    """The release ``CRANE_KUBE_RELEASE`` names (default the newest)."""
    release = os.environ.get(RELEASE_ENV) or NEWEST
    if release not in RELEASES:
        raise RuntimeError(f"{RELEASE_ENV}={release!r}: supported releases are {', '.join(sorted(RELEASES))}")
    return release


def ensure_binaries(module_dir: Path | None = None, *, quiet: bool = False) -> KubeBinaries:
    """Return the cached Kubernetes binaries of ``module_dir`` (default: the release ``CRANE_KUBE_RELEASE``
    selects, the newest unless set), building them first if this pin was never built on this machine."""
    if module_dir is None:
        module_dir = RELEASES[selected_release()]
    version = pinned_version(module_dir)
    # the newest: thin mains of its own, and the judge; the oldest: upstream's own commands (the same mains)
    own = (module_dir / "cmd").is_dir()
    binaries: tuple[str, ...] = BINARIES if own else tuple(b for b in BINARIES if b != "judge")
    packages = ("./cmd/...",) if own else tuple(f"k8s.io/kubernetes/cmd/{b}" for b in binaries)
    what = f"{', '.join(binaries)} {version}"
    key = _build_key(module_dir, version)
    target = _ensure_built(module_dir, key, binaries, what, quiet=quiet, packages=packages)
    path = {b: target / b for b in binaries}
    return KubeBinaries(
        version, path["kube-apiserver"], path["kube-scheduler"], path["kube-controller-manager"], path.get("judge")
    )


def ensure_judge(*, quiet: bool = False) -> Path:
    """The judge, always built from the newest release (kube-scheduler's own plugins: the reference the
    differential suite compares with), whatever ``CRANE_KUBE_RELEASE`` says."""
    judge = ensure_binaries(MODULE_DIR, quiet=quiet).judge
    assert judge is not None, f"{MODULE_DIR}/cmd/judge is missing"
    return judge


def ensure_kwok(module_dir: Path = KWOK_MODULE_DIR, *, quiet: bool = False) -> KwokBinaries:
    """Return the cached KWOK controller and its stage file, building them first if needed."""
    version = pinned_version(module_dir, "sigs.k8s.io/kwok")
    key = _build_key(module_dir, version, prefix="kwok-")
    stages = "kwok-stages.yaml"
    extra = {stages: _module_files_writer("sigs.k8s.io/kwok", KWOK_STAGES)}
    target = _ensure_built(module_dir, key, KWOK_BINARIES, f"kwok {version}", quiet=quiet, extra=extra)
    return KwokBinaries(version, target / KWOK_BINARIES[0], target / stages)


@dataclass(frozen=True)
class DeschedulerBinaries:
    version: str
    descheduler: Path


def ensure_descheduler(module_dir: Path = DESCHEDULER_MODULE_DIR, *, quiet: bool = False) -> DeschedulerBinaries:
    """Return the cached kubernetes-sigs/descheduler, building it first if needed (not built by scripts/setup:
    only bench/rebalance runs it)."""
    version = pinned_version(module_dir, "sigs.k8s.io/descheduler")
    key = _build_key(module_dir, version, prefix="descheduler-")
    target = _ensure_built(module_dir, key, DESCHEDULER_BINARIES, f"descheduler {version}", quiet=quiet)
    return DeschedulerBinaries(version, target / DESCHEDULER_BINARIES[0])


@dataclass(frozen=True)
class CoschedulerBinaries:
    version: str
    coscheduler: Path
    """kube-scheduler (the scheduler-plugins release's Kubernetes) with the Coscheduling plugin registered"""


def ensure_coscheduler(module_dir: Path = COSCHEDULER_MODULE_DIR, *, quiet: bool = False) -> CoschedulerBinaries:
    """Return the cached scheduler-plugins scheduler, building it first if needed (not built by scripts/setup:
    only bench/gangs runs it)."""
    version = pinned_version(module_dir, "sigs.k8s.io/scheduler-plugins")
    key = _build_key(module_dir, version, prefix="scheduler-plugins-")
    target = _ensure_built(module_dir, key, COSCHEDULER_BINARIES, f"scheduler-plugins {version}", quiet=quiet)
    return CoschedulerBinaries(version, target / COSCHEDULER_BINARIES[0])


def kubectl_binary() -> Path:
    """kubectl at the sandbox's Kubernetes pin, built by scripts/tools (cached in ~/.cache/crane-tools; the first
    call builds it, or waits for the build scripts/setup started)."""
    out = subprocess.run(
        [str(SANDBOX_DIR.parent / "scripts" / "tools"), "kubectl"],
        check=True,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return Path(out.stdout.strip())


@dataclass(frozen=True)
class KarpenterBinaries:
    version: str
    karpenter: Path
    """Karpenter core with the KWOK cloud provider (sigs.k8s.io/karpenter's kwok/main.go)"""
    crds: Path
    """one YAML stream with the CRDs of ``KARPENTER_CRDS``"""
    chart: Path
    """Karpenter's KWOK Helm chart (``KARPENTER_CHART``)"""


KARPENTER_GO_ENV = {"GOTOOLCHAIN": "auto"}
"""Karpenter's releases follow Go's patch releases closely (v1.15.0 needs Go 1.26.9): where the local Go is older
than the module's ``go`` line, Go fetches that toolchain once through the module proxy (golang.org/toolchain)
instead of refusing; a local Go that is new enough is used as it is."""


KARPENTER_EXTRA = {
    "karpenter-crds.yaml": _module_files_writer("sigs.k8s.io/karpenter", KARPENTER_CRDS),
    "karpenter-chart": _module_tree_writer("sigs.k8s.io/karpenter", KARPENTER_CHART),
}


def _karpenter_target(module_dir: Path) -> tuple[str, str, Path]:
    version = pinned_version(module_dir, "sigs.k8s.io/karpenter")
    key = _build_key(module_dir, version, prefix="karpenter-")
    return version, key, cache_root() / key


def _karpenter_binaries(version: str, target: Path) -> KarpenterBinaries:
    crds, chart = KARPENTER_EXTRA
    return KarpenterBinaries(version, target / KARPENTER_BINARIES[0], target / crds, target / chart)


def ensure_karpenter(module_dir: Path = KARPENTER_MODULE_DIR, *, quiet: bool = False) -> KarpenterBinaries:
    """Return the cached Karpenter (KWOK provider), its CRDs and chart, building them first if needed (not built
    by scripts/setup: only ``--autoscaler karpenter`` and bench/autoscale run it; the first build takes many
    minutes)."""
    version, key, _ = _karpenter_target(module_dir)
    what = f"karpenter {version}"
    target = _ensure_built(
        module_dir, key, KARPENTER_BINARIES, what, quiet=quiet, extra=KARPENTER_EXTRA, env=KARPENTER_GO_ENV
    )
    return _karpenter_binaries(version, target)


def built_karpenter(module_dir: Path = KARPENTER_MODULE_DIR) -> KarpenterBinaries | None:
    """The cached Karpenter of the pin, or None when it was never built on this machine (nothing is built)."""
    version, _, target = _karpenter_target(module_dir)
    found = _karpenter_binaries(version, target)
    return found if all(p.exists() for p in (found.karpenter, found.crds, found.chart)) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "modules",
        nargs="*",
        choices=("kube", "kube135", "kwok", "descheduler", "coscheduler", "karpenter"),
        default=["kube", "kwok"],
        help="which module to build (default kube and kwok); scripts/setup builds kube (the newest release, "
        f"{NEWEST}) first and KWOK in the background; kube135 (the oldest supported release's servers, for "
        f"{RELEASE_ENV}=1.35 test runs), the descheduler (bench/rebalance only), the coscheduler "
        "(scheduler-plugins, bench/gangs only) and Karpenter (--autoscaler karpenter, bench/autoscale) are built "
        "on demand",
    )
    args = parser.parse_args()
    for name, release in (("kube", NEWEST), ("kube135", OLDEST)):
        if name in args.modules:
            bins = ensure_binaries(RELEASES[release])
            print(f"{bins.version}\n{bins.apiserver}\n{bins.scheduler}\n{bins.controller_manager}")
            if bins.judge is not None:
                print(bins.judge)
    if "kwok" in args.modules:
        kwok = ensure_kwok()
        print(f"{kwok.version}\n{kwok.kwok}")
    if "descheduler" in args.modules:
        desch = ensure_descheduler()
        print(f"{desch.version}\n{desch.descheduler}")
    if "coscheduler" in args.modules:
        cosched = ensure_coscheduler()
        print(f"{cosched.version}\n{cosched.coscheduler}")
    if "karpenter" in args.modules:
        karp = ensure_karpenter()
        print(f"{karp.version}\n{karp.karpenter}\n{karp.crds}\n{karp.chart}")


if __name__ == "__main__":
    main()
