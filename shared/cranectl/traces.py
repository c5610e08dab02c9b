"""Traces for ``cranectl replay``: nodes, workloads, and what happens to them over time.

A trace is a YAML or JSON document (``kind: CraneTrace``), read strictly (an unknown field is refused with a
suggestion, every problem reported at once, each naming its field path)::

    apiVersion: crane.io/v1alpha1
    kind: CraneTrace
    metadata: {name: hotspot}
    spec:
      description: one node turns hot under its pods
      duration: 1h                 # virtual time replayed
      step: 15s                    # the virtual clock's tick (usage sampled, pods scheduled, events applied)
      nodes:
        - name: node               # count: 4 names them node-1 .. node-4
          count: 4
          cpu: 16                  # allocatable cores
          memory: 64Gi
          base: {cpu: 0.15, memory: 0.20}   # real usage outside the trace's pods (system, other tenants)
          labels: {zone: a}
      workloads:
        - name: web
          kind: Deployment         # Deployment: replaced when evicted; Job: pods end after lifetime; Pod: plain
          requests: {cpu: "2", memory: 4Gi}
          usage: {cpu: 1.2, memory: 2Gi}     # each pod's real usage (cores, bytes)
          replicas: 12             # at the start
          priority: 0
        - name: batch
          kind: Job
          requests: {cpu: "4", memory: 8Gi}
          usage: {cpu: 3.5, memory: 6Gi}
          lifetime: 30m            # a pod ends this long after it started
        - name: agent
          kind: Pod
          node: node-1             # its pods are bound there by hand (not scheduled)
          replicas: 1
      events:                      # at: time since the start; one change each
        - {at: 15m, node: node-1, base: {cpu: 0.55}}
        - {at: 20m, workload: web, usage: {cpu: 1.5}}
        - {at: 25m, workload: web, replicas: 14}
        - {at: 30m, workload: batch, create: 3}

Built in (``builtin:NAME``): ``seed`` and ``seed-cpu``, the seed experiment (its memory-heavy and CPU-heavy
services, from ``../shared/seeds/001``), ``hotspot``, and ``random`` (generated from ``--seed``: seeded arrivals,
departures, usage drift and noisy neighbours). ``document(name)`` is a built-in trace as a document (``cranectl
replay --print-trace``), to edit and replay as a file.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from crane_shared.durations import format_duration
from crane_shared.policyyaml import PolicyError, check_keys, count, describe, duration, read_yaml
from crane_shared.quantity import parse_quantity

KIND = "CraneTrace"
API_VERSION = "crane.io/v1alpha1"
WORKLOAD_KINDS = ("Deployment", "Job", "Pod")
BUILTIN = ("seed", "seed-cpu", "hotspot", "random")
GI = 1024**3

_SPEC = ("description", "duration", "step", "nodes", "workloads", "events")
_NODE = ("name", "count", "cpu", "memory", "base", "labels")
_WORKLOAD = ("name", "namespace", "kind", "requests", "usage", "replicas", "priority", "lifetime", "node")
_EVENT = ("at", "node", "workload", "base", "usage", "replicas", "create")
_RESOURCES = ("cpu", "memory")


@dataclass(frozen=True)
class Resources:
    """CPU in cores, memory in bytes (or, for a node's ``base``, fractions of the node)."""

    cpu: float = 0.0
    memory: float = 0.0


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpu: float
    memory: float
    base: Resources
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    namespace: str
    kind: str
    requests: Mapping[str, str]
    """as written (quantities), for the pods' spec"""
    usage: Resources
    replicas: int = 0
    priority: int = 0
    lifetime: float | None = None
    """seconds a Job's pod runs"""
    node: str | None = None


@dataclass(frozen=True)
class Event:
    at: float
    """seconds since the start"""
    node: str | None = None
    workload: str | None = None
    base: Mapping[str, float] | None = None
    """node: the new base fractions (only the resources named)"""
    usage: Mapping[str, float] | None = None
    """workload: each pod's new usage (only the resources named)"""
    replicas: int | None = None
    create: int | None = None


@dataclass(frozen=True)
class Trace:
    name: str
    description: str
    duration: float
    step: float
    nodes: tuple[NodeSpec, ...]
    workloads: tuple[WorkloadSpec, ...]
    events: tuple[Event, ...]
    """in time order (a stable sort: events at the same time in the order written)"""


# ------------------------------------------------------------------------------------------ reading


def parse_trace(doc: object, source: str = "<trace>") -> Trace:
    """A trace document read and validated; ``PolicyError`` lists every problem, each naming its field path."""
    problems: list[str] = []
    trace = _read(doc, problems)
    if problems or trace is None:
        raise PolicyError(source, problems)
    return trace


def read_trace(text: str, source: str) -> Trace:
    return parse_trace(read_yaml(text, source), source)


def _read(doc: object, problems: list[str]) -> Trace | None:
    if not isinstance(doc, dict):
        problems.append(f"the trace must be a mapping, got {describe(doc)}")
        return None
    check_keys(doc, "", ("apiVersion", "kind", "metadata", "spec"), problems)
    if doc.get("kind") != KIND:
        problems.append(f"kind: must be {KIND}, got {describe(doc.get('kind'))}")
    meta = doc.get("metadata") or {}
    name = str(meta.get("name") or "trace") if isinstance(meta, dict) else "trace"
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        problems.append(f"spec: must be a mapping, got {describe(spec)}")
        return None
    check_keys(spec, "spec", _SPEC, problems)
    duration = _duration(spec, "spec", "duration", problems, required=True)
    step = _duration(spec, "spec", "step", problems, default=15.0)
    if step <= 0:
        problems.append("spec.step: must be > 0")
    nodes = tuple(n for i, raw in enumerate(_list(spec, "spec.nodes", problems)) for n in _nodes(raw, i, problems))
    names = [n.name for n in nodes]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"spec.nodes: node {dup!r} given twice")
    if not nodes:
        problems.append("spec.nodes: at least one node is required")
    workloads = tuple(
        w
        for i, raw in enumerate(_list(spec, "spec.workloads", problems))
        if (w := _workload(raw, f"spec.workloads[{i}]", set(names), problems)) is not None
    )
    known = {w.name for w in workloads}
    if len(known) < len(workloads):
        problems.append("spec.workloads: a workload name is given twice")
    events = [
        e
        for i, raw in enumerate(_list(spec, "spec.events", problems))
        if (e := _event(raw, f"spec.events[{i}]", set(names), known, duration, problems)) is not None
    ]
    events.sort(key=lambda e: e.at)
    return Trace(name, str(spec.get("description") or ""), duration, step, nodes, workloads, tuple(events))


