"""One scheduling decision: PreFilter, Filter, node sampling, PreScore, Score, NormalizeScore, select.

Same results as kube-scheduler's ``schedulePod``, computed differently: each Filter plugin answers for every node
at once, and a node's status is the first plugin (in profile order) that rejects it, as kube's per-node loop
would have it. Sampling then takes the first ``numFeasibleNodesToFind`` feasible nodes in rotation order from
``next_start``, exactly the nodes kube-scheduler's parallel search would have accepted, and advances the start
by the number of nodes that search would have examined.

When nothing fits, the ``Diagnosis`` carries the histogram of rejection reasons that becomes the
``0/N nodes are available: ...`` message, and the plugins that rejected nodes (they decide which cluster events
requeue the pod).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from crane_scheduler.framework.interface import PreFilterPlugin
from crane_scheduler.framework.runtime import Observe, Profile
from crane_scheduler.framework.types import (
    EXPLAIN_DECIDER,
    EXPLAIN_FILTERS,
    EXPLAIN_SCORES,
    MAX_NODE_SCORE,
    Code,
    CycleState,
    Diagnosis,
    Rejection,
    Rows,
    Status,
    sooner,
)
from crane_scheduler.nodetable import IntArray, Mask, NodeTable
from crane_scheduler.podinfo import PodInfo
from crane_scheduler.unsupported import GATE, refusal, unsupported_field
from crane_shared.batch import BATCH_CPU, BATCH_MEMORY, batch_refusal, regular_resources_of_batch_pod

BATCH_GATE = "BatchPodResources"
"""the rejector of a batch pod that also requests cpu or memory (``crane_shared.batch.batch_refusal``)"""

MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE = 5


@dataclass
class ScheduleResult:
    node: str
    evaluated: int
    feasible: int


@dataclass(frozen=True, slots=True)
class PreFiltered:
    """PreFilter passed: the node names it restricted the pod to (None: every node)."""

    allowed: frozenset[str] | None


@dataclass(frozen=True, slots=True)
class Hint:
    """A node a decider worker chose for the pod on its replica of the table (``crane_scheduler.deciders``).
    ``fresh``: the worker had seen the node's row as it is here now (no change to it since), so a Filter reading
    only that row would answer as it did there: with every Filter that reads other nodes skipped by PreFilter, the
    hint is taken without filtering. Otherwise the node is filtered alone here, as a nominated node is; a node that
    no longer fits falls back to the whole decision."""

    node: str
    fresh: bool = False


def num_feasible_nodes_to_find(percentage: int, num_nodes: int) -> int:
    """kube's ``numFeasibleNodesToFind``: all below 100 nodes; else ``percentage`` % (adaptive when 0:
    50 - N/125, at least 5 %), and never fewer than 100."""
    if num_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return num_nodes
    if percentage == 0:
        percentage = max(50 - num_nodes // 125, MIN_FEASIBLE_NODES_PERCENTAGE)
    return max(num_nodes * percentage // 100, MIN_FEASIBLE_NODES_TO_FIND)


def sample_feasible(candidates: Rows, feasible: Mask, start: int, want: int) -> tuple[Rows, int]:
    """The first ``want`` feasible rows of ``candidates`` rotated to begin at ``start``, and how many candidates
    a sequential search would have examined to find them."""
    if len(candidates) == 0:
        return candidates, 0
    cut = start % len(candidates)
    order = np.concatenate((candidates[cut:], candidates[:cut])) if cut else candidates  # np.roll, cheaper
    hits = np.flatnonzero(feasible[order])
    if len(hits) > want:
        return order[hits[:want]], int(hits[want - 1]) + 1
    return order[hits], len(order)


def sample_all(candidates: Rows, start: int, want: int) -> tuple[Rows, int]:
    """``sample_feasible`` when every candidate is feasible (no Filter rejected any row): a slice of the rotation."""
    n = len(candidates)
    if n == 0:
        return candidates, 0
    cut = start % n
    if n <= want:
        return (np.concatenate((candidates[cut:], candidates[:cut])) if cut else candidates), n
    end = cut + want
    if end <= n:
        return candidates[cut:end], want
    return np.concatenate((candidates[cut:], candidates[: end - n])), want


def _ignore(point: str, status: str, seconds: float) -> None:
    pass


def nominated_node(pod: PodInfo) -> str:
    return str((pod.raw.get("status") or {}).get("nominatedNodeName") or "")


class Algorithm:
    """The decision for one pod at a time; keeps kube's rotating start index between pods."""

    def __init__(
        self, table: NodeTable, percentage_of_nodes_to_score: int = 0, rng: random.Random | None = None
    ) -> None:
        self.table = table
        self.percentage = percentage_of_nodes_to_score
        self.rng = rng or random.Random()
        self.next_start = 0

    def _candidates(self, allowed: frozenset[str] | None) -> Mask:
        """The live rows, restricted to ``allowed`` (PreFilter's node names) when set."""
        table = self.table
        candidates = table.live.copy()
        if allowed is not None:
            pinned = np.zeros(table.n_rows, dtype=bool)
            pinned[[table.rows[n] for n in allowed if n in table.rows]] = True
            candidates &= pinned
        return candidates

    def _pre_filter(
        self,
        plugins: list[PreFilterPlugin],
        state: CycleState,
        pod: PodInfo,
        skipped: set[str],
        restricting: list[str],
        allowed: frozenset[str] | None,
        t0: float,
    ) -> PreFiltered | Diagnosis | Status:
        """PreFilter of ``plugins`` in order (kube's ``RunPreFilterPlugins``): SKIPs into ``skipped``, node-name
        restrictions intersected into the result, the first rejection or error returned."""
        table = self.table
        for pl in plugins:
            res = pl.pre_filter(state, pod, table)
            if res.status.code is Code.SKIP:
                skipped.add(pl.name)
            elif res.status.rejected:
                self._observe("PreFilter", res.status.code.value, time.perf_counter() - t0)
                resolvable = res.status.code is Code.UNSCHEDULABLE
                return Diagnosis(
                    table.num_nodes,
                    rejectors={pl.name},
                    pre_filter_msg=res.status.message,
                    preemptible=table.live.copy() if resolvable else np.zeros(table.n_rows, dtype=bool),
                )
            elif not res.status.success:
                self._observe("PreFilter", "Error", time.perf_counter() - t0)
                return Status(Code.ERROR, res.status.reasons, pl.name)
            if res.node_names is not None:
                restricting.append(pl.name)
                allowed = res.node_names if allowed is None else allowed & res.node_names
                if not allowed:
                    msg = (
                        f"node(s) didn't satisfy plugin {pl.name}"
                        if len(restricting) == 1
                        else f"node(s) didn't satisfy plugin(s) [{' '.join(restricting)}] simultaneously"
                    )
                    return Diagnosis(table.num_nodes, rejectors=set(restricting), pre_filter_msg=msg)
        return PreFiltered(allowed)

    @staticmethod
    def _left_out(profile: Profile, skipped: set[str]) -> list[PreFilterPlugin]:
        """The PreFilters a worker's fresh answer left out (``Profile.decider_pre_filter``), to run once that answer
        is not taken as it is (their SKIPs taken back out of ``skipped``): for the pod the worker placed they
        cannot reject; their state and node names join the cycle's."""
        ran = {p.name for p in profile.decider_pre_filter[0]}
        rest = [p for p in profile.pre_filter if p.name not in ran]
        skipped.difference_update(p.name for p in rest)
        return rest

    def schedule(
        self,
        profile: Profile,
        pod: PodInfo,
        state: CycleState,
        observe: Observe | None = None,
        hint: Hint | None = None,
    ) -> ScheduleResult | Diagnosis | Status:
        """A node, or a Diagnosis when none fits, or an error Status (plugin failure). ``observe`` receives
        each extension point's duration (for the metrics); ``hint``: a decider worker's choice, checked first
        (``Hint``)."""
        table = self.table
        self._observe = observe or _ignore
        if table.num_nodes == 0:
            return Diagnosis(0)
        field = unsupported_field(pod.raw, profile.supported_fields)
        if field is not None:  # refused, never placed as if the field were absent
            return Diagnosis(table.num_nodes, rejectors={GATE}, pre_filter_msg=refusal(field))
        requests = pod.requests
        if BATCH_CPU in requests or BATCH_MEMORY in requests:  # a batch pod: BestEffort, or refused
            field = regular_resources_of_batch_pod(pod.raw.get("spec"))
            if field is not None:
                return Diagnosis(table.num_nodes, rejectors={BATCH_GATE}, pre_filter_msg=batch_refusal(field))
        t0 = time.perf_counter()
        skipped: set[str] = set()
        restricting: list[str] = []
        checking = hint is not None and hint.fresh
        if checking:  # a worker's fresh answer: the PreFilters that read only this pod object answered there
            pre_filters, skips = profile.decider_pre_filter
            skipped.update(skips)
        else:
            pre_filters = profile.pre_filter
        found = self._pre_filter(pre_filters, state, pod, skipped, restricting, None, t0)
        if not isinstance(found, PreFiltered):
            return found
        allowed = found.allowed
        t1 = time.perf_counter()
        self._observe("PreFilter", "Success", t1 - t0)

        candidates = self._candidates(allowed)
        if hint is not None:
            hint_row = table.rows.get(hint.node, -1)
            if hint_row >= 0 and candidates[hint_row] and hint.fresh and profile.other_nodes_filters <= skipped:
                state[EXPLAIN_DECIDER] = "a decider worker's node, its row unchanged since the worker's view"
                self._observe("Filter", "Success", time.perf_counter() - t1)
                return ScheduleResult(hint.node, 1, 1)
            if checking:  # not taken as it is: the PreFilters left out run now, and the cycle goes on as for any pod
                found = self._pre_filter(
                    self._left_out(profile, skipped), state, pod, skipped, restricting, allowed, t0
                )
                if not isinstance(found, PreFiltered):
                    return found
                allowed = found.allowed
                order = {p.name: i for i, p in enumerate(profile.pre_filter)}
                restricting.sort(key=lambda name: order.get(name, len(order)))
                candidates = self._candidates(allowed)
            if hint_row >= 0 and candidates[hint_row]:
                only = np.zeros(table.n_rows, dtype=bool)
                only[hint_row] = True
                rejected = profile.run_filter_plugins(state, pod, table, only, skipped)
                if only[hint_row] and filter_error(rejected) is None:
                    state[EXPLAIN_FILTERS] = rejected
                    state[EXPLAIN_DECIDER] = "a decider worker's node, filtered again here (its row had changed)"
                    self._observe("Filter", "Success", time.perf_counter() - t1)
                    return ScheduleResult(hint.node, 1, 1)
            # taken by another worker's pod meanwhile: the whole decision, here
        excluded_by = sorted(restricting) if allowed is not None else []
        own = table.nominated.get(pod.uid)
        nominated_row = table.rows.get(own[1] if own else nominated_node(pod), -1)
        if nominated_row >= 0 and candidates[nominated_row]:
            # kube's evaluateNominatedNode: the node preemption made room on is tried alone first, so only the
            # pods nominated there are added for the second pass (with every preemptor nominated somewhere,
            # adding them on all nodes made a retry cost 9 ms at 500 nodes); if it does not fit, all nodes are.
            only = np.zeros(table.n_rows, dtype=bool)
            only[nominated_row] = True
            rejected = profile.run_filter_plugins(state, pod, table, only, skipped)
            failed = filter_error(rejected)
            if failed is not None:
                return failed
            if only[nominated_row]:
                state[EXPLAIN_FILTERS] = rejected
                self._observe("Filter", "Success", time.perf_counter() - t1)
                return ScheduleResult(table.names[nominated_row], 1, 1)
        alive = candidates.copy()
        rejected = profile.run_filter_plugins(state, pod, table, alive, skipped)
        state[EXPLAIN_FILTERS] = rejected  # references only: kept for explain, costs nothing per node
        failed = filter_error(rejected)
        if failed is not None:
            self._observe("Filter", "Error", time.perf_counter() - t1)
            return failed
        cand_rows = np.flatnonzero(candidates)
        want = num_feasible_nodes_to_find(
            profile.percentage_of_nodes_to_score
            if profile.percentage_of_nodes_to_score is not None
            else self.percentage,
            len(cand_rows),
        )
        if rejected:
            rows, processed = sample_feasible(cand_rows, alive, self.next_start, want)
        else:  # nothing filtered out: every candidate is feasible
            rows, processed = sample_all(cand_rows, self.next_start, want)
        self.next_start = (self.next_start + processed) % table.num_nodes
        t2 = time.perf_counter()
        self._observe("Filter", "Success", t2 - t1)

        if len(rows) == 0:
            diagnosis = Diagnosis(table.num_nodes)
            for name, rejections, before in rejected:
                for r in rejections:
                    count = int(np.count_nonzero(r.mask & before))
                    if count:
                        diagnosis.reasons[r.reason] += count
                        diagnosis.rejectors.add(name)
                        diagnosis.retry_after = sooner(diagnosis.retry_after, r.lifts_in())
            outside = table.num_nodes - len(cand_rows)
            if outside:
                diagnosis.reasons[f"node(s) didn't satisfy plugin(s) [{' '.join(excluded_by)}]"] += outside
                diagnosis.rejectors.update(excluded_by)
            unresolvable = np.zeros(table.n_rows, dtype=bool)
            for _, rejections, before in rejected:
                for r in rejections:
                    if r.unresolvable:
                        unresolvable |= r.mask & before
            diagnosis.preemptible = candidates & ~unresolvable
            return diagnosis
        if len(rows) == 1:
            return ScheduleResult(table.names[int(rows[0])], processed, 1)

        scored = self.score(profile, pod, state, rows)
        if isinstance(scored, Status):
            return scored
        self._observe("Score", "Success", time.perf_counter() - t2)
        best = np.flatnonzero(scored == scored.max())
        pick = int(best[self.rng.randrange(len(best))]) if len(best) > 1 else int(best[0])
        return ScheduleResult(table.names[int(rows[pick])], processed, len(rows))

    def score(self, profile: Profile, pod: PodInfo, state: CycleState, rows: Rows) -> IntArray | Status:
        skipped = set()
        for pre in profile.pre_score:
            status = pre.pre_score(state, pod, self.table, rows)
            if status.code is Code.SKIP:
                skipped.add(pre.name)
            elif not status.success:
                return Status(Code.ERROR, status.reasons, pre.name)
        explained: list[tuple[str, int, IntArray]] = []
        for pl, weight in profile.score:
            if pl.name in skipped:
                continue
            scores = pl.score(state, pod, self.table, rows)
            normalize = getattr(pl, "normalize_score", None)  # NormalizeScorePlugin; isinstance() is slow
            if normalize is not None:
                scores = normalize(state, pod, scores)
            explained.append((pl.name, weight, scores))
        if not explained or not len(rows):
            state[EXPLAIN_SCORES] = (rows, explained)
            return np.zeros(len(rows), dtype=np.int64)
        # One pass over every plugin's scores (numpy's cost per call dominates at a few hundred rows): the range
        # check, then the weighted sum.
        matrix = np.stack([scores for _, _, scores in explained])
        if matrix.min() < 0 or matrix.max() > MAX_NODE_SCORE:
            name = next(n for n, _, sc in explained if sc.min() < 0 or sc.max() > MAX_NODE_SCORE)
            return Status(Code.ERROR, (f"plugin {name} returned a score outside [0, 100]",), name)
        weights = np.array([weight for _, weight, _ in explained], dtype=np.int64)
        total: IntArray = weights @ matrix
        # What explain keeps of the last 2,000 decisions, as copies and compact: ``rows`` is a view of the decision's
        # array of every candidate row (``sample_all`` slices it), so keeping it kept that array (120 KB at 15,000
        # nodes) alive per record; and the scores are in [0, 100] once checked, uint8 rather than eight plugins'
        # int64 (48 KB a decision at 750 scored rows). Together ~280 MB of the log after a burst at 15,000 nodes.
        compact = matrix.astype(np.uint8)
        state[EXPLAIN_SCORES] = (
            rows.astype(np.int32),
            [(name, weight, compact[k]) for k, (name, weight, _) in enumerate(explained)],
        )
        return total


def filter_error(rejected: list[tuple[str, list[Rejection], Mask]]) -> Status | None:
    """kube's ``RunFilterPlugins`` error: a Filter plugin that failed (not rejected) on a node it ran on fails the
    attempt, ``running "<plugin>" filter plugin: <error>``; the lowest such row is the one reported (kube's
    first node in its walk)."""
    first: tuple[int, str, str] | None = None
    for name, rejections, before in rejected:
        for r in rejections:
            if not r.error:
                continue
            rows = np.flatnonzero(r.mask & before)
            if len(rows) and (first is None or int(rows[0]) < first[0]):
                first = (int(rows[0]), name, r.reason)
    if first is None:
        return None
    return Status(Code.ERROR, (f'running "{first[1]}" filter plugin: {first[2]}',), first[1])
