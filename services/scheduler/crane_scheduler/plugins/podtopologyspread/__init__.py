"""PodTopologySpread with kube-scheduler 1.35 semantics (``pkg/scheduler/framework/plugins/podtopologyspread``).

Filter (``DoNotSchedule``): placing the pod in a node's domain must keep ``matching + self - min <= maxSkew``,
where ``min`` is the smallest count over the eligible domains (0 while fewer than ``minDomains`` exist); nodes
without the topology key are unresolvable. Score (``ScheduleAnyway``): ``count * log(domains + 2) + maxSkew - 1``
per constraint, rounded, then reversed so the emptiest domain scores 100. Eligible nodes follow
``nodeAffinityPolicy`` (default Honor) and ``nodeTaintsPolicy`` (default Ignore); ``matchLabelKeys`` adds the
pod's values of those keys to the selector. A pod without constraints gets the default ones
(``defaultingType: System``: hostname maxSkew 3 and zone maxSkew 5, both ScheduleAnyway) with the selector of the
Services, ReplicaSets, StatefulSets and ReplicationControllers that own or select it (watched here).

Counts come from the shared ``PodIndex`` (per-node counts per (namespace, selector), kept up to date on pod
events) folded into domains by one ``np.bincount`` per constraint: no pass over the pods per decision.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from kubernetes_asyncio import client

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import IntArray, Mask, NodeTable
from crane_scheduler.plugins.nodeaffinity import required_mask
from crane_scheduler.plugins.podindex import (
    Matcher,
    PodIndexPlugin,
    Selector,
    SelectorError,
    parse_selector,
    per_row,
    selector_from_set,
)
from crane_scheduler.podinfo import NodeInfo, PodInfo, tolerated
from crane_shared.informer import EventType, Informer

NAME = "PodTopologySpread"
REASON = "node(s) didn't match pod topology spread constraints"
REASON_LABEL = REASON + " (missing required label)"
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
ACTIONS = ("DoNotSchedule", "ScheduleAnyway")
POLICIES = ("Honor", "Ignore")
SYSTEM_DEFAULTS: tuple[Mapping[str, Any], ...] = (
    {"topologyKey": HOSTNAME, "whenUnsatisfiable": "ScheduleAnyway", "maxSkew": 3},
    {"topologyKey": ZONE, "whenUnsatisfiable": "ScheduleAnyway", "maxSkew": 5},
)
_FILTER = "PodTopologySpread.filter"
_SCORE = "PodTopologySpread.score"
MAX_INT32 = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Constraint:
    max_skew: int
    key: str
    selector: Selector
    min_domains: int = 1
    honor_affinity: bool = True
    honor_taints: bool = False


def _constraints(raw: Any, labels: Mapping[str, str], action: str, path: str) -> list[Constraint]:
    """kube's ``filterTopologySpreadConstraints``: the constraints with ``whenUnsatisfiable == action``."""
    out = []
    for i, c in enumerate(raw or ()):
        if c.get("whenUnsatisfiable") != action:
            continue
        selector = parse_selector(c.get("labelSelector"), f"{path}[{i}].labelSelector")
        keys = c.get("matchLabelKeys") or ()
        selector = selector.with_labels({k: labels[k] for k in keys if k in labels})
        min_domains = c.get("minDomains")
        out.append(
            Constraint(
                int(c.get("maxSkew") or 0),
                str(c.get("topologyKey") or ""),
                selector,
                1 if min_domains is None else int(min_domains),
                (c.get("nodeAffinityPolicy") or "Honor") == "Honor",
                (c.get("nodeTaintsPolicy") or "Ignore") == "Honor",
            )
        )
    return out


_OWN: dict[tuple[str, str], tuple[Mapping[str, Any], list[Constraint] | SelectorError]] = {}
_OWN_MAX = 8192


def _own_constraints(pod: PodInfo, labels: Mapping[str, str], action: str) -> list[Constraint]:
    """The pod's own constraints for ``action``, memoised per pod object (PreFilter, PreScore and the queueing
    hints ask for the same pod; they depend on the pod alone); a new version of the pod is parsed again."""
    key = (pod.uid, action)
    found = _OWN.get(key)
    if found is not None and found[0] is pod.raw:
        result = found[1]
    else:
        raw = (pod.raw.get("spec") or {}).get("topologySpreadConstraints")
        try:
            result = _constraints(raw, labels, action, "spec.topologySpreadConstraints")
        except SelectorError as err:
            result = err
        if len(_OWN) >= _OWN_MAX:
            _OWN.clear()
        _OWN[key] = (pod.raw, result)
    if isinstance(result, SelectorError):
        raise result
    return result


