"""Pods nominated to a node by preemption, in Dynamic's load estimate, kept per node row.

kube-scheduler's Filter counts the pods nominated to a node with at least the incoming pod's priority
(``RunFilterPluginsWithNominatedPods``: the room preemption freed is kept for the preemptor). Dynamic is crane's
plugin, not kube's, but the same reasoning holds for load: a nominated pod will run on its node, so its estimated
usage counts there as a binding of this scheduler made now (``RecentEffects``'s term with nothing absorbed yet:
``factor·request / allocatable`` per metric; on a row of a node annotated with no metric yet it also judges the
readings, ``judged``, as recent bindings do). Without it two preemptors could
be nominated to a node whose load headroom takes one; the one retried second then fails Dynamic on its nominated
node and preempts again elsewhere (PreemptionBasic at 500 nodes: 14-20 % more victims than preemptors).

What counts, as kube's ``addGENominatedPods``: every pod in ``NodeTable.nominated`` that the table does not
account yet (not assumed or bound: then it is in the recent bindings if it is ours, in the node's annotated usage
later if not), of priority at least the incoming pod's, other than the incoming pod itself. The sums here are over
every not-yet-placed nominated pod, updated when a nomination is made or cleared (``Nominations.listeners``), when
such a pod is assumed, bound or removed (the table's pod hooks) and when its node's annotations or allocatable
change; a decision reads them as a vector. The two per-pod exceptions (the pod's own nomination, nominated pods of
lower priority) are taken out of their rows only, at decision time (``exclusions``); with one priority for every
nominated pod, as in PreemptionBasic, that is at most the pod's own row.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from crane_scheduler.loadaware.columns import LoadColumns
from crane_scheduler.loadaware.rowload import RowLoad
from crane_shared.loadaware.dynamic import resource_of


@dataclass(slots=True)
class Nominee:
    uid: str
    node: str
    priority: int
    cpu: float
    memory: float
    placed: bool
    """assumed or bound in the table: not counted here"""


class NominatedLoad(RowLoad):
    """Per node row, the estimated usage of the pods nominated there and not placed yet (``extra[metric]``, a
    fraction of allocatable). Rows are found by node name through ``rows`` (the table's index)."""

    def __init__(self, cols: LoadColumns, rows: dict[str, int], capacity: int = 64) -> None:
        super().__init__(cols, capacity)
        self.rows = rows
        self.nominees: dict[str, Nominee] = {}
        self._on_node: dict[str, dict[str, Nominee]] = {}
        self._names: dict[int, str] = {}
        self._priorities: Counter[int] = Counter()
        """priorities of the counted nominees (few distinct values): is any below an incoming pod's?"""
        self.changed: set[int] = set()
        """rows whose ``extra`` may have changed since the consumer last cleared this"""

    # -- inputs ---------------------------------------------------------------------------------------------------

    def nominate(self, uid: str, node: str, priority: int, cpu: float, memory: float, placed: bool) -> None:
        old = self.nominees.get(uid)
        if old is not None:
            if (old.node, old.priority, old.cpu, old.memory, old.placed) == (node, priority, cpu, memory, placed):
                return  # an update of the pod that changes nothing counted (the common informer echo)
            self.clear(uid)
        nominee = Nominee(uid, node, priority, cpu, memory, placed)
        self.nominees[uid] = nominee
        self._on_node.setdefault(node, {})[uid] = nominee
        if not placed:
            self._priorities[priority] += 1
            self._refresh_node(node)

    def clear(self, uid: str) -> None:
        nominee = self.nominees.pop(uid, None)
        if nominee is None:
            return
        on_node = self._on_node[nominee.node]
        del on_node[uid]
        if not on_node:
            del self._on_node[nominee.node]
        if not nominee.placed:
            self._uncount(nominee.priority)
            self._refresh_node(nominee.node)

    def placed(self, uid: str, placed: bool) -> None:
        """The table assumed or bound the pod (True), or no longer accounts it (False)."""
        nominee = self.nominees.get(uid)
        if nominee is None or nominee.placed == placed:
            return
        nominee.placed = placed
        if placed:
            self._uncount(nominee.priority)
        else:
            self._priorities[nominee.priority] += 1
        self._refresh_node(nominee.node)

    def _uncount(self, priority: int) -> None:
        self._priorities[priority] -= 1
        if not self._priorities[priority]:
            del self._priorities[priority]

    @property
    def counted(self) -> int:
        """nominees not placed (0: nothing to add anywhere)"""
        return self._priorities.total()

    def node_changed(self, row: int, name: str, cpu: float, memory: float) -> None:
        """A node's annotations or allocatable changed (``cols`` already decoded), or a row got a new node."""
        self.ensure(row)
        self.alloc_cpu[row], self.alloc_memory[row] = cpu, memory
        self._names[row] = name
        self._refresh(row, self._on_node.get(name, {}).values())

    def counting(self, name: str, uid: str = "", priority: int | None = None) -> list[Nominee]:
        """The pods nominated to node ``name``, not placed yet, that count for the pod ``uid`` of ``priority``
        (kube's ``addGENominatedPods``: not itself, none of lower priority; every one when ``priority`` is None)."""
        return [
            n
            for n in self._on_node.get(name, {}).values()
            if not n.placed and n.uid != uid and (priority is None or n.priority >= priority)
        ]

    # -- per decision ---------------------------------------------------------------------------------------------

    def exclusions(self, uid: str, priority: int) -> dict[int, dict[str, float]]:
        """Rows whose sum includes pods that do not count for a pod of ``priority`` (itself, lower priorities),
        with the estimate per metric of the pods that do count there."""
        own = self.nominees.get(uid)
        rows: dict[int, dict[str, float]] = {}
        if own is not None and not own.placed:
            row = self.rows.get(own.node)
            if row is not None:
                rows[row] = {}
        if self._priorities and min(self._priorities) < priority:
            for nominee in self.nominees.values():
                if nominee.priority < priority and not nominee.placed:
                    row = self.rows.get(nominee.node)
                    if row is not None:
                        rows[row] = {}
        for row in rows:
            rows[row] = self._estimate(row, self.counting(self._names.get(row, ""), uid, priority))
        return rows

    def judges(self, row: int, uid: str, priority: int) -> dict[str, bool]:
        """Per metric, whether the nominated pods that count for the pod ``uid`` of ``priority`` judge the row's
        new node's metric (``exclusions``'s rows)."""
        return self._judges(row, bool(self.counting(self._names.get(row, ""), uid, priority)))

    # -- per node -------------------------------------------------------------------------------------------------

    def _refresh_node(self, node: str) -> None:
        row = self.rows.get(node)
        if row is not None:
            self.ensure(row)
            self._refresh(row, self._on_node.get(node, {}).values())

    def _refresh(self, row: int, nominees: Iterable[Nominee]) -> None:
        counted = [n for n in nominees if not n.placed]
        for metric, value in self._estimate(row, counted).items():
            self.extra[metric][row] = value
        for metric, judged in self._judges(row, bool(counted)).items():
            self.judged[metric][row] = judged
        self.changed.add(row)

    def _judges(self, row: int, any_counted: bool) -> dict[str, bool]:
        """Per metric: the row's node has no metric annotated and a counted nominee's estimate judges it (a binding
        made now: ``dynamic._estimate_missing``'s conditions)."""
        est = self.cols.args.estimate
        missing = self.cols.judged_as_new(row)
        out: dict[str, bool] = {}
        for metric in self.extra:
            total = float(self.alloc_cpu[row] if resource_of(metric) == "cpu" else self.alloc_memory[row])
            window = est.window_of(metric).total_seconds()
            out[metric] = any_counted and missing and est.enabled and total > 0 and window > 0
        return out

    def _estimate(self, row: int, nominees: list[Nominee]) -> dict[str, float]:
        """Per metric, ``factor·Σ request / allocatable`` (a binding made now, nothing absorbed), where the
        metric is annotated or the node has no metric annotated (``RecentEffects._estimate``'s conditions)."""
        est = self.cols.args.estimate
        never = self.cols.judged_as_new(row)
        out: dict[str, float] = {}
        for metric in self.extra:
            stamp = float(self.cols.stamps[metric][row]) if row < self.cols.capacity else math.nan
            resource = resource_of(metric)
            total = float(self.alloc_cpu[row] if resource == "cpu" else self.alloc_memory[row])
            if not est.enabled or not nominees or (math.isnan(stamp) and not never) or total <= 0:
                out[metric] = 0.0
                continue
            if est.window_of(metric).total_seconds() <= 0:
                out[metric] = 0.0  # every binding counts as absorbed at once (RecentEffects)
                continue
            factor = est.cpu_factor if resource == "cpu" else est.memory_factor
            added = 0.0
            for n in nominees:
                added += factor * (n.cpu if resource == "cpu" else n.memory)
            out[metric] = added / total
        return out
