"""This scheduler's recent bindings, folded into per-node columns when they change, not per decision.

A recent binding changes a node's load in two ways (``dynamic.node_load`` is the reference):

- estimated usage, per metric: ``Σ factor·request·(1 - clamp((T - bound_at)/W, 0, 1)) / allocatable``, where
  ``T`` is the metric annotation's timestamp. It depends on the bindings, the annotation and the allocatable, and
  not on the clock: the decay over the window is measured against the annotation's stamp (what the averaged
  metric has absorbed), so the value is exact until one of those inputs changes. It is recomputed for one node
  when a binding to it is added, removed, pruned or departed (its pod deleted or terminal: ``depart``), or its
  annotations or allocatable change; for a binding added, removed or departed, by the next decision that reads
  it, as of the change's time (Reserve only marks the row: with decider workers the scheduling process may read
  none before many more binds). With the policy's ``newNodes.estimate``, a node annotated with no metric yet (a
  new node) has no stamp: each metric's estimate is ``Σ factor·request / allocatable`` over the bindings with
  ``now < bound_at + W`` (nothing absorbed), ``judged`` marks it, and it also changes at each ``bound_at + W`` (a
  step, kept with the hot value's next change time below);
- own bindings in the hot value: ``Σ_rules floor(#{b : b > after, b > now - range} / count)``, with ``after``
  the hot-value annotation's stamp while it is fresh. This one depends on the clock, but only in steps: it is
  piecewise constant and can change only at ``bound_at + range`` of a binding, or when the hot-value annotation
  turns fresh (``stamp - max_skew``) or stale (``stamp + 5m``). Each node keeps its value and its next possible
  change time; a decision recomputes only the nodes whose next change time has passed (amortised: each binding
  causes at most one recomputation per rule), everything else is a vector read.

A binding may belong to a gang (``group``): with Dynamic's ``gangHotValue: together`` a member's score leaves its
own group's bindings out of the hot value (``own_hot_without``, recomputed for the few rows holding them), so the
members of one gang cycle are not pushed apart by each other; the estimate still counts every member.

A departed binding (its pod seen deleted, or terminal: the pod watch drops it) adds nothing to the estimate from
then on, on any node: the pod runs no more, and on a new node its estimate was all that judged it. It still
counts in the hot value until its range passes, as its ``Scheduled`` event does in the annotator's hot value.

Per decision the cost is therefore a comparison over the node table, independent of how many pods were bound
recently. The per-node recomputation repeats the reference's arithmetic in the reference's order (bindings in time
order, the same float expressions), so the cached values are bit-identical to ``node_load``'s; the property tests
in ``tests/unit/loadaware/test_columns.py`` hold them equal at random times, bindings and annotation changes.
Change times are taken ``EARLY`` seconds early, so a float rounding in ``stamp - skew`` can only cause an extra
recomputation, never a stale value.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import ItemsView
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from crane_scheduler.loadaware.columns import FloatArray, LoadColumns, Mask
from crane_shared.annotations import HOT_VALUE_FRESHNESS, HOT_VALUE_KEY
from crane_shared.loadaware.dynamic import RecentBinding, new_node_window, resource_of

EARLY = 1e-3
"""Seconds by which a next-change time is brought forward (float-rounding margin; costs a recomputation)."""


@dataclass
class _Binding:
    uid: str
    bound_at: float
    cpu: float
    memory: float
    learned: bool = False
    """``cpu``/``memory`` are the workload's learned usage (no factor)"""
    group: str | None = None
    """the gang the pod belongs to (``gangHotValue: together``)"""
    left: bool = False
    """the pod was seen deleted or terminal: no estimate, still in the hot value (``depart``)"""


@dataclass
class _Node:
    name: str
    bindings: list[_Binding] = field(default_factory=list)
    """oldest first (added in clock order; a rare out-of-order add is inserted in place)"""