@dataclass(frozen=True)
class Args:
    default_constraints: tuple[Mapping[str, Any], ...] = SYSTEM_DEFAULTS
    system_defaulted: bool = True

    @classmethod
    def parse(cls, args: Mapping[str, Any]) -> Args:
        """``PodTopologySpreadArgs`` and kube's ``ValidatePodTopologySpreadArgs``."""
        problems = [(k, "unknown field") for k in args if k not in ("defaultConstraints", "defaultingType")]
        kind = args.get("defaultingType", "System")
        if kind not in ("System", "List"):
            problems.append(("defaultingType", f'supported values: "List", "System", got {kind!r}'))
        raw = args.get("defaultConstraints") or []
        if not isinstance(raw, list):
            problems.append(("defaultConstraints", "must be a list"))
            raw = []
        seen: set[tuple[str, str]] = set()
        for i, c in enumerate(raw):
            p = f"defaultConstraints[{i}]"
            if not isinstance(c, Mapping):
                problems.append((p, "must be a mapping"))
                continue
            skew = c.get("maxSkew")
            if not isinstance(skew, int) or isinstance(skew, bool) or skew <= 0:
                problems.append((f"{p}.maxSkew", f"must be greater than zero, got {skew!r}"))
            if not c.get("topologyKey"):
                problems.append((f"{p}.topologyKey", "can not be empty"))
            if c.get("whenUnsatisfiable") not in ACTIONS:
                problems.append((f"{p}.whenUnsatisfiable", f"supported values: {', '.join(ACTIONS)}"))
            if c.get("labelSelector") is not None:
                problems.append(
                    (f"{p}.labelSelector", "constraint must not define a selector, as they deduced for each pod")
                )
            pair = (str(c.get("topologyKey")), str(c.get("whenUnsatisfiable")))
            if pair in seen:
                problems.append((p, f"duplicate {{{pair[0]}, {pair[1]}}} pair"))
            seen.add(pair)
        if kind == "System" and raw:
            problems.append(("defaultingType", 'when .defaultingType is "System", .defaultConstraints must be empty'))
        if problems:
            raise fwk.ArgsError(problems)
        if kind == "System":
            return cls()
        return cls(tuple(raw), False)


_EVERYTHING = selector_from_set({})
"""the selector of no labels (matches everything): a pod that no service or owner selects"""


