"""The pods already placed, indexed for the plugins that look at other pods (InterPodAffinity, PodTopologySpread).

kube-scheduler walks every pod of every node for each decision (in parallel goroutines). Here the counts a decision
needs are kept up to date as pods come and go, so a decision costs a few numpy passes over the node rows:

- a *matcher* (namespaces + label selectors) is registered the first time a decision asks for it; from then on
  every pod added, assumed, relabelled or removed updates its per-node count (``NodeCounts``), O(1) per matcher;
- every existing pod's own affinity terms (required anti-affinity, the terms scoring reads) are grouped by term:
  ``groups[(kind, term, weight)]`` counts, per node, the pods carrying that term;
- ``domain_sums`` folds a per-row count into topology domains with one ``np.bincount`` over the table's
  dictionary-encoded label column.

One index per node table (``PodIndex.of(table)``), fed by the table's pod hooks, so both plugins share it.
Label selectors follow ``metav1.LabelSelectorAsSelector``: a missing selector matches nothing, an empty one
everything; ``NotIn``/``DoesNotExist`` match pods without the key.
"""

from __future__ import annotations

import weakref
from abc import abstractmethod
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import IntArray, NodeTable, PodRecord
from crane_scheduler.podinfo import PodInfo

__all__ = [
    "EVERYTHING",
    "NOTHING",
    "AffinityTerm",
    "Matcher",
    "NodeCounts",
    "PodEntry",
    "PodIndex",
    "PodIndexPlugin",
    "PodTerms",
    "Selector",
    "SelectorError",
    "WeightedTerm",
    "domain_sums",
    "parse_selector",
    "pod_terms",
]

_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
MAX_MATCHERS = 1024


class SelectorError(ValueError):
    """A label selector kube's ``LabelSelectorAsSelector`` would refuse."""


@dataclass(frozen=True, slots=True)
class Selector:
    """A parsed label selector: requirements ANDed; ``nothing`` for a missing (nil) selector."""

    requirements: tuple[tuple[str, str, frozenset[str]], ...] = ()
    nothing: bool = False

    @property
    def everything(self) -> bool:
        """kube's ``Selector.Empty()``: no requirement at all (matches every pod)."""
        return not self.nothing and not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.nothing:
            return False
        for key, op, values in self.requirements:
            value = labels.get(key)
            if op == "In":
                if value is None or value not in values:
                    return False
            elif op == "NotIn":
                if value is not None and value in values:
                    return False
            elif op == "Exists":
                if value is None:
                    return False
            elif value is not None:  # DoesNotExist
                return False
        return True

    def with_labels(self, labels: Mapping[str, str]) -> Selector:
        """kube's ``mergeLabelSetWithSelector`` (matchLabelKeys): ``labels`` as In requirements, then ours; a
        nothing-selector stays nothing."""
        if self.nothing or not labels:
            return self
        reqs = tuple((k, "In", frozenset((v,))) for k, v in sorted(labels.items()))
        return Selector(tuple(dict.fromkeys(reqs + self.requirements)))

    def add(self, other: Selector) -> Selector:
        if self.nothing or other.nothing:
            return NOTHING
        return Selector(tuple(dict.fromkeys(self.requirements + other.requirements)))


NOTHING = Selector(nothing=True)
EVERYTHING = Selector()


def selector_from_set(labels: Mapping[str, str]) -> Selector:
    """``labels.Set.AsSelector()``: one In requirement per label (an empty set selects everything)."""
    return Selector(tuple((k, "In", frozenset((v,))) for k, v in sorted(labels.items())))


def parse_selector(raw: Any, path: str = "labelSelector") -> Selector:
    """``metav1.LabelSelectorAsSelector``; raises ``SelectorError`` naming ``path`` for an invalid selector."""
    if raw is None:
        return NOTHING
    if not isinstance(raw, Mapping):
        raise SelectorError(f"{path}: must be a label selector")
    reqs: list[tuple[str, str, frozenset[str]]] = []
    for key, value in sorted((raw.get("matchLabels") or {}).items()):
        reqs.append((str(key), "In", frozenset((str(value),))))
    for i, expr in enumerate(raw.get("matchExpressions") or ()):
        op = expr.get("operator", "")
        values = tuple(str(v) for v in expr.get("values") or ())
        where = f"{path}.matchExpressions[{i}]"
        if op not in _OPERATORS:
            raise SelectorError(f"{where}.operator: {op!r} is not a valid label selector operator")
        if op in ("In", "NotIn") and not values:
            raise SelectorError(f"{where}.values: must be specified when `operator` is 'In' or 'NotIn'")
        if op in ("Exists", "DoesNotExist") and values:
            raise SelectorError(f"{where}.values: may not be specified when `operator` is 'Exists' or 'DoesNotExist'")
        reqs.append((str(expr.get("key", "")), op, frozenset(values)))
    return Selector(tuple(dict.fromkeys(reqs)))


