"""The scheduler-extender wire format (``k8s.io/kube-scheduler/extender/v1``) around the Dynamic policy, pure.

kube-scheduler POSTs ``ExtenderArgs {Pod, Nodes, NodeNames}`` (Go field names) to ``<urlPrefix>/<verb>``:
``Nodes`` is a ``v1.NodeList`` when the extender is not ``nodeCacheCapable``, else only ``NodeNames`` are sent
and node data must come from our own cache. Filter answers ``ExtenderFilterResult {Nodes | NodeNames,
FailedNodes, FailedAndUnresolvableNodes, Error}``; prioritize answers ``[{Host, Score}]`` with Score 0..10.

Rules kube-scheduler imposes (pkg/scheduler/extender.go, schedule_one.go) and this module keeps:
- the returned nodes are a subset of the input, in input order; in Nodes mode the node objects are echoed back
  unchanged (kube-scheduler rebuilds its NodeInfo from them); in NodeNames mode a null ``NodeNames`` would
  filter out every node, so it is always a list;
- ``Error`` makes the scheduler skip the extender when ``ignorable: true`` (fail open) and fail the cycle
  otherwise; prioritize has no error field and its errors are always ignored, so a bad prioritize request gets
  an empty list ("no opinion": every node gets the same 0);
- ``FailedNodes`` are Unschedulable (preemption may help), ``FailedAndUnresolvableNodes`` are not.

The decisions are ``crane_shared.loadaware.dynamic`` unchanged: the same annotations, policy, time and recent
bindings give the same verdicts and scores as the in-process plugins (scores scaled from 0..100 to 0..10),
including the two classes: a regular pod is judged by the node's usage less the batch pods' usage, a batch pod
(``crane_shared.batch.is_batch``) by the whole. The incoming pod's estimate is always ``factor x request``: the
extender has no pod informer, so it cannot learn a workload's usage (the scheduler's ``estimate.learned``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from crane_shared.batch import BATCH_METRIC_PREFIX, batch_refusal, is_batch, regular_resources_of_batch_pod
from crane_shared.loadaware.dynamic import (
    BATCH_USAGE_KEYS,
    DynamicArgs,
    EstimateArgs,
    NodeCapacity,
    NodeLoad,
    RecentBinding,
    filter_reason,
    incoming_fraction,
    node_load,
    resource_of,
    score,
)
from crane_shared.loadaware.podsize import PodSize, is_daemonset_pod, pod_size
from crane_shared.podresources import CPU, MEMORY
from crane_shared.quantity import quantity

__all__ = [
    "MAX_EXTENDER_PRIORITY",
    "UNKNOWN_NODE_REASON",
    "Decide",
    "ExtenderArgs",
    "Load",
    "MalformedRequest",
    "NodeView",
    "PodView",
    "Verdict",
    "daemonset_priorities",
    "extender_score",
    "filter_error",
    "filter_nodes",
    "filter_verdicts",
    "node_view",
    "parse_args",
    "pod_view",
    "prioritize_nodes",
    "prioritize_verdicts",
    "verdict",
]

MAX_EXTENDER_PRIORITY = 10
"""extenderv1.MaxExtenderPriority: kube-scheduler multiplies by the extender weight and by 100 / 10."""
UNKNOWN_NODE_REASON = "node(s) unknown to the crane extender's node cache"

Obj = dict[str, Any]


class MalformedRequest(ValueError):
    """The request is not an ``ExtenderArgs``; ``kind`` groups occurrences for the metric and the log."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


@dataclass(frozen=True)
class PodView:
    """What the policy needs of the pod being scheduled: the DaemonSet exemption and its estimated size."""

    uid: str
    namespace: str
    name: str
    daemonset: bool
    cpu: float
    """estimated cores (requests, else limits; the estimate's factor is applied by the policy)"""
    memory: float
    """estimated bytes"""
    batch: bool = False
    """a batch pod (requests ``crane.io/batch-*``): judged by the node's whole usage"""
    refusal: str | None = None
    """why no node is given to it whatever the load (a batch pod that also requests cpu or memory)"""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class NodeView:
    """One candidate node as the policy sees it: its load annotations and allocatable capacity."""

    name: str
    annotations: Mapping[str, str]
    capacity: NodeCapacity | None


