"""Preemption's victims leaving a node in Dynamic's Filter: in the dry run's what-if, and once they are gone.

Dynamic judges a node by its annotated usage, which the victims' usage is part of. Taking them out by requests
alone (kube's what-if) never changes that verdict, so a high-priority pod whose target node is hot because of
low-priority pods would wait forever. Here a victim takes out of every Filter metric of a resource:

- its **measured usage**, from the node's ``crane.io/pod-usage`` annotation (``crane_shared.batch``: cores and
  bytes per ``namespace/name``), as a fraction of the node's allocatable, weighted by the share of the metric's
  window the pod ran in (``share``): a metric averaged over ``W`` and stamped ``T`` holds the pod's usage over the
  part of ``[T - W, T]`` between its start (``status.startTime``; unknown: the whole window) and its departure
  (in the what-if: still there). ``W`` is the estimate's window of the metric (``EstimateArgs.window_of``, 5m: the
  window of the 5-minute averages under the ``*_max_avg_*`` maxima too). That is exact for the averages and an
  approximation for the long max windows: a 1-hour or 1-day maximum may hold a victim's past usage until that
  window passes, which this leaves out once its 5-minute average has moved on (optimistic there, as the estimate
  of a new binding is there);
- its **estimate**, when it is one of this scheduler's recent bindings (``RecentEffects``): in the what-if the
  difference the binding makes to the node's estimate; once gone, the binding is dropped.

Once a victim is gone (it left the table carrying kube's ``DisruptionTarget`` condition with reason
``PreemptionByScheduler``, ours or another scheduler's), its measured share stays taken out, computed with its
departure time, until no fresh annotation can still hold it, so the preemptor's next attempt (and every other
pod's Filter) sees the room its preemption made: the preemptor binds instead of preempting again. Other pods
that leave a node do so with the annotator's next rounds, as before. Filter only: Score is unchanged.

A victim missing from the annotation (not measured yet, no annotation, a malformed one: skipped, counted and
logged once by the plugin) takes out only its estimate: a node hot through unmeasured pods stays hot in the
what-if, and preemption cannot help there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from crane_scheduler.loadaware.columns import LoadColumns
from crane_scheduler.loadaware.rowload import RowLoad
from crane_shared.annotations import metric_freshness_window
from crane_shared.batch import PodUsage, PodUsageError, decode_pod_usage
from crane_shared.loadaware.dynamic import resource_of


@dataclass(frozen=True, slots=True)
class Leaving:
    """One victim on its node: order key, presence interval (unix seconds) and measured usage."""

    seq: int
    """the table's ``PodRecord.seq``: every sum over victims runs in this order, whatever the what-if's history"""
    since: float
    """when the pod started; -inf when unknown (it ran through any window)"""
    left: float
    """when it left; inf in the what-if (still there at any annotation's stamp)"""
    cpu: float
    """measured cores (0 when not measured)"""
    memory: float
    """measured bytes"""


def share(stamp: float, window: float, since: float, left: float) -> float:
    """The share of a ``window``-second average stamped ``stamp`` during which a pod present from ``since`` to
    ``left`` ran (a window of 0: a reading at ``stamp``, 1 while the pod was there)."""
    if window <= 0:
        return 1.0 if since <= stamp < left else 0.0
    if since <= stamp - window and left >= stamp:
        return 1.0  # there through the whole window (exactly 1: no rounding in ``stamp - (stamp - window)``)
    lo = max(stamp - window, since)
    hi = min(stamp, left)
    return min(1.0, max(0.0, (hi - lo) / window))


def taken_out(entries: Iterable[Leaving], resource: str, stamp: float, window: float, total: float) -> float:
    """The fraction of the node's ``total`` that ``entries`` hold in a metric of ``resource`` stamped ``stamp``,
    summed in ``seq`` order (so the same victims give the same float in every what-if)."""
    if total <= 0 or math.isnan(stamp):
        return 0.0
    return _taken_out(sorted(entries, key=_seq), resource, stamp, window) / total


def _seq(e: Leaving) -> int:
    return e.seq


def _taken_out(ordered: list[Leaving], resource: str, stamp: float, window: float) -> float:
    out = 0.0
    for e in ordered:
        amount = e.cpu if resource == "cpu" else e.memory
        if amount:
            out += amount * share(stamp, window, e.since, e.left)
    return out


def preempted(raw: Mapping[str, object] | None) -> bool:
    """kube's marker of a preemption victim: condition ``DisruptionTarget`` True, reason
    ``PreemptionByScheduler`` (written by kube-scheduler and by us before the delete)."""
    status = (raw or {}).get("status")
    conditions = status.get("conditions") if isinstance(status, dict) else None
    for cond in conditions or ():
        if isinstance(cond, dict) and cond.get("type") == "DisruptionTarget":
            return cond.get("status") == "True" and cond.get("reason") == "PreemptionByScheduler"
    return False


def started(raw: Mapping[str, object] | None) -> float:
    """``status.startTime`` in unix seconds; -inf when absent or unreadable."""
    status = (raw or {}).get("status")
    text = status.get("startTime") if isinstance(status, dict) else None
    if not isinstance(text, str):
        return -math.inf
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return -math.inf


class PodUsageIndex:
    """Each node row's ``crane.io/pod-usage`` text, decoded when a victim is looked up (one decode per text, not
    per annotator round). A malformed text is skipped: ``on_malformed(node, error)`` once per text."""

    def __init__(self, on_malformed: Callable[[str, str], None]) -> None:
        self.on_malformed = on_malformed
        self._text: dict[int, tuple[str, str]] = {}  # row -> (node, text)
        self._decoded: dict[int, Mapping[str, PodUsage]] = {}

    def rows(self) -> set[int]:
        """The rows whose node has the annotation."""
        return set(self._text)

    def set_row(self, row: int, node: str, text: str | None) -> None:
        if text is None:
            self._text.pop(row, None)
            self._decoded.pop(row, None)
        elif self._text.get(row) != (node, text):
            self._text[row] = (node, text)
            self._decoded.pop(row, None)

    def usage(self, row: int, key: str) -> PodUsage | None:
        """The measured usage of pod ``namespace/name`` on the row's node; None when not measured."""
        decoded = self._decoded.get(row)
        if decoded is None:
            found = self._text.get(row)
            if found is None:
                return None
            try:
                decoded = decode_pod_usage(found[1]).pods
            except PodUsageError as err:
                self.on_malformed(found[0], str(err))
                decoded = {}
            self._decoded[row] = decoded
        return decoded.get(key)


class LeavingLoad(RowLoad):
    """Per node row and metric, the fraction of allocatable that victims take out of Dynamic's Filter
    (``extra[metric]``, to subtract): those of the current what-if and those gone recently."""

    def __init__(self, cols: LoadColumns, capacity: int = 64) -> None:
        super().__init__(cols, capacity)
        self.what_if: dict[int, dict[str, Leaving]] = {}
        self.estimates: dict[int, dict[str, float]] = {}
        """per what-if row, what its victims' recent bindings add to the estimate (per metric)"""
        self.departed: dict[int, dict[str, Leaving]] = {}
        self._names: dict[int, str] = {}
        self._first_left = math.inf
        """the earliest departure kept (``prune`` has nothing to do before it is past the horizon)"""
        self.changed: set[int] = set()
        """rows whose ``extra`` changed since the consumer last cleared this"""
        periods = [metric_freshness_window(s.period).total_seconds() for s in cols.args.policy.sync_policy]
        windows = [cols.args.estimate.window_of(m).total_seconds() for m in self.extra]
        self.horizon = max(periods, default=0.0) + max(windows, default=0.0)
        self._metrics = [(m, resource_of(m) or "", cols.args.estimate.window_of(m).total_seconds()) for m in self.extra]
        """seconds after a departure past which no fresh annotation can still hold the pod"""

    @property
    def counted(self) -> bool:
        """Any row with something taken out (else Filter adds nothing)."""
        return bool(self.what_if or self.departed)

    def node_changed(self, row: int, name: str, cpu: float, memory: float) -> None:
        """A node's annotations (stamps) or allocatable changed; a row reused by another node forgets the last."""
        self.ensure(row)
        self.alloc_cpu[row], self.alloc_memory[row] = cpu, memory
        if self._names.get(row, name) != name:
            self.departed.pop(row, None)
        self._names[row] = name
        if row in self.departed or row in self.what_if:
            self._refresh(row)

    def take_out(self, row: int, uid: str, entry: Leaving) -> None:
        self.ensure(row)
        self.what_if.setdefault(row, {})[uid] = entry

    def put_back(self, row: int, uid: str) -> bool:
        """Whether the victim was taken out here (else nothing changes)."""
        on_row = self.what_if.get(row)
        if on_row is None or on_row.pop(uid, None) is None:
            return False
        if not on_row:
            del self.what_if[row]
            self.estimates.pop(row, None)
        return True

    def set_estimates(self, row: int, removed: Mapping[str, float]) -> None:
        """What the row's what-if victims' recent bindings add to its estimate, per metric (0 when none)."""
        if row in self.what_if and any(removed.values()):
            self.estimates[row] = dict(removed)
        else:
            self.estimates.pop(row, None)
        self._refresh(row)

    def depart(self, row: int, uid: str, entry: Leaving) -> None:
        self.ensure(row)
        self.departed.setdefault(row, {})[uid] = entry
        self._first_left = min(self._first_left, entry.left)
        self._refresh(row)

    def prune(self, now: float) -> None:
        """Forget departures no fresh annotation can still hold (a comparison while none is due)."""
        if now - self._first_left <= self.horizon:
            return
        self._first_left = min((e.left for gone in self.departed.values() for e in gone.values()), default=math.inf)
        if now - self._first_left <= self.horizon:
            return
        for row in [r for r, gone in self.departed.items() if any(now - e.left > self.horizon for e in gone.values())]:
            kept = {uid: e for uid, e in self.departed[row].items() if now - e.left <= self.horizon}
            if kept:
                self.departed[row] = kept
            else:
                del self.departed[row]
            self._refresh(row)
        self._first_left = min((e.left for gone in self.departed.values() for e in gone.values()), default=math.inf)

    def _refresh(self, row: int) -> None:
        """Recompute the row (``taken_out`` per metric plus the estimates); marked changed only when a value moved,
        so a what-if of unmeasured victims leaves the plugin's per-row caches alone. When every victim ran through
        every metric's window (the common case) the sums per resource serve every metric, as ``taken_out`` with a
        share of exactly 1 gives them."""
        measured = [
            e for e in (*self.departed.get(row, {}).values(), *self.what_if.get(row, {}).values()) if e.cpu or e.memory
        ]
        estimates = self.estimates.get(row, {})
        stamps: list[float] = []
        whole: tuple[float, float] | None = None
        if measured:
            measured.sort(key=_seq)
            columns, inside = self.cols.stamps, row < self.cols.capacity
            stamps = [float(columns[m][row]) if inside else math.nan for m, _, _ in self._metrics]
            known = [(t, w) for t, (_, _, w) in zip(stamps, self._metrics, strict=True) if not math.isnan(t)]
            if known and all(w > 0 for _, w in known):
                lo, hi = min(t - w for t, w in known), max(t for t, _ in known)
                if all(e.since <= lo and e.left >= hi for e in measured):
                    cpu = memory = 0.0
                    for e in measured:
                        cpu += e.cpu
                        memory += e.memory
                    whole = (cpu, memory)
        done: dict[tuple[str, float, float], float] = {}  # metrics of one resource, stamp and window: summed once
        moved = False
        for i, (metric, resource, window) in enumerate(self._metrics):
            arr = self.extra[metric]  # looked up: ``ensure`` replaces the arrays when the table grows
            value = 0.0
            if measured:
                stamp = stamps[i]
                total = float(self.alloc_cpu[row] if resource == "cpu" else self.alloc_memory[row])
                if total > 0 and not math.isnan(stamp):
                    if whole is not None:
                        held = whole[0] if resource == "cpu" else whole[1]
                    else:
                        key = (resource, stamp, window)
                        found = done.get(key)
                        held = done[key] = _taken_out(measured, resource, stamp, window) if found is None else found
                    value = held / total
            value += estimates.get(metric, 0.0)
            if arr[row] != value:
                arr[row] = value
                moved = True
        if moved:
            self.changed.add(row)
