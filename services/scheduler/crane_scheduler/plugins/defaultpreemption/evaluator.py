"""Preemption's decision (kube's ``framework/preemption`` and ``defaultpreemption.SelectVictimsOnNode``), pure
apart from a what-if on the node table that it always undoes.

kube dry-runs each candidate node alone: remove every lower-priority pod, check the preemptor fits, then put the
victims back one by one, most important first (PDB-violating ones before the others), keeping each one that
still lets the preemptor fit ("reprieve"). Here the node table answers Filter for all rows at once, so the
candidate nodes are dry-run together, in rounds: round 0 removes every candidate's potential victims, round k
puts back every candidate's k-th victim. Each node's outcome is the one kube's per-node loop gives as long as
the Filter plugins judge a node by that node's pods only. When a plugin that looks across nodes
(``CrossNodeFilterPlugin``: InterPodAffinity, PodTopologySpread) has something to say about the pod, the
candidates are dry-run one by one instead, as kube does, and the pod index follows each removal and reprieve.

When NodeResourcesFit is the only Filter plugin with something to say about the pod that reads pods (the others
are ``PodBlindFilterPlugin``s or skip the pod), a returning victim can change no other verdict, so the reprieve
rounds after round 0 are NodeResourcesFit's own comparison done as arithmetic on the candidates' free
allocatable (``ResourceReprieve``), without moving pods in the table or running the plugins again.

A Filter plugin that judges a node by its load (Dynamic) is told of every victim taken out and put back
(``NodeTable.what_if``), so the victims' measured usage leaves the node in the what-if; in the arithmetic reprieve
a victim whose requests fit comes back only if those plugins still pass the pod with it (``ResourceReprieve.load``).
The plugins that refused candidates here and the soonest time one of those refusals could lift are kept
(``DryRun.rejectors``, ``DryRun.retry_after``): the pod is retried on their events or then.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from crane_scheduler.framework.runtime import nominated_records
from crane_scheduler.framework.types import Code, CycleState, Rejection, sooner
from crane_scheduler.nodetable import Mask, NodeTable, PodRecord
from crane_scheduler.plugins.noderesources import TOO_MANY_PODS, insufficient
from crane_scheduler.podinfo import PODS, PodInfo
from crane_shared.labels import label_selector_matches as _label_selector_matches

NO_VICTIMS = "No preemption victims found for incoming pod"
NOT_HELPFUL = "Preemption is not helpful for scheduling"


class RunFilters(Protocol):
    """(fresh state, pod, rows to test, narrowed in place) -> rejections: the profile's PreFilter and Filter;
    ``with_nominated=False``: without the pass that counts the nominated pods (``run_filter_plugins``)."""

    def __call__(
        self, state: CycleState, pod: PodInfo, alive: Mask, /, *, with_nominated: bool = True
    ) -> list[tuple[str, list[Rejection], Mask]]: ...


@dataclass
class Candidate:
    node: str
    victims: list[PodRecord]
    pdb_violations: int


@dataclass(frozen=True)
class ResourceReprieve:
    """The reprieve rounds as arithmetic: NodeResourcesFit is the only Filter verdict a returning victim can change,
    and it holds ``requests`` (resource, amount) and one more pod against each node's free allocatable."""

    requests: tuple[tuple[str, int], ...]
    load: tuple[Any, ...] = ()
    """Filter plugins told of the what-if's victims (``NodeTable.victims_simulated``): a victim whose requests fit
    is put back only where each of them still passes the pod"""


@dataclass
class DryRun:
    candidates: list[Candidate] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)  # reason -> nodes, for nodes that are no candidate
    tried: int = 0
    rejectors: set[str] = field(default_factory=set)
    """plugins that refused a node even without its victims (their events may make preemption help)"""
    retry_after: float | None = None
    """seconds until the soonest of those refusals could lift with no event (``Rejection.retry_after``)"""


def start_time(record: PodRecord, now: float) -> float:
    """``GetPodStartTime``: status.startTime, or now for a pod that has not started."""
    raw = ((record.pod.raw if record.pod else {}).get("status") or {}).get("startTime")
    parsed = _parse_time(str(raw)) if raw else None
    return now if parsed is None else parsed


