"""DynamicResources (kube-scheduler 1.37, default gates): a pod's ResourceClaims, and its requests of extended
resources backed by devices, get devices from ResourceSlices.

- PreEnqueue: every claim must resolve (exist, not be deleting, be the pod's own for a template claim); a
  template claim waits for kube-controller-manager's resourceclaim controller.
- PreFilter: claims as above (kube's messages, UnschedulableAndUnresolvable); a pod asking for an extended resource
  a DeviceClass maps (``extended``) also gets the claim kube makes for it, last (in memory until PreBind, or the one
  an earlier attempt wrote); an allocated claim limits the pod to its ``status.allocation.nodeSelector``; an
  unallocated one must not be in flight for another pod ("resource claim ns/c is in the process of being
  allocated") and its requests' classes must exist; one ``Allocator`` for the cycle, over every slice (the
  DeviceTaintRules' taints added), the devices allocated or in flight, and the shares of devices allocated
  several times.
- Filter, per node: the extended resources first ("cannot fit resource": neither the node's allocatable nor a
  class has it; "cannot schedule extended resource claim": an earlier attempt's claim, deleted by PostFilter);
  then "resourceclaim not available on the node" (an allocated claim's node selector, or its binding conditions
  failed or timed out), or the allocator's answer: "cannot allocate all claims", "invalid resource pools were
  encountered". What kube answers with an Error status fails the attempt the same way (``Rejection.error``): a
  broken selector, an "All" request on a pool being updated, and the filter timeout (10 s by default, for all
  nodes of the cycle together here: "node <n>: timed out trying to allocate devices").
- Reserve: the chosen node's allocation is signalled in flight (``ClaimTracker``), no API write; Unreserve
  drops it, takes the pod out of ``reservedFor`` of a claim PreBind already reserved (kube's strategic-merge
  patch on ``status``, in a task: Unreserve cannot wait), and deletes the extended resources' claim PreBind wrote.
- PreBind, per claim not yet reserved for the pod, retried on conflict: the extended resources' claim is created
  first; the finalizer ``resource.kubernetes.io/delete-protection`` by Update, then ``status.allocation`` (with
  ``allocationTimestamp``) and ``status.reservedFor`` by UpdateStatus; the written claim is assumed until the
  informer shows it; the pod's ``status.extendedResourceClaimStatus`` names the claim and maps each container's
  request. Then, when a chosen device has binding conditions, it waits (an Event "BindingConditionsPending")
  until every condition is true in the claim's ``status.devices``, a failure condition turns true ("device
  binding failed"), or ``bindingTimeout`` passes ("device binding timeout"; 600 s by default). The writes go
  through the API writer process, as the bind does, in its leadership term; each first checks the term
  (``Handle.may_bind``), and the process refuses a write past the term's deadline: a leader that may have lost
  its lease allocates nothing more (``binding``: kube's ``bindClaim`` and the API adapters).
- Score: per node, the sum over ``firstAvailable`` requests of 8 - the index of the subrequest the allocation
  chose; NormalizeScore scales by the maximum (weight 2 in the default profile).
- PostFilter (kube's, before DefaultPreemption): an allocated claim that kept the pod off a node and is reserved
  by nobody else is deallocated ("deallocation of ResourceClaim completed"); an extended resources' claim an
  earlier attempt wrote is deleted ("deletion of ResourceClaim completed"); otherwise Unschedulable without a
  message, and "not found" (kube's Error reading its cycle state) when a PreFilter before it rejected the pod.
- Queueing: claim events with kube's hint (a deallocated claim, or the pod's own claim created or changed),
  slice, class, DeviceTaintRule and node events always.
- DeviceTaintRules (resource.k8s.io/v1, served since 1.37): the plugin's worker (``run``) asks discovery whether they
  are served and watches them into the listers; until they are listed, a pod with claims waits ("waiting for
  DeviceTaintRules to be listed", as kube-scheduler waits for its informers) and is retried once they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, Protocol

import numpy as np
from kubernetes_asyncio import client

from crane_scheduler.framework import (
    SKIP,
    SUCCESS,
    ArgsError,
    ClusterChange,
    ClusterEvent,
    Code,
    CycleState,
    Diagnosis,
    Handle,
    PreFilterResult,
    QueueingHint,
    QueueingHints,
    Rejection,
    Rows,
    Status,
    default_normalize,
    error,
    unschedulable,
)
from crane_scheduler.framework.interface import (
    FilterPlugin,
    NormalizeScorePlugin,
    PostFilterPlugin,
    PreBindPlugin,
    PreFilterPlugin,
    QueueingHintPlugin,
    ReservePlugin,
)
from crane_scheduler.nodetable import IntArray, NodeTable
from crane_scheduler.plugins.dynamicresources import extended
from crane_scheduler.plugins.dynamicresources.allocator import (
    NO_SHARES,
    AllocationError,
    AllocationTimeout,
    Allocator,
    FailedOnNode,
    Plan,
    claim_ref,
)
from crane_scheduler.plugins.dynamicresources.binding import (
    BindingFailed,
    ClaimWriter,
    Conflict,
    LazyApiClaims,
    bind_claim,
    binding_timed_out,
    has_binding_conditions,
    ready_for_binding,
)
from crane_scheduler.plugins.dynamicresources.claims import (
    FINALIZER,
    ClaimError,
    ClaimGetter,
    ClaimTracker,
    claim_key,
    is_reserved_for_pod,
    pod_claims,
    resource_version,
)
from crane_scheduler.plugins.dynamicresources.nodeview import DeviceCache
from crane_scheduler.plugins.dynamicresources.pools import PoolError, node_selector_matches
from crane_scheduler.plugins.dynamicresources.taints import apply_rules
from crane_scheduler.podinfo import NodeInfo, PodInfo
from crane_shared.durations import parse_duration
from crane_shared.informer import Informer
from crane_shared.logs import get_logger

log = get_logger("crane.scheduler.dynamicresources")

NAME = "DynamicResources"
STATE_KEY = NAME
DEFAULT_FILTER_TIMEOUT = 10.0
DEFAULT_BINDING_TIMEOUT = 600.0
BINDING_POLL = 5.0
"""kube polls binding conditions every 5 s; here every claim change wakes the check too, 5 s at most between"""

REASON_CANNOT_ALLOCATE = "cannot allocate all claims"
REASON_NOT_AVAILABLE = "resourceclaim not available on the node"
RULES: Final = "devicetaintrules"
EXT_MADE_KEPT = 1024
"""extended resources' claims PreBind made, kept by pod until the informer shows them"""