# ---------------------------------------------------------------------------------------------- affinity terms


@dataclass(frozen=True, slots=True)
class AffinityTerm:
    """kube's ``framework.AffinityTerm``: namespaces (the pod's own when neither namespaces nor a namespace
    selector is given), the namespace selector, the pod label selector and the topology key."""

    namespaces: frozenset[str]
    ns_selector: Selector
    selector: Selector
    topology_key: str

    def matches(self, namespace: str, labels: Mapping[str, str], ns_labels: Mapping[str, str] | None) -> bool:
        if namespace in self.namespaces or self.ns_selector.matches(ns_labels or {}):
            return self.selector.matches(labels)
        return False


@dataclass(frozen=True, slots=True)
class WeightedTerm:
    term: AffinityTerm
    weight: int


@dataclass(frozen=True, slots=True)
class PodTerms:
    required_affinity: tuple[AffinityTerm, ...] = ()
    required_anti: tuple[AffinityTerm, ...] = ()
    preferred_affinity: tuple[WeightedTerm, ...] = ()
    preferred_anti: tuple[WeightedTerm, ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.required_affinity or self.required_anti or self.preferred_affinity or self.preferred_anti)


NO_TERMS = PodTerms()


def _term(namespace: str, raw: Mapping[str, Any], path: str) -> AffinityTerm:
    names = raw.get("namespaces") or ()
    ns_raw = raw.get("namespaceSelector")
    namespaces = frozenset((namespace,)) if not names and ns_raw is None else frozenset(str(n) for n in names)
    return AffinityTerm(
        namespaces,
        parse_selector(ns_raw, f"{path}.namespaceSelector"),
        parse_selector(raw.get("labelSelector"), f"{path}.labelSelector"),
        str(raw.get("topologyKey") or ""),
    )


def pod_terms(raw_pod: Mapping[str, Any]) -> PodTerms:
    """The pod's inter-pod (anti-)affinity terms; raises ``SelectorError`` naming the field of a bad selector.

    ``matchLabelKeys``/``mismatchLabelKeys`` need nothing here: since Kubernetes 1.33 the API server merges them
    into ``labelSelector`` when the pod is created, and kube-scheduler reads only ``labelSelector`` (as we do)."""
    spec = raw_pod.get("spec") or {}
    affinity = spec.get("affinity") or {}
    namespace = (raw_pod.get("metadata") or {}).get("namespace") or ""
    out: dict[str, Any] = {}
    for kind, short in (("podAffinity", "affinity"), ("podAntiAffinity", "anti")):
        section = affinity.get(kind) or {}
        base = f"spec.affinity.{kind}"
        req = f"{base}.requiredDuringSchedulingIgnoredDuringExecution"
        out[f"required_{short}"] = tuple(
            _term(namespace, t, f"{req}[{i}]")
            for i, t in enumerate(section.get("requiredDuringSchedulingIgnoredDuringExecution") or ())
        )
        pref = f"{base}.preferredDuringSchedulingIgnoredDuringExecution"
        out[f"preferred_{short}"] = tuple(
            WeightedTerm(
                _term(namespace, w.get("podAffinityTerm") or {}, f"{pref}[{i}].podAffinityTerm"),
                int(w.get("weight") or 0),
            )
            for i, w in enumerate(section.get("preferredDuringSchedulingIgnoredDuringExecution") or ())
        )
    return PodTerms(**out)


_TERMS: dict[str, tuple[Mapping[str, Any], PodTerms | SelectorError]] = {}
_TERMS_MAX = 8192


def terms_of(pod: PodInfo) -> PodTerms:
    """``pod_terms`` memoised per pod object (PreFilter, PreScore and the index's assume all ask for the same pod);
    a new version of the pod (a new raw object from the informer) is parsed again."""
    found = _TERMS.get(pod.uid)
    if found is not None and found[0] is pod.raw:
        result = found[1]
    else:
        try:
            result = pod_terms(pod.raw) if (pod.raw.get("spec") or {}).get("affinity") else NO_TERMS
        except SelectorError as err:
            result = err
        if len(_TERMS) >= _TERMS_MAX:
            _TERMS.clear()
        _TERMS[pod.uid] = (pod.raw, result)
    if isinstance(result, SelectorError):
        raise result
    return result


# ---------------------------------------------------------------------------------------------- the index