def _list(spec: Mapping[str, Any], path: str, problems: list[str]) -> list[Any]:
    raw = spec.get(path.rsplit(".", 1)[1])
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.append(f"{path}: must be a list, got {describe(raw)}")
        return []
    return raw


def _duration(
    item: Mapping[str, Any],
    path: str,
    key: str,
    problems: list[str],
    *,
    required: bool = False,
    default: float = 0.0,
) -> float:
    """Seconds of a Go duration field (0 allowed); ``default`` when it is optional and absent, or wrong."""
    if key not in item and not required:
        return default
    value = duration(item, path, key, problems, allow_zero=True)
    return default if value is None else value.total_seconds()


def _quantity(raw: object, path: str, problems: list[str]) -> float | None:
    """Cores or bytes: a number or a Kubernetes quantity (``500m``, ``20Gi``)."""
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        problems.append(f"{path}: must be a quantity, got {describe(raw)}")
        return None
    try:
        value = float(parse_quantity(raw))
    except ValueError as err:
        problems.append(f"{path}: {err}")
        return None
    if value < 0:
        problems.append(f"{path}: must be >= 0, got {describe(raw)}")
        return None
    return value


def _resources(raw: object, path: str, problems: list[str], *, fractions: bool = False) -> dict[str, float]:
    """``{cpu, memory}`` (either may be left out): quantities, or fractions in [0, 1] (a node's ``base``)."""
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping of cpu and memory, got {describe(raw)}")
        return {}
    check_keys(raw, path, _RESOURCES, problems)
    out: dict[str, float] = {}
    for key in _RESOURCES:
        if key not in raw:
            continue
        where = f"{path}.{key}"
        if fractions:
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                problems.append(f"{where}: must be a fraction of the node between 0 and 1, got {describe(value)}")
                continue
            out[key] = float(value)
        else:
            found = _quantity(raw[key], where, problems)
            if found is not None:
                out[key] = found
    return out