Raw = Mapping[str, Any]


class DraObjects(Protocol):
    """What the plugin reads: claims by namespace/name, every ResourceSlice, DeviceClasses by name (and, where
    served, DeviceTaintRules: ``device_taint_rules``)."""

    def resource_claim(self, namespace: str, name: str) -> Raw | None: ...

    def resource_claims_by_key(self) -> Mapping[str, Raw]: ...

    def resource_slices(self) -> Sequence[Raw]: ...

    def device_classes(self) -> Mapping[str, Raw]: ...


class Allocations(Mapping[str, list[dict[str, Any]]]):
    """Node name -> the allocation results of the claims to allocate, for the nodes Filter found feasible. A node
    Filter answered by counting (``Allocator.fits_nodes``: a row of its ``fit`` mask, or one node) gets its
    results from the search when first asked (Reserve asks for the chosen node; Score only when a request has
    subrequests, which counting never answers): the search then runs on the same allocator, so it finds what it
    would have found in Filter."""

    def __init__(self, allocator: Allocator | None = None, claims: Sequence[Raw] = ()) -> None:
        self.allocator, self.claims = allocator, claims  # what a deferred node's search runs with
        self._found: dict[str, list[dict[str, Any]]] = {}
        self._deferred: dict[str, NodeInfo] = {}
        self._mask: np.ndarray[Any, np.dtype[np.bool_]] | None = None  # deferred rows of ``_nodes``
        self._nodes: Sequence[NodeInfo | None] = ()
        self._rows: Mapping[str, int] = {}
        self._in_mask = 0

    def found(self, node: str, results: list[dict[str, Any]]) -> None:
        self._found[node] = results

    def defer(self, node: NodeInfo) -> None:
        self._deferred[node.name] = node

    def defer_rows(
        self, mask: np.ndarray[Any, np.dtype[np.bool_]], nodes: Sequence[NodeInfo | None], rows: Mapping[str, int]
    ) -> None:
        """The rows of ``mask`` (owned from now on) in ``nodes`` (the node table's rows, copied); ``rows``: the
        table's row of each node name."""
        self._mask, self._nodes, self._rows = mask, list(nodes), rows
        self._in_mask = int(np.count_nonzero(mask))

    def _row(self, node: str) -> int | None:
        """The row of a deferred node in the mask, None when not there."""
        if self._mask is None or not self._in_mask:
            return None
        row = self._rows.get(node)
        if row is None or row >= len(self._mask) or not self._mask[row]:
            return None
        info = self._nodes[row]
        return row if info is not None and info.name == node else None

    def __getitem__(self, node: str) -> list[dict[str, Any]]:
        results = self._found.get(node)
        if results is None:
            info = self._deferred.pop(node, None)
            if info is None:
                row = self._row(node)
                if row is None:
                    raise KeyError(node)
                assert self._mask is not None
                self._mask[row] = False
                self._in_mask -= 1
                info = self._nodes[row]
                assert info is not None
            found = None
            if self.allocator is not None:
                try:
                    found = self.allocator.allocate(info, self.claims)
                except AllocationError as err:
                    log.error("search failed on a node the device count admitted", node=node, error=str(err))
            if found is None:  # a bug if ever: Reserve answers kube's "claim allocation not found for node"
                log.error("no allocation on a node the device count admitted", node=node)
                raise KeyError(node)
            results = self._found[node] = found
        return results

    def __contains__(self, node: object) -> bool:
        return node in self._found or node in self._deferred or (isinstance(node, str) and self._row(node) is not None)

    def __iter__(self) -> Iterator[str]:
        yield from self._found
        yield from self._deferred
        if self._mask is not None:
            for row in np.flatnonzero(self._mask):
                info = self._nodes[int(row)]
                if info is not None:
                    yield info.name

    def __len__(self) -> int:
        return len(self._found) + len(self._deferred) + self._in_mask


@dataclass
class _Group:
    """Nodes that need the same claims allocated (with extended resources: the same node claim)."""

    claims: list[Raw]  # the claims to allocate, in ``_State.to_allocate`` order
    plan: Plan | None = None
    allocations: Allocations = field(default_factory=Allocations)
    ext_claim: dict[str, Any] | None = None  # the extended resources' claim as this node needs it
    mappings: list[Any] = field(default_factory=list)