@functools.lru_cache(maxsize=4096)
def _parse_time(raw: str) -> float | None:
    """RFC 3339 to seconds; pods of one workload share few distinct start times, and every dry run sorts by them."""
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def more_important(now: float) -> Callable[[PodRecord], tuple[int, float, int]]:
    """Sort key for ``MoreImportantPod``: higher priority first, then the one that started earlier; exact ties
    keep the node's pod order (kube sorts its NodeInfo's pods, listed in the order they were added)."""

    def key(r: PodRecord) -> tuple[int, float, int]:
        return (-(r.pod.priority if r.pod else 0), start_time(r, now), r.seq)

    return key


@dataclass
class _NodeOrder:
    """A node's pods (those with a pod), most important first by a ``now``-free key, as of ``version``."""

    version: int
    records: list[PodRecord]
    neg_priorities: list[int]  # ascending: the pods of lower priority than p are the suffix past -p


class VictimOrders:
    """Each node's pods sorted by ``more_important``, kept across dry runs: every dry run asks for the victims
    of each node it reaches, and a node's pods change far less often than preemptors come. An entry is valid
    while the node's ``pods_version`` is (the table bumps it on every pod added, removed or replaced there,
    what-ifs included; versions are never reused). Kept only when the order cannot depend on ``now`` (every pod
    has a start time, or none has: ``now`` then ties them all and the table's order decides)."""

    def __init__(self, table: NodeTable) -> None:
        self.table = table
        self._orders: dict[str, _NodeOrder] = {}

    def lower(self, node: str, priority: int, now: float) -> list[PodRecord]:
        """The node's pods of lower priority than ``priority``, sorted by ``more_important(now)``."""
        version = self.table.pods_version.get(node, 0)
        entry = self._orders.get(node)
        if entry is None or entry.version != version:
            records = [r for r in self.table.pods_on(node) if r.pod is not None]
            entry = _order_of(records, version)
            if entry is None:
                self._orders.pop(node, None)
                return sorted((r for r in records if r.pod and r.pod.priority < priority), key=more_important(now))
            self._orders[node] = entry
        return entry.records[bisect.bisect_right(entry.neg_priorities, -priority) :]


def _order_of(records: list[PodRecord], version: int) -> _NodeOrder | None:
    starts = [start_time(r, math.nan) for r in records]
    missing = sum(1 for s in starts if math.isnan(s))
    if 0 < missing < len(records):
        return None
    keyed = sorted(
        zip(records, starts, strict=True),
        key=lambda rs: (-(rs[0].pod.priority if rs[0].pod else 0), 0.0 if missing else rs[1], rs[0].seq),
    )
    ordered = [r for r, _ in keyed]
    return _NodeOrder(version, ordered, [-(r.pod.priority if r.pod else 0) for r in ordered])


def pdb_split(
    victims: Sequence[PodRecord], pdbs: Sequence[Mapping[str, Any]]
) -> tuple[list[PodRecord], list[PodRecord]]:
    """``filterPodsWithPDBViolation``: victims whose eviction would exceed a matching PDB's disruptionsAllowed."""
    allowed = [int((p.get("status") or {}).get("disruptionsAllowed") or 0) for p in pdbs]
    violating: list[PodRecord] = []
    fine: list[PodRecord] = []
    for record in victims:
        labels = ((record.pod.raw.get("metadata") or {}).get("labels") if record.pod else None) or {}
        violated = False
        if labels:
            for i, pdb in enumerate(pdbs):
                meta = pdb.get("metadata") or {}
                if meta.get("namespace") != record.namespace:
                    continue
                selector = (pdb.get("spec") or {}).get("selector")
                if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
                    continue  # an empty (or nil) selector selects nothing here, as in kube
                if not _label_selector_matches(selector, labels):
                    continue
                if record.name in ((pdb.get("status") or {}).get("disruptedPods") or {}):
                    continue
                allowed[i] -= 1
                if allowed[i] < 0:
                    violated = True
        (violating if violated else fine).append(record)
    return violating, fine


def _first_failure(rejected: list[tuple[str, list[Rejection], Mask]], row: int) -> tuple[Code, list[str]]:
    for _, rejections, before in rejected:
        if not before[row]:
            continue
        hits = [r for r in rejections if r.mask[row]]
        if hits:
            code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE if any(r.unresolvable for r in hits) else Code.UNSCHEDULABLE
            return code, [r.reason for r in hits]
    return Code.SUCCESS, []