def _nodes(raw: object, i: int, problems: list[str]) -> list[NodeSpec]:
    path = f"spec.nodes[{i}]"
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping, got {describe(raw)}")
        return []
    check_keys(raw, path, _NODE, problems)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        problems.append(f"{path}.name: required, a node name")
        return []
    size = {k: _quantity(raw.get(k), f"{path}.{k}", problems) for k in _RESOURCES}
    base = _resources(raw.get("base", {}), f"{path}.base", problems, fractions=True)
    labels = raw.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        problems.append(f"{path}.labels: must map label names to strings")
        labels = {}
    many = count(raw, path, "count", 0, 1, problems)
    cpu, memory = size["cpu"], size["memory"]
    if cpu is None or memory is None:
        return []
    if cpu <= 0 or memory <= 0:
        problems.append(f"{path}: cpu and memory must be > 0")
        return []
    names = [f"{name}-{k + 1}" for k in range(many)] if many else [name]
    made = Resources(base.get("cpu", 0.0), base.get("memory", 0.0))
    return [NodeSpec(n, cpu, memory, made, {str(k): str(v) for k, v in labels.items()}) for n in names]


def _workload(raw: object, path: str, nodes: set[str], problems: list[str]) -> WorkloadSpec | None:
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping, got {describe(raw)}")
        return None
    check_keys(raw, path, _WORKLOAD, problems)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        problems.append(f"{path}.name: required")
        return None
    kind = raw.get("kind", "Deployment")
    if kind not in WORKLOAD_KINDS:
        problems.append(f"{path}.kind: must be one of {', '.join(WORKLOAD_KINDS)}, got {describe(kind)}")
    requests = raw.get("requests") or {}
    _resources(requests, f"{path}.requests", problems)
    usage = _resources(raw.get("usage") or {}, f"{path}.usage", problems)
    node = raw.get("node")
    if node is not None and node not in nodes:
        problems.append(f"{path}.node: no node {describe(node)} in spec.nodes")
    lifetime = _duration(raw, path, "lifetime", problems) or None
    if lifetime is not None and kind != "Job":
        problems.append(f"{path}.lifetime: only a Job's pods end by themselves (kind: Job)")
    namespace = raw.get("namespace", "default")
    if not isinstance(namespace, str) or not namespace:
        problems.append(f"{path}.namespace: must be a namespace name")
        namespace = "default"
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        problems.append(f"{path}.priority: must be an integer, got {describe(priority)}")
        priority = 0
    return WorkloadSpec(
        name,
        namespace,
        str(kind),
        {k: str(v) for k, v in requests.items()} if isinstance(requests, dict) else {},
        Resources(usage.get("cpu", 0.0), usage.get("memory", 0.0)),
        count(raw, path, "replicas", 0, 0, problems),
        priority,
        lifetime,
        node if isinstance(node, str) else None,
    )


def _event(
    raw: object, path: str, nodes: set[str], workloads: set[str], duration: float, problems: list[str]
) -> Event | None:
    if not isinstance(raw, dict):
        problems.append(f"{path}: must be a mapping, got {describe(raw)}")
        return None
    check_keys(raw, path, _EVENT, problems)
    at = _duration(raw, path, "at", problems, required=True)
    if at > duration:
        problems.append(f"{path}.at: after the trace's duration ({format_duration_s(duration)})")
    node, workload = raw.get("node"), raw.get("workload")
    changes = [k for k in ("base", "usage", "replicas", "create") if k in raw]
    if (node is None) == (workload is None):
        problems.append(f"{path}: names either a node or a workload")
        return None
    if len(changes) != 1:
        problems.append(f"{path}: one change per event (base for a node; usage, replicas or create for a workload)")
        return None
    if node is not None:
        if node not in nodes:
            problems.append(f"{path}.node: no node {describe(node)} in spec.nodes")
        if changes != ["base"]:
            problems.append(f"{path}.{changes[0]}: a node event changes its base only")
            return None
        return Event(at, node=str(node), base=_resources(raw["base"], f"{path}.base", problems, fractions=True))
    if workload not in workloads:
        problems.append(f"{path}.workload: no workload {describe(workload)} in spec.workloads")
    if changes == ["base"]:
        problems.append(f"{path}.base: a workload event changes usage, replicas or create")
        return None
    if changes == ["usage"]:
        return Event(at, workload=str(workload), usage=_resources(raw["usage"], f"{path}.usage", problems))
    if changes == ["replicas"]:
        return Event(at, workload=str(workload), replicas=count(raw, path, "replicas", 0, 0, problems))
    return Event(at, workload=str(workload), create=count(raw, path, "create", 0, 1, problems))