@dataclass(frozen=True)
class ExtenderArgs:
    """A decoded request. ``nodes`` are the raw ``v1.NodeList`` items, kept to be echoed back unchanged."""

    pod: PodView
    nodes: tuple[Obj, ...] | None
    node_names: tuple[str, ...] | None

    @property
    def names(self) -> tuple[str, ...]:
        if self.nodes is not None:
            return tuple(_node_name(n) for n in self.nodes)
        return self.node_names or ()


Resolve = Callable[[str], NodeView | None]
"""Cache lookup by node name (NodeNames mode); None for a node the cache does not know."""
Recent = Callable[[str], Sequence[RecentBinding]]
"""Recent bindings to one node, for the hot value and the usage estimate."""
Load = Callable[[str, NodeView | None], NodeLoad]
"""``node_load`` of one node under a ``Decide``'s inputs (the server memoizes it)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """A node's load with what both verbs read of it, derived once per load (the server keeps it per node):
    the Dynamic score, the filter reason without the incoming pod (``base``), and the predicates before ``base``
    that the incoming pod could still push over (``checks``: usage, is it cpu, the node's allocatable of that
    resource, threshold, reason, in policy order; none without a capacity), so a request only adds the pod's
    share to a few cached numbers."""

    load: NodeLoad
    score: int
    base: str | None
    checks: tuple[tuple[float, bool, float, float, str], ...]
    capacity: NodeCapacity | None
    regular: Verdict | None = None
    """the verdict for a regular pod where it differs (the node has fresh batch usage); None: this one"""

    def of(self, pod: PodView) -> Verdict:
        """The verdict of ``pod``'s class."""
        return self.regular if self.regular is not None and not pod.batch else self

    def reason(self, pod: PodView, estimate: EstimateArgs) -> str | None:
        """``filter_reason(load, incoming=incoming_fraction(pod))``, from the cached parts (same arithmetic)."""
        if pod.daemonset:
            return None
        if self.regular is not None and not pod.batch:
            return self.regular.reason(pod, estimate)
        if self.checks and estimate.enabled and estimate.incoming_pod:
            cpu, memory = estimate.cpu_factor * pod.cpu, estimate.memory_factor * pod.memory
            for usage, is_cpu, allocatable, limit, reason in self.checks:
                incoming = (cpu if is_cpu else memory) / allocatable if allocatable > 0 else 0.0
                if usage + incoming > limit:
                    return reason
        return self.base


def verdict(
    load: NodeLoad, args: DynamicArgs, capacity: NodeCapacity | None, regular: NodeLoad | None = None
) -> Verdict:
    """The ``Verdict`` of a load: ``filter_reason``'s loop split at the first pod-independent failure;
    ``regular``: the node's load for a regular pod, kept as ``Verdict.regular`` when it differs."""
    if regular is not None and any(r.batch for r in regular.readings.values()):
        return replace(verdict(load, args, capacity), regular=verdict(regular, args, capacity))
    base = filter_reason(load, args)
    checks: list[tuple[float, bool, float, float, str]] = []
    for predicate in args.policy.predicate:
        if predicate.max_limit_percent == 0:
            continue
        reading = load.readings.get(predicate.name)
        usage = reading.usage if reading else None
        if usage is None:
            if args.stale == "fail-closed":
                break
            continue
        if usage > predicate.max_limit_percent:
            break
        resource = resource_of(predicate.name)
        if resource is not None and capacity is not None:
            reason = f"node(s) would have {predicate.name} above {predicate.max_limit_percent:g}"
            allocatable = capacity.cpu if resource == "cpu" else capacity.memory
            checks.append((usage, resource == "cpu", allocatable, predicate.max_limit_percent, reason))
    return Verdict(load, score(load, args), base, tuple(checks), capacity)


