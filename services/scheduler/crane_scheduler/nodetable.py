"""The node table: every node's scheduling state as numpy columns, so plugins answer for all nodes at once.

kube-scheduler calls each Filter and Score plugin once per node; in Python that loop would cost more than the
API calls it feeds. Here a node is a row: allocatable and requested resources are int64 matrices (one column per
resource, extended resources added on first sight), labels are dictionary-encoded per key (a requirement is
evaluated once per distinct value, then broadcast with one array lookup), and taint lists are interned into
groups (tolerations are checked once per distinct taint list, not once per node).

The table is also the scheduler cache: bound pods are accounted against their node's row, and a pod the
scheduler has just chosen a node for is *assumed* there until the informer confirms the binding (or the bind
fails and the assumption is forgotten). Deleted nodes leave a dead row that the next new node reuses, so rows
never move and plugin caches keyed by row stay valid.
"""

from __future__ import annotations

from collections.abc import Callable, Container, ItemsView, Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Never, TypeVar

import numpy as np
import numpy.typing as npt

from crane_scheduler.podinfo import (
    CPU,
    EPHEMERAL,
    MEMORY,
    PODS,
    HostPort,
    NodeInfo,
    PodInfo,
    Requirement,
    Taint,
    parse_int,
)
from crane_scheduler.rowcache import RowVersions

Mask = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]
FIXED_RESOURCES = (CPU, MEMORY, EPHEMERAL, PODS)
_S = TypeVar("_S", bound=np.generic)


@dataclass(slots=True)
class PodRecord:
    """A pod counted against a node: bound (seen by the informer) or assumed (our bind is in flight)."""

    uid: str
    namespace: str
    name: str
    node: str
    requests: dict[str, int]
    nonzero_cpu: int
    nonzero_memory: int
    host_ports: tuple[HostPort, ...]
    scheduler_name: str
    scheduled_at: str | None
    assumed: bool = False
    pod: PodInfo | None = None
    """The pod itself, for plugins that read more than the accounting (volumes, priority, labels)."""
    delta: Any = None
    """The record's accounting as one int64 row (requests by column, non-zero cpu and memory, 1 pod), built by
    the table's batch updates on first use."""
    seq: int = 0
    """Order in which the table first counted the pod (kept across what-ifs): kube's NodeInfo lists a node's pods
    in the order they were added, and preemption breaks exact ties between victims by it."""

    @classmethod
    def of(cls, pod: PodInfo, node: str, *, assumed: bool = False) -> PodRecord:
        return cls(
            pod.uid,
            pod.namespace,
            pod.name,
            node,
            pod.requests,
            pod.nonzero_cpu,
            pod.nonzero_memory,
            pod.host_ports,
            pod.scheduler_name,
            pod.scheduled_at,
            assumed,
            pod,
        )


Nomination = tuple[PodInfo, str]
"""(the nominated pod, the node preemption nominated it to)"""