class Owners:
    """Services, ReplicationControllers, ReplicaSets and StatefulSets: only their selectors, for
    ``helper.DefaultSelector``."""

    def __init__(self) -> None:
        self.services: dict[str, dict[str, Mapping[str, str] | None]] = {}  # ns -> name -> spec.selector
        self.rcs: dict[tuple[str, str], Mapping[str, str]] = {}
        self.selectors: dict[tuple[str, str, str], Selector] = {}  # (kind, ns, name) -> ReplicaSet/StatefulSet

    def on_event(self, kind: str, event: EventType, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        spec = obj.get("spec") or {}
        deleted = event == "DELETED"
        if kind == "Service":
            if deleted:
                self.services.get(ns, {}).pop(name, None)
            else:
                self.services.setdefault(ns, {})[name] = spec.get("selector")
        elif kind == "ReplicationController":
            if deleted:
                self.rcs.pop((ns, name), None)
            else:
                self.rcs[(ns, name)] = dict(spec.get("selector") or {})
        elif deleted:
            self.selectors.pop((kind, ns, name), None)
        else:
            try:
                self.selectors[(kind, ns, name)] = parse_selector(spec.get("selector"))
            except SelectorError:
                self.selectors.pop((kind, ns, name), None)

    def default_selector(self, pod: PodInfo) -> Selector:
        labels = (pod.raw.get("metadata") or {}).get("labels") or {}
        merged: dict[str, str] = {}
        for selector in self.services.get(pod.namespace, {}).values():
            if selector is not None and selector_from_set(selector).matches(labels):
                merged.update(selector)
        owner = next(
            (o for o in (pod.raw.get("metadata") or {}).get("ownerReferences") or () if o.get("controller")), None
        )
        if owner is None:
            return selector_from_set(merged) if merged else _EVERYTHING  # no service, no owner: most pods here
        result = selector_from_set(merged)
        api, kind, name = owner.get("apiVersion"), owner.get("kind"), str(owner.get("name", ""))
        if (api, kind) == ("v1", "ReplicationController"):
            rc = self.rcs.get((pod.namespace, name))
            if rc is not None:
                result = selector_from_set({**merged, **rc})
        elif (api, kind) in (("apps/v1", "ReplicaSet"), ("apps/v1", "StatefulSet")):
            found = self.selectors.get((str(kind), pod.namespace, name))
            if found is not None and not found.nothing:
                result = result.add(found)
        return result


class PodTopologySpread(PodIndexPlugin):
    name = NAME
    node_events = fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE | fwk.ClusterEvent.NODE_DELETE

    def __init__(self, args: Args, handle: fwk.Handle) -> None:
        super().__init__(handle)
        self.args = args
        self.owners = Owners()

    def constraints(self, pod: PodInfo, action: str) -> list[Constraint]:
        spec = pod.raw.get("spec") or {}
        labels = (pod.raw.get("metadata") or {}).get("labels") or {}
        own = spec.get("topologySpreadConstraints")
        if own:
            return _own_constraints(pod, labels, action)
        if not any(c.get("whenUnsatisfiable") == action for c in self.args.default_constraints):
            return []  # kube's defaults are ScheduleAnyway: none for Filter, whoever owns the pod
        selector = self.owners.default_selector(pod)  # first: most pods have no owner with a selector here
        if selector.everything:
            return []
        defaults = _constraints(self.args.default_constraints, labels, action, "defaultConstraints")
        return [
            Constraint(c.max_skew, c.key, selector, c.min_domains, c.honor_affinity, c.honor_taints) for c in defaults
        ]

    def _counts(self, pod: PodInfo, c: Constraint) -> IntArray:
        """Pods in the pod's namespace, not being deleted, matching the selector, per row (kube's
        ``countPodsMatchSelector``: an empty selector counts nothing)."""
        if c.selector.everything:
            return np.zeros(self.handle.table.n_rows, dtype=np.int64)
        return self.index.counts(Matcher(((frozenset((pod.namespace,)), c.selector),), live_only=True))

    def _eligible(self, pod: PodInfo, table: NodeTable, c: Constraint, cache: dict[str, Mask]) -> Mask:
        """Nodes whose pods count, by the constraint's node inclusion policies."""
        mask = table.live.copy()
        if c.honor_affinity:
            if "affinity" not in cache:
                cache["affinity"] = required_mask(table, pod)
            mask &= cache["affinity"]
        if c.honor_taints:
            if "taints" not in cache:
                bad = np.fromiter(
                    (
                        any(t.effect in ("NoSchedule", "NoExecute") and not tolerated(pod.tolerations, t) for t in ts)
                        for ts in table.taint_sets
                    ),
                    dtype=bool,
                    count=len(table.taint_sets),
                )
                cache["taints"] = ~bad[table.taint_group]
            mask &= cache["taints"]
        return mask

    @staticmethod
    def _codes(table: NodeTable, key: str) -> tuple[Any, int]:
        found = table.label_codes(key)
        if found is None:
            return np.full(table.n_rows, -1, dtype=np.int32), 0
        return found[0], len(found[1])

    # -- filter ---------------------------------------------------------------------------------------------------

    def pre_filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> fwk.PreFilterResult:
        try:
            constraints = self.constraints(pod, "DoNotSchedule")
        except SelectorError as err:
            return fwk.PreFilterResult(fwk.unschedulable(f"parsing pod: {err}", unresolvable=True))
        if not constraints:
            return fwk.PreFilterResult(fwk.SKIP)
        n = table.n_rows
        codes = [self._codes(table, c.key) for c in constraints]
        has_all = table.live.copy()
        for code, _ in codes:
            has_all &= code >= 0
        cache: dict[str, Mask] = {}
        labels = (pod.raw.get("metadata") or {}).get("labels") or {}
        status = np.zeros(n, dtype=np.int8)  # 0 fits, 1 skew, 2 missing label (first failing constraint wins)
        for c, (code, size) in zip(constraints, codes, strict=True):
            eligible = has_all & self._eligible(pod, table, c, cache)
            use = eligible & (code >= 0)
            sums = np.bincount(code[use], weights=self._counts(pod, c)[use], minlength=size).astype(np.int64)
            present = np.bincount(code[use], minlength=size) > 0
            domains = int(present.sum())
            low = int(sums[present].min()) if domains else MAX_INT32
            if domains < c.min_domains:
                low = 0
            own = 1 if c.selector.matches(labels) else 0
            undecided = status == 0
            missing = undecided & (code < 0)
            status[missing] = 2
            skewed = undecided & (code >= 0) & (per_row(code, sums) + own - low > c.max_skew)
            status[skewed] = 1
        state[_FILTER] = [
            fwk.Rejection(REASON, status == 1),
            fwk.Rejection(REASON_LABEL, status == 2, unresolvable=True),
        ]
        return fwk.PreFilterResult()

    def filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> list[fwk.Rejection]:
        rejections: list[fwk.Rejection] = state.get(_FILTER, [])
        return [r for r in rejections if r.mask.any()]

    # -- score ----------------------------------------------------------------------------------------------------

    def pre_score(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> fwk.Status:
        if table.num_nodes == 0:
            return fwk.SKIP
        try:
            constraints = self.constraints(pod, "ScheduleAnyway")
        except SelectorError as err:
            return fwk.Status(fwk.Status().code.ERROR, (f"calculating preScoreState: {err}",))
        if not constraints:
            return fwk.SKIP
        own = bool((pod.raw.get("spec") or {}).get("topologySpreadConstraints"))
        require_all = own or not self.args.system_defaulted
        codes = [self._codes(table, c.key) for c in constraints]
        has_all = np.ones(table.n_rows, dtype=bool)
        for code, _ in codes:
            has_all &= code >= 0
        ignored = ~has_all[rows] if require_all else np.zeros(len(rows), dtype=bool)
        kept = rows[~ignored]
        cache: dict[str, Mask] = {}
        total = np.zeros(len(rows), dtype=np.float64)
        for c, (code, size) in zip(constraints, codes, strict=True):
            counts = self._counts(pod, c)
            row_codes = code[rows]
            has = row_codes >= 0
            if c.key == HOSTNAME:
                weight = float(np.log(len(kept) + 2))
                cnt = counts[rows]
            else:
                # Domains of the filtered, non-ignored nodes (a node without the key: the "" domain, which no
                # node scores from); counted over all eligible nodes.
                kept_codes = code[kept]
                wanted = np.zeros(size + 1, dtype=bool)  # last slot: the "" domain of nodes without the key
                wanted[np.where(kept_codes >= 0, kept_codes, size)] = True
                weight = float(np.log(int(wanted.sum()) + 2))
                eligible = self._eligible(pod, table, c, cache)
                if require_all:
                    eligible &= has_all
                use = eligible & (code >= 0)
                sums = np.bincount(code[use], weights=counts[use], minlength=size).astype(np.int64)
                sums[~wanted[:size]] = 0
                cnt = per_row(row_codes, sums)
            total += np.where(has, cnt * weight + float(c.max_skew - 1), 0.0)
        scores = np.floor(total + 0.5).astype(np.int64)  # math.Round (scores are never negative)
        scores[ignored] = 0  # kube's Score returns 0 for them before normalising
        state[_SCORE] = (scores, ignored)
        return fwk.SUCCESS

    def score(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> IntArray:
        scores: IntArray = state[_SCORE][0]
        return scores

    def normalize_score(self, state: fwk.CycleState, pod: PodInfo, scores: IntArray) -> IntArray:
        """kube's integer normalisation: ``100 * (max + min - s) / max`` over the non-ignored nodes, 0 for the
        ignored ones, 100 for all when the maximum is 0."""
        ignored: Mask = state[_SCORE][1]
        if not len(scores):
            return scores
        valid = scores[~ignored]
        low = int(valid.min()) if len(valid) else MAX_INT32
        high = max(int(valid.max()), 0) if len(valid) else 0
        if high == 0:
            out = np.full(len(scores), fwk.MAX_NODE_SCORE, dtype=np.int64)
        else:
            out = fwk.MAX_NODE_SCORE * (high + low - scores) // high
        out[ignored] = 0
        return out

    # -- queueing and the owner watches ---------------------------------------------------------------------------

    def after_pod_change(self, pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
        """kube's ``isSchedulableAfterPodChange``: a placed pod of the pod's namespace added or deleted that one of
        its DoNotSchedule constraints selects, or updated so that some constraint's selector flips on it."""
        old, new = change.old, change.new
        for other in (old, new):
            if isinstance(other, PodInfo) and not _involved(other, pod):
                return fwk.QueueingHint.SKIP
        constraints = self.constraints(pod, "DoNotSchedule")  # a bad selector raises: the queue requeues the pod
        if isinstance(old, PodInfo) and isinstance(new, PodInfo):
            before, after = _labels_of(old), _labels_of(new)
            if before == after:
                return fwk.QueueingHint.SKIP
            flips = any(c.selector.matches(before) != c.selector.matches(after) for c in constraints)
            return fwk.QueueingHint.QUEUE if flips else fwk.QueueingHint.SKIP
        other = new if isinstance(new, PodInfo) else old
        if not isinstance(other, PodInfo):
            return fwk.QueueingHint.QUEUE
        labels = _labels_of(other)
        return fwk.QueueingHint.QUEUE if any(c.selector.matches(labels) for c in constraints) else fwk.QueueingHint.SKIP

    def after_node_change(self, pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
        """kube's ``isSchedulableAfterNodeChange``: a node with all the constraints' topology keys added or deleted;
        an update that gives or takes one of them, or, on a node with all of them, changes a key's value or the
        taints."""
        old, new = change.old, change.new
        if not isinstance(old, NodeInfo) and not isinstance(new, NodeInfo):
            return fwk.QueueingHint.QUEUE
        keys = [c.key for c in self.constraints(pod, "DoNotSchedule")]
        was = isinstance(old, NodeInfo) and all(k in old.labels for k in keys)
        now = isinstance(new, NodeInfo) and all(k in new.labels for k in keys)
        if isinstance(old, NodeInfo) and isinstance(new, NodeInfo):
            if was != now:
                return fwk.QueueingHint.QUEUE
            moved = any(old.labels.get(k) != new.labels.get(k) for k in keys)
            return fwk.QueueingHint.QUEUE if now and (moved or old.taints != new.taints) else fwk.QueueingHint.SKIP
        return fwk.QueueingHint.QUEUE if was or now else fwk.QueueingHint.SKIP

    object_kinds = ("Service", "ReplicationController", "ReplicaSet", "StatefulSet")

    def apply_object(self, kind: str, event: EventType, obj: dict[str, Any]) -> None:
        self.owners.on_event(kind, event, obj)

    def objects_listed(self) -> None:
        pass

    async def run(self, stopping: asyncio.Event) -> None:
        """Watch the owners' selectors while default constraints are configured (kube sets its listers then)."""
        if self.handle.api is None or not self.args.default_constraints:
            return
        core, apps = client.CoreV1Api(self.handle.api), client.AppsV1Api(self.handle.api)
        sources = (
            ("Service", "services", core.list_service_for_all_namespaces),
            ("ReplicationController", "replicationcontrollers", core.list_replication_controller_for_all_namespaces),
            ("ReplicaSet", "replicasets", apps.list_replica_set_for_all_namespaces),
            ("StatefulSet", "statefulsets", apps.list_stateful_set_for_all_namespaces),
        )

        def handler(kind: str) -> Any:
            # through ``apply_object``: the scheduler's decider workers are fed from there
            return lambda event, obj, old: self.apply_object(kind, event, obj)

        informers = [Informer(resource, list_fn, handler(kind)) for kind, resource, list_fn in sources]
        await asyncio.gather(*(i.run(stopping) for i in informers))


def _labels_of(pod: PodInfo) -> Mapping[str, str]:
    labels: Mapping[str, str] = (pod.raw.get("metadata") or {}).get("labels") or {}
    return labels


def _involved(other: PodInfo, pod: PodInfo) -> bool:
    """kube's ``involvedInTopologySpreading``: the pod itself, or a placed pod of its namespace."""
    return other.uid == pod.uid or (bool(other.node_name) and other.namespace == pod.namespace)


def new(args: Mapping[str, Any], handle: fwk.Handle) -> PodTopologySpread:
    return PodTopologySpread(Args.parse(args), handle)