def format_duration_s(seconds: float) -> str:
    """``seconds`` as a Go duration (``1h30m``)."""
    return format_duration(timedelta(seconds=seconds))


# ------------------------------------------------------------------------------------------ built in


def builtin(name: str, seed: int = 0) -> Trace:
    """A built-in trace (``BUILTIN``); ``seed`` generates ``random``."""
    return parse_trace(document(name, seed), f"builtin:{name}")


def document(name: str, seed: int = 0) -> dict[str, Any]:
    """A built-in trace as a document (what ``--print-trace`` writes)."""
    if name in ("seed", "seed-cpu"):
        return _seed(cpu=name == "seed-cpu")
    if name == "hotspot":
        return _hotspot()
    if name == "random":
        return generate(seed)
    raise ValueError(f"builtin:{name}: no such trace (built in: {', '.join(BUILTIN)})")


def _doc(name: str, description: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {"description": description, **spec},
    }


def _seed(cpu: bool) -> dict[str, Any]:
    """Seed 001's test ("真实环境测试"): three nodes whose real load is uneven in a way requests do not show (the
    busiest, node-03, carries the fewest requests: the other tenants' pods on node-01 and node-02 request much and
    use nothing), and a service scaled up one replica a minute whose replicas really use much less than they
    request: memory-heavy (uses 2 CPU / 20Gi, requests 5 / 40Gi, to 12 replicas) or CPU-heavy (uses 8 / 8Gi,
    requests 12 / 12Gi, to 9). The seed reports kube-scheduler crowding node-03 past its memory (pods crashing)
    and crane-scheduler refusing it: ``0/3 nodes are available: 1 Load[mem_usage_avg_5m] of [node-03] is too
    high, 2 Insufficient memory``. Node sizes and base loads as ``bench.seedlive`` and ``bench.loadaware``."""
    if cpu:
        requests, usage, replicas = {"cpu": "12", "memory": "12Gi"}, {"cpu": 8, "memory": "8Gi"}, 9
        what = "CPU-heavy (uses 8 CPU / 8Gi, requests 12 / 12Gi)"
    else:
        requests, usage, replicas = {"cpu": "5", "memory": "40Gi"}, {"cpu": 2, "memory": "20Gi"}, 12
        what = "memory-heavy (uses 2 CPU / 20Gi, requests 5 / 40Gi)"
    bases = [(0.10, 0.15), (0.20, 0.25), (0.35, 0.45)]
    nodes = [
        {"name": f"node-0{i + 1}", "cpu": 48, "memory": "192Gi", "base": {"cpu": c, "memory": m}}
        for i, (c, m) in enumerate(bases)
    ]
    others = [
        {
            "name": f"other-{n}",
            "kind": "Pod",
            "node": f"node-0{n}",
            "requests": {"cpu": cpu_, "memory": mem},
            "usage": {"cpu": 0, "memory": 0},
            "replicas": 1,
        }
        for n, cpu_, mem in ((1, "16", "64Gi"), (2, "8", "32Gi"))
    ]
    name = "cpu-stress" if cpu else "mem-stress"
    workload = {"name": name, "kind": "Deployment", "requests": requests, "usage": usage}
    events = [{"at": f"{k}m", "workload": name, "replicas": k} for k in range(1, replicas + 1)]
    return _doc(
        "seed-cpu" if cpu else "seed",
        f"the seed experiment: a {what} service scaled up one replica a minute on three nodes whose real load "
        "requests do not show (node-03 busiest, fewest requests)",
        {"duration": "30m", "step": "15s", "nodes": nodes, "workloads": [*others, workload], "events": events},
    )