class Nominations(MutableMapping[str, Nomination]):
    """Pods nominated to a node by preemption (ours or another scheduler's), not bound yet: uid -> (pod, node).

    A dict whose changes are told to ``listeners`` (uid, the new nomination or None when it is cleared), so a
    plugin can keep per-node sums of the nominated pods up to date on nominate/clear instead of walking every
    nomination per decision (Dynamic's load estimate, ``loadaware/nominated.py``)."""

    __slots__ = ("_by_node", "_pods", "_records", "listeners")

    def __init__(self) -> None:
        self._pods: dict[str, Nomination] = {}
        self._records: dict[str, PodRecord] = {}
        self._by_node: dict[str, dict[str, None]] = {}  # node -> its nominated uids (in nomination order)
        self.listeners: list[Callable[[str, Nomination | None], None]] = []

    def __getitem__(self, uid: str) -> Nomination:
        return self._pods[uid]

    def __setitem__(self, uid: str, nomination: Nomination) -> None:
        old = self._pods.get(uid)
        if old is not None and old[1] != nomination[1]:
            self._off_node(uid, old[1])
        self._pods[uid] = nomination
        self._by_node.setdefault(nomination[1], {})[uid] = None
        self._records.pop(uid, None)
        for listener in self.listeners:
            listener(uid, nomination)

    def __delitem__(self, uid: str) -> None:
        _, node = self._pods.pop(uid)
        self._off_node(uid, node)
        self._records.pop(uid, None)
        for listener in self.listeners:
            listener(uid, None)

    def _off_node(self, uid: str, node: str) -> None:
        uids = self._by_node.get(node)
        if uids is not None:
            uids.pop(uid, None)
            if not uids:
                del self._by_node[node]

    def on_node(self, node: str) -> Iterable[str]:
        """The uids nominated to ``node``."""
        return self._by_node.get(node, {}).keys()

    def waiting_on(self, node: str, placed: Container[str]) -> bool:
        """Whether a pod nominated to ``node`` is not placed yet (``placed``: the table's pods, assumed ones
        included): a pod assumed there is in the node's row already, not one of its nominated pods (kube's assume
        deletes the nominator's entry)."""
        return any(uid not in placed for uid in self._by_node.get(node, ()))

    def __iter__(self) -> Iterator[str]:
        return iter(self._pods)

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def get(self, uid: str, default: Any = None) -> Any:  # the dict's: the mixin's raises and catches KeyError
        return self._pods.get(uid, default)

    def pop(self, uid: str, *default: Any) -> Any:
        """As ``dict.pop``; the pod watch asks it for every pod event (most have no nomination)."""
        if uid not in self._pods:
            if default:
                return default[0]
            raise KeyError(uid)
        nomination = self._pods[uid]
        del self[uid]
        return nomination

    def items(self) -> ItemsView[str, Nomination]:  # the dict's own view: Filter walks it per decision
        return self._pods.items()

    def record(self, uid: str) -> PodRecord:
        """The nominated pod as an assumed ``PodRecord`` on its node, built once per nomination: Filter adds the
        nominated pods for every decision, and a kept record keeps its delta row (``NodeTable.delta_rows``)."""
        record = self._records.get(uid)
        if record is None:
            pod, node = self._pods[uid]
            record = self._records[uid] = PodRecord.of(pod, node, assumed=True)
        return record


class _LabelColumn:
    """One label key: per-row code into ``values`` (-1 = the node has no such label)."""

    __slots__ = ("codes", "index", "values")

    def __init__(self, capacity: int) -> None:
        self.codes: npt.NDArray[np.int32] = np.full(capacity, -1, dtype=np.int32)
        self.values: list[str] = []
        self.index: dict[str, int] = {}

    def code(self, value: str) -> int:
        code = self.index.get(value)
        if code is None:
            code = self.index[value] = len(self.values)
            self.values.append(value)
        return code


@dataclass(slots=True)
class _Column:
    array: npt.NDArray[Any]
    default: Any
    extract: Callable[[NodeInfo], Any]


class _RowView(Generic[_S]):
    """A read-only view of the rows in use of a backing array: ``table.live`` is ``table._live[: table.n_rows]``.
    The backing arrays are replaced when the table grows, so the view is sliced on every access."""

    __slots__ = ("_backing", "_name")

    def __init__(self, backing: str) -> None:
        self._backing = backing
        self._name = backing

    def __set_name__(self, owner: type[NodeTable], name: str) -> None:
        self._name = name

    def __get__(self, table: NodeTable, owner: type[NodeTable] | None = None) -> npt.NDArray[_S]:
        array: npt.NDArray[_S] = getattr(table, self._backing)
        return array[: table.n_rows]

    def __set__(self, table: NodeTable, value: Never) -> None:
        raise AttributeError(f"{self._name} is a read-only view of the table's rows")