@dataclass
class _State:
    claims: list[Raw]  # the pod's claims, then the extended resources' claim (``ext_index``)
    available_on: list[Raw | None]  # the allocated claims' node selectors
    allocator: Allocator | None = None
    to_allocate: list[int] = field(default_factory=list)  # indexes of the unallocated claims
    groups: list[_Group] = field(default_factory=list)
    chosen: dict[int, dict[str, Any]] = field(default_factory=dict)  # claim index -> allocation (Reserve)
    reserved: _Group | None = None  # the chosen node's group (Reserve)
    unavailable: set[int] = field(default_factory=set)  # allocated claims some node refused
    ext_index: int | None = None
    ext_uid: str = ""  # the extended resources' claim's uid in PreFilter (in memory: a temporary one)
    ext_scalars: dict[str, int] = field(default_factory=dict)
    classes: extended.ClassResolver | None = None

    @property
    def plan(self) -> Plan | None:
        """The one group's count plan (the common case: every node needs the same claims)."""
        return self.groups[0].plan if len(self.groups) == 1 else None

    def group_of(self, node: str) -> _Group | None:
        for group in self.groups:
            if node in group.allocations:
                return group
        return None

    def results(self, node: str) -> list[dict[str, Any]] | None:
        group = self.group_of(node)
        return None if group is None else group.allocations.get(node)

    @property
    def user_claims(self) -> list[Raw]:
        return self.claims if self.ext_index is None else self.claims[: self.ext_index]


