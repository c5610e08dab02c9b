"""NodeResourcesFit and NodeResourcesBalancedAllocation, vectorised over the node table.

Fit filters on *requests* (allocatable - requested, per resource, plus the pod-count limit) and scores with
LeastAllocated (default), MostAllocated or RequestedToCapacityRatio (a broken-line function of utilization).
Scoring counts a container without cpu/memory requests as 100m / 200Mi, on the node and for the pod, so
best-effort pods still spread; the filter never does. The pod is read as kube 1.37 reads it (``podinfo``): Filter
its spec's requests with pod-level ones, Score its containers' spec requests only (kube's Fit does not pass its
scorer the pod-level and resize options), BalancedAllocation its requests with pod-level ones and its status.
BalancedAllocation favours nodes whose cpu and memory fractions the pod brings closer (kube 1.37 scores the
balance's improvement, ``50 + (50 + with - without) / 2``; 1.35 scored the balance after the pod alone), on plain
requests, and skips best-effort pods (kube-scheduler >= 1.32). Integer arithmetic matches kube-scheduler's exactly.

An extended resource a DeviceClass maps (DRAExtendedResource, GA in 1.37) is not checked on a node whose allocatable
does not offer it: DynamicResources allocates devices for it there (kube's ``shouldDelegateResourceToDRA``).

Both keep their results per node row and pod size (``crane_scheduler.rowcache``): a row is recomputed only when
the table says its allocatable or accounted requests changed (``NodeTable.row_versions``: a pod assumed, bound or
removed there, the node updated), so a burst of same-sized pods costs a lookup per decision, not a pass over
every scored row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import IntArray, NodeTable
from crane_scheduler.plugins.dynamicresources.extended import is_extended_name as is_dra_extended
from crane_scheduler.plugins.dynamicresources.extended import resolver as extended_resolver
from crane_scheduler.podinfo import CPU, MEMORY, PODS, NodeInfo, PodInfo, is_scalar_resource
from crane_scheduler.rowcache import FilterCache

STRATEGIES = ("LeastAllocated", "MostAllocated", "RequestedToCapacityRatio")
MAX_CUSTOM_PRIORITY_SCORE = 10  # shape scores are 0..10, scaled by 10 to node scores
DEFAULT_RESOURCES = ((CPU, 1), (MEMORY, 1))


def is_extended_resource(name: str) -> bool:
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def parse_resources(
    raw: Any, path: str, problems: list[tuple[str, str]], *, weight_one: bool = False
) -> tuple[tuple[str, int], ...]:
    if raw is None:
        return DEFAULT_RESOURCES
    if not isinstance(raw, list):
        problems.append((path, "must be a list of {name, weight}"))
        return DEFAULT_RESOURCES
    out: list[tuple[str, int]] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        name = item.get("name") if isinstance(item, dict) else None
        weight = item.get("weight", 1) if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            problems.append((f"{path}[{i}].name", "required"))
            continue
        if name in seen:
            problems.append((f"{path}[{i}].name", f"duplicate resource {name!r}"))
        seen.add(name)
        if weight_one and weight != 1:
            problems.append((f"{path}[{i}].weight", "must be 1"))
        elif not isinstance(weight, int) or isinstance(weight, bool) or not 0 < weight <= 100:
            problems.append((f"{path}[{i}].weight", f"resource weight of {name} not in valid range (0, 100]"))
        out.append((name, weight if isinstance(weight, int) else 1))
    return tuple(out)


def _unknown(args: Mapping[str, Any], known: set[str], prefix: str = "") -> list[tuple[str, str]]:
    return [(f"{prefix}{k}", "unknown field") for k in args if k not in known]


def parse_shape(raw: Any, path: str, problems: list[tuple[str, str]]) -> tuple[tuple[int, int], ...]:
    """``requestedToCapacityRatio.shape`` as kube's ``validateFunctionShape``: at least one point, utilization
    0..100 strictly increasing, score 0..10. Returned scores are scaled to 0..100."""
    if not isinstance(raw, list) or not raw:
        problems.append((path, "at least one point must be specified"))
        return ()
    points: list[tuple[int, int]] = []
    for i, item in enumerate(raw):
        u = item.get("utilization") if isinstance(item, Mapping) else None
        sc = item.get("score") if isinstance(item, Mapping) else None
        if not isinstance(u, int) or isinstance(u, bool) or not 0 <= u <= 100:
            problems.append((f"{path}[{i}].utilization", f"not in valid range [0, 100], got {u!r}"))
            continue
        if not isinstance(sc, int) or isinstance(sc, bool) or not 0 <= sc <= MAX_CUSTOM_PRIORITY_SCORE:
            problems.append((f"{path}[{i}].score", f"not in valid range [0, {MAX_CUSTOM_PRIORITY_SCORE}], got {sc!r}"))
            continue
        points.append((u, sc * (fwk.MAX_NODE_SCORE // MAX_CUSTOM_PRIORITY_SCORE)))
    for i in range(1, len(points)):
        if points[i - 1][0] >= points[i][0]:
            problems.append((f"{path}[{i}].utilization", "values must be sorted in increasing order"))
            break
    return tuple(points)


def _trunc_div(a: IntArray, b: int) -> IntArray:
    """Go's integer division (truncates toward zero, also for negative numerators)."""
    q: IntArray = np.sign(a) * (np.abs(a) // b)
    return q


def broken_linear(shape: tuple[tuple[int, int], ...], p: IntArray) -> IntArray:
    """kube's ``helper.BuildBrokenLinearFunction`` over an array of utilizations (0..100)."""
    out = np.full(len(p), shape[-1][1], dtype=np.int64)
    done = np.zeros(len(p), dtype=bool)
    for i, (u, score) in enumerate(shape):
        here = ~done & (p <= u)
        if i == 0:
            out[here] = score
        else:
            u0, s0 = shape[i - 1]
            out[here] = s0 + _trunc_div((score - s0) * (p[here] - u0), u - u0)
        done |= here
    return out


@dataclass(frozen=True)
class FitArgs:
    strategy: str = "LeastAllocated"
    resources: tuple[tuple[str, int], ...] = DEFAULT_RESOURCES
    ignored_resources: frozenset[str] = frozenset()
    ignored_groups: frozenset[str] = frozenset()
    shape: tuple[tuple[int, int], ...] = ()  # RequestedToCapacityRatio: (utilization, score 0..100)

    @classmethod
    def parse(cls, args: Mapping[str, Any]) -> FitArgs:
        problems = _unknown(args, {"scoringStrategy", "ignoredResources", "ignoredResourceGroups"})
        strategy_raw = args.get("scoringStrategy") or {}
        problems += _unknown(strategy_raw, {"type", "resources", "requestedToCapacityRatio"}, "scoringStrategy.")
        strategy = strategy_raw.get("type", "LeastAllocated")
        if strategy not in STRATEGIES:
            problems.append(
                ("scoringStrategy.type", f"unsupported value {strategy!r}: supported " + ", ".join(STRATEGIES))
            )
        shape: tuple[tuple[int, int], ...] = ()
        if strategy == "RequestedToCapacityRatio":
            rtcr = strategy_raw.get("requestedToCapacityRatio") or {}
            problems += _unknown(rtcr, {"shape"}, "scoringStrategy.requestedToCapacityRatio.")
            shape = parse_shape(rtcr.get("shape"), "scoringStrategy.requestedToCapacityRatio.shape", problems)
        resources = parse_resources(strategy_raw.get("resources"), "scoringStrategy.resources", problems)
        groups = list(args.get("ignoredResourceGroups") or ())
        for i, g in enumerate(groups):
            if "/" in str(g):
                problems.append((f"ignoredResourceGroups[{i}]", "resource group name can't contain '/'"))
        if problems:
            raise fwk.ArgsError(problems)
        return cls(strategy, resources, frozenset(args.get("ignoredResources") or ()), frozenset(groups), shape)


def _pod_request(pod: PodInfo, res: str, nonzero: bool) -> int:
    """The pod's request of ``res`` as kube's ``calculatePodResourceRequest`` reads the pod being scheduled:
    ``nonzero`` (NodeResourcesFit's Score) its spec's container requests with the 100m / 200Mi defaults and no
    pod-level request, else (BalancedAllocation) its requests with pod-level ones and its status."""
    if not nonzero:
        return pod.requests.get(res, 0)
    if res == CPU:
        return pod.score_nonzero_cpu
    if res == MEMORY:
        return pod.score_nonzero_memory
    return pod.score_requests.get(res, 0)


class _Rows:
    """The scored rows' allocatable and requested matrices, gathered once per Score call."""

    __slots__ = ("alloc", "nonzero", "requested", "table")

    def __init__(self, table: NodeTable, rows: fwk.Rows) -> None:
        self.table = table
        self.alloc = table.alloc[rows]
        self.requested = table.requested[rows]
        self.nonzero = table.nonzero_requested[rows]

    def pair(self, pod: PodInfo, res: str, nonzero: bool) -> tuple[IntArray, IntArray] | None:
        """(allocatable, requested including this pod) per row; None when the resource does not score
        (kube's ``calculateResourceAllocatableRequest`` returning 0, 0)."""
        pod_req = _pod_request(pod, res, nonzero)
        if pod_req == 0 and is_scalar_resource(res):
            return None
        col = self.table.resources.get(res)
        if col is None:
            return None
        nonzero_col = {CPU: 0, MEMORY: 1}.get(res) if nonzero else None
        used = self.requested[:, col] if nonzero_col is None else self.nonzero[:, nonzero_col]
        return self.alloc[:, col], used + pod_req

    def scored(self, pod: PodInfo, resources: tuple[tuple[str, int], ...]) -> Iterator[tuple[int, IntArray, IntArray]]:
        """(weight, allocatable, requested) of each weighted resource that scores, with non-zero requests (the
        loop head of kube's ``resourceAllocationScorer``)."""
        for res, weight in resources:
            pair = self.pair(pod, res, nonzero=True)
            if pair is not None:
                yield weight, *pair


class _TableCaches:
    """Per-row results of one plugin instance over one node table, keyed by what of the pod they depend on:
    (filter, score)."""

    __slots__ = ("caches", "table")

    def __init__(self) -> None:
        self.table: NodeTable | None = None
        self.caches: tuple[FilterCache, FilterCache] | None = None

    def of(self, table: NodeTable) -> tuple[FilterCache, FilterCache]:
        if self.table is not table or self.caches is None:  # an instance serves one table; a new one starts afresh
            self.table = table
            self.caches = (FilterCache(table.row_versions), FilterCache(table.row_versions))
        return self.caches


def _requests_key(pod: PodInfo, resources: tuple[tuple[str, int], ...], nonzero: bool) -> tuple[int, ...]:
    """What of the pod a resource score reads: its (non-zero) request of each scored resource."""
    return tuple(_pod_request(pod, res, nonzero) for res, _ in resources)


MAX_CACHED_CHECKS = 31
"""Filter reasons are kept as bits of an int64 per row: pods checked on more resources are filtered uncached"""
ONE_BY_ONE = 16
"""up to this many changed rows are recomputed one at a time in Python ints and floats (numpy's per-call cost
dominates below that), with the vector path's exact arithmetic (``test_noderesources_rowcache`` holds them equal)"""


TOO_MANY_PODS = "Too many pods"
"""NodeResourcesFit's reason when the node's pod count is full"""


def insufficient(resource: str) -> str:
    """NodeResourcesFit's reason when ``resource`` does not fit (kube's ``Insufficient <name>``)."""
    return f"Insufficient {resource}"


class NodeResourcesFit(fwk.FilterPlugin, fwk.ScorePlugin, fwk.QueueingHintPlugin):
    name = "NodeResourcesFit"

    def __init__(self, args: FitArgs, classes: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.args = args
        self.classes = classes  # the DeviceClasses (DRA-backed extended resources), None without listers
        self._caches = _TableCaches()

    def delegated(self, checked: list[tuple[str, int]]) -> frozenset[str]:
        """The checked resources a DeviceClass maps: only checked where the node's allocatable offers them."""
        if self.classes is None or not any(is_dra_extended(res) for res, _ in checked):
            return frozenset()
        classes = self.classes()
        if not classes:
            return frozenset()
        mapped = extended_resolver(classes)
        return frozenset(res for res, _ in checked if is_dra_extended(res) and mapped.backed(res))

    def _ignored(self, res: str) -> bool:
        return is_extended_resource(res) and (
            res in self.args.ignored_resources or res.split("/", 1)[0] in self.args.ignored_groups
        )

    def checked(self, pod: PodInfo) -> list[tuple[str, int]]:
        """The (resource, request) pairs Filter holds against each node's free allocatable, besides one more pod:
        the spec's requests (kube's ``computePodResourceRequest``, no status: the pod is not on a node yet)."""
        return [
            (res, want) for res, want in pod.fit_requests.items() if want > 0 and res != PODS and not self._ignored(res)
        ]

    def filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> list[fwk.Rejection]:
        """The rejections of ``_filter_all``, from per-row reason bits kept per pod size (``_reason_bits``)."""
        checked = self.checked(pod)
        delegated = self.delegated(checked)
        if len(checked) > MAX_CACHED_CHECKS:
            return self._filter_all(pod, table, delegated)
        fits = self._caches.of(table)[0]
        key = (*checked, delegated) if delegated else tuple(checked)
        codes = fits.get(key, table.n_rows, lambda rows: _reason_bits(table, checked, rows, delegated))
        if not codes.any():
            return []
        present = int(np.bitwise_or.reduce(codes))
        out: list[fwk.Rejection] = []
        if present & 1:
            out.append(fwk.Rejection(TOO_MANY_PODS, (codes & 1) != 0))
        for i, (res, _) in enumerate(checked):
            for bit, unresolvable in ((1 << (1 + 2 * i), False), (1 << (2 + 2 * i), True)):
                if present & bit:
                    out.append(fwk.Rejection(insufficient(res), (codes & bit) != 0, unresolvable=unresolvable))
        return out

    def _filter_all(
        self, pod: PodInfo, table: NodeTable, delegated: frozenset[str] = frozenset()
    ) -> list[fwk.Rejection]:
        out: list[fwk.Rejection] = []
        too_many = table.pod_count + 1 > table.alloc[:, table.resources[PODS]]
        if too_many.any():
            out.append(fwk.Rejection(TOO_MANY_PODS, too_many))
        for res, want in self.checked(pod):
            col = table.resources.get(res)
            if col is None:
                if res in delegated:
                    continue
                mask = whole = np.ones(table.n_rows, dtype=bool)
            else:
                mask = want > table.alloc[:, col] - table.requested[:, col]
                whole = want > table.alloc[:, col]
                if res in delegated:
                    offered = table.alloc[:, col] > 0
                    mask, whole = mask & offered, whole & offered
            # A request above the node's whole allocatable is UnschedulableAndUnresolvable in kube (preemption
            # cannot help there), otherwise Unschedulable: one reason, split by that flag (found by the judge).
            for part, unresolvable in ((mask & ~whole, False), (mask & whole, True)):
                if part.any():
                    out.append(fwk.Rejection(insufficient(res), part, unresolvable=unresolvable))
        return out

    def score(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> IntArray:
        key = _requests_key(pod, self.args.resources, nonzero=True)
        values = self._caches.of(table)[1].get(key, table.n_rows, lambda changed: self._score(pod, table, changed))
        out: IntArray = values[rows]
        return out

    def _score(self, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> IntArray:
        if len(rows) <= ONE_BY_ONE and self.args.strategy != "RequestedToCapacityRatio":
            return np.array([self._score_of(pod, table, row) for row in rows.tolist()], dtype=np.int64)
        gathered = _Rows(table, rows)
        total = np.zeros(len(rows), dtype=np.int64)
        weights = np.zeros(len(rows), dtype=np.int64)
        least = self.args.strategy == "LeastAllocated"
        if self.args.strategy == "RequestedToCapacityRatio":
            return self._requested_to_capacity_ratio(pod, gathered, len(rows))
        for weight, alloc, req in gathered.scored(pod, self.args.resources):
            valid = alloc > 0
            safe = np.where(valid, alloc, 1)
            if least:
                s = np.where(req > alloc, 0, (alloc - req) * fwk.MAX_NODE_SCORE // safe)
            else:
                s = np.minimum(req, alloc) * fwk.MAX_NODE_SCORE // safe
            if valid.all():
                total += s * weight
                weights += weight
            else:
                total += np.where(valid, s * weight, 0)
                weights += np.where(valid, weight, 0)
        return np.where(weights > 0, total // np.maximum(weights, 1), 0)

    def _score_of(self, pod: PodInfo, table: NodeTable, row: int) -> int:
        """``_score`` of one row (LeastAllocated, MostAllocated)."""
        alloc, requested, nonzero = (
            table.alloc[row].tolist(),
            table.requested[row].tolist(),
            table.nonzero_requested[row].tolist(),
        )
        least = self.args.strategy == "LeastAllocated"
        total = weights = 0
        for res, weight in self.args.resources:
            pod_req = _pod_request(pod, res, nonzero=True)
            col = table.resources.get(res)
            if (pod_req == 0 and is_scalar_resource(res)) or col is None:
                continue
            a = alloc[col]
            if a <= 0:
                continue
            req = (nonzero[0] if res == CPU else nonzero[1] if res == MEMORY else requested[col]) + pod_req
            if least:
                s = 0 if req > a else (a - req) * fwk.MAX_NODE_SCORE // a
            else:
                s = min(req, a) * fwk.MAX_NODE_SCORE // a
            total += s * weight
            weights += weight
        return total // weights if weights > 0 else 0

    def _requested_to_capacity_ratio(self, pod: PodInfo, gathered: _Rows, n: int) -> IntArray:
        """kube's ``buildRequestedToCapacityRatioScorerFunction``: the shape at each resource's utilization
        (100 when over capacity), averaged by weight over the resources scoring above 0, rounded."""
        total = np.zeros(n, dtype=np.int64)
        weights = np.zeros(n, dtype=np.int64)
        for weight, alloc, req in gathered.scored(pod, self.args.resources):
            valid = alloc > 0
            utilization = np.where(req > alloc, 100, req * 100 // np.where(valid, alloc, 1))
            s = broken_linear(self.args.shape, utilization)
            counted = valid & (s > 0)
            total += np.where(counted, s * weight, 0)
            weights += np.where(counted, weight, 0)
        mean = total / np.maximum(weights, 1)
        out: IntArray = np.where(weights > 0, np.floor(mean + 0.5), 0).astype(np.int64)  # math.Round, >= 0
        return out

    def events_to_register(self) -> fwk.ClusterEvent:
        """kube's: an assigned pod deleted or scaled down, a node added or its allocatable changed, a DeviceClass
        added or changed (it may map an extended resource the pod asks for to devices)."""
        return (
            fwk.ClusterEvent.POD_DELETE
            | fwk.ClusterEvent.POD_UPDATE
            | fwk.ClusterEvent.NODE_ADD
            | fwk.ClusterEvent.NODE_UPDATE
            | fwk.ClusterEvent.DEVICE_CLASS_CHANGE
        )

    def queueing_hints(self) -> fwk.QueueingHints:
        return {
            fwk.ClusterEvent.POD_DELETE | fwk.ClusterEvent.POD_UPDATE: after_pod_event,
            fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE: after_node_change,
            fwk.ClusterEvent.DEVICE_CLASS_CHANGE: after_device_class_change,
        }


def after_pod_event(pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
    """kube's ``isSchedulableAfterPodEvent``: a placed pod deleted (the cache reports only placed and assumed
    pods' deletions, so always), or scaled down in a resource the pod requests."""
    old, new = change.old, change.new
    if not isinstance(new, PodInfo) or not isinstance(old, PodInfo):
        return fwk.QueueingHint.QUEUE
    if new.uid == pod.uid:
        return fwk.QueueingHint.QUEUE
    if not new.node_name:
        return fwk.QueueingHint.SKIP
    shrunk = any(want > 0 and old.requests.get(r, 0) > new.requests.get(r, 0) for r, want in pod.requests.items())
    return fwk.QueueingHint.QUEUE if shrunk else fwk.QueueingHint.SKIP


def after_device_class_change(pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
    """kube's ``isSchedulableAfterDeviceClassEvent``: a class that now maps (explicitly, or by its implicit name
    when added) an extended resource the pod asks for."""
    new, old = change.new_object, change.old_object
    if not isinstance(new, Mapping):  # the change came without its objects: maybe
        return fwk.QueueingHint.QUEUE
    name = (new.get("spec") or {}).get("extendedResourceName")
    before = ((old or {}).get("spec") or {}).get("extendedResourceName") if isinstance(old, Mapping) else None
    if name and name != before and pod.requests.get(name):
        return fwk.QueueingHint.QUEUE
    implicit = "deviceclass.resource.kubernetes.io/" + str((new.get("metadata") or {}).get("name", ""))
    if old is None and pod.requests.get(implicit):
        return fwk.QueueingHint.QUEUE
    return fwk.QueueingHint.SKIP


def _fits_empty(pod: PodInfo, node: NodeInfo) -> bool:
    """kube's ``isFit``: the pod fits the node with nothing on it."""
    alloc = node.allocatable
    if alloc.get(PODS, 0) < 1:
        return False
    return all(want <= 0 or r == PODS or want <= alloc.get(r, 0) for r, want in pod.fit_requests.items())


def after_node_change(pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
    """kube's ``isSchedulableAfterNodeChange``: the (new or updated) node could hold the pod when empty and, for
    an update, its allowed pod number or the allocatable of a resource the pod requests grew."""
    old, new = change.old, change.new
    if not isinstance(new, NodeInfo):
        return fwk.QueueingHint.QUEUE
    if not _fits_empty(pod, new):
        return fwk.QueueingHint.SKIP
    if not isinstance(old, NodeInfo):
        return fwk.QueueingHint.QUEUE
    before, after = old.allocatable, new.allocatable
    if after.get(PODS, 0) > before.get(PODS, 0):
        return fwk.QueueingHint.QUEUE
    grew = any(want > 0 and r != PODS and after.get(r, 0) > before.get(r, 0) for r, want in pod.fit_requests.items())
    return fwk.QueueingHint.QUEUE if grew else fwk.QueueingHint.SKIP


def _reason_bits(
    table: NodeTable, checked: list[tuple[str, int]], rows: fwk.Rows, delegated: frozenset[str] = frozenset()
) -> IntArray:
    """``NodeResourcesFit._filter_all``'s reasons of ``rows`` as bits: 1 too many pods; for the i-th checked
    resource 1 << (1 + 2i) insufficient, 1 << (2 + 2i) insufficient beyond the whole allocatable (unresolvable).
    A ``delegated`` resource is not checked where the node's allocatable lacks it (DynamicResources' then)."""
    if len(rows) <= ONE_BY_ONE:
        return np.array([_reason_bits_of(table, checked, row, delegated) for row in rows.tolist()], dtype=np.int64)
    alloc = table.alloc[rows]
    codes = np.zeros(len(rows), dtype=np.int64)
    codes[table.pod_count[rows] + 1 > alloc[:, table.resources[PODS]]] = 1
    for i, (res, want) in enumerate(checked):
        col = table.resources.get(res)
        if col is None:  # no node has it: every row, unresolvable
            if res not in delegated:
                codes |= 1 << (2 + 2 * i)
            continue
        mask = want > alloc[:, col] - table.requested[rows, col]
        whole = want > alloc[:, col]
        if res in delegated:
            offered = alloc[:, col] > 0
            mask, whole = mask & offered, whole & offered
        codes[mask & ~whole] |= 1 << (1 + 2 * i)
        codes[mask & whole] |= 1 << (2 + 2 * i)
    return codes


def _reason_bits_of(
    table: NodeTable, checked: list[tuple[str, int]], row: int, delegated: frozenset[str] = frozenset()
) -> int:
    """``_reason_bits`` of one row."""
    alloc, requested = table.alloc[row].tolist(), table.requested[row].tolist()
    code = 1 if int(table.pod_count[row]) + 1 > alloc[table.resources[PODS]] else 0
    for i, (res, want) in enumerate(checked):
        col = table.resources.get(res)
        if col is None:
            if res not in delegated:
                code |= 1 << (2 + 2 * i)
        elif res in delegated and alloc[col] <= 0:
            continue
        elif want > alloc[col] - requested[col]:
            code |= 1 << ((2 if want > alloc[col] else 1) + 2 * i)
    return code


class BalancedAllocation(fwk.PreScorePlugin, fwk.ScorePlugin, fwk.EnqueueExtensions):
    name = "NodeResourcesBalancedAllocation"

    def __init__(self, resources: tuple[tuple[str, int], ...]) -> None:
        self.resources = resources
        self._caches = _TableCaches()

    def pre_score(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> fwk.Status:
        if all(_pod_request(pod, res, nonzero=False) == 0 for res, _ in self.resources):
            return fwk.SKIP  # best-effort pods would all pile onto one node otherwise (kubernetes#129138)
        return fwk.SUCCESS

    def score(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> IntArray:
        key = _requests_key(pod, self.resources, nonzero=False)
        values = self._caches.of(table)[1].get(key, table.n_rows, lambda changed: self._score(pod, table, changed))
        out: IntArray = values[rows]
        return out

    def _score(self, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> IntArray:
        """kube 1.37's ``balancedResourceScorer``: the balance with the pod against the balance without it,
        ``50 + (50 + with - without) / 2`` (75 where the pod changes nothing, towards 100 where it evens the
        node out, towards 50 where it tilts it)."""
        if len(rows) <= ONE_BY_ONE and len(self.resources) == 2:
            return np.array([self._score_of(pod, table, row) for row in rows.tolist()], dtype=np.int64)
        gathered = _Rows(table, rows)
        with_pod: list[npt.NDArray[np.float64]] = []
        without: list[npt.NDArray[np.float64]] = []
        valids: list[npt.NDArray[np.bool_]] = []
        for res, _ in self.resources:
            pair = gathered.pair(pod, res, nonzero=False)
            if pair is None:
                continue
            alloc, req = pair
            valid = alloc > 0
            safe = np.where(valid, alloc, 1)
            with_pod.append(np.minimum(req / safe, 1.0))
            without.append(np.minimum((req - _pod_request(pod, res, nonzero=False)) / safe, 1.0))
            valids.append(valid)
        half = fwk.MAX_NODE_SCORE // 2
        delta = _balance(with_pod, valids, len(rows)) - _balance(without, valids, len(rows))
        result: IntArray = half + _trunc_div(half + delta, 2)
        return result

    def _score_of(self, pod: PodInfo, table: NodeTable, row: int) -> int:
        """``_score`` of one row, for two resources (the default: cpu and memory)."""
        alloc, requested = table.alloc[row].tolist(), table.requested[row].tolist()
        with_pod: list[float] = []
        without: list[float] = []
        for res, _ in self.resources:
            pod_req = _pod_request(pod, res, nonzero=False)
            col = table.resources.get(res)
            if (pod_req == 0 and is_scalar_resource(res)) or col is None:
                continue
            a = alloc[col]
            if a <= 0:
                continue
            with_pod.append(min(float(requested[col] + pod_req) / float(a), 1.0))
            without.append(min(float(requested[col]) / float(a), 1.0))
        half = fwk.MAX_NODE_SCORE // 2
        delta = _balance_of(with_pod) - _balance_of(without)
        return half + int((half + delta) / 2)  # Go's integer division (the numerator is never negative)

    def events_to_register(self) -> fwk.ClusterEvent:
        return fwk.ClusterEvent.ALL


def _balance_of(fractions: list[float]) -> int:
    """kube's ``balancedResourceScore`` for at most two fractions (the allocatable ones)."""
    std = abs((fractions[0] - fractions[1]) / 2) if len(fractions) == 2 else 0.0
    return int((1.0 - std) * fwk.MAX_NODE_SCORE)


def _balance(fractions: list[npt.NDArray[np.float64]], valids: list[npt.NDArray[np.bool_]], n: int) -> IntArray:
    """kube's ``balancedResourceScore`` per row: ``(1 - std) * 100`` over the fractions of the resources the row
    has allocatable of (|a - b| / 2 for two, the population standard deviation for more, 0 below two)."""
    if not fractions:
        return np.full(n, fwk.MAX_NODE_SCORE, dtype=np.int64)
    f, v = np.stack(fractions), np.stack(valids)
    count = v.sum(axis=0)
    if len(fractions) == 2:  # the default (cpu, memory): kube's |a - b| / 2 where both count
        std = np.where(count == 2, np.abs((f[0] - f[1]) / 2), 0.0)
    else:
        hi = np.where(v, f, -np.inf).max(axis=0)
        lo = np.where(v, f, np.inf).min(axis=0)
        std = np.where(count == 2, (hi - lo) / 2, 0.0)  # max - min is the same float as |a - b|
        safe_count = np.maximum(count, 1)
        mean = np.where(v, f, 0.0).sum(axis=0) / safe_count
        var = np.where(v, (f - mean) ** 2, 0.0).sum(axis=0) / safe_count
        std = np.where(count > 2, np.sqrt(var), std)
    out: IntArray = ((1.0 - std) * fwk.MAX_NODE_SCORE).astype(np.int64)
    return out


def new_fit(args: Mapping[str, Any], handle: fwk.Handle) -> NodeResourcesFit:
    return NodeResourcesFit(FitArgs.parse(args), handle.listers.device_classes)


def new_balanced_allocation(args: Mapping[str, Any], handle: fwk.Handle) -> BalancedAllocation:
    problems = _unknown(args, {"resources"})
    resources = parse_resources(args.get("resources"), "resources", problems, weight_one=True)
    if problems:
        raise fwk.ArgsError(problems)
    return BalancedAllocation(resources)