@dataclass(frozen=True)
class Decide:
    """Everything a decision depends on besides the request: policy, clock, node cache, recent bindings.

    ``load`` replaces the direct ``node_load`` call with an equivalent (memoized) one; None computes directly.
    """

    args: DynamicArgs
    now: datetime
    resolve: Resolve = lambda name: None
    recent: Recent = lambda name: ()
    load: Load | None = None
    verdict: Callable[[str, NodeView | None], Verdict] | None = None
    """the server's per-node cache of verdicts (None: derived from ``node_load`` per call)"""

    def verdict_of(self, name: str, view: NodeView | None) -> Verdict:
        if self.verdict is not None:
            return self.verdict(name, view)
        regular = None
        if view is not None and has_batch_usage(view.annotations):
            regular = node_load(
                name, view.annotations, self.args, self.now, self.recent(name), view.capacity, regular=True
            )
        return verdict(self.node_load(name, view), self.args, view.capacity if view is not None else None, regular)

    def node_load(self, name: str, view: NodeView | None) -> NodeLoad:
        if self.load is not None:
            return self.load(name, view)
        if view is None:
            return node_load(name, None, self.args, self.now, self.recent(name))
        return node_load(name, view.annotations, self.args, self.now, self.recent(name), view.capacity)


def has_batch_usage(annotations: Mapping[str, str] | None) -> bool:
    """Whether a node carries a batch annotation, per resource or per metric (only then can a regular pod's load
    differ)."""
    if not annotations:
        return False
    return any(key in annotations for key in BATCH_USAGE_KEYS.values()) or any(
        key.startswith(BATCH_METRIC_PREFIX) for key in annotations
    )


# --- decoding ---------------------------------------------------------------------------------------------------


def parse_args(body: bytes | str | Any) -> ExtenderArgs:
    """Decode an ``ExtenderArgs`` (raw JSON or already decoded); raises only ``MalformedRequest``."""
    if isinstance(body, bytes | str):
        if not body:
            raise MalformedRequest("empty", "empty request body; expected ExtenderArgs JSON")
        try:
            body = json.loads(body)
        except (ValueError, RecursionError) as err:
            raise MalformedRequest("not-json", f"request body is not JSON: {err}") from None
    if not isinstance(body, dict):
        raise MalformedRequest("not-object", f"ExtenderArgs must be a JSON object, got {_kind(body)}")
    pod = body.get("Pod")
    if not isinstance(pod, dict):
        raise MalformedRequest("no-pod", f"ExtenderArgs.Pod must be a v1.Pod object, got {_kind(pod)}")
    nodes = _nodes(body.get("Nodes"))
    names = _node_names(body.get("NodeNames"))
    if nodes is None and names is None:
        raise MalformedRequest("no-nodes", "ExtenderArgs has neither Nodes (a v1.NodeList) nor NodeNames")
    if nodes is not None and names is not None:  # kube-scheduler sends one, by the extender's nodeCacheCapable
        raise MalformedRequest("both-nodes", "ExtenderArgs has both Nodes and NodeNames; one is expected")
    return ExtenderArgs(pod_view(pod), nodes, names)