@dataclass(slots=True)
class PodEntry:
    uid: str
    namespace: str
    labels: Mapping[str, str]
    node: str
    deleting: bool
    terms: PodTerms

    def same_placement(self, other: PodEntry) -> bool:
        """Equal for every matcher and term group (uid aside)."""
        return (
            self.node == other.node
            and self.namespace == other.namespace
            and self.deleting == other.deleting
            and self.labels == other.labels
            and (self.terms is other.terms or self.terms == other.terms)
        )

    @classmethod
    def of(cls, pod: PodInfo, node: str) -> PodEntry:
        meta = pod.raw.get("metadata") or {}
        try:
            terms = terms_of(pod)
        except SelectorError:
            terms = NO_TERMS  # the API server validates selectors; a bound pod with a bad one constrains nothing
        return cls(pod.uid, pod.namespace, dict(meta.get("labels") or {}), node, pod.deleting, terms)


@dataclass(frozen=True, slots=True)
class Matcher:
    """Pods matching every (namespaces, selector) pair; ``namespaces`` None = any namespace. ``live_only`` leaves
    out pods being deleted (PodTopologySpread's ``countPodsMatchSelector``)."""

    parts: tuple[tuple[frozenset[str] | None, Selector], ...]
    live_only: bool = False

    def matches(self, entry: PodEntry) -> bool:
        if self.live_only and entry.deleting:
            return False
        return all((ns is None or entry.namespace in ns) and sel.matches(entry.labels) for ns, sel in self.parts)


@dataclass(slots=True)
class NodeCounts:
    """A count per node (by name), mirrored as an int64 array over the table's rows. The array is rebuilt only
    when the table's nodes changed; in between, pod events update it in place."""

    by_node: Counter[str] = field(default_factory=Counter)
    total: int = 0
    _array: IntArray | None = None
    _version: int = -1

    def add(self, table: NodeTable, node: str, delta: int) -> None:
        self.by_node[node] += delta
        if not self.by_node[node]:
            del self.by_node[node]
        self.total += delta
        if self._array is not None and self._version == table.nodes_version:
            row = table.rows.get(node)
            if row is not None:
                self._array[row] += delta

    def rows(self, table: NodeTable) -> IntArray:
        if self._array is None or self._version != table.nodes_version or len(self._array) < table.n_rows:
            array = np.zeros(table.n_rows, dtype=np.int64)
            for node, count in self.by_node.items():
                row = table.rows.get(node)
                if row is not None:
                    array[row] = count
            self._array, self._version = array, table.nodes_version
        return self._array[: table.n_rows]


GroupKey = tuple[str, AffinityTerm, int]
"""(kind, term, weight) of an existing pod's term: kind "anti" (required anti-affinity), "affinity" (required
affinity, scored with hardPodAffinityWeight), "preferred" / "preferred-anti" (weight from the term)."""


_INDEXES: weakref.WeakKeyDictionary[NodeTable, PodIndex] = weakref.WeakKeyDictionary()