def dry_run(
    table: NodeTable,
    pod: PodInfo,
    potential: Mask,
    run: RunFilters,
    pdbs: Sequence[Mapping[str, Any]],
    offset: int,
    wanted: int,
    now: float | None = None,
    *,
    per_node: bool = False,
    reprieve: ResourceReprieve | None = None,
    orders: VictimOrders | None = None,
) -> DryRun:
    """Candidates (node, minimal victims, PDB violations) among ``potential`` rows, in kube's order from
    ``offset``: stops once ``wanted`` are found with at least one that violates no PDB.

    ``per_node``: the pod's Filter verdicts depend on other nodes' pods (a ``CrossNodeFilterPlugin`` did not skip
    it), so candidates are dry-run one at a time, as kube's ``SelectVictimsOnNode``, with the table's
    ``pod_simulated`` hooks told of every removal and reprieve (kube's ``RemovePod``/``AddPod``). ``reprieve``:
    the reprieve rounds are NodeResourcesFit's arithmetic (see the module's docstring). ``orders``: the nodes'
    sorted pods kept across dry runs (the plugin's), else sorted here."""
    now = time.time() if now is None else now
    out = DryRun()
    rows = [int(r) for r in np.flatnonzero(potential)]
    if not rows:
        return out
    rows = rows[offset % len(rows) :] + rows[: offset % len(rows)]
    order = more_important(now)
    queue: dict[int, list[PodRecord]] = {}  # row -> victims to try putting back, in order
    n_violating: dict[int, set[str]] = {}

    def with_victims(row: int) -> bool:
        """Queue the row's potential victims (lower priority, PDB violators first): built only for the rows the
        search reaches, as kube's parallel search visits nodes until it has found enough (at 1,000 nodes sorting
        every node's pods was most of a dry run)."""
        name = table.names[row]
        if orders is not None:
            lower = orders.lower(name, pod.priority, now)
        else:
            lower = sorted(
                (r for r in table.pods_on(name) if r.pod is not None and r.pod.priority < pod.priority), key=order
            )
        if not lower:
            out.statuses[NO_VICTIMS] += 1
            return False
        violating, fine = pdb_split(lower, pdbs) if pdbs else ([], lower)
        queue[row] = violating + fine
        n_violating[row] = {r.uid for r in violating}
        return True

    reached = (row for row in rows if with_victims(row))
    if per_node:
        victims = _one_by_one(table, pod, reached, queue, n_violating, run, out, wanted)
    else:  # chunks of ``wanted`` rows in rotation order, until enough candidates (kube cancels its search there)
        victims = {}
        n_found = n_clean = 0
        while chunk := list(itertools.islice(reached, max(wanted, 1))):
            got = _batched(table, pod, {row: queue[row] for row in chunk}, run, out, reprieve)
            victims.update(got)
            for row in chunk:
                if got.get(row):
                    n_found += 1
                    n_clean += not any(r.uid in n_violating[row] for r in got[row])
            if n_clean > 0 and n_found >= wanted:
                break
    for row in [r for r in rows if r in queue and victims.get(r)]:
        found = victims[row]
        violations = sum(1 for r in found if r.uid in n_violating[row])
        if violations and len(found) > violations:
            found.sort(key=order)
        out.candidates.append(Candidate(table.names[row], found, violations))
    # kube's parallel search stops once enough candidates are found; keep the same prefix of the rotation.
    picked: list[Candidate] = []
    clean = 0
    for c in out.candidates:
        picked.append(c)
        clean += c.pdb_violations == 0
        if clean > 0 and len(picked) >= wanted:
            break
    out.candidates = [c for c in picked if c.pdb_violations == 0] + [c for c in picked if c.pdb_violations]
    out.tried = len(rows)
    return out


def _not_fitting(out: DryRun, rejected: list[tuple[str, list[Rejection], Mask]], row: int) -> None:
    _, reasons = _first_failure(rejected, row)
    for reason in reasons or [NOT_HELPFUL]:
        out.statuses[reason] += 1
    for name, rejections, before in rejected:
        if before[row]:
            for r in rejections:
                if r.mask[row]:
                    out.rejectors.add(name)
                    out.retry_after = sooner(out.retry_after, r.lifts_in())


def _take_out(table: NodeTable, uids: list[str], *, notify: bool = False) -> list[PodRecord]:
    """``simulate_remove`` of victims, told to the load plugins (``NodeTable.what_if``)."""
    removed = table.simulate_remove(uids, notify=notify)
    table.what_if(removed, -1)
    return removed


