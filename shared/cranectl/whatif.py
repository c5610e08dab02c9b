"""``cranectl simulate``: where would these manifests' pods go, and what would the nodes' load become?

Input: a snapshot (``cranectl snapshot``) or the live cluster read once (nothing is written to it), and manifests.
Workloads are expanded as their controllers would: a Deployment's or ReplicaSet's ``replicas``, a StatefulSet's
(``<name>-<ordinal>``), a Job's ``parallelism`` (at most its ``completions``), plain Pods; PodGroups are taken as
objects; a pod's claims from a ResourceClaimTemplate (the manifests' or the snapshot's) are made as the
resourceclaim controller makes them. Any other kind is refused naming it (and so are the fields not simulated: a
StatefulSet's ``volumeClaimTemplates``). A pod's priority is its ``priorityClassName``'s (the snapshot's
PriorityClasses, as admission resolves it). The pods are placed one after another, higher priority first, then in
manifest order (as the scheduler's queue takes pods that arrive together), by crane-scheduler itself
(``crane_scheduler.simulate.Simulator``: the same plugins, profile and Dynamic policy, the load annotations read at
the snapshot's time), each seeing those placed before it. A PodGroup's members are decided together when its first
member's turn comes, as the scheduler's gang cycle decides them (``Simulator.schedule_gang``), and kept only when
with the members placed already they meet ``minMember`` (no gang is placed in part); else they are reported pending
with that reason and the room they held is given back before the next pod is placed.

The answer: per pod its node, or pending with the scheduler's reason (kube's FitError message, with preemption's
part: DefaultPreemption is dry-run, nothing is evicted, and a pod that would preempt is reported pending with the
node it would be nominated to and the victims there); per node the CPU
and memory requested before and after, and the load the Dynamic policy estimates (the annotated usage plus its
estimate of each pod placed) before and after, against the policy's thresholds. ``--compare`` runs a second
policy or scheduler configuration on the same input. Rendering (table, JSON, PNG, HTML) is pure and tested
without a cluster.
"""

from __future__ import annotations

import base64
import copy
import html
import io
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from crane_scheduler.simulate import ConfigError, GangPlacement, Placement, Simulator, parse_pod
from crane_shared.policy import DynamicSchedulerPolicy, PolicyError, default_policy, parse_policy

WORKLOAD_KINDS = ("Deployment", "ReplicaSet", "StatefulSet", "Job", "Pod", "PodGroup", "ResourceClaimTemplate")
CLAIM_TEMPLATE = "ResourceClaimTemplate"
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
"""the annotation the resourceclaim controller puts on a claim it made from a template: the pod's claim entry"""
GI = 1024**3


class ManifestError(ValueError):
    """A manifest the simulation cannot take: the message names the object and the field."""


@dataclass
class Workload:
    """Manifests expanded: the pods to place (in order) and the objects they need (owners, PodGroups)."""

    pods: list[dict[str, Any]] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    """ResourceClaimTemplates: the claims of the pods naming them are made from them (``claims_from_templates``)"""


# ------------------------------------------------------------------------------------------ manifests


def read_manifests(paths: Sequence[str]) -> list[dict[str, Any]]:
    """Every document of every file (``-``: stdin), a ``List``'s items flattened; ``ManifestError`` naming the
    file for unreadable ones."""
    docs: list[dict[str, Any]] = []
    for path in paths:
        try:
            text = sys.stdin.read() if path == "-" else Path(path).read_text()
            loaded = list(yaml.safe_load_all(text))
        except OSError as err:
            raise ManifestError(f"{path}: {err.strerror}") from err
        except yaml.YAMLError as err:
            raise ManifestError(f"{path}: not YAML: {err}") from err
        for doc in loaded:
            if doc is None:
                continue
            if not isinstance(doc, dict):
                raise ManifestError(f"{path}: a document is not a mapping")
            docs.extend(doc.get("items") or [] if doc.get("kind") == "List" else [doc])
    return docs


def _name(doc: Mapping[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    return f"{doc.get('kind')} {meta.get('namespace') or 'default'}/{meta.get('name')}"


def _owner(kind: str, api_version: str, ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": f"simulated-{kind.lower()}-{ns}-{name}",
        "controller": True,
    }


def _pod_of(
    template: Mapping[str, Any], ns: str, name: str, owner: dict[str, Any], labels: Mapping[str, str]
) -> dict[str, Any]:
    meta = template.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {**(meta.get("labels") or {}), **labels},
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [owner],
        },
        "spec": copy.deepcopy(template.get("spec") or {}),
        "status": {"phase": "Pending"},
    }