class PodIndex:
    """Placed pods (bound and assumed) by uid, matcher counts and term groups; see the module docstring."""

    def __init__(self, table: NodeTable) -> None:
        self.table = table
        self.entries: dict[str, PodEntry] = {}
        self._matchers: OrderedDict[Matcher, NodeCounts] = OrderedDict()
        self.groups: dict[GroupKey, NodeCounts] = {}
        self.namespace_labels: dict[str, dict[str, str]] = {}
        table.pod_added.append(lambda pod: self._put(pod, pod.node_name))
        table.pod_assumed.append(self._put)
        table.pod_removed.append(self._remove)
        table.pod_simulated.append(self._simulated)
        for record in table.pods.values():
            if record.pod is not None:
                self._put(record.pod, record.node)

    @classmethod
    def of(cls, table: NodeTable) -> PodIndex:
        index = _INDEXES.get(table)
        if index is None:
            index = _INDEXES[table] = cls(table)
        return index

    # -- namespaces (fed by InterPodAffinity's namespace informer) ------------------------------------------------

    def set_namespace(self, raw: Mapping[str, Any], deleted: bool = False) -> None:
        meta = raw.get("metadata") or {}
        if deleted:
            self.namespace_labels.pop(str(meta.get("name", "")), None)
        else:
            self.namespace_labels[str(meta.get("name", ""))] = dict(meta.get("labels") or {})

    def namespaces_matching(self, selector: Selector) -> frozenset[str]:
        return frozenset(ns for ns, labels in self.namespace_labels.items() if selector.matches(labels))

    # -- queries --------------------------------------------------------------------------------------------------

    def counts(self, matcher: Matcher) -> IntArray:
        """Per-row count of placed pods ``matcher`` selects (registering it on first use)."""
        found = self._matchers.get(matcher)
        if found is None:
            found = NodeCounts()
            for entry in self.entries.values():
                if matcher.matches(entry):
                    found.add(self.table, entry.node, 1)
            self._matchers[matcher] = found
            while len(self._matchers) > MAX_MATCHERS:
                self._matchers.popitem(last=False)
        else:
            self._matchers.move_to_end(matcher)
        return found.rows(self.table)

    def groups_of(self, kinds: Iterable[str]) -> list[tuple[GroupKey, NodeCounts]]:
        wanted = set(kinds)
        return [(key, counts) for key, counts in self.groups.items() if key[0] in wanted and counts.total > 0]

    # -- maintenance ----------------------------------------------------------------------------------------------

    def _put(self, pod: PodInfo, node: str) -> None:
        """Index a placed pod; a new version that changes nothing the index reads (our assumption confirmed by
        the informer, a status update) costs no pass over the matchers."""
        entry = PodEntry.of(pod, node)
        old = self.entries.get(pod.uid)
        if old is not None and old.same_placement(entry):
            self.entries[pod.uid] = entry
            return
        self._remove(pod.uid)
        self.entries[pod.uid] = entry
        self._apply(entry, +1)

    def _remove(self, uid: str) -> None:
        entry = self.entries.pop(uid, None)
        if entry is not None:
            self._apply(entry, -1)

    def _simulated(self, records: list[PodRecord], sign: int) -> None:
        """A what-if on the table (preemption's dry run) took pods out (-1) or put them back (+1)."""
        for record in records:
            if sign < 0:
                self._remove(record.uid)
            elif record.pod is not None:
                self._put(record.pod, record.node)

    def _apply(self, entry: PodEntry, delta: int) -> None:
        table = self.table
        for matcher, counts in self._matchers.items():
            if matcher.matches(entry):
                counts.add(table, entry.node, delta)
        terms = entry.terms
        if not terms.any:
            return
        keys: list[GroupKey] = [("anti", t, 0) for t in terms.required_anti]
        keys += [("affinity", t, 0) for t in terms.required_affinity]
        keys += [("preferred", w.term, w.weight) for w in terms.preferred_affinity]
        keys += [("preferred-anti", w.term, w.weight) for w in terms.preferred_anti]
        for key in keys:
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = NodeCounts()
            group.add(table, entry.node, delta)
            if not group.total:
                del self.groups[key]


def domain_sums(table: NodeTable, per_row: IntArray, key: str, eligible: Any = None) -> tuple[Any, IntArray] | None:
    """(row codes of label ``key``, the sum of ``per_row`` per value code) over live rows with the label (and
    ``eligible``); None when no node has the key."""
    found = table.label_codes(key)
    if found is None:
        return None
    codes, values = found
    use = codes >= 0
    if eligible is not None:
        use &= eligible
    sums = np.bincount(codes[use], weights=per_row[use], minlength=len(values)).astype(np.int64)
    return codes, sums


def per_row(codes: Any, by_code: IntArray) -> IntArray:
    """``by_code[codes]`` with 0 for rows without the label (code -1)."""
    return np.where(codes >= 0, by_code[np.maximum(codes, 0)], 0) if len(by_code) else np.zeros(len(codes), np.int64)


class PodIndexPlugin(
    fwk.PreFilterPlugin,
    fwk.FilterPlugin,
    fwk.PreScorePlugin,
    fwk.NormalizeScorePlugin,
    fwk.QueueingHintPlugin,
    fwk.WorkerPlugin,
    fwk.ObjectPlugin,
    fwk.CrossNodeFilterPlugin,
):
    """What InterPodAffinity and PodTopologySpread share: their extension points, the node table's one
    ``PodIndex``, and their Filter verdict on a node depending on pods of other nodes (``CrossNodeFilterPlugin``:
    preemption dry-runs such pods node by node). Each runs a worker for the objects its selectors resolve against
    (namespaces; the owners of default spread constraints)."""

    reads_other_nodes = True
    POD_EVENTS = fwk.ClusterEvent.POD_ADD | fwk.ClusterEvent.POD_UPDATE | fwk.ClusterEvent.POD_DELETE
    node_events: ClassVar[fwk.ClusterEvent]
    """The node changes ``after_node_change`` judges."""

    def __init__(self, handle: fwk.Handle) -> None:
        self.handle = handle
        self.index = PodIndex.of(handle.table)

    def events_to_register(self) -> fwk.ClusterEvent:
        return self.POD_EVENTS | self.node_events

    def queueing_hints(self) -> fwk.QueueingHints:
        return {self.POD_EVENTS: self.after_pod_change, self.node_events: self.after_node_change}

    @abstractmethod
    def after_pod_change(self, pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
        """kube's ``isSchedulableAfterPodChange`` for this plugin."""

    @abstractmethod
    def after_node_change(self, pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
        """kube's ``isSchedulableAfterNodeChange`` for this plugin."""