class NodeTable:
    """Rows of node state plus the pod accounting that feeds them. Single-threaded: the event loop owns it."""

    def __init__(self, capacity: int = 64) -> None:
        self._cap = capacity
        self.n_rows = 0  # rows in use (live or dead); arrays are meaningful on [:n_rows]
        self.num_nodes = 0
        self.version = 0  # bumped on every change; plugins key their caches on it
        self.nodes_version = 0  # bumped when a node is added, changed or removed (not on pod accounting)
        self.labels_version = 0
        self.taints_version = 0
        # Per row, when its allocatable or accounted requests last changed (per-row result caches refresh those).
        self.row_versions = RowVersions(capacity)
        self.names: list[str] = []
        self.nodes: list[NodeInfo | None] = []
        self.rows: dict[str, int] = {}
        self._free: list[int] = []
        self.resources: dict[str, int] = {r: i for i, r in enumerate(FIXED_RESOURCES)}
        self._live = np.zeros(capacity, dtype=bool)
        self._alloc = np.zeros((capacity, len(FIXED_RESOURCES)), dtype=np.int64)
        self._requested = np.zeros((capacity, len(FIXED_RESOURCES)), dtype=np.int64)
        self._nonzero = np.zeros((capacity, 2), dtype=np.int64)  # cpu, memory with scoring defaults
        self._pod_count = np.zeros(capacity, dtype=np.int64)
        self._unschedulable = np.zeros(capacity, dtype=bool)
        self._taint_group = np.zeros(capacity, dtype=np.int32)
        self.taint_sets: list[tuple[Taint, ...]] = [()]
        self._taint_index: dict[tuple[Taint, ...], int] = {(): 0}
        self._labels: dict[str, _LabelColumn] = {}
        self._columns: dict[str, _Column] = {}
        self.ports: dict[int, list[HostPort]] = {}
        self.pods: dict[str, PodRecord] = {}
        self._pods_by_node: dict[str, set[str]] = {}
        self.unschedulable_count = 0
        self._seq = 0
        # Per node, a number that changes whenever the node's pods change (also in what-ifs): plugins that
        # aggregate a node's pods cache the aggregate under it.
        self.pods_version: dict[str, int] = {}
        self._touches = 0
        # Pods nominated to a node by preemption (ours or another scheduler's), not bound yet: uid -> (pod, node).
        # Filter counts them for pods of equal or lower priority (kube's nominator).
        self.nominated = Nominations()
        # Plugins that account something of their own per bound pod (NRT zone results) listen here.
        self.pod_added: list[Callable[[PodInfo], None]] = []
        self.pod_removed: list[Callable[[str], None]] = []
        # Plugins that must see a pod as soon as it is assumed (InterPodAffinity, PodTopologySpread): (pod, node).
        self.pod_assumed: list[Callable[[PodInfo, str], None]] = []
        # An assumption undone (its bind failed or was withheld), with its record: the decider workers' feed.
        self.pod_forgotten: list[Callable[[PodRecord, bool], None]] = []
        self.reserve_kept: str | None = None
        """while ``forget(uid, unreserved=False)`` removes the pod: ``uid`` (a ``pod_removed`` hook keeps what that
        pod's Reserve took: it is bound already, and the informer will account it)"""
        # What-ifs that must be seen by plugins reading other nodes' pods (preemption's per-node dry run, kube's
        # PreFilterExtensions RemovePod/AddPod): (records, -1 taken out / +1 put back), with ``notify=True`` only.
        self.pod_simulated: list[Callable[[list[PodRecord], int], None]] = []
        # Preemption's what-if on its victims, for plugins whose verdict depends on them through something the
        # table does not account (Dynamic: their measured usage): (victims, -1 taken out / +1 put back), told by
        # the dry run in every mode (``what_if``), also when no pod moves in the table.
        self.victims_simulated: list[Callable[[list[PodRecord], int], None]] = []
        # A pod left the table (deleted, or its assumption forgotten), with its last record: plugins that keep
        # something about the pod's node after it is gone (Dynamic: a preemption victim's usage) listen here.
        self.pod_left: list[Callable[[PodRecord], None]] = []
        # A pod left the cluster (deleted, or terminal: the pod watch's field selector drops it), after ``pod_left``:
        # plugins that count something of a bound pod beyond the table's accounting (Dynamic: its estimate).
        self.pod_deleted: list[Callable[[PodRecord], None]] = []

    # ------------------------------------------------------------------------------------------ views

    live = _RowView[np.bool_]("_live")
    alloc = _RowView[np.int64]("_alloc")
    requested = _RowView[np.int64]("_requested")
    nonzero_requested = _RowView[np.int64]("_nonzero")
    pod_count = _RowView[np.int64]("_pod_count")
    unschedulable = _RowView[np.bool_]("_unschedulable")
    taint_group = _RowView[np.int32]("_taint_group")

    def column(self, name: str) -> npt.NDArray[Any]:
        """A plugin-registered per-node column (see ``register_column``)."""
        return self._columns[name].array[: self.n_rows]

    def has_column(self, name: str) -> bool:
        """Whether ``register_column`` made ``name`` (one column serves every profile's instance of a plugin)."""
        return name in self._columns

    def label_codes(self, key: str) -> tuple[npt.NDArray[np.int32], list[str]] | None:
        """The rows' codes for label ``key`` (-1: no such label) and the distinct values they index; None when no
        node has ever had the key. Plugins group rows into topology domains with this (``np.bincount``)."""
        lc = self._labels.get(key)
        return None if lc is None else (lc.codes[: self.n_rows], lc.values)

    def live_rows(self) -> npt.NDArray[np.intp]:
        return np.flatnonzero(self.live)

    # ------------------------------------------------------------------------------------------ nodes

    def register_column(
        self, name: str, extract: Callable[[NodeInfo], Any], dtype: npt.DTypeLike = np.float64, default: Any = 0
    ) -> None:
        """Keep ``extract(node)`` for every node in an array (e.g. a load annotation parsed once per update)."""
        array = np.full(self._cap, default, dtype=dtype)
        for row, node in enumerate(self.nodes):
            if node is not None:
                array[row] = extract(node)
        self._columns[name] = _Column(array, default, extract)

    def upsert_node(self, node: NodeInfo) -> str | None:
        """Add or update a node; returns "add", "update", or None when nothing the scheduler reads changed."""
        row = self.rows.get(node.name)
        if row is not None:
            old = self.nodes[row]
            assert old is not None
            if (old.allocatable, old.labels, old.taints, old.unschedulable, old.annotations, old.declared_features) == (
                node.allocatable,
                node.labels,
                node.taints,
                node.unschedulable,
                node.annotations,
                node.declared_features,
            ) and (old.raw.get("status") or {}).get("images") == (node.raw.get("status") or {}).get("images"):
                self.nodes[row] = node
                return None
            kind = "update"
        else:
            row = self._new_row(node.name)
            old = None
            kind = "add"
        self.nodes[row] = node
        self._alloc[row] = 0
        for res, value in node.allocatable.items():
            col = self._resource(res)  # may widen the matrices: look the column up first
            self._alloc[row, col] = value
        if bool(self._unschedulable[row]) != node.unschedulable:
            self.unschedulable_count += 1 if node.unschedulable else -1
        self._unschedulable[row] = node.unschedulable
        if old is None or old.taints != node.taints:
            self._taint_group[row] = self._taint_group_of(node.taints)
            self.taints_version += 1
        if old is None or old.labels != node.labels:
            self._set_labels(row, old.labels if old else {}, node.labels)
        for extra in self._columns.values():
            extra.array[row] = extra.extract(node)
        if old is None:
            for uid in self._pods_by_node.get(node.name, ()):
                self._apply(self.pods[uid], +1)
        if old is None or old.allocatable != node.allocatable:  # what the row caches read (pods: in _apply)
            self.row_versions.touch_row(row)
        self.version += 1
        self.nodes_version += 1
        return kind

    def remove_node(self, name: str) -> bool:
        row = self.rows.pop(name, None)
        if row is None:
            return False
        old = self.nodes[row]
        if old is not None:
            self._set_labels(row, old.labels, {})
        if self._unschedulable[row]:
            self.unschedulable_count -= 1
        self.nodes[row] = None
        self.names[row] = ""
        self._live[row] = False
        for arr in (self._alloc, self._requested, self._nonzero):
            arr[row] = 0
        self._pod_count[row] = 0
        self._unschedulable[row] = False
        self._taint_group[row] = 0
        for col in self._columns.values():
            col.array[row] = col.default
        self.ports.pop(row, None)
        self.row_versions.touch_row(row)
        self._free.append(row)
        self.num_nodes -= 1
        self.version += 1
        self.nodes_version += 1
        return True

    def node_names(self) -> set[str]:
        return set(self.rows)

    def _new_row(self, name: str) -> int:
        if self._free:
            row = self._free.pop()
        else:
            if self.n_rows == self._cap:
                self._grow(self._cap * 2)
            row = self.n_rows
            self.n_rows += 1
            self.names.append("")
            self.nodes.append(None)
        self.names[row] = name
        self.rows[name] = row
        self._live[row] = True
        self.num_nodes += 1
        return row

    def _grow(self, cap: int) -> None:
        def grown(a: npt.NDArray[Any], fill: Any = 0) -> npt.NDArray[Any]:
            out = np.full((cap, *a.shape[1:]), fill, dtype=a.dtype)
            out[: self._cap] = a
            return out

        self._live, self._alloc, self._requested = grown(self._live), grown(self._alloc), grown(self._requested)
        self._nonzero, self._pod_count = grown(self._nonzero), grown(self._pod_count)
        self._unschedulable, self._taint_group = grown(self._unschedulable), grown(self._taint_group)
        for lc in self._labels.values():
            lc.codes = grown(lc.codes, -1)
        for col in self._columns.values():
            col.array = grown(col.array, col.default)
        self._cap = cap

    def _resource(self, name: str) -> int:
        col = self.resources.get(name)
        if col is None:
            col = self.resources[name] = len(self.resources)
            pad = ((0, 0), (0, 1))
            self._alloc = np.pad(self._alloc, pad)
            self._requested = np.pad(self._requested, pad)
            self.row_versions.touch_all()  # a resource no node had: results that looked it up are stale
        return col

    def _taint_group_of(self, taints: tuple[Taint, ...]) -> int:
        group = self._taint_index.get(taints)
        if group is None:
            group = self._taint_index[taints] = len(self.taint_sets)
            self.taint_sets.append(taints)
        return group

    def _set_labels(self, row: int, old: Any, new: Any) -> None:
        for key in old.keys() - new.keys():
            self._labels[key].codes[row] = -1
        for key, value in new.items():
            lc = self._labels.get(key)
            if lc is None:
                lc = self._labels[key] = _LabelColumn(self._cap)
            lc.codes[row] = lc.code(value)
        self.labels_version += 1

    # ------------------------------------------------------------------------------------------ labels

    def label_mask(self, req: Requirement) -> Mask:
        """Rows whose labels (or name, for a ``metadata.name`` field requirement) satisfy ``req``."""
        n = self.n_rows
        if req.field:
            hit = np.zeros(n, dtype=bool)
            row = self.rows.get(req.values[0]) if req.values else None
            if row is not None:
                hit[row] = True
            return hit if req.operator == "In" else ~hit
        lc = self._labels.get(req.key)
        op = req.operator
        if lc is None:  # no node has this key
            return np.full(n, op in ("NotIn", "DoesNotExist"), dtype=bool)
        codes = lc.codes[:n]
        if op == "Exists":
            return codes >= 0
        if op == "DoesNotExist":
            return codes < 0
        if op in ("In", "NotIn"):
            wanted = [c for v in req.values if (c := lc.index.get(v)) is not None]
            if not wanted:
                hit = np.zeros(n, dtype=bool)
            elif len(wanted) == 1:
                hit = codes == wanted[0]
            else:
                hit = np.isin(codes, wanted)
            return hit if op == "In" else ~hit
        if op in ("Gt", "Lt"):
            bound = parse_int(req.values[0]) if len(req.values) == 1 else None
            if bound is None:
                return np.zeros(n, dtype=bool)
            ok = np.zeros(len(lc.values) + 1, dtype=bool)  # last slot: label missing (code -1)
            for code, value in enumerate(lc.values):
                num = parse_int(value)
                ok[code] = num is not None and (num > bound if op == "Gt" else num < bound)
            return ok[codes]
        return np.zeros(n, dtype=bool)

    # ------------------------------------------------------------------------------------------ pods

    def add_pod(self, pod: PodInfo) -> bool:
        """A bound pod seen by the informer; confirms our assumption if we made one. True when the accounted
        usage changed (a new pod, or one that moved or was resized)."""
        old = self.pods.get(pod.uid)
        record = PodRecord.of(pod, pod.node_name)
        if old is not None:
            if (old.node, old.requests, old.nonzero_cpu, old.nonzero_memory, old.host_ports) == (
                record.node,
                record.requests,
                record.nonzero_cpu,
                record.nonzero_memory,
                record.host_ports,
            ):
                old.assumed = False
                old.scheduled_at = record.scheduled_at
                if old.pod is not pod:  # same accounting, new object (its status, its start time): pods changed
                    self._touch(old.node)
                old.pod = pod
                for added in self.pod_added:
                    added(pod)
                return False
            self.remove_pod(pod.uid)
        self._insert(record)
        for added in self.pod_added:
            added(pod)
        return True

    def assume(self, pod: PodInfo, node: str) -> None:
        """Count ``pod`` against ``node`` now, before the bind lands, so the next decision sees it."""
        if pod.uid in self.pods:
            self.remove_pod(pod.uid)
        self._insert(PodRecord.of(pod, node, assumed=True))
        for assumed in self.pod_assumed:
            assumed(pod, node)

    def forget(self, uid: str, *, unreserved: bool = True) -> bool:
        """Undo an assumption whose bind failed; a binding the informer already confirmed is kept. ``unreserved``
        False: the plugins' Reserve state stays (the pod turned out bound already: the informer accounts it), and
        the hooks are told so (the decider workers' replicas keep theirs too)."""
        record = self.pods.get(uid)
        if record is None or not record.assumed:
            return False
        self.reserve_kept = None if unreserved else uid
        try:
            self.remove_pod(uid)
        finally:
            self.reserve_kept = None
        for forgotten in self.pod_forgotten:
            forgotten(record, unreserved)
        return True

    def is_assumed(self, uid: str) -> bool:
        record = self.pods.get(uid)
        return record is not None and record.assumed

    def remove_pod(self, uid: str, deleted: bool = False) -> PodRecord | None:
        """Take the pod out of the accounting; ``deleted``: it left the cluster (deleted or terminal), not just the
        table (a forgotten assumption, a resize re-inserted), and the ``pod_deleted`` hooks hear of it too."""
        record = self.pods.pop(uid, None)
        if record is None:
            return None
        self._touch(record.node)
        on_node = self._pods_by_node.get(record.node)
        if on_node is not None:
            on_node.discard(uid)
            if not on_node:
                del self._pods_by_node[record.node]
        self._apply(record, -1)
        self.version += 1
        for removed in self.pod_removed:
            removed(uid)
        for left in self.pod_left:
            left(record)
        if deleted:
            for gone in self.pod_deleted:
                gone(record)
        return record

    def what_if(self, victims: list[PodRecord], sign: int) -> None:
        """Tell the ``victims_simulated`` hooks that preemption's what-if takes ``victims`` out (-1) or puts them
        back (+1); the dry run calls it alongside ``simulate_remove``/``simulate_add``, or alone where it moves no
        pod (its arithmetic reprieve)."""
        if victims:
            for hook in self.victims_simulated:
                hook(victims, sign)

    def simulate_remove(self, uids: Iterable[str], *, notify: bool = False) -> list[PodRecord]:
        """Take pods out of the accounting for a what-if (preemption's dry run); ``simulate_add`` puts them back.
        Synchronous callers only: nothing else may look at the table in between. The pod hooks are not called;
        with ``notify`` the ``pod_simulated`` hooks are (the pod index follows the what-if)."""
        removed = []
        for uid in uids:
            record = self.pods.pop(uid, None)
            if record is None:
                continue
            self._pods_by_node.get(record.node, set()).discard(uid)
            removed.append(record)
        for node in {record.node for record in removed}:
            self._touch(node)
        self._apply_many(removed, -1)
        if notify:
            for hook in self.pod_simulated:
                hook(removed, -1)
        return removed

    def simulate_add(self, records: Iterable[PodRecord], *, notify: bool = False) -> None:
        added = list(records)
        for record in added:
            self.pods[record.uid] = record
            self._pods_by_node.setdefault(record.node, set()).add(record.uid)
        for node in {record.node for record in added}:
            self._touch(node)
        self._apply_many(added, +1)
        if notify:
            for hook in self.pod_simulated:
                hook(added, +1)

    def _apply_many(self, records: list[PodRecord], sign: int) -> None:
        """``_apply`` for many pods: each record's delta row (requests, non-zero cpu/memory, 1 pod) is built once
        and kept on the record, then the rows are summed per node with numpy (the dry run moves hundreds of pods
        at a time; Python arithmetic per resource per pod would dominate it)."""
        if not records:
            return
        for record in records:  # every resource has its column before the widths are fixed
            for res in record.requests:
                if res not in self.resources:
                    self._resource(res)
        width = self._requested.shape[1]
        rows: list[int] = []
        vectors: list[IntArray] = []
        rows_of = self.rows
        for record in records:
            row = rows_of.get(record.node)
            if row is None:
                continue
            vector = record.delta
            if vector is None or len(vector) != width + 3:
                vector = record.delta = self._delta_of(record, width)
            rows.append(row)
            vectors.append(vector)
            if record.host_ports:
                self._apply_ports(row, record.host_ports, sign)
        if rows:
            index = np.asarray(rows, dtype=np.intp)
            matrix = np.array(vectors)
            order = np.argsort(index, kind="stable")
            touched, starts = np.unique(index[order], return_index=True)
            sums = np.add.reduceat(matrix[order], starts, axis=0)
            if sign < 0:
                sums = -sums
            self._requested[touched] += sums[:, :width]
            self._nonzero[touched] += sums[:, width : width + 2]
            self._pod_count[touched] += sums[:, width + 2]
            self.row_versions.touch(touched.tolist())
        self.version += 1

    def delta_rows(self, records: Sequence[PodRecord]) -> IntArray:
        """The records' delta rows (``PodRecord.delta``: requests by resource column, then non-zero cpu and
        memory and 1 pod), one matrix row each: built once per record and kept, so a dry run that reads
        hundreds of victims' requests per attempt does no Python arithmetic per resource."""
        width = self._requested.shape[1]
        for record in records:
            if record.delta is None or len(record.delta) != width + 3:
                for res in record.requests:
                    if res not in self.resources:
                        self._resource(res)
        width = self._requested.shape[1]
        vectors: list[IntArray] = []
        for record in records:
            vector = record.delta
            if vector is None or len(vector) != width + 3:
                vector = record.delta = self._delta_of(record, width)
            vectors.append(vector)
        if not vectors:
            return np.zeros((0, width + 3), dtype=np.int64)
        return np.array(vectors, dtype=np.int64)

    def _delta_of(self, record: PodRecord, width: int) -> IntArray:
        vector = np.zeros(width + 3, dtype=np.int64)
        for res, value in record.requests.items():
            vector[self.resources[res]] += value
        vector[width] = record.nonzero_cpu
        vector[width + 1] = record.nonzero_memory
        vector[width + 2] = 1
        return vector

    def pods_on(self, node: str) -> Iterable[PodRecord]:
        return (self.pods[uid] for uid in self._pods_by_node.get(node, ()))

    def _touch(self, node: str) -> None:
        self._touches += 1
        self.pods_version[node] = self._touches

    def _insert(self, record: PodRecord) -> None:
        self._seq += 1
        record.seq = self._seq
        self._touch(record.node)
        self.pods[record.uid] = record
        self._pods_by_node.setdefault(record.node, set()).add(record.uid)
        self._apply(record, +1)
        self.version += 1

    def _apply(self, record: PodRecord, sign: int) -> None:
        row = self.rows.get(record.node)
        if row is None:  # pod on a node we do not (yet) know: counted when the node arrives
            return
        for res, value in record.requests.items():
            col = self._resource(res)
            self._requested[row, col] += sign * value
        self._nonzero[row, 0] += sign * record.nonzero_cpu
        self._nonzero[row, 1] += sign * record.nonzero_memory
        self._pod_count[row] += sign
        self.row_versions.touch_row(row)
        self._apply_ports(row, record.host_ports, sign)

    def _apply_ports(self, row: int, host_ports: tuple[HostPort, ...], sign: int) -> None:
        """Add (sign +1) or remove (-1) a pod's host ports on a row; a row with none in use has no entry."""
        if not host_ports:
            return
        used = self.ports.setdefault(row, [])
        for hp in host_ports:
            if sign > 0:
                used.append(hp)
            else:
                used.remove(hp)
        if not used:
            del self.ports[row]