def _put_back(table: NodeTable, records: Iterable[PodRecord], *, notify: bool = False) -> None:
    """``simulate_add`` of victims, told to the load plugins."""
    back = list(records)
    table.simulate_add(back, notify=notify)
    table.what_if(back, +1)


def _batched(
    table: NodeTable,
    pod: PodInfo,
    queue: dict[int, list[PodRecord]],
    run: RunFilters,
    out: DryRun,
    reprieve: ResourceReprieve | None = None,
) -> dict[int, list[PodRecord]]:
    """All candidate rows at once: round 0 takes out every candidate's potential victims, round k puts every
    candidate's k-th one back (kept where the pod still fits). Exact when each row's verdict depends on that
    row's pods only. With ``reprieve``, see ``_batched_arithmetic``."""
    if reprieve is not None:
        found = _batched_arithmetic(table, pod, queue, run, out, reprieve)
        if found is not None:
            return found
    removed: dict[int, list[PodRecord]] = {row: [] for row in queue}
    victims: dict[int, list[PodRecord]] = {row: [] for row in queue}
    try:
        taken = {r.uid for r in _take_out(table, [r.uid for records in queue.values() for r in records])}
        for row, records in queue.items():
            removed[row] = [r for r in records if r.uid in taken]
        alive = np.zeros(table.n_rows, dtype=bool)
        alive[list(queue)] = True
        rejected = run({}, pod, alive)
        fitting = []
        for row in queue:
            if alive[row]:
                fitting.append(row)
            else:
                _not_fitting(out, rejected, row)
        step = 0
        while True:
            trying = {row: queue[row][step] for row in fitting if step < len(queue[row])}
            if not trying:
                break
            _put_back(table, trying.values())
            for row, record in trying.items():
                removed[row].remove(record)
            alive = np.zeros(table.n_rows, dtype=bool)
            alive[list(trying)] = True
            run({}, pod, alive)
            back = [(row, record) for row, record in trying.items() if not alive[row]]
            _take_out(table, [record.uid for _, record in back])
            for row, record in back:
                removed[row].append(record)
                victims[row].append(record)
            step += 1
    finally:
        _put_back(table, [r for records in removed.values() for r in records])
    return victims


def _batched_arithmetic(
    table: NodeTable,
    pod: PodInfo,
    queue: dict[int, list[PodRecord]],
    run: RunFilters,
    out: DryRun,
    reprieve: ResourceReprieve,
) -> dict[int, list[PodRecord]] | None:
    """``_batched`` when NodeResourcesFit is the only plugin with a say that reads pods: round 0 takes the
    candidates' victims out of the columns NodeResourcesFit reads (the pod's requested resources and the pod
    count) and runs the profile's filters once, for the same verdicts and reasons; the reprieve rounds are then
    NodeResourcesFit's comparison per row, on the room round 0 left over the preemptor's requests and the pods
    nominated there (counted as its Filter counts them, kube's ``RunFilterPluginsWithNominatedPods``: adding pods
    only lowers the room, so with them is the binding check). A victim is put back where its requests and one
    pod fit in that room; else it stays a victim. No pod moves in the table. None when a requested resource has
    no column (nothing fits; the generic rounds report it). The load plugins (``reprieve.load``) see every
    candidate's victims taken out for the whole dry run, and each victim put back that stays (``_load_passes``)."""
    found = [table.resources.get(res) for res, _ in reprieve.requests]
    cols = [c for c in found if c is not None]
    if len(cols) != len(found):
        return None
    out_now: dict[str, PodRecord] = {}
    relevant: set[int] = set()
    if reprieve.load:
        relevant = set().union(*(pl.victim_rows(pod) for pl in reprieve.load)) & queue.keys()
        if relevant:  # a row they pass with every victim there they pass with any (monotone): nothing to do there
            refused = np.zeros(table.n_rows, dtype=bool)
            for plugin in reprieve.load:
                refused |= plugin.refuses(pod, table)
            relevant = {row for row in relevant if refused[row]}
        out_now = {r.uid: r for row in relevant for r in queue[row]}
        table.what_if(list(out_now.values()), -1)
    try:
        return _arithmetic_rounds(table, pod, queue, run, out, reprieve, cols, out_now, relevant)
    finally:
        table.what_if(list(out_now.values()), +1)