class RecentEffects:
    """Recent bindings per node row and their cached effects: ``extra[metric]`` (estimated usage to add, as a
    fraction of allocatable), ``judged[metric]`` (a new node, no metric annotated, and bindings count: its usage is
    ``0 + extra``) and ``own_hot`` (own bindings in the hot value), arrays over the node rows."""

    def __init__(self, cols: LoadColumns, capacity: int = 64) -> None:
        self.cols = cols
        self._cap = capacity
        self.extra: dict[str, FloatArray] = {}
        self.judged: dict[str, Mask] = {}
        for metric in cols.metrics:
            if resource_of(metric) is not None:
                self.extra[metric] = np.zeros(capacity)
                self.judged[metric] = np.zeros(capacity, dtype=bool)
        self.own_hot = np.zeros(capacity)
        self.own_next = np.full(capacity, math.inf)
        """the row's next possible change with the clock: its own hot value, or a binding leaving a judged metric"""
        self.estimated_at = np.zeros(capacity)
        """when each row's estimate was computed (a judged metric's bindings count while ``now < bound_at + W``)"""
        self._est_next = np.full(capacity, math.inf)
        self.alloc_cpu = np.zeros(capacity)
        self.alloc_memory = np.zeros(capacity)
        self._nodes: dict[int, _Node] = {}
        self._where: dict[str, int] = {}
        self._groups: dict[str, set[str]] = {}
        """gang -> uids of its members' bindings still held"""
        self._group_of: dict[str, str] = {}
        self._order: deque[tuple[float, str]] = deque()
        self.recomputed = 0
        """rows whose own hot value was recomputed at decision time (a cost counter for tests and benches)"""
        self.changed: set[int] = set()
        """rows whose ``extra`` or ``own_hot`` may have changed since the consumer last cleared this"""
        self._stale: dict[int, float] = {}
        """rows whose effects an input change left to recompute, with the time of that (last) change: done by the
        next reader (``_flush``), not by the change (Reserve, on the scheduling process's critical path)"""
        self._plan_of: object = None
        self._metric_plan: tuple[tuple[str, bool, float, float], ...] = ()

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, uid: object) -> bool:
        return uid in self._where

    def rows(self) -> set[int]:
        """The rows with recent bindings."""
        return set(self._nodes)

    def placed(self) -> ItemsView[str, int]:
        """(uid, row) of every recent binding."""
        return self._where.items()

    # -- inputs ---------------------------------------------------------------------------------------------------

    def _ensure(self, row: int) -> None:
        if row < self._cap:
            return
        cap = max(row + 1, 2 * self._cap)
        for name, arr in self.extra.items():
            self.extra[name] = _grown(arr, cap, 0.0)
        for name, mask in self.judged.items():
            grown = np.zeros(cap, dtype=bool)
            grown[: len(mask)] = mask
            self.judged[name] = grown
        self.estimated_at = _grown(self.estimated_at, cap, 0.0)
        self._est_next = _grown(self._est_next, cap, math.inf)
        self.own_hot = _grown(self.own_hot, cap, 0.0)
        self.own_next = _grown(self.own_next, cap, math.inf)
        self.alloc_cpu = _grown(self.alloc_cpu, cap, 0.0)
        self.alloc_memory = _grown(self.alloc_memory, cap, 0.0)
        self._cap = cap

    def node_changed(self, row: int, name: str, cpu: float, memory: float, now: float) -> None:
        """A node's annotations or allocatable changed (``cols`` already decoded): refresh its effects.

        A row reused by another node forgets the previous node's bindings."""
        self._ensure(row)
        self.alloc_cpu[row], self.alloc_memory[row] = cpu, memory
        node = self._nodes.get(row)
        if node is not None and node.name != name:
            for b in node.bindings:
                self._forget(b.uid)
            del self._nodes[row]
        self._refresh(row, now)

    def add(
        self,
        uid: str,
        row: int,
        name: str,
        bound_at: float,
        cpu: float,
        memory: float,
        learned: bool = False,
        group: str | None = None,
    ) -> None:
        self._ensure(row)
        if uid in self._where:
            self.remove(uid, bound_at)
        node = self._nodes.get(row)
        if node is None or node.name != name:
            node = self._nodes[row] = _Node(name)
        binding = _Binding(uid, bound_at, cpu, memory, learned, group)
        if node.bindings and node.bindings[-1].bound_at > bound_at:
            i = len(node.bindings)
            while i > 0 and node.bindings[i - 1].bound_at > bound_at:
                i -= 1
            node.bindings.insert(i, binding)
        else:
            node.bindings.append(binding)
        self._where[uid] = row
        if group is not None:
            self._groups.setdefault(group, set()).add(uid)
            self._group_of[uid] = group
        self._order.append((bound_at, uid))
        self._mark(row, bound_at)

    def _forget(self, uid: str) -> int | None:
        """Drop ``uid`` from the indexes; its row, None when unknown."""
        row = self._where.pop(uid, None)
        group = self._group_of.pop(uid, None)
        if group is not None:
            uids = self._groups[group]
            uids.discard(uid)
            if not uids:
                del self._groups[group]
        return row

    def remove(self, uid: str, now: float) -> None:
        row = self._forget(uid)
        if row is None:
            return
        node = self._nodes[row]
        node.bindings = [b for b in node.bindings if b.uid != uid]
        self._mark(row, now)

    def depart(self, uid: str, now: float) -> bool:
        """The pod ``uid`` was seen deleted or terminal: its estimate leaves its node now; it stays in the hot value
        until pruned. True when it was a binding whose estimate counted (a refusal may have lifted)."""
        row = self._where.get(uid)
        if row is None:
            return False
        binding = next((b for b in self._nodes[row].bindings if b.uid == uid), None)
        if binding is None or binding.left:
            return False
        binding.left = True
        self._mark(row, now)
        return True

    def prune(self, before: float, now: float) -> None:
        """Forget bindings at or before ``before`` (outside every window); amortised O(1) per binding."""
        touched: set[int] = set()
        order = self._order
        while order and order[0][0] <= before:
            bound_at, uid = order.popleft()
            row = self._where.get(uid)
            if row is None:
                continue  # removed (unreserved) meanwhile
            node = self._nodes[row]
            kept = [b for b in node.bindings if not (b.uid == uid and b.bound_at == bound_at)]
            if len(kept) == len(node.bindings):
                continue  # re-added since: its newer entry is still queued
            node.bindings = kept
            self._forget(uid)
            touched.add(row)
        for row in touched:
            self._refresh(row, now)

    def bindings_of(self, row: int) -> list[RecentBinding]:
        """The row's bindings, oldest first, as the reference takes them (for explain and ``node_load``)."""
        node = self._nodes.get(row)
        if node is None:
            return []
        return [RecentBinding(node.name, b.bound_at, b.cpu, b.memory, b.learned, b.left) for b in node.bindings]

    def uids_of(self, row: int) -> list[tuple[str, float, float, float, bool, str | None, bool]]:
        """(uid, bound_at, cpu, memory, learned, group, left) of the row's bindings, oldest first (to carry them
        over a policy reload)."""
        node = self._nodes.get(row)
        if node is None:
            return []
        return [(b.uid, b.bound_at, b.cpu, b.memory, b.learned, b.group, b.left) for b in node.bindings]

    def rows_of(self, group: str) -> list[int]:
        """The rows holding bindings of ``group``'s members (a gang's few nodes)."""
        return sorted({self._where[uid] for uid in self._groups.get(group, ())})

    def own_hot_without(self, row: int, group: str, now: float) -> float:
        """The row's own-bindings hot value at ``now`` leaving ``group``'s members out (not cached: a gang member's
        score asks it for the few rows of ``rows_of``)."""
        return self._own_value(row, now, self._groups.get(group, set()))[0]

    def added_by(self, row: int, uids: set[str]) -> dict[str, float]:
        """What the bindings ``uids`` add to the row's estimate, per metric: the cached value less the one
        recomputed without them (the same arithmetic; preemption's what-if takes victims' estimates out)."""
        node = self._nodes.get(row)
        if node is None or not any(b.uid in uids for b in node.bindings):
            return {}
        self._flush()
        kept = {m: float(a[row]) for m, a in self.extra.items()}
        kept_judged = {m: bool(a[row]) for m, a in self.judged.items()}
        kept_next = float(self._est_next[row])
        at = float(self.estimated_at[row])
        self._estimate(row, [b for b in node.bindings if b.uid not in uids], at)
        without = {m: float(a[row]) for m, a in self.extra.items()}
        for m, value in kept.items():
            self.extra[m][row] = value
            self.judged[m][row] = kept_judged[m]
        self._est_next[row] = kept_next
        return {m: kept[m] - without[m] for m in kept}

    def oldest(self, mask: npt.NDArray[np.bool_]) -> FloatArray:
        """The oldest binding time of each row with bindings where ``mask`` is set (when it is pruned, the row's
        estimate changes); walks the rows with recent bindings, not the mask."""
        n = len(mask)
        return np.asarray(
            [node.bindings[0].bound_at for row, node in self._nodes.items() if row < n and mask[row] and node.bindings],
            dtype=np.float64,
        )

    # -- per decision ---------------------------------------------------------------------------------------------

    def at(self, now: float, n_rows: int) -> tuple[dict[str, FloatArray], FloatArray]:
        """(extra usage per metric, own hot value) over rows ``[:n_rows]`` at ``now`` (views, do not modify);
        ``judged_at`` gives the judged masks of the same instant."""
        self._flush()
        self._ensure(max(0, n_rows - 1))
        due = np.flatnonzero(self.own_next[:n_rows] <= now).tolist()
        for row in due:
            if self._est_next[row] - EARLY <= now:
                node = self._nodes.get(row)
                self._estimate(row, node.bindings if node else [], now)
            self._own(row, now)
        self.changed.update(due)
        self.recomputed += len(due)
        return {m: a[:n_rows] for m, a in self.extra.items()}, self.own_hot[:n_rows]

    def judged_at(self, n_rows: int) -> dict[str, Mask]:
        """The judged masks over rows ``[:n_rows]`` as of the last ``at`` (views, do not modify)."""
        self._flush()
        return {m: a[:n_rows] for m, a in self.judged.items()}

    # -- per node: the reference's arithmetic -----------------------------------------------------------------------

    def _refresh(self, row: int, now: float) -> None:
        """An input of the row changed at ``now`` (its annotations or allocatable, a pruned binding): recompute
        its effects as of ``now``, now (a node update, a decision's pruning: off the per-pod path)."""
        self._mark(row, now)
        self._recompute(row, self._stale.pop(row))

    def _mark(self, row: int, now: float) -> None:
        """A binding of the row was added, removed or departed at ``now`` (Reserve, Unreserve, a pod deleted: the
        per-pod path): its effects are recomputed as of ``now`` by the next reader (``_flush``), once however many
        such changes came before it. Every input change comes through here (``_refresh`` too, then recomputes at
        once), and the later one wins, so the recomputation sees the inputs the last change left."""
        node = self._nodes.get(row)
        if node is not None and not node.bindings:
            del self._nodes[row]
        self._stale[row] = now
        self.changed.add(row)

    def _flush(self) -> None:
        if not self._stale:
            return
        stale, self._stale = self._stale, {}
        for row, now in stale.items():
            self._recompute(row, now)

    def _recompute(self, row: int, now: float) -> None:
        node = self._nodes.get(row)
        self._estimate(row, node.bindings if node else [], now)
        self._own(row, now)

    def _plan(self) -> tuple[tuple[str, bool, float, float], ...]:
        """(metric, measures cpu, estimate window in seconds, factor) per metric of ``extra``: read once per
        arguments object (a policy reload brings a new one), not per metric per binding added."""
        args = self.cols.args
        if self._plan_of is not args:
            est = args.estimate
            self._metric_plan = tuple(
                (m, cpu, est.window_of(m).total_seconds(), est.cpu_factor if cpu else est.memory_factor)
                for m in self.extra
                for cpu in (resource_of(m) == "cpu",)
            )
            self._plan_of = args
        return self._metric_plan

    def _estimate(self, row: int, bindings: list[_Binding], now: float) -> None:
        est = self.cols.args.estimate
        bindings = [b for b in bindings if not b.left]  # a departed pod adds nothing (``dynamic._estimate``)
        self.estimated_at[row] = now
        self._est_next[row] = math.inf
        extra, judged = self.extra, self.judged
        if self.cols.judged_as_new(row):
            for metric, arr in extra.items():
                judged[metric][row] = False
                arr[row] = self._missing(row, metric, bindings, now)  # a new node: dynamic._estimate_missing
            return
        if not est.enabled or not bindings:
            for metric, arr in extra.items():
                judged[metric][row] = False
                arr[row] = 0.0
            return
        stamps = self.cols.stamps if row < self.cols.capacity else None
        alloc_cpu, alloc_memory = float(self.alloc_cpu[row]), float(self.alloc_memory[row])
        # Metrics of one resource with the same window and annotation time get the same estimate: summed once.
        done: dict[tuple[bool, float, float], float] = {}
        for metric, cpu, window, factor in self._plan():
            judged[metric][row] = False
            stamp = float(stamps[metric][row]) if stamps is not None else math.nan
            total = alloc_cpu if cpu else alloc_memory
            if math.isnan(stamp) or total <= 0:
                extra[metric][row] = 0.0
                continue
            key = (cpu, window, stamp)
            added = done.get(key)
            if added is None:
                added = 0.0
                for b in bindings:  # dynamic._estimate, term by term
                    absorbed = min(1.0, max(0.0, (stamp - b.bound_at) / window)) if window > 0 else 1.0
                    amount = b.cpu if cpu else b.memory
                    added += (1.0 if b.learned else factor) * amount * (1.0 - absorbed)
                done[key] = added
            extra[metric][row] = added / total

    def _missing(self, row: int, metric: str, bindings: list[_Binding], now: float) -> float:
        """A new node's metric's estimate (``dynamic._estimate_missing``, term by term): the bindings with
        ``now < bound_at + window``, nothing absorbed; sets ``judged`` and the next time one leaves."""
        est = self.cols.args.estimate
        resource = resource_of(metric)
        total = float(self.alloc_cpu[row] if resource == "cpu" else self.alloc_memory[row])
        window = new_node_window(self.cols.args, metric)
        if not est.enabled or not bindings or total <= 0 or window <= 0:
            return 0.0
        factor = est.cpu_factor if resource == "cpu" else est.memory_factor
        added = 0.0
        counted = 0
        for b in bindings:
            end = b.bound_at + window
            if now < end:
                amount = b.cpu if resource == "cpu" else b.memory
                added += (1.0 if b.learned else factor) * amount
                counted += 1
                self._est_next[row] = min(float(self._est_next[row]), end)
        self.judged[metric][row] = counted > 0
        return added / total

    def _own(self, row: int, now: float) -> None:
        total, nxt = self._own_value(row, now, set())
        self.own_hot[row] = total
        self.own_next[row] = min(nxt, float(self._est_next[row])) - EARLY

    def _own_value(self, row: int, now: float, skip: set[str]) -> tuple[float, float]:
        """(own hot value, its next possible change time) of the row, bindings in ``skip`` left out."""
        args = self.cols.args
        node = self._nodes.get(row)
        if not node or not args.own_bindings_in_hot_value or not args.policy.hot_value:
            return 0.0, math.inf
        skew, window = args.max_skew.total_seconds(), HOT_VALUE_FRESHNESS.total_seconds()
        stamp = float(self.cols.stamps[HOT_VALUE_KEY][row]) if row < self.cols.capacity else math.nan
        fresh = not math.isnan(stamp) and stamp <= now + skew and now < stamp + window  # columns._fresh
        after = stamp if fresh else -math.inf
        nxt = math.inf
        if not math.isnan(stamp):
            for change in (stamp - skew, stamp + window):
                if change > now - EARLY:
                    nxt = min(nxt, change)
        total = 0
        for rule in args.policy.hot_value:
            span = rule.time_range.total_seconds()
            count = 0
            for b in node.bindings:
                if b.uid in skip:
                    continue
                if b.bound_at > after and b.bound_at > now - span:
                    count += 1
                end = b.bound_at + span
                if end > now - EARLY:
                    nxt = min(nxt, end)
            total += count // rule.count
        return float(total), nxt


def _grown(arr: FloatArray, cap: int, fill: float) -> FloatArray:
    out = np.full(cap, fill)
    out[: len(arr)] = arr
    return out