def _count(doc: Mapping[str, Any], field_: str, default: int = 1) -> int:
    value = (doc.get("spec") or {}).get(field_, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ManifestError(f"{_name(doc)}: spec.{field_} must be a non-negative integer, not {value!r}")
    return value


def expand(docs: Iterable[Mapping[str, Any]]) -> Workload:
    """Pods as the workloads' controllers would create them, and the objects they refer to."""
    out = Workload()
    for doc in docs:
        kind = doc.get("kind")
        meta = doc.get("metadata") or {}
        name, ns = meta.get("name"), meta.get("namespace") or "default"
        if not name:
            raise ManifestError(f"a {kind or 'document'} without metadata.name")
        if not isinstance(name, str) or not isinstance(ns, str):
            raise ManifestError(f"{_name(doc)}: metadata.name and metadata.namespace must be strings")
        spec = doc.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise ManifestError(f"{_name(doc)}: spec must be a mapping")
        if kind == "Pod":
            _check_pod_spec(_name(doc), "spec", spec)
            pod = copy.deepcopy(dict(doc))
            pod["metadata"] = {**pod.get("metadata", {}), "namespace": ns}
            pod["status"] = {"phase": "Pending"}
            out.pods.append(pod)
        elif kind == "PodGroup":
            out.objects.append({**copy.deepcopy(dict(doc)), "metadata": {**meta, "namespace": ns}})
        elif kind == CLAIM_TEMPLATE:
            out.templates.append({**copy.deepcopy(dict(doc)), "metadata": {**meta, "namespace": ns}})
        elif kind in ("Deployment", "ReplicaSet", "StatefulSet", "Job"):
            template = spec.get("template")
            if not isinstance(template, dict):
                raise ManifestError(f"{_name(doc)}: spec.template is missing")
            _check_pod_spec(_name(doc), "spec.template.spec", template.get("spec") or {})
            labels = (template.get("metadata") or {}).get("labels") or {}
            if not isinstance(labels, Mapping):
                raise ManifestError(f"{_name(doc)}: spec.template.metadata.labels must be a mapping")
            out.pods.extend(_replicas(doc, str(kind), ns, str(name), template, out.objects))
        else:
            raise ManifestError(
                f"{_name(doc)}: kind {kind!r} is not simulated (these are: {', '.join(WORKLOAD_KINDS)})"
            )
    return out


def _check_pod_spec(name: str, path: str, spec: Any) -> None:
    """What admission would add to the pod and the simulation cannot: a RuntimeClass's overhead."""
    if not isinstance(spec, Mapping):
        raise ManifestError(f"{name}: {path} must be a mapping")
    if spec.get("runtimeClassName") and spec.get("overhead") is None:
        raise ManifestError(
            f"{name}: {path}.runtimeClassName is not simulated (admission adds its RuntimeClass's overhead, which "
            f"a snapshot does not hold): give {path}.overhead"
        )


def _replicas(
    doc: Mapping[str, Any], kind: str, ns: str, name: str, template: Mapping[str, Any], objects: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    spec = doc.get("spec") or {}
    selector = spec.get("selector")
    if kind == "Job":
        count = _count(doc, "parallelism")
        completions = spec.get("completions")
        if completions is not None:
            count = min(count, _count(doc, "completions"))
        owner = _owner("Job", "batch/v1", ns, name)
        labels = {"batch.kubernetes.io/job-name": name, "job-name": name}
        return [_pod_of(template, ns, f"{name}-{i}", owner, labels) for i in range(count)]
    count = _count(doc, "replicas")
    if kind == "StatefulSet":
        if spec.get("volumeClaimTemplates"):
            raise ManifestError(f"{_name(doc)}: spec.volumeClaimTemplates is not simulated (its claims do not exist)")
        owner = _owner("StatefulSet", "apps/v1", ns, name)
        objects.append({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": _meta(owner, ns), "spec": spec})
        return [
            _pod_of(template, ns, f"{name}-{i}", owner, {"statefulset.kubernetes.io/pod-name": f"{name}-{i}"})
            for i in range(count)
        ]
    rs = name if kind == "ReplicaSet" else f"{name}-simulated"  # a Deployment's pods belong to its ReplicaSet
    owner = _owner("ReplicaSet", "apps/v1", ns, rs)
    objects.append(
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": _meta(owner, ns), "spec": {"selector": selector}}
    )
    return [_pod_of(template, ns, f"{rs}-{i}", owner, {}) for i in range(count)]


def _meta(owner: Mapping[str, Any], ns: str) -> dict[str, Any]:
    return {"name": owner["name"], "namespace": ns, "uid": owner["uid"]}


# ------------------------------------------------------------------------------------------ policies


@dataclass(frozen=True)
class Setup:
    """One side of a run: a label, the scheduler configuration (None: the default profile) and the policy."""

    label: str
    config: Mapping[str, Any] | None
    policy: DynamicSchedulerPolicy


def setup_of(doc: Mapping[str, Any] | None, base: Setup, label: str) -> Setup:
    """``--compare``'s file: a DynamicSchedulerPolicy replaces the policy, a KubeSchedulerConfiguration the
    configuration."""
    if doc is None:
        return base
    kind = doc.get("kind")
    if kind == "DynamicSchedulerPolicy":
        try:
            return Setup(label, base.config, parse_policy(yaml.safe_dump(dict(doc)), label))
        except PolicyError as err:
            raise ManifestError(str(err)) from err
    if kind == "KubeSchedulerConfiguration":
        return Setup(label, doc, base.policy)
    raise ManifestError(f"{label}: kind {kind!r}: a DynamicSchedulerPolicy or a KubeSchedulerConfiguration expected")


def base_setup(snapshot: Mapping[str, Any], label: str = "as is") -> Setup:
    policy_doc = snapshot.get("policy")
    try:
        policy = parse_policy(yaml.safe_dump(policy_doc), "snapshot policy") if policy_doc else default_policy()
    except PolicyError as err:
        raise ManifestError(str(err)) from err
    return Setup(label, snapshot.get("schedulerConfig"), policy)


# ------------------------------------------------------------------------------------------ the run


@dataclass(frozen=True)
class PodResult:
    pod: str
    node: str | None
    reason: str
    feasible: list[str] | None = None
    """the nodes that passed every Filter for it (asked for: ``run(feasible=True)``, ``--feasible``)"""
    preemption: dict[str, Any] | None = None
    """pending and preemption would make room: ``node`` (where it would be nominated) and ``victims`` (the pods it
    would evict there, ``namespace/name``); nothing is evicted in the simulation"""


@dataclass(frozen=True)
class NodeResult:
    node: str
    cpu: tuple[float, float]
    """cores requested before, after"""
    memory: tuple[float, float]
    """bytes requested before, after"""
    cpu_allocatable: float
    memory_allocatable: float
    load: dict[str, tuple[float | None, float | None]]
    """metric -> the estimated usage (a fraction of the node) before, after; None: no fresh annotation"""


@dataclass(frozen=True)
class Outcome:
    label: str
    pods: list[PodResult]
    nodes: list[NodeResult]
    thresholds: dict[str, float]
    stand_in: dict[str, list[str]] = field(default_factory=dict)
    """schedulerName -> the pods naming it though no profile serves it: decided with the first profile,
    ``stand_in_profile`` (the live scheduler would leave them to that scheduler)"""
    stand_in_profile: str = ""

    @property
    def placed(self) -> int:
        return sum(1 for p in self.pods if p.node is not None)


def _usage(load: Mapping[str, Any] | None) -> dict[str, float | None]:
    if load is None:
        return {}
    return {m: v.get("usage") for m, v in (load.get("metrics") or {}).items()}


def run(
    snapshot: Mapping[str, Any],
    workload: Workload,
    setup: Setup,
    phases: dict[str, float] | None = None,
    *,
    feasible: bool = False,
) -> Outcome:
    """Place ``workload``'s pods on the snapshot with ``setup`` (see the module's docstring); ``phases``: the
    seconds spent loading the snapshot (``load``) and placing the pods (``place``) go there; ``feasible``: each
    pod's feasible nodes kept (as the search found them: all of them below 100 nodes, kube's sampling above)."""
    phases = {} if phases is None else phases
    started = time.perf_counter()
    taken = datetime.fromisoformat(str(snapshot["takenAt"])).timestamp()
    try:
        sim = Simulator(setup.config, dynamic=setup.policy, clock=lambda: taken)
    except ConfigError as err:
        raise ManifestError(f"{setup.label}: scheduler configuration: {err}") from err
    classes = [o for o in snapshot["objects"] if o.get("kind") == "PriorityClass"]
    templates = [o for o in snapshot["objects"] if o.get("kind") == CLAIM_TEMPLATE] + workload.templates
    loaded = (o for o in snapshot["objects"] if o.get("kind") not in ("PriorityClass", CLAIM_TEMPLATE))
    pods, claims = claims_from_templates(workload.pods, templates)
    try:
        sim.load([*loaded, *workload.objects, *claims])
    except ValueError as err:
        raise ManifestError(f"snapshot: {err}") from err
    pods = queue_order(with_priority(pods, classes))
    for pod in pods:  # what the scheduler cannot read is refused naming the pod, not met mid-run
        try:
            parse_pod(pod)
        except (ValueError, TypeError, AttributeError, KeyError) as err:
            raise ManifestError(f"pod {_key(pod)}: {err}") from err
    names = list(sim.table.names)
    before = {n: (sim.requested(n), _usage(sim.node_load(n))) for n in names}
    phases["load"] = time.perf_counter() - started
    started = time.perf_counter()
    results: dict[str, PodResult] = {}
    order = [_key(pod) for pod in pods]
    if len(set(order)) < len(order):
        raise ManifestError(f"pod {next(k for k in order if order.count(k) > 1)}: given twice")
    gangs: dict[str, list[dict[str, Any]]] = {}  # group -> its pending members, in queue order
    for pod in pods:
        if not (pod.get("spec") or {}).get("nodeName") and (gang := sim.gang_of(pod)) is not None:
            gangs.setdefault(gang, []).append(pod)
    for pod in pods:
        key = _key(pod)
        if key in results:  # a gang's member, decided with the group
            continue
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound and bound not in sim.table.rows:  # no kubelet to run it: it stays Pending
            results[key] = PodResult(key, None, f"spec.nodeName: node {bound!r} is not in the snapshot")
        elif bound:  # placed by hand: accounted where it says
            sim.add({**pod, "status": {"phase": "Running"}})
            results[key] = PodResult(key, str(bound), "spec.nodeName")
        elif (gang := sim.gang_of(pod)) is not None:  # the group decided now, whole or not at all
            results |= _gang(sim.schedule_gang(gangs[gang]), feasible)
        else:
            results[key] = _result(key, sim.schedule(pod), feasible)
    phases["place"] = time.perf_counter() - started
    thresholds = {p.name: p.max_limit_percent for p in setup.policy.predicate}
    nodes = []
    for n in names:
        requested, load = before[n]
        after = sim.requested(n)
        load_after = load if after == requested else _usage(sim.node_load(n))  # Dynamic adds only placed pods
        alloc = sim.allocatable(n)
        nodes.append(
            NodeResult(
                n,
                (requested.get("cpu", 0) / 1000, after.get("cpu", 0) / 1000),
                (float(requested.get("memory", 0)), float(after.get("memory", 0))),
                alloc.get("cpu", 0) / 1000,
                float(alloc.get("memory", 0)),
                {m: (load.get(m), load_after.get(m)) for m in sorted(set(load) | set(load_after))},
            )
        )
    stand_in: dict[str, list[str]] = {}
    for pod in pods:
        named = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
        if named not in sim.profiles and not (pod.get("spec") or {}).get("nodeName"):
            stand_in.setdefault(str(named), []).append(_key(pod))
    first = next(iter(sim.profiles))
    return Outcome(setup.label, [results[k] for k in order], nodes, thresholds, stand_in, first if stand_in else "")


def claims_from_templates(
    pods: Sequence[dict[str, Any]], templates: Sequence[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What the resourceclaim controller does for a new pod whose ``spec.resourceClaims`` name a template: a claim
    made from the template's ``spec`` (its labels and annotations too), owned by the pod, and the pod's
    ``status.resourceClaimStatuses`` naming it. Returns the pods (those changed copied) and the claims; a template
    neither the snapshot nor the manifests have is refused naming the pod's field."""
    by_key = {
        f"{(t.get('metadata') or {}).get('namespace')}/{(t.get('metadata') or {}).get('name')}": t for t in templates
    }
    out_pods: list[dict[str, Any]] = []
    claims: list[dict[str, Any]] = []
    for pod in pods:
        entries = (pod.get("spec") or {}).get("resourceClaims") or ()
        if not any(isinstance(e, Mapping) and e.get("resourceClaimTemplateName") for e in entries):
            out_pods.append(pod)
            continue
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        uid = meta.get("uid") or f"{ns}/{name}"  # the simulator's uid for a manifest's pod
        statuses = []
        for i, entry in enumerate(entries):
            template_name = entry.get("resourceClaimTemplateName") if isinstance(entry, Mapping) else None
            if not template_name:
                continue
            template = by_key.get(f"{ns}/{template_name}")
            if template is None:
                raise ManifestError(
                    f"pod {ns}/{name}: spec.resourceClaims[{i}].resourceClaimTemplateName {template_name!r}: no such "
                    f"ResourceClaimTemplate in namespace {ns} (in the snapshot or the manifests)"
                )
            body = template.get("spec") or {}
            tmeta = body.get("metadata") or {}
            claim_name = f"{name}-{entry.get('name')}-simulated"
            claims.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {
                        "name": claim_name,
                        "namespace": ns,
                        "uid": f"simulated-claim-{ns}-{claim_name}",
                        "labels": dict(tmeta.get("labels") or {}),
                        "annotations": {**(tmeta.get("annotations") or {}), POD_CLAIM_NAME: str(entry.get("name"))},
                        "ownerReferences": [
                            {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": True}
                        ],
                    },
                    "spec": copy.deepcopy(body.get("spec") or {}),
                }
            )
            statuses.append({"name": entry.get("name"), "resourceClaimName": claim_name})
        status = {**(pod.get("status") or {}), "resourceClaimStatuses": statuses}
        out_pods.append({**pod, "metadata": {**meta, "uid": uid}, "status": status})
    return out_pods, claims


def with_priority(pods: Sequence[dict[str, Any]], classes: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each pod's ``spec.priority`` and ``spec.preemptionPolicy`` as the Priority admission plugin sets them: its
    ``priorityClassName``'s value and policy, else the global default class's, else 0 and
    ``PreemptLowerPriority`` (a priority the manifest gives is kept, and so is its policy); an unknown class is
    refused."""
    by_name = {str((c.get("metadata") or {}).get("name")): c for c in classes}
    default = next((c for c in classes if c.get("globalDefault")), None)
    out = []
    for pod in pods:
        spec = pod.get("spec") or {}
        if spec.get("priority") is not None:
            if not isinstance(spec["priority"], int) or isinstance(spec["priority"], bool):
                raise ManifestError(f"pod {_key(pod)}: spec.priority must be an integer, not {spec['priority']!r}")
            out.append(pod)
            continue
        name = spec.get("priorityClassName")
        if name and name not in by_name:
            meta = pod.get("metadata") or {}
            raise ManifestError(
                f"pod {meta.get('namespace')}/{meta.get('name')}: spec.priorityClassName {name!r}: no such "
                "PriorityClass in the snapshot"
            )
        found = by_name[name] if name else default
        priority = int(found.get("value") or 0) if found is not None else 0
        policy = (found or {}).get("preemptionPolicy") or "PreemptLowerPriority"
        out.append({**pod, "spec": {"preemptionPolicy": policy, **spec, "priority": priority}})
    return out


def queue_order(pods: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The order the scheduler's queue takes pods that arrive together: higher priority first, then as given."""
    return sorted(pods, key=lambda p: -int((p.get("spec") or {}).get("priority") or 0))


def _key(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def _result(key: str, placement: Placement, feasible: bool, reason: str | None = None) -> PodResult:
    found = list(placement.feasible) if feasible else None
    would = placement.preemption
    preempts = {"node": would.node, "victims": list(would.victims)} if would and would.possible else None
    return PodResult(key, placement.node, placement.message if reason is None else reason, found, preempts)


def _gang(cycle: GangPlacement, feasible: bool) -> dict[str, PodResult]:
    """A gang cycle's members: where they go when the group's quorum was met; else all pending, saying how many
    found a node (and, for one that did not, its own reason), as nothing of the group is kept."""
    out: dict[str, PodResult] = {}
    if cycle.kept:
        for placement in cycle.placements:
            out[placement.pod.key] = _result(placement.pod.key, placement, feasible)
    else:
        text = (
            f"gang {cycle.gang}: {cycle.placed_before + cycle.found} of minMember {cycle.quorum} members found a node"
        )
        for placement in cycle.placements:
            why = f"{text}; {placement.message}" if placement.node is None else text
            out[placement.pod.key] = replace(_result(placement.pod.key, placement, feasible, why), node=None)
    for pod in cycle.untried:
        out[pod.key] = PodResult(
            pod.key, None, f"gang {cycle.gang}: not decided once minMember {cycle.quorum} was out of reach"
        )
    return out


# ------------------------------------------------------------------------------------------ rendering


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _arrow(before: float | None, after: float | None, threshold: float | None = None) -> str:
    mark = "!" if threshold is not None and after is not None and after > threshold else ""
    if before == after:
        return _fraction(after) + mark
    return f"{_fraction(before)}->{_fraction(after)}{mark}"


def shown_metrics(outcomes: Sequence[Outcome]) -> list[str]:
    """The policies' Filter metrics (those with a threshold), in policy order, the first run's first."""
    return list(dict.fromkeys(m for o in outcomes for m in o.thresholds))


def _threshold(outcome: Outcome, metric: str) -> str:
    found = outcome.thresholds.get(metric)
    return "no threshold" if found is None else f"{found:g}"


def table(outcomes: Sequence[Outcome], limit: int | None = None) -> str:
    """Pods (node or pending and why; one column per run), then nodes (requests and load before -> after)."""
    first = outcomes[0]
    rows = [["POD", *(o.label.upper() if len(outcomes) > 1 else "NODE" for o in outcomes)]]
    reasons: list[str] = []
    for i, pod in enumerate(first.pods):
        cells = []
        for o in outcomes:
            r = o.pods[i]
            if r.node is not None:
                cells.append(r.node)
            else:
                cells.append("pending")
                reasons.append(f"  {pod.pod}{' (' + o.label + ')' if len(outcomes) > 1 else ''}: {r.reason}")
                if r.preemption is not None:
                    victims = ", ".join(r.preemption["victims"])
                    reasons.append(f"    would preempt on {r.preemption['node']}: {victims}")
        rows.append([pod.pod, *cells])
    lines = columns(rows)
    if reasons:
        lines.append("pending:")
        lines += reasons
    metrics = shown_metrics(outcomes)
    header = ["NODE"]
    for o in outcomes:
        run = ["CPU REQ", "MEM REQ", *(f"{m} ({_threshold(o, m)})" for m in metrics)]
        header += [f"{o.label}: {col}" for col in run] if len(outcomes) > 1 else run
    node_rows = [header]
    changed = [i for i, n in enumerate(first.nodes) if any(o.nodes[i] != _unchanged(o.nodes[i]) for o in outcomes)]
    shown = changed if limit is not None and len(first.nodes) > limit else list(range(len(first.nodes)))
    for i in shown[: limit if limit is not None else None]:
        cells = [first.nodes[i].node]
        for o in outcomes:
            n = o.nodes[i]
            cells.append(f"{_arrow(*n.cpu, n.cpu_allocatable)}/{n.cpu_allocatable:g}")
            cells.append(f"{_arrow(n.memory[0] / GI, n.memory[1] / GI)}/{n.memory_allocatable / GI:.0f}Gi")
            cells += [_arrow(*n.load.get(m, (None, None)), o.thresholds.get(m)) for m in metrics]
        node_rows.append(cells)
    lines.append("")
    lines += columns(node_rows)
    if len(shown) < len(first.nodes):
        lines.append(
            f"({len(shown[:limit])} of {len(first.nodes)} nodes shown: {len(changed)} changed, the first {limit} "
            "of them in the snapshot's order; -o json has every node)"
        )
    for o in outcomes:
        lines.append(f"{o.label}: {o.placed}/{len(o.pods)} pods placed, {len(o.pods) - o.placed} pending")
        for named, keys in o.stand_in.items():
            lines.append(
                f"{o.label}: {len(keys)} pods name schedulerName {named!r}, which no profile serves: decided with "
                f"profile {o.stand_in_profile!r} as if they named it"
            )
    lines.append(
        "(load: the Dynamic policy's estimate, a fraction of the node: the annotated usage plus the pods placed; "
        "! above the threshold)"
    )
    return "\n".join(lines)


def _unchanged(n: NodeResult) -> NodeResult:
    return NodeResult(
        n.node,
        (n.cpu[0], n.cpu[0]),
        (n.memory[0], n.memory[0]),
        n.cpu_allocatable,
        n.memory_allocatable,
        {m: (b, b) for m, (b, _) in n.load.items()},
    )


def columns(rows: list[list[str]]) -> list[str]:
    """Rows as left-aligned columns, two spaces apart (trailing blanks cut)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def as_json(outcomes: Sequence[Outcome], snapshot: Mapping[str, Any]) -> str:
    return json.dumps(
        {"takenAt": snapshot.get("takenAt"), "runs": [asdict(o) | {"placed": o.placed} for o in outcomes]}, indent=1
    )


def plot_png(outcomes: Sequence[Outcome], limit: int = 40) -> bytes:
    """Per node, per Filter metric, the estimated load before (solid) and added by the placed pods (hatched),
    stacked, with the threshold drawn; one column of charts per run. The ``limit`` nodes that changed most."""
    plt = pyplot()
    metrics = shown_metrics(outcomes)
    rows = max(1, len(metrics))

    def growth(i: int) -> float:
        return (
            max(
                (o.nodes[i].load.get(m, (0, 0))[1] or 0) - (o.nodes[i].load.get(m, (0, 0))[0] or 0)
                for o in outcomes
                for m in metrics or [""]
            )
            + max(o.nodes[i].cpu[1] - o.nodes[i].cpu[0] for o in outcomes) * 1e-6
        )

    order = sorted(range(len(outcomes[0].nodes)), key=lambda i: (-growth(i), outcomes[0].nodes[i].node))[:limit]
    order.sort(key=lambda i: outcomes[0].nodes[i].node)
    width = max(6.0, 0.3 * len(order) + 2)
    fig, axes = plt.subplots(rows, len(outcomes), figsize=(width * len(outcomes), 3.2 * rows), squeeze=False)
    names = [outcomes[0].nodes[i].node for i in order]
    for col, o in enumerate(outcomes):
        for row, m in enumerate(metrics):
            ax = axes[row][col]
            base = [o.nodes[i].load.get(m, (None, None))[0] or 0.0 for i in order]
            after = [o.nodes[i].load.get(m, (None, None))[1] or 0.0 for i in order]
            added = [max(0.0, a - b) for a, b in zip(after, base, strict=True)]
            x = list(range(len(order)))
            ax.bar(x, base, color="#7f9fbf", label="before")
            ax.bar(x, added, bottom=base, color="#f0a040", hatch="//", label="added by the placed pods")
            limit_line = o.thresholds.get(m)
            if limit_line is not None:
                ax.axhline(limit_line, color="red", linestyle="--", linewidth=1, label=f"threshold {limit_line:g}")
            ax.set_ylim(0, max(1.0, *after, limit_line or 0) * 1.05)
            ax.set_title(f"{o.label}: {m}, threshold {_threshold(o, m)} ({o.placed}/{len(o.pods)} placed)", fontsize=9)
            ax.set_xticks(x, names, rotation=60, ha="right", fontsize=7)
            ax.set_ylabel("fraction of node")
            if row == 0 and col == 0:
                ax.legend(fontsize=7, loc="upper right")
    return png_of(fig)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display); a clear error when the ``plot`` extra is missing."""
    try:
        import matplotlib
    except ImportError as err:
        raise ManifestError("plots need matplotlib: pip install 'crane-scheduler-py[plot]'") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_of(fig: Any) -> bytes:
    """A figure laid out, rendered as PNG bytes and closed."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    pyplot().close(fig)
    return buf.getvalue()


def page(title: str, alt: str, png: bytes, text: str) -> str:
    """One self-contained page: a title, the plot embedded, and the text below it."""
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>\n"
        f"<pre>{html.escape(text)}</pre>\n</body></html>\n"
    )


def html_page(outcomes: Sequence[Outcome], png: bytes, text: str) -> str:
    """One self-contained page: the plot (embedded) and the table."""
    title = "cranectl simulate" + (f": {' vs '.join(o.label for o in outcomes)}" if len(outcomes) > 1 else "")
    return page(title, "load per node before and after", png, text)