def _load_passes(
    table: NodeTable,
    pod: PodInfo,
    plugins: tuple[Any, ...],
    back: list[tuple[int, PodRecord]],
    out_now: dict[str, PodRecord],
) -> list[bool]:
    """Put ``back`` (row, victim) into the load plugins' what-if, run their Filter, and take out again the victims
    of the rows they now refuse; whether each one stays back."""
    records = [record for _, record in back]
    for record in records:
        out_now.pop(record.uid, None)
    table.what_if(records, +1)
    refused = np.zeros(table.n_rows, dtype=bool)
    for plugin in plugins:
        refused |= plugin.refuses(pod, table)
    passes = [not bool(refused[row]) for row, _ in back]
    again = [record for (_, record), ok in zip(back, passes, strict=True) if not ok]
    out_now.update((r.uid, r) for r in again)
    table.what_if(again, -1)
    return passes


def _arithmetic_rounds(
    table: NodeTable,
    pod: PodInfo,
    queue: dict[int, list[PodRecord]],
    run: RunFilters,
    out: DryRun,
    reprieve: ResourceReprieve,
    cols: list[int],
    out_now: dict[str, PodRecord],
    relevant: set[int],
) -> dict[int, list[PodRecord]]:
    """``_batched_arithmetic``'s rounds, the load plugins' what-if already made on the ``relevant`` rows (elsewhere
    their verdict does not depend on the victims: a row they passed without its victims they pass with them)."""
    resources = [res for res, _ in reprieve.requests]
    rows = list(queue)
    index = np.asarray(rows, dtype=np.intp)
    width = len(resources) + 1  # the requested resources, then the pod count
    # every victim's requests and 1 pod, one matrix row each, the candidates' victims one after the other
    deltas = table.delta_rows([r for row in rows for r in queue[row]])
    matrix = deltas[:, [*cols, deltas.shape[1] - 1]]  # the delta rows end with the pod count (1)
    first = {row: 0 for row in rows}
    offset = 0
    for row in rows:
        first[row] = offset
        offset += len(queue[row])
    taken = np.add.reduceat(matrix, np.fromiter(first.values(), dtype=np.intp, count=len(rows)), axis=0)
    requested, pod_count = table.requested, table.pod_count
    victims: dict[int, list[PodRecord]] = {row: [] for row in queue}
    columns = np.asarray(cols, dtype=np.intp)
    grid = np.ix_(index, columns)
    requested[grid] -= taken[:, :-1]
    pod_count[index] -= taken[:, -1]
    table.version += 1
    table.row_versions.touch(rows)  # per-row result caches (NodeResourcesFit's) see the what-if
    try:
        alive = np.zeros(table.n_rows, dtype=bool)
        alive[index] = True
        rejected = run({}, pod, alive, with_nominated=False)  # the nominated pods: counted on the room below
        fitting: list[int] = []
        for row in rows:
            if alive[row]:
                fitting.append(row)
            else:
                _not_fitting(out, rejected, row)
        if not fitting:
            return victims
        at = {row: i for i, row in enumerate(fitting)}
        where = np.asarray(fitting, dtype=np.intp)
        room = np.empty((len(fitting), width), dtype=np.int64)
        room[:, :-1] = table.alloc[np.ix_(where, columns)] - requested[np.ix_(where, columns)]
        room[:, -1] = table.alloc[where, table.resources[PODS]] - pod_count[where]
    finally:
        requested[grid] += taken[:, :-1]
        pod_count[index] += taken[:, -1]
        table.version += 1
        table.row_versions.touch(rows)
    room -= np.array([want for _, want in reprieve.requests] + [1], dtype=np.int64)
    mask = np.zeros(table.n_rows, dtype=bool)
    mask[where] = True
    nominated = nominated_records(table, pod, mask)
    if nominated:  # each one's requests and 1 pod, from its kept delta row
        taken_by = table.delta_rows(nominated)
        slots = np.fromiter((at[table.rows[r.node]] for r in nominated), dtype=np.intp, count=len(nominated))
        np.subtract.at(room, slots, taken_by[:, [*cols, taken_by.shape[1] - 1]])
        # Filter's pass with the nominated pods, as arithmetic: only NodeResourcesFit reads pods, and adding pods
        # only lowers the room, so a row fails there where the room went negative, with NodeResourcesFit's reasons.
        short: npt.NDArray[np.bool_] = room < 0
        failing: Mask = np.asarray(short.any(axis=1), dtype=bool)
        if failing.any():
            for i in np.flatnonzero(failing).tolist():
                if short[i, -1]:
                    out.statuses[TOO_MANY_PODS] += 1
                for j in np.flatnonzero(short[i, :-1]).tolist():
                    out.statuses[insufficient(resources[j])] += 1
            keep: list[bool] = (~failing).tolist()
            fitting = [row for row, kept in zip(fitting, keep, strict=True) if kept]
            room = room[~failing]
    step = 0
    while True:
        trying = [(i, row) for i, row in enumerate(fitting) if step < len(queue[row])]
        if not trying:
            return victims
        slots = np.fromiter((i for i, _ in trying), dtype=np.intp, count=len(trying))
        back = matrix[np.fromiter((first[row] + step for _, row in trying), dtype=np.intp, count=len(trying))]
        fits: Mask = np.asarray((back <= room[slots]).all(axis=1), dtype=bool)
        if relevant and fits.any():
            checked = [ok and row in relevant for (_, row), ok in zip(trying, fits.tolist(), strict=True)]
            returning = [(row, queue[row][step]) for (_, row), check in zip(trying, checked, strict=True) if check]
            if returning:
                verdict = iter(_load_passes(table, pod, reprieve.load, returning, out_now))
                kept = [
                    ok and (next(verdict) if check else True) for ok, check in zip(fits.tolist(), checked, strict=True)
                ]
                fits = np.asarray(kept, dtype=bool)
        room[slots[fits]] -= back[fits]
        for (_, row), kept in zip(trying, fits.tolist(), strict=True):
            if not kept:
                victims[row].append(queue[row][step])
        step += 1