class DynamicResources(
    PreFilterPlugin,
    FilterPlugin,
    PostFilterPlugin,
    NormalizeScorePlugin,
    ReservePlugin,
    PreBindPlugin,
    QueueingHintPlugin,
):
    name = NAME
    reads_node_pods = False  # PodBlindFilterPlugin: devices, not the node's pods, decide

    def __init__(
        self,
        objects: DraObjects,
        writer: ClaimWriter | None = None,
        filter_timeout: float = DEFAULT_FILTER_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        binding_timeout: float = DEFAULT_BINDING_TIMEOUT,
        handle: Handle | None = None,
    ) -> None:
        self.objects = objects
        self.writer = writer
        self.filter_timeout = filter_timeout
        self.binding_timeout = binding_timeout
        self.clock = clock
        self.handle = handle
        changed_keys = getattr(objects, "changed_keys", None)  # Listers: only changed claims are recounted
        self.tracker = ClaimTracker(changed_keys("resourceclaims") if changed_keys is not None else None)
        self._ext_claims = extended.ClaimIndex(changed_keys("resourceclaims") if changed_keys is not None else None)
        self._ext_made: dict[str, str] = {}  # pod uid -> the claim PreBind made for its extended resources
        self.devices = DeviceCache()  # node views and selector verdicts, kept while slices and classes are
        self._tasks: set[asyncio.Task[None]] = set()
        self._patched: tuple[list[Raw], list[Raw], list[Raw]] = ([], [], [])  # slices, rules -> patched slices
        self.rules_pending = False  # the DeviceTaintRules are served but not listed yet (``run``)

    @property
    def _get(self) -> ClaimGetter:
        return self.tracker.get(self.objects.resource_claim)

    def _rules(self) -> list[Raw]:
        rules = getattr(self.objects, "device_taint_rules", None)
        return list(rules()) if rules is not None else []

    def _slices(self) -> Sequence[Raw]:
        """The slices with the DeviceTaintRules' taints (kube's ``ListWithDeviceTaintRules``), the same objects
        while neither changed (the node views are kept by slice identity)."""
        slices, rules = list(self.objects.resource_slices()), self._rules()
        if not rules:
            return slices
        have_slices, have_rules, patched = self._patched
        if _same(slices, have_slices) and _same(rules, have_rules):
            return patched
        patched = apply_rules(slices, rules)
        self._patched = (slices, rules, patched)
        return patched

    # ------------------------------------------------------------------------------------------ queueing

    def events_to_register(self) -> ClusterEvent:
        """kube's: Node Add/Update, ResourceClaim Add/Update (hinted), DeviceClass and ResourceSlice Add/Update
        (a DeviceTaintRule changes the slices kube's tracker reports); the pod's own update naming its claims is
        the queue's (``SchedulingQueue.update``)."""
        return (
            ClusterEvent.NODE_ADD
            | ClusterEvent.NODE_UPDATE
            | ClusterEvent.RESOURCE_CLAIM_CHANGE
            | ClusterEvent.RESOURCE_SLICE_CHANGE
            | ClusterEvent.DEVICE_CLASS_CHANGE
        )

    def queueing_hints(self) -> QueueingHints:
        return {ClusterEvent.RESOURCE_CLAIM_CHANGE: self.after_claim_change}

    def after_claim_change(self, pod: PodInfo, change: ClusterChange) -> QueueingHint:
        """kube's ``isSchedulableAfterClaimChange``: a deallocated (or deleted allocated) claim may free devices
        for anyone; otherwise only the pod's own claims matter, when created or when their status changed."""
        new, old = change.new_object, change.old_object
        if new is None:
            if old is not None and (old.get("status") or {}).get("allocation") is None:
                return QueueingHint.SKIP
            return QueueingHint.QUEUE
        try:
            claims = pod_claims(pod.raw, self._get)
        except ClaimError:
            return QueueingHint.SKIP
        uid = (new.get("metadata") or {}).get("uid")
        uses = any((c.get("metadata") or {}).get("uid") == uid for c in claims)
        old_status, new_status = ((old or {}).get("status") or {}), (new.get("status") or {})
        if old is not None and old_status.get("allocation") is not None and new_status.get("allocation") is None:
            return QueueingHint.QUEUE
        if not uses:
            return QueueingHint.SKIP
        if old is None:
            return QueueingHint.QUEUE
        return QueueingHint.SKIP if old_status == new_status else QueueingHint.QUEUE

    def pre_enqueue(self, pod: PodInfo) -> bool:
        """Gated (True) while a claim does not resolve."""
        if not (pod.raw.get("spec") or {}).get("resourceClaims"):
            return False  # the queue asks for every pod it moves: keep the common case free
        try:
            pod_claims(pod.raw, self._get)
        except ClaimError:
            return True
        return False

    # ------------------------------------------------------------------------------------------ scheduling cycle

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> PreFilterResult:
        # kube writes its state first and sets the claims last: a pod refused here has none (PostFilter reads it)
        st = _State([], [])
        state[STATE_KEY] = st
        if not (pod.raw.get("spec") or {}).get("resourceClaims") and not extended.has_scalar_requests(pod):
            return PreFilterResult(SKIP)  # most pods: no claim, nothing an extended resource name could back
        try:
            claims = pod_claims(pod.raw, self._get)
        except ClaimError as err:
            return PreFilterResult(unschedulable(str(err), unresolvable=True))
        classes = self.objects.device_classes()
        ext_claim: Raw | None = None
        if extended.has_scalar_requests(pod):
            resolver = extended.resolver(classes)
            scalars = extended.backed_requests(pod, resolver)
            if scalars:
                st.ext_scalars, st.classes = scalars, resolver
                ext_claim = self._ext_claim(pod) or extended.in_memory_claim(pod)
        if ext_claim is not None:
            claims = [*claims, ext_claim]
        if not claims:
            return PreFilterResult(SKIP)
        if self.rules_pending:
            return PreFilterResult(unschedulable("waiting for DeviceTaintRules to be listed", unresolvable=True))
        available_on: list[Raw | None] = [None] * len(claims)
        to_allocate: list[int] = []
        for index, claim in enumerate(claims):
            allocation = (claim.get("status") or {}).get("allocation")
            if allocation is not None:
                available_on[index] = allocation.get("nodeSelector")
                continue
            to_allocate.append(index)
            uid = str((claim.get("metadata") or {}).get("uid", ""))
            if self.tracker.has_pending(uid):
                reason = f"resource claim {claim_ref(claim)} is in the process of being allocated"
                return PreFilterResult(unschedulable(reason, unresolvable=True))
            if claim is ext_claim:
                continue
            status = _validate_requests(claim, classes)
            if status is not None:
                return PreFilterResult(status)
        if to_allocate:
            allocated = self.tracker.allocated(self.objects.resource_claims_by_key())
            shared = self.tracker.shared(self.objects.resource_claims_by_key())
            st.allocator = Allocator(
                classes, self._slices(), allocated, clock=self.clock, cache=self.devices, shared=shared or NO_SHARES
            )
            if ext_claim is None:
                group_claims = [claims[i] for i in to_allocate]
                st.groups = [
                    _Group(group_claims, st.allocator.plan(group_claims), Allocations(st.allocator, group_claims))
                ]
        st.claims, st.available_on, st.to_allocate = claims, available_on, to_allocate
        if ext_claim is not None:
            st.ext_index = len(claims) - 1
            st.ext_uid = str((ext_claim.get("metadata") or {}).get("uid", ""))
        return PreFilterResult()

    def _ext_claim(self, pod: PodInfo) -> Raw | None:
        """The claim an earlier attempt made for the pod's extended resources, as the scheduler sees it (kube's
        ``findExtendedResourceClaim`` over the assume cache): the lister's, or the one PreBind wrote."""
        listed = self.objects.resource_claims_by_key()
        keys = {self._ext_claims.key_of(pod, listed), self._ext_made.get(pod.uid)}
        found = []
        for key in keys:
            if key is None:
                continue
            claim = self.tracker.newest(key, listed.get(key))
            if claim is not None:
                found.append(claim)
        return extended.find_claim(pod, found)

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> list[Rejection]:
        st: _State | None = state.get(STATE_KEY)
        if st is None or not st.claims:
            return []
        masks: dict[tuple[str, bool], np.ndarray[Any, Any]] = {}
        deadline = self.clock() + self.filter_timeout if self.filter_timeout > 0 else None
        never = self._never_available(st)
        nodes = table.nodes

        def mask_of(reason: str, failed: bool) -> np.ndarray[Any, Any]:
            mask = masks.get((reason, failed))
            if mask is None:  # made once per reason (``setdefault`` would make an array for every rejected node)
                mask = masks[(reason, failed)] = np.zeros(table.n_rows, dtype=bool)
            return mask

        def reject(row: int, reason: str, failed: bool = False) -> None:
            mask_of(reason, failed)[row] = True

        if st.ext_index is not None:
            rows_of = self._extended_groups(st, pod, table, reject)
        else:
            rows_of = [(st.groups[0] if st.groups else None, None)]
        for group, rows in rows_of:
            to_allocate = group.claims if group is not None else []
            fits = None
            if st.allocator is not None and group is not None and group.plan is not None:
                fits = st.allocator.fits_nodes(nodes, group.plan, table.nodes_version)
            if fits is not None and rows is None and not never and all(s is None for s in st.available_on):
                # Claims of one shape: every node answered by a count at once (Allocator.fits_nodes)
                assert group is not None
                for row in fits.search.tolist():
                    node = nodes[row]
                    assert node is not None  # a present row
                    verdict = self._filter_node(st, group, node, to_allocate, deadline, None, never)
                    if verdict is not None:
                        reject(row, *verdict)
                group.allocations.defer_rows(fits.fit, nodes, table.rows)
                if fits.cannot.any():
                    mask_of(REASON_CANNOT_ALLOCATE, False)[: len(fits.cannot)] |= fits.cannot
                continue
            for row in range(len(nodes)) if rows is None else rows:
                node = nodes[row]
                if node is None:
                    continue
                fit = fits.answer(row) if fits is not None else None
                verdict = self._filter_node(st, group, node, to_allocate, deadline, fit, never)
                if verdict is not None:
                    reject(row, *verdict)
        out: list[Rejection] = []
        for (reason, failed), mask in masks.items():
            if failed and reason.startswith("node ") and reason.endswith(TIMEOUT_TAIL):
                out.append(Rejection(reason, mask, unresolvable=True, error=True))
            else:
                out.append(Rejection(reason, mask, unresolvable=True, error=failed))
        return out

    def _extended_groups(
        self, st: _State, pod: PodInfo, table: NodeTable, reject: Callable[..., None]
    ) -> list[tuple[_Group | None, list[int] | None]]:
        """kube's ``filterExtendedResources`` per node: the nodes grouped by the claims they need allocated (the
        rejected ones rejected); (group, rows) pairs (rows None: every node). A node needs the resources a class
        maps that its allocatable does not offer; with only such resources asked, the nodes are grouped by the
        table's allocatable columns at once."""
        assert st.ext_index is not None and st.classes is not None
        st.groups = []
        ext = st.claims[st.ext_index]
        live = table.live_rows()
        if extended.has_requests(ext):  # an earlier attempt's claim: PostFilter deletes it
            for row in live.tolist():
                reject(int(row), extended.REASON_STALE)
            return []
        allocated = (ext.get("status") or {}).get("allocation") is not None
        asked = [(n, q) for n, q in st.ext_scalars.items() if q and extended.is_extended_name(n)]
        by_need: dict[extended.NodeRequests, list[int]] = {}
        if all(st.classes.backed(n) for n, _ in asked):
            offered = np.zeros((len(asked), len(live)), dtype=bool)
            for i, (name, _) in enumerate(asked):
                col = table.resources.get(name)
                if col is not None:
                    offered[i] = table.alloc[live, col] > 0
            codes = np.zeros(len(live), dtype=np.int64)
            for i in range(len(asked)):
                codes |= offered[i].astype(np.int64) << i
            for code in np.unique(codes).tolist():
                need = extended.NodeRequests(tuple(sorted(a for i, a in enumerate(asked) if not code >> i & 1)))
                by_need[need] = live[codes == code].tolist()
        else:  # a resource no class maps: the node must have the key (kube's "cannot fit resource")
            for row in live.tolist():
                node = table.nodes[row]
                assert node is not None
                found = extended.node_requests(st.ext_scalars, node, st.classes)
                if isinstance(found, str):
                    reject(row, found)
                else:
                    by_need.setdefault(found, []).append(row)
        out: list[tuple[_Group | None, list[int] | None]] = []
        every = len(by_need) == 1 and len(next(iter(by_need.values()), ())) == len(live)
        for need, rows in by_need.items():
            if not need.resources and st.ext_index == 0:
                continue  # no claim of the pod's own and nothing to allocate here: kube leaves these nodes be
            group: _Group | None
            if allocated:  # kube: no node claim; the claim is not allocated again
                to_allocate = [st.claims[i] for i in st.to_allocate]
                group = self._group(st, to_allocate, None, []) if st.allocator is not None else None
            else:
                claim, mappings = extended.node_claim(ext, pod.raw, need, st.classes)
                to_allocate = [claim if i == st.ext_index else st.claims[i] for i in st.to_allocate]
                group = self._group(st, to_allocate, claim, mappings)
            out.append((group, None if every else rows))
        return out

    def _group(self, st: _State, claims: list[Raw], ext_claim: dict[str, Any] | None, mappings: list[Any]) -> _Group:
        assert st.allocator is not None
        group = _Group(claims, st.allocator.plan(claims), Allocations(st.allocator, claims), ext_claim, mappings)
        st.groups.append(group)
        return group

    def _never_available(self, st: _State) -> list[int]:
        """Allocated claims no node can take now: their devices' binding failed, or timed out (kube checks it
        per node; it does not depend on the node)."""
        out = []
        now = time.time()
        for index, claim in enumerate(st.claims):
            if (claim.get("status") or {}).get("allocation") is None:
                continue
            try:
                ready = ready_for_binding(claim)
            except BindingFailed:
                out.append(index)
                continue
            if not ready and binding_timed_out(claim, self.binding_timeout, now):
                out.append(index)
        return out

    def _filter_node(
        self,
        st: _State,
        group: _Group | None,
        node: NodeInfo,
        to_allocate: list[Raw],
        deadline: float | None,
        fits: bool | None,
        never: list[int],
    ) -> tuple[str, bool] | None:
        """None when the node fits, else (reason, whether it is kube's Error rather than a rejection); ``fits``:
        the count's answer for the node (``Allocator.fits_nodes``), None when the search must answer."""
        # kube allocates before it looks at the unavailable claims, so a broken selector wins over them.
        results = None
        if fits is False:
            return REASON_CANNOT_ALLOCATE, False
        if st.allocator is not None and group is not None and fits is None:
            try:
                results = st.allocator.allocate(node, to_allocate, deadline)
            except AllocationTimeout:
                return f"node {node.name}{TIMEOUT_TAIL}", True
            except FailedOnNode as err:
                return str(err), False
            except AllocationError as err:
                return str(err), True
            if results is None or len(results) != len(to_allocate):
                return REASON_CANNOT_ALLOCATE, False
        unavailable = list(never)
        for index, selector in enumerate(st.available_on):
            if selector is None or index in unavailable:
                continue
            try:
                if not node_selector_matches(node, selector):
                    unavailable.append(index)
            except PoolError as err:
                return str(err), True
        if unavailable:
            st.unavailable.update(unavailable)
            return REASON_NOT_AVAILABLE, False
        if group is None:
            return None
        if results is not None:
            group.allocations.found(node.name, results)
        elif fits:
            group.allocations.defer(node)
        return None

    def post_filter(self, state: CycleState, pod: PodInfo, diagnosis: Diagnosis) -> Status:
        st: _State | None = state.get(STATE_KEY)
        if st is None:
            return error("not found")  # kube: its cycle state cannot be read (a PreFilter before it rejected)
        if not st.claims:
            return Status(Code.UNSCHEDULABLE, ())
        ext = st.claims[st.ext_index] if st.ext_index is not None else None
        written_ext = ext is not None and not extended.is_in_memory(ext)
        for index in sorted(st.unavailable):  # kube walks a set: any of them
            if index == st.ext_index:
                if written_ext:
                    break
                continue
            claim = st.claims[index]
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            if not reserved or (len(reserved) == 1 and reserved[0].get("uid") == pod.uid):
                if self.writer is not None:
                    self._spawn(self._deallocate(self.writer, claim))
                return Status(Code.UNSCHEDULABLE, ("deallocation of ResourceClaim completed",))
        if written_ext and ext is not None:
            if self.writer is not None:
                self._spawn(self._delete(self.writer, ext))
            return Status(Code.UNSCHEDULABLE, ("deletion of ResourceClaim completed",))
        return Status(Code.UNSCHEDULABLE, ())

    async def _deallocate(self, writer: ClaimWriter, claim: Raw) -> None:
        try:
            await writer.deallocate(claim)
        except (ClaimError, Conflict) as err:  # the pod is retried; the claim is looked at again then
            log.warning("deallocate", claim=claim_ref(claim), error=str(err))

    async def _delete(self, writer: ClaimWriter, claim: Raw) -> None:
        try:
            await writer.delete(claim)
        except (ClaimError, Conflict) as err:  # the pod is retried; the claim is looked at again then
            log.warning("delete extended resources' claim", claim=claim_ref(claim), error=str(err))

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, rows: Rows) -> IntArray:
        out = np.zeros(len(rows), dtype=np.int64)
        st: _State | None = state.get(STATE_KEY)
        if st is None or st.allocator is None or not st.groups:  # no claim to allocate (most pods): 0, as kube
            return out
        if all(group.plan is not None for group in st.groups):  # exactly requests only: 0 everywhere
            return out
        for i, row in enumerate(rows):
            node = table.nodes[int(row)]
            results = st.results(node.name) if node is not None else None
            if results is not None:
                out[i] = _prioritized_list_score(st.claims, results)
        return out

    def normalize_score(self, state: CycleState, pod: PodInfo, scores: IntArray) -> IntArray:
        return default_normalize(scores)

    def reserve(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        st: _State | None = state.get(STATE_KEY)
        if st is None or st.allocator is None:  # no claims, or all allocated
            return SUCCESS
        group = st.group_of(node)
        results = group.allocations.get(node) if group is not None else None
        if not results:
            if all(i == st.ext_index for i in st.to_allocate):
                return SUCCESS  # the extended resources come from a device plugin on this node
            return error("claim allocation not found for node")
        assert group is not None
        if len(results) != len(st.to_allocate):
            return error(
                f"internal error, have {len(results)} allocations, {len(st.to_allocate)} claims to allocate, want "
                f"{len(st.to_allocate)} claims"
            )
        st.reserved = group
        for index, allocation in zip(st.to_allocate, results, strict=True):
            st.chosen[index] = allocation
            claim = group.ext_claim if index == st.ext_index and group.ext_claim is not None else st.claims[index]
            self.tracker.signal_pending(_with_allocation(claim, allocation))
        return SUCCESS

    def write_offline(self, state: CycleState, pod: PodInfo) -> list[tuple[str, Raw | None]]:
        """What PreBind would write for a reserved pod, taken as written, with no API (the simulator has no
        binding cycle): each of its claims allocated where Reserve chose and reserved for it, as the informer would
        soon show them. A pod sharing a claim then finds it allocated, not "in the process of being allocated" for
        ever. Returns, per claim written, its key and the assumed version it replaced, for ``unwrite_offline``."""
        st: _State | None = state.get(STATE_KEY)
        if st is None or not st.claims:
            return []
        written: list[tuple[str, Raw | None]] = []
        for index, claim in enumerate(st.claims):
            allocation = st.chosen.get(index)
            is_ext = index == st.ext_index
            if is_ext and st.reserved is not None and st.reserved.ext_claim is not None:
                claim = st.reserved.ext_claim
            if (is_ext and allocation is None) or is_reserved_for_pod(pod.raw, claim):
                continue  # a device plugin's extended resources, or reserved for the pod already
            key = claim_key(claim)
            previous = self.tracker.assumed.get(key)
            base = _with_allocation(claim, allocation) if allocation is not None else claim
            meta = dict(base.get("metadata") or {})
            newest = max(resource_version(claim), resource_version(previous) if previous is not None else 0)
            meta["resourceVersion"] = str(newest + 1)  # newer than the lister's
            status = dict(base.get("status") or {})
            status["reservedFor"] = [
                *(status.get("reservedFor") or ()),
                {"resource": "pods", "name": pod.name, "uid": pod.uid},
            ]
            self.tracker.assume({**base, "metadata": meta, "status": status}, created=is_ext)
            self.tracker.remove_pending(st.ext_uid if is_ext else str(meta.get("uid", "")))
            written.append((key, previous))
        return written

    def unwrite_offline(self, written: Sequence[tuple[str, Raw | None]]) -> None:
        """``write_offline`` taken back (last written first)."""
        for key, previous in reversed(written):
            self.tracker.restore(key)
            if previous is not None:
                self.tracker.assume(previous)

    def unreserve(self, state: CycleState, pod: PodInfo, node: str) -> None:
        st: _State | None = state.get(STATE_KEY)
        if st is None:
            return
        for claim in st.user_claims:
            if self.tracker.remove_pending(str((claim.get("metadata") or {}).get("uid", ""))):
                self.tracker.restore(claim_key(claim))
            allocated = (claim.get("status") or {}).get("allocation") is not None
            if allocated and is_reserved_for_pod(pod.raw, claim) and self.writer is not None:
                self._spawn(self._unreserve(self.writer, claim, pod.uid))
        if st.ext_index is not None:
            ext = st.claims[st.ext_index]
            self.tracker.remove_pending(st.ext_uid)
            if not extended.is_in_memory(ext):
                self.tracker.restore(claim_key(ext))
                self._ext_made.pop(pod.uid, None)
                if self.writer is not None:
                    self._spawn(self._delete(self.writer, ext))

    async def _unreserve(self, writer: ClaimWriter, claim: Raw, pod_uid: str) -> None:
        try:
            await writer.unreserve(claim, pod_uid)
        except (ClaimError, Conflict) as err:  # kube logs it too; the claim's controller frees it with the pod
            log.warning("unreserve", claim=claim_ref(claim), error=str(err))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop (a test calling Unreserve directly): nothing can be written anyway
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for Unreserve's writes (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # ------------------------------------------------------------------------------------------ binding cycle

    def pre_bind_pre_flight(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        """kube's ``PreBindPreFlight``: PreBind works for a pod with claims (its extended-resource claim too)."""
        st: _State | None = state.get(STATE_KEY)
        return SKIP if st is None or not st.claims else SUCCESS

    async def pre_bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        st: _State | None = state.get(STATE_KEY)
        if st is None or not st.claims:
            return SUCCESS
        if self.writer is None:
            return error("DynamicResources has no API client")
        for index, claim in enumerate(st.claims):
            if is_reserved_for_pod(pod.raw, claim):
                continue
            allocation = st.chosen.get(index)
            is_ext = index == st.ext_index
            try:
                if is_ext:
                    if allocation is None and not extended.has_requests(claim):
                        continue  # the extended resources come from a device plugin on this node
                    if extended.is_in_memory(claim):
                        claim = await self.writer.create(self._ext_claim_to_write(st))
                        st.claims[index] = claim
                written = await bind_claim(self.writer, claim, allocation, pod.raw, self.tracker, stamp=True)
                st.claims[index] = written
                if is_ext:
                    self.tracker.assume(written, created=True)  # its devices held until the informer shows it
                    self.tracker.remove_pending(st.ext_uid)
                    self._ext_made[pod.uid] = claim_key(written)
                    if len(self._ext_made) > EXT_MADE_KEPT:  # the informer has shown most: the index finds those
                        listed = self.objects.resource_claims_by_key()
                        kept = [(uid, k) for uid, k in self._ext_made.items() if k not in listed]
                        self._ext_made = dict(kept[-EXT_MADE_KEPT // 2 :])
                    await self.writer.pod_extended_status(pod.raw, written, st.reserved.mappings if st.reserved else [])
            except (ClaimError, Conflict) as err:
                return error(str(err))
        if has_binding_conditions(st.claims):
            return await self._wait_for_binding(st, pod, node)
        return SUCCESS

    def _ext_claim_to_write(self, st: _State) -> dict[str, Any]:
        group = st.reserved
        if group is None or group.ext_claim is None:
            raise ClaimError("extended resource claim not found for node")
        claim = dict(group.ext_claim)
        meta = {k: v for k, v in (claim.get("metadata") or {}).items() if k not in ("name", "uid")}
        claim["metadata"] = meta
        claim.pop("status", None)
        return claim

    async def _wait_for_binding(self, st: _State, pod: PodInfo, node: str) -> Status:
        """kube's wait in PreBind: poll the claims (here: on every change of any, and every 5 s) until every
        allocated device with binding conditions has them all true, one has a failure condition true (an error),
        or ``bindingTimeout`` passes."""
        if self.handle is not None:
            self.handle.record_event(
                _ref(pod.raw),
                None,
                "Normal",
                "BindingConditionsPending",
                "Scheduling",
                f"waiting for binding conditions for device on node {node}",
            )
        deadline = self.clock() + self.binding_timeout
        wait_change = getattr(self.objects, "wait_change", None)
        while True:
            try:
                ready = self._ready(st)
            except BindingFailed as err:
                return error(str(err))
            if ready:
                return SUCCESS
            remaining = deadline - self.clock()
            if remaining <= 0:
                return error("device binding timeout: context deadline exceeded")
            if wait_change is not None:
                await wait_change(min(BINDING_POLL, remaining))
            else:
                await asyncio.sleep(min(BINDING_POLL, remaining))

    def _ready(self, st: _State) -> bool:
        """kube's ``isPodReadyForBinding`` over the claims as the scheduler sees them now."""
        now = time.time()
        for index, claim in enumerate(st.claims):
            meta = claim.get("metadata") or {}
            fresh = self._get(meta.get("namespace", ""), meta.get("name", ""))
            if fresh is None:
                raise BindingFailed(f'resourceclaim.resource.k8s.io "{meta.get("name", "")}" not found')
            st.claims[index] = fresh
            if not ready_for_binding(fresh):
                if binding_timed_out(fresh, self.binding_timeout, now):
                    name = (fresh.get("metadata") or {}).get("name", "")
                    raise BindingFailed(f"device binding timeout: claim={name}")
                return False
        return True

    # ------------------------------------------------------------------------------------------ DeviceTaintRules

    async def run(self, stopping: asyncio.Event) -> None:
        """Watch the DeviceTaintRules where the API server serves them (resource.k8s.io/v1 since 1.37; a 1.35
        server does not, and then there are none), into the listers; pods with claims wait until they are listed
        (kube-scheduler waits for its informers before scheduling)."""
        handle = self.handle
        if handle is None or handle.api is None or not hasattr(handle.listers, "informer"):
            return
        self.rules_pending = True
        served: bool | None = None
        backoff = 1.0
        while served is None:  # pods with claims wait, with the reason, until it is known
            try:
                served = await _serves(handle.api, "resource.k8s.io/v1", RULES)
            except Exception as err:  # the API server may be starting: ask again
                log.warning("DeviceTaintRules discovery failed; retrying", error=repr(err), retry_in=backoff)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), backoff)
                if stopping.is_set():
                    return
                backoff = min(backoff * 2, 30.0)
        if not served:
            self.rules_pending = False
            log.info("DeviceTaintRules are not served (Kubernetes before 1.37): none apply")
            return
        api = client.CustomObjectsApi(handle.api)
        informer: Informer = handle.listers.informer(
            RULES, partial(api.list_cluster_custom_object, "resource.k8s.io", "v1", RULES)
        )
        watch = asyncio.create_task(informer.run(stopping))
        try:
            await informer.synced.wait()
            self.rules_pending = False
            handle.listers.on_change(RULES, None, None)  # the pods that waited go back to the queue
            await stopping.wait()
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)


TIMEOUT_TAIL = ": timed out trying to allocate devices"


async def _serves(api: Any, group_version: str, resource: str) -> bool:
    """Whether the API server serves ``resource`` in ``group_version`` (discovery)."""
    from crane_shared.kube import raw_json

    try:
        body = await raw_json(
            api.call_api(
                f"/apis/{group_version}",
                "GET",
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=30,
            )
        )
    except client.ApiException as err:
        if err.status == 404:
            return False
        raise
    return any(r.get("name") == resource for r in (body or {}).get("resources") or ())


def _ref(pod: Raw) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    return {"namespace": meta.get("namespace", ""), "name": meta.get("name", ""), "uid": meta.get("uid", "")}


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


FIRST_AVAILABLE_MAX_SIZE = 8
"""``resourceapi.FirstAvailableDeviceRequestMaxSize``."""


def _prioritized_list_score(claims: Sequence[Raw], results: Sequence[Raw]) -> int:
    """kube 1.37's ``computeScore``: an allocated claim scores with its own allocation, the others with the
    node's results in order."""
    score = 0
    unallocated = 0
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation is None:
            if unallocated >= len(results):
                break
            allocation = results[unallocated]
            unallocated += 1
        chosen = {
            r.get("request", "")
            for r in (allocation.get("devices") or {}).get("results") or ()
            if len(str(r.get("request", "")).split("/")) == 2
        }
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
            if request.get("exactly") is not None:
                continue
            for index, sub in enumerate(request.get("firstAvailable") or ()):
                if f"{request.get('name', '')}/{sub.get('name', '')}" in chosen:
                    score += FIRST_AVAILABLE_MAX_SIZE - index
    return score


def _with_allocation(claim: Raw, allocation: dict[str, Any]) -> dict[str, Any]:
    meta = dict(claim.get("metadata") or {})
    finalizers = list(meta.get("finalizers") or ())
    if FINALIZER not in finalizers:
        finalizers.append(FINALIZER)
    meta["finalizers"] = finalizers
    return {**claim, "metadata": meta, "status": {**(claim.get("status") or {}), "allocation": allocation}}


def _validate_requests(claim: Raw, classes: Mapping[str, Raw]) -> Status | None:
    """PreFilter's checks of an unallocated claim's requests (kube's messages)."""
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        name = request.get("name", "")
        if request.get("exactly") is not None:
            checks = [(name, request["exactly"].get("deviceClassName") or "")]
        elif request.get("firstAvailable"):
            checks = [
                (f"{name}/{sub.get('name', '')}", sub.get("deviceClassName") or "") for sub in request["firstAvailable"]
            ]
        else:
            reason = f"resource claim {claim_ref(claim)}, request {name}: unknown request type"
            return unschedulable(reason, unresolvable=True)
        for request_name, class_name in checks:
            if not class_name:
                return error(f"request {request_name}: unsupported request type")
            if class_name not in classes:
                return unschedulable(
                    f"request {request_name}: device class {class_name} does not exist", unresolvable=True
                )
    return None


def new(args: Mapping[str, Any], handle: Handle) -> DynamicResources:
    """DynamicResourcesArgs: ``filterTimeout`` (a duration, default 10s; 0 turns the timeout off) and
    ``bindingTimeout`` (how long PreBind waits for binding conditions, default 600s, at least 1s)."""
    problems: list[tuple[str, str]] = []
    timeout = DEFAULT_FILTER_TIMEOUT
    binding = DEFAULT_BINDING_TIMEOUT
    for key, value in args.items():
        if key in ("apiVersion", "kind"):
            continue
        if key not in ("filterTimeout", "bindingTimeout"):
            problems.append((key, "unknown field"))
            continue
        try:
            seconds = parse_duration(str(value)).total_seconds()
        except ValueError as err:
            problems.append((key, str(err)))
            continue
        if key == "filterTimeout":
            timeout = seconds
            if seconds < 0:
                problems.append((key, "must be zero or positive"))
        else:
            binding = seconds
            if seconds < 1:
                problems.append((key, "must be at least 1 second"))
    if problems:
        raise ArgsError(problems)
    return DynamicResources(
        handle.listers, LazyApiClaims(handle), filter_timeout=timeout, binding_timeout=binding, handle=handle
    )
