"""InterPodAffinity with kube-scheduler 1.35 semantics (``pkg/scheduler/framework/plugins/interpodaffinity``).

Filter: the incoming pod's required affinity (every term's topology domain must hold a pod matching *all* terms;
the first pod of a group that matches its own terms may start anywhere with the topology keys), its required
anti-affinity, and existing pods' required anti-affinity against the incoming pod (symmetry). Score: the incoming
pod's preferred terms over all placed pods, plus existing pods' required affinity (``hardPodAffinityWeight``) and
preferred terms matching the incoming pod, summed per topology domain, then min-max normalised to 0..100.

Same results as kube's per-node loops, computed per domain: the shared ``PodIndex`` keeps per-node counts of the
pods each term selects (updated on pod add/remove), ``np.bincount`` folds them into domains, and one lookup per
row broadcasts the domain's verdict. A term's ``namespaceSelector`` is resolved against the namespaces watched here.
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
from crane_scheduler.plugins.podindex import (
    AffinityTerm,
    Matcher,
    PodIndexPlugin,
    PodTerms,
    SelectorError,
    domain_sums,
    per_row,
    terms_of,
)
from crane_scheduler.podinfo import NodeInfo, PodInfo
from crane_shared.informer import EventType, Informer

NAME = "InterPodAffinity"
REASON_AFFINITY = "node(s) didn't match pod affinity rules"
REASON_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
REASON_EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
_FILTER = "InterPodAffinity.filter"
_SCORE = "InterPodAffinity.score"


@dataclass(frozen=True)
class Args:
    hard_pod_affinity_weight: int = 1
    ignore_preferred_terms_of_existing_pods: bool = False

    @classmethod
    def parse(cls, args: Mapping[str, Any]) -> Args:
        problems = [
            (k, "unknown field")
            for k in args
            if k not in ("hardPodAffinityWeight", "ignorePreferredTermsOfExistingPods")
        ]
        weight = args.get("hardPodAffinityWeight", 1)
        if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= 100:
            problems.append(("hardPodAffinityWeight", f"not in valid range [0, 100], got {weight!r}"))
        ignore = args.get("ignorePreferredTermsOfExistingPods", False)
        if not isinstance(ignore, bool):
            problems.append(("ignorePreferredTermsOfExistingPods", f"must be true or false, got {ignore!r}"))
        if problems:
            raise fwk.ArgsError(problems)
        return cls(weight, ignore)


def _own_labels(pod: PodInfo) -> Mapping[str, str]:
    return (pod.raw.get("metadata") or {}).get("labels") or {}


def after_node_change(pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
    """kube's ``isSchedulableAfterNodeChange``: for a required affinity term, a node added with its topology key,
    or updated to get the key or a different value; for a required anti-affinity term, any added node, or one
    updated to lose the key or change its value."""
    old, new = change.old, change.new
    if not isinstance(new, NodeInfo):
        return fwk.QueueingHint.QUEUE
    terms = terms_of(pod)
    before = old.labels if isinstance(old, NodeInfo) else None
    for t in terms.required_affinity:
        key = t.topology_key
        if before is None:
            if key in new.labels:
                return fwk.QueueingHint.QUEUE
            continue
        if key in new.labels and (key not in before or before[key] != new.labels[key]):
            return fwk.QueueingHint.QUEUE
    for t in terms.required_anti:
        key = t.topology_key
        if before is None:
            return fwk.QueueingHint.QUEUE
        if key in before and (key not in new.labels or before[key] != new.labels[key]):
            return fwk.QueueingHint.QUEUE
    return fwk.QueueingHint.SKIP


class InterPodAffinity(PodIndexPlugin):
    name = NAME
    node_events = fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE
    after_node_change = staticmethod(after_node_change)

    def __init__(self, args: Args, handle: fwk.Handle) -> None:
        super().__init__(handle)
        self.args = args

    # -- namespaces -----------------------------------------------------------------------------------------------

    def _matcher(self, term: AffinityTerm) -> tuple[frozenset[str] | None, Any]:
        """The incoming pod's term after kube's ``mergeAffinityTermNamespacesIfNotEmpty``: the namespaces its
        namespace selector selects now join ``namespaces`` and the selector is spent (``Nothing``); an empty
        selector (``{}``) is left as it is, so it admits every namespace, known or not.

        Kubernetes 1.37 (the judge's release) merges into the term itself. 1.35 took the term by value, so the
        selector outlived the merge and was matched against *nil* namespace labels: there a selector matching an
        empty label set (``NotIn``, ``DoesNotExist``) admitted every namespace, which crane copied until 1.37."""
        if term.ns_selector.nothing:
            return term.namespaces, term.selector
        if term.ns_selector.everything:
            return None, term.selector
        return term.namespaces | self.index.namespaces_matching(term.ns_selector), term.selector

    def _counts(self, *terms: AffinityTerm) -> IntArray:
        return self.index.counts(Matcher(tuple(self._matcher(t) for t in terms)))

    def _self_matches_all(self, pod: PodInfo, terms: tuple[AffinityTerm, ...]) -> bool:
        labels = _own_labels(pod)
        for t in terms:
            ns, sel = self._matcher(t)
            if not ((ns is None or pod.namespace in ns) and sel.matches(labels)):
                return False
        return True

    # -- filter ---------------------------------------------------------------------------------------------------

    def pre_filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> fwk.PreFilterResult:
        try:
            terms = terms_of(pod)
        except SelectorError as err:
            return fwk.PreFilterResult(fwk.unschedulable(f"parsing pod: {err}", unresolvable=True))
        placed_anti = self.index.groups_of(("anti",))
        if not placed_anti and not terms.required_affinity and not terms.required_anti:
            return fwk.PreFilterResult(fwk.SKIP)  # most pods: no terms, and no placed pod with anti-affinity
        ns_labels = self.index.namespace_labels.get(pod.namespace)
        labels = _own_labels(pod)
        n = table.n_rows
        existing = np.zeros(n, dtype=bool)
        any_existing = False
        for (_, term, _), counts in placed_anti:
            if not term.matches(pod.namespace, labels, ns_labels):
                continue
            found = domain_sums(table, counts.rows(table), term.topology_key)
            if found is None:
                continue
            codes, sums = found
            if sums.any():
                any_existing = True
                existing |= per_row(codes, sums) > 0
        if not any_existing and not terms.required_affinity and not terms.required_anti:
            return fwk.PreFilterResult(fwk.SKIP)
        affinity = self._affinity_fails(pod, terms, table) if terms.required_affinity else np.zeros(n, dtype=bool)
        anti = np.zeros(n, dtype=bool)
        for term in terms.required_anti:
            found = domain_sums(table, self._counts(term), term.topology_key)
            if found is not None:
                anti |= per_row(found[0], found[1]) > 0
        anti &= ~affinity
        existing &= ~(affinity | anti)
        state[_FILTER] = [
            fwk.Rejection(REASON_AFFINITY, affinity, unresolvable=True),
            fwk.Rejection(REASON_ANTI_AFFINITY, anti),
            fwk.Rejection(REASON_EXISTING_ANTI_AFFINITY, existing),
        ]
        return fwk.PreFilterResult()

    def _affinity_fails(self, pod: PodInfo, terms: PodTerms, table: NodeTable) -> Mask:
        """kube's ``satisfyPodAffinity`` for every row at once; True = the node fails."""
        n = table.n_rows
        counts = self._counts(*terms.required_affinity)  # pods matching *all* the terms
        has_keys = np.ones(n, dtype=bool)
        pods_exist = np.ones(n, dtype=bool)
        any_count = False
        for term in terms.required_affinity:
            found = domain_sums(table, counts, term.topology_key)
            if found is None:
                has_keys[:] = False
                continue
            codes, sums = found
            any_count |= bool(sums.any())
            has_keys &= codes >= 0
            pods_exist &= per_row(codes, sums) > 0
        if not any_count and self._self_matches_all(pod, terms.required_affinity):
            return ~has_keys  # the first pod of a group that matches its own terms
        return ~(has_keys & pods_exist)

    def filter(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable) -> list[fwk.Rejection]:
        rejections: list[fwk.Rejection] = state.get(_FILTER, [])
        return [r for r in rejections if r.mask.any()]

    # -- score ----------------------------------------------------------------------------------------------------

    def pre_score(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> fwk.Status:
        try:
            terms = terms_of(pod)
        except SelectorError as err:
            return fwk.error(f"failed to parse pod: {err}")
        has_constraints = bool(terms.preferred_affinity or terms.preferred_anti)
        if self.args.ignore_preferred_terms_of_existing_pods and not has_constraints:
            return fwk.SKIP
        scores: dict[str, IntArray] = {}  # topology key -> score per value code
        any_entry = False

        def add(key: str, per_node: IntArray, weight: int) -> None:
            nonlocal any_entry
            found = domain_sums(table, per_node, key)
            if found is None or not found[1].any():
                return
            any_entry = True
            sums = found[1]
            current = scores.get(key)
            if current is None or len(current) < len(sums):
                grown = np.zeros(len(sums), dtype=np.int64)
                if current is not None:
                    grown[: len(current)] = current
                current = grown
            current[: len(sums)] += weight * sums
            scores[key] = current

        for w in terms.preferred_affinity:
            add(w.term.topology_key, self._counts(w.term), w.weight)
        for w in terms.preferred_anti:
            add(w.term.topology_key, self._counts(w.term), -w.weight)
        ns_labels = self.index.namespace_labels.get(pod.namespace)
        labels = _own_labels(pod)
        hard = self.args.hard_pod_affinity_weight
        for (kind, term, weight), counts in self.index.groups_of(("affinity", "preferred", "preferred-anti")):
            if kind == "affinity":
                if hard <= 0:
                    continue
                weight = hard
            elif kind == "preferred-anti":
                weight = -weight
            if term.matches(pod.namespace, labels, ns_labels):
                add(term.topology_key, counts.rows(table), weight)
        if not any_entry:
            return fwk.SKIP
        total = np.zeros(len(rows), dtype=np.int64)
        for key, by_code in scores.items():
            found = table.label_codes(key)
            if found is not None:
                total += per_row(found[0][rows], by_code)
        state[_SCORE] = total
        return fwk.SUCCESS

    def score(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> IntArray:
        scores: IntArray = state[_SCORE]
        return scores

    def normalize_score(self, state: fwk.CycleState, pod: PodInfo, scores: IntArray) -> IntArray:
        """Min-max to 0..100 in float64, truncated (kube's ``NormalizeScore``)."""
        if not len(scores):
            return scores
        low, high = int(scores.min()), int(scores.max())
        if high == low:
            return np.zeros(len(scores), dtype=np.int64)
        return (float(fwk.MAX_NODE_SCORE) * ((scores - low).astype(np.float64) / float(high - low))).astype(np.int64)

    # -- queueing and the namespace watch -------------------------------------------------------------------------

    def after_pod_change(self, pod: PodInfo, change: fwk.ClusterChange) -> fwk.QueueingHint:
        """kube's ``isSchedulableAfterPodChange``: a placed pod added that matches all the pod's required affinity
        terms, updated to match them or to stop matching all its anti-affinity terms, or deleted while matching
        all its anti-affinity terms. One addition: a placed pod deleted whose own required anti-affinity selected
        the pod (the symmetric rejection, "existing pods anti-affinity rules") also requeues it; kube's hint
        skips that deletion, leaving the pod to the 5-minute flush (a wake-up more than kube, never one fewer)."""
        old, new = change.old, change.new
        if (isinstance(new, PodInfo) and not new.node_name) or (isinstance(old, PodInfo) and not old.node_name):
            return fwk.QueueingHint.SKIP
        terms = terms_of(pod)  # a bad selector raises: the queue requeues the pod, as kube on an error
        affinity, anti = terms.required_affinity, terms.required_anti
        if isinstance(old, PodInfo) and isinstance(new, PodInfo):
            if not _matches_all(affinity, old) and _matches_all(affinity, new):
                return fwk.QueueingHint.QUEUE
            if _matches_all(anti, old) and not _matches_all(anti, new):
                return fwk.QueueingHint.QUEUE
            return fwk.QueueingHint.SKIP
        if isinstance(new, PodInfo):
            return fwk.QueueingHint.QUEUE if _matches_all(affinity, new) else fwk.QueueingHint.SKIP
        if not isinstance(old, PodInfo):
            return fwk.QueueingHint.QUEUE
        if _matches_all(anti, old):
            return fwk.QueueingHint.QUEUE
        ns_labels = self.index.namespace_labels.get(pod.namespace)
        labels = _own_labels(pod)
        try:
            theirs = terms_of(old).required_anti
        except SelectorError:
            return fwk.QueueingHint.SKIP  # a placed pod with a bad selector constrains nothing (PodEntry.of)
        hated = any(t.matches(pod.namespace, labels, ns_labels) for t in theirs)
        return fwk.QueueingHint.QUEUE if hated else fwk.QueueingHint.SKIP

    object_kinds = ("Namespace",)

    def apply_object(self, kind: str, event: EventType, obj: dict[str, Any]) -> None:
        self.index.set_namespace(obj, deleted=event == "DELETED")

    def objects_listed(self) -> None:
        pass

    async def run(self, stopping: asyncio.Event) -> None:
        """Watch namespaces (their labels resolve ``namespaceSelector``); nothing to do without an API."""
        if self.handle.api is None:
            return
        # through ``apply_object``: the scheduler's decider workers are fed from there
        informer = Informer(
            "namespaces",
            client.CoreV1Api(self.handle.api).list_namespace,
            lambda event, obj, old: self.apply_object("Namespace", event, obj),
        )
        await informer.run(stopping)


def _matches_all(terms: tuple[AffinityTerm, ...], other: PodInfo) -> bool:
    """kube's ``podMatchesAllAffinityTerms``: false without terms; the incoming pod's namespace selector is
    matched against no labels there (kube passes nil namespace labels)."""
    if not terms:
        return False
    labels = _own_labels(other)
    return all(t.matches(other.namespace, labels, None) for t in terms)


def new(args: Mapping[str, Any], handle: fwk.Handle) -> InterPodAffinity:
    return InterPodAffinity(Args.parse(args), handle)