def _nodes(raw: Any) -> tuple[Obj, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise MalformedRequest("bad-nodes", f"ExtenderArgs.Nodes must be a v1.NodeList object, got {_kind(raw)}")
    items = raw.get("items")
    if items is None:
        return ()
    if not isinstance(items, list):
        raise MalformedRequest("bad-nodes", f"ExtenderArgs.Nodes.items must be a list, got {_kind(items)}")
    for i, item in enumerate(items):
        meta = item.get("metadata") if isinstance(item, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise MalformedRequest("bad-nodes", f"ExtenderArgs.Nodes.items[{i}] has no metadata.name")
    return tuple(items)


def _node_names(raw: Any) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(n, str) and n for n in raw):
        raise MalformedRequest("bad-node-names", "ExtenderArgs.NodeNames must be a list of node names")
    return tuple(raw)


def _node_name(node: Obj) -> str:
    name: str = node["metadata"]["name"]
    return name


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def pod_view(pod: Mapping[str, Any]) -> PodView:
    """The pod's identity, DaemonSet ownership and estimated size, by the rules the in-process plugin uses
    (``crane_shared.loadaware.podsize``)."""
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    spec = pod.get("spec")
    try:
        size = pod_size(spec) if isinstance(spec, dict) else PodSize(0.0, 0.0)
    except (ValueError, TypeError, AttributeError):  # unparseable resources: no estimate, still scheduled
        size = PodSize(0.0, 0.0)
    try:
        batch = is_batch(spec) if isinstance(spec, dict) else False
        refusal = _batch_refusal(spec) if isinstance(spec, dict) else None
    except (ValueError, TypeError, AttributeError) as err:
        raise MalformedRequest("bad-pod", f"ExtenderArgs.Pod.spec: the containers cannot be read: {err}") from None
    return PodView(
        uid=str(meta.get("uid") or ""),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        daemonset=is_daemonset_pod(meta),
        cpu=size.cpu,
        memory=size.memory,
        batch=batch,
        refusal=refusal,
    )


def _batch_refusal(spec: Mapping[str, Any]) -> str | None:
    field = regular_resources_of_batch_pod(spec)
    return batch_refusal(field) if field is not None else None


def refused(req: ExtenderArgs, names: Sequence[str], reason: str) -> Obj:
    """Every node Failed and Unresolvable for ``reason`` (no load would change it)."""
    return {
        "Nodes": {"items": []} if req.nodes is not None else None,
        "NodeNames": [] if req.node_names is not None else None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": dict.fromkeys(names, reason),
        "Error": "",
    }


def node_view(node: Mapping[str, Any]) -> NodeView:
    """A ``v1.Node`` JSON object as the policy sees it; non-string annotation values count as absent."""
    meta = node.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise MalformedRequest("bad-nodes", f"node {meta.get('name')!r}: metadata.annotations is not an object")
    if not all(isinstance(v, str) for v in annotations.values()):
        annotations = {k: v for k, v in annotations.items() if isinstance(v, str)}
    return NodeView(str(meta.get("name") or ""), annotations, _capacity(node))


def _capacity(node: Mapping[str, Any]) -> NodeCapacity | None:
    status = node.get("status")
    allocatable = status.get("allocatable") if isinstance(status, dict) else None
    if not isinstance(allocatable, dict):
        return None
    try:
        cpu, memory = allocatable.get(CPU), allocatable.get(MEMORY)
        if cpu is None or memory is None:
            return None
        return NodeCapacity(cpu=quantity(cpu, milli=True) / 1000, memory=float(quantity(memory)))
    except (ValueError, TypeError):
        return None


# --- decisions ------------------------------------------------------------------------------------------------


def _candidates(req: ExtenderArgs, decide: Decide) -> list[tuple[str, NodeView | None]]:
    """Input nodes in input order with their data: from the request itself when it carries the objects."""
    if req.nodes is not None:
        return [(_node_name(n), node_view(n)) for n in req.nodes]
    return [(name, decide.resolve(name)) for name in req.node_names or ()]


def filter_nodes(req: ExtenderArgs, decide: Decide) -> Obj:
    """``ExtenderFilterResult``: nodes above a predicate's threshold fail with the policy's node-free reason."""
    candidates = _candidates(req, decide)
    if req.pod.refusal is not None:
        return refused(req, [name for name, _ in candidates], req.pod.refusal)
    passed: list[int] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    pod, estimate, verdict_of = req.pod, decide.args.estimate, decide.verdict_of
    for i, (name, view) in enumerate(candidates):
        if view is None:
            unresolvable[name] = UNKNOWN_NODE_REASON
            continue
        # upstream: DaemonSet pods always pass (also filter_reason's rule)
        reason = None if pod.daemonset else verdict_of(name, view).of(pod).reason(pod, estimate)
        if reason is None:
            passed.append(i)
        else:
            failed[name] = reason
    return {
        "Nodes": {"items": [req.nodes[i] for i in passed]} if req.nodes is not None else None,
        "NodeNames": [candidates[i][0] for i in passed] if req.node_names is not None else None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }


def prioritize_nodes(req: ExtenderArgs, decide: Decide) -> list[Obj]:
    """``HostPriorityList`` for every input node, in input order; a node the cache lacks scores as unannotated."""
    if req.pod.daemonset:
        return daemonset_priorities(req)
    verdict_of, pod = decide.verdict_of, req.pod
    return [
        {"Host": name, "Score": extender_score(pod_score(verdict_of(name, view).of(pod), pod, decide.args))}
        for name, view in _candidates(req, decide)
    ]


def pod_score(found: Verdict, pod: PodView, args: DynamicArgs) -> int:
    """The Dynamic score of a node for ``pod`` (``found``: the verdict of its class): the cached one, except with
    the ``pack`` strategy, whose score counts the pod's own estimated usage (``dynamic.pack_score``)."""
    if args.policy.scoring.strategy != "pack":
        return found.score
    incoming = incoming_fraction(args.estimate, pod.cpu, pod.memory, found.capacity) if found.capacity else None
    return score(found.load, args, incoming)


def filter_verdicts(
    req: ExtenderArgs, verdicts: Sequence[Verdict], unknown: Container[str], estimate: EstimateArgs
) -> Obj:
    """``filter_nodes`` in node cache mode from verdicts already looked up; ``unknown``: not in the cache."""
    pod = req.pod
    if pod.refusal is not None:
        return refused(req, list(req.node_names or ()), pod.refusal)
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    # Verdict.reason inlined (the per-node cost of a request): the same arithmetic, incoming_fraction's order.
    incoming = estimate.enabled and estimate.incoming_pod
    cpu, memory = estimate.cpu_factor * pod.cpu, estimate.memory_factor * pod.memory
    for name, found in zip(req.node_names or (), verdicts, strict=True):
        if pod.daemonset:  # placed whatever the node's load, known to the cache or not (a new node's own pods)
            reason = None
        elif unknown and name in unknown:
            unresolvable[name] = UNKNOWN_NODE_REASON
            continue
        else:
            if found.regular is not None and not pod.batch:
                found = found.regular
            reason = found.base
            if incoming and found.checks:
                for usage, is_cpu, allocatable, limit, why in found.checks:
                    if usage + ((cpu if is_cpu else memory) / allocatable if allocatable > 0 else 0.0) > limit:
                        reason = why
                        break
        if reason is None:
            passed.append(name)
        else:
            failed[name] = reason
    return {
        "Nodes": None,
        "NodeNames": passed,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": "",
    }


def prioritize_verdicts(req: ExtenderArgs, verdicts: Sequence[Verdict], args: DynamicArgs) -> list[Obj]:
    """``prioritize_nodes`` in node cache mode from verdicts already looked up."""
    if req.pod.daemonset:
        return daemonset_priorities(req)
    pod = req.pod
    return [
        {"Host": name, "Score": extender_score(pod_score(found.of(pod), pod, args))}
        for name, found in zip(req.node_names or (), verdicts, strict=True)
    ]


def daemonset_priorities(req: ExtenderArgs) -> list[Obj]:
    """A DaemonSet pod skips the Dynamic score as it skips the filter (the plugin's Score gives every node 0): the
    same 0 for every input node, so the extender does not rank the nodes its daemon must run on."""
    return [{"Host": name, "Score": 0} for name in req.names]


def extender_score(dynamic_score: int) -> int:
    """0..100 to 0..10, rounding half up (45 -> 5), so equal Dynamic scores stay equal."""
    return max(0, min(MAX_EXTENDER_PRIORITY, (dynamic_score + 5) // 10))


def filter_error(message: str) -> Obj:
    """A filter answer that makes kube-scheduler skip the extender (``ignorable: true``) or fail the cycle."""
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": message}