def _hotspot() -> dict[str, Any]:
    """Twelve replicas spread over four calm nodes; at 15m something outside Kubernetes (a backup, a noisy
    neighbour) takes 40 % of node-1's CPU for half an hour: node-1 is over the threshold with its pods, which
    only the descheduler can move."""
    return _doc(
        "hotspot",
        "one node turns hot under its pods (a noisy neighbour from 15m to 45m): the scheduler alone cannot "
        "cool it, the descheduler moves pods off",
        {
            "duration": "1h",
            "step": "15s",
            "nodes": [{"name": "node", "count": 4, "cpu": 16, "memory": "64Gi", "base": {"cpu": 0.15, "memory": 0.2}}],
            "workloads": [
                {
                    "name": "web",
                    "requests": {"cpu": "2", "memory": "4Gi"},
                    "usage": {"cpu": 1.2, "memory": "2Gi"},
                    "replicas": 12,
                }
            ],
            "events": [
                {"at": "15m", "node": "node-1", "base": {"cpu": 0.55}},
                {"at": "45m", "node": "node-1", "base": {"cpu": 0.15}},
            ],
        },
    )


def generate(seed: int, *, nodes: int = 8, services: int = 6, jobs: int = 3, hours: float = 3.0) -> dict[str, Any]:
    """A random trace from ``seed`` (the same seed, the same trace): ``nodes`` nodes of 16 or 32 cores with
    uneven base load; ``services`` Deployments scaled up and down at random (about every 20 minutes each), their
    usage drifting (a random walk every 10 minutes, between 20 % and 150 % of the request); ``jobs`` Job
    workloads whose pods arrive in bursts (about every 15 minutes) and end after 10 to 40 minutes; and noisy
    neighbours (about every 30 minutes a node's base CPU changes)."""
    rng = random.Random(seed)
    duration = hours * 3600
    node_docs = []
    for i in range(nodes):
        cores = rng.choice((16, 32))
        base = {"cpu": round(rng.uniform(0.05, 0.3), 2), "memory": round(rng.uniform(0.1, 0.3), 2)}
        node_docs.append({"name": f"node-{i + 1:02d}", "cpu": cores, "memory": f"{cores * 4}Gi", "base": base})
    workloads: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []

    def at(seconds: float) -> str:
        return f"{int(seconds)}s"

    for k in range(services):
        name = f"svc-{k + 1}"
        cpu = rng.choice((0.5, 1, 2, 4))
        memory = cpu * rng.choice((2, 4))
        ratio = rng.uniform(0.3, 1.0)
        workloads.append(
            {
                "name": name,
                "requests": {"cpu": f"{int(cpu * 1000)}m", "memory": f"{int(memory * 1024)}Mi"},
                "usage": {"cpu": round(cpu * ratio, 3), "memory": f"{int(memory * 1024 * rng.uniform(0.4, 0.9))}Mi"},
                "replicas": rng.randint(1, 4),
            }
        )
        t = rng.expovariate(1 / 1200)
        while t < duration:
            events.append({"at": at(t), "workload": name, "replicas": rng.randint(1, 8)})
            t += rng.expovariate(1 / 1200)
        t = 600.0
        while t < duration:
            ratio = min(1.5, max(0.2, ratio * rng.uniform(0.8, 1.25)))
            events.append({"at": at(t), "workload": name, "usage": {"cpu": round(cpu * ratio, 3)}})
            t += 600
    for k in range(jobs):
        name = f"job-{k + 1}"
        cpu = rng.choice((1, 2, 4))
        workloads.append(
            {
                "name": name,
                "kind": "Job",
                "requests": {"cpu": str(cpu), "memory": f"{cpu * 2}Gi"},
                "usage": {"cpu": round(cpu * rng.uniform(0.6, 1.2), 3), "memory": f"{cpu}Gi"},
                "lifetime": f"{rng.randint(10, 40)}m",
            }
        )
        t = rng.expovariate(1 / 900)
        while t < duration:
            events.append({"at": at(t), "workload": name, "create": rng.randint(1, 4)})
            t += rng.expovariate(1 / 900)
    t = rng.expovariate(1 / 1800)
    while t < duration:
        node = rng.choice(node_docs)["name"]
        events.append({"at": at(t), "node": node, "base": {"cpu": round(rng.uniform(0.05, 0.55), 2)}})
        t += rng.expovariate(1 / 1800)
    events.sort(key=lambda e: int(e["at"][:-1]))
    return _doc(
        "random",
        f"generated from seed {seed}: {nodes} nodes, {services} services scaled at random with drifting usage, "
        f"{jobs} Job workloads arriving in bursts, noisy neighbours",
        {
            "duration": f"{int(hours * 60)}m",
            "step": "15s",
            "nodes": node_docs,
            "workloads": workloads,
            "events": events,
        },
    )