def _one_by_one(
    table: NodeTable,
    pod: PodInfo,
    rows: Iterable[int],
    queue: dict[int, list[PodRecord]],
    n_violating: dict[int, set[str]],
    run: RunFilters,
    out: DryRun,
    wanted: int,
) -> dict[int, list[PodRecord]]:
    """kube's loop: one candidate at a time, its victims taken out (and reprieved) with the hooks notified, so
    plugins counting pods across nodes see this node's removals only. Stops once ``wanted`` candidates are
    found, one of them violating no PDB (kube cancels its parallel search there)."""
    victims: dict[int, list[PodRecord]] = {}
    clean = found = 0
    for row in rows:
        records = queue.get(row)
        if records is None:
            continue
        removed = _take_out(table, [r.uid for r in records], notify=True)
        try:
            alive = np.zeros(table.n_rows, dtype=bool)
            alive[row] = True
            rejected = run({}, pod, alive)
            if not alive[row]:
                _not_fitting(out, rejected, row)
                continue
            chosen: list[PodRecord] = []
            taken = {r.uid for r in removed}
            for record in [r for r in records if r.uid in taken]:
                _put_back(table, [record], notify=True)
                removed.remove(record)
                alive[row] = True
                run({}, pod, alive)
                if not alive[row]:
                    _take_out(table, [record.uid], notify=True)
                    removed.append(record)
                    chosen.append(record)
        finally:
            _put_back(table, removed, notify=True)
        victims[row] = chosen
        found += 1
        clean += not any(r.uid in n_violating[row] for r in chosen)
        if clean > 0 and found >= wanted:
            break
    return victims


def pick_one(candidates: Sequence[Candidate], now: float | None = None) -> Candidate | None:
    """``pickOneNodeForPreemption``: fewest PDB violations, then the lowest highest-priority victim, then the
    lowest priority sum, then fewest victims, then the latest start of the earliest highest-priority victim."""
    if not candidates:
        return None
    now = time.time() if now is None else now

    def highest(c: Candidate) -> int:
        return c.victims[0].pod.priority if c.victims[0].pod else 0

    def earliest(c: Candidate) -> float:
        top = max(v.pod.priority if v.pod else 0 for v in c.victims)
        return min(start_time(v, now) for v in c.victims if (v.pod.priority if v.pod else 0) == top)

    scores: list[Callable[[Candidate], float]] = [
        lambda c: -c.pdb_violations,
        lambda c: -highest(c),
        lambda c: -sum((v.pod.priority if v.pod else 0) + 2**31 for v in c.victims),
        lambda c: -len(c.victims),
        earliest,
    ]
    remaining = list(candidates)
    for score in scores:
        best = -math.inf
        kept: list[Candidate] = []
        for c in remaining:
            s = score(c)
            if s > best:
                best, kept = s, [c]
            elif s == best:
                kept.append(c)
        if len(kept) == 1:
            return kept[0]
        remaining = kept
    return remaining[0]
