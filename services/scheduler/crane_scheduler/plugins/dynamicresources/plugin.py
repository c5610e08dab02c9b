"""DynamicResources (kube-scheduler 1.35, default gates): a pod's ResourceClaims get devices from ResourceSlices.

- PreEnqueue: every claim must resolve (exist, not be deleting, be the pod's own for a template claim); a
  template claim waits for kube-controller-manager's resourceclaim controller.
- PreFilter: claims as above (kube's messages, UnschedulableAndUnresolvable); an allocated claim limits the pod to
  its ``status.allocation.nodeSelector``; an unallocated one must not be in flight for another pod ("resource
  claim ns/c is in the process of being allocated") and its requests' classes must exist; one ``Allocator`` for
  the cycle, over every slice and the devices allocated or in flight.
- Filter, per node: "resourceclaim not available on the node", or the allocator's answer: "cannot allocate all
  claims", "invalid resource pools were encountered", "timed out trying to allocate devices" (the filter
  timeout, 10 s by default, for all nodes of the cycle together here). What kube answers with an Error status
  (a broken selector, an "All" request on a pool being updated) fails the attempt the same way
  (``Rejection.error``).
- Reserve: the chosen node's allocation is signalled in flight (``ClaimTracker``), no API write; Unreserve
  drops it, and takes the pod out of ``reservedFor`` of a claim PreBind already reserved (kube's strategic-merge
  patch on ``status``, in a task: Unreserve cannot wait).
- PreBind, per claim not yet reserved for the pod, retried on conflict: the finalizer
  ``resource.kubernetes.io/delete-protection`` by Update, then ``status.allocation`` and ``status.reservedFor``
  by UpdateStatus; the written claim is assumed until the informer shows it. The writes go through the API
  writer process, as the bind does, in its leadership term; each first checks the term (``Handle.may_bind``), and
  the process refuses a write past the term's deadline: a leader that may have lost its lease allocates nothing
  more (``binding``: kube's ``bindClaim`` and the API adapters).
- Score: per node, the sum over ``firstAvailable`` requests of 8 - the index of the subrequest the allocation
  chose; NormalizeScore scales by the maximum (weight 2 in the default profile). kube indexes the node's
  allocations (one per claim to allocate) by the claim's position among all the pod's claims, so a pod with an
  allocated claim and one to allocate fails scoring ("number of allocations 1 is smaller than number of
  claims") when more than one node fits: kept, as the judge holds us to kube.
- PostFilter (kube's, before DefaultPreemption): an allocated claim that kept the pod off a node and is reserved
  by nobody else is deallocated (``status`` cleared, in a task: "deallocation of ResourceClaim completed");
  otherwise "still not schedulable", "no new claims to deallocate" for a pod without claims, and "not found"
  (kube's Error reading its cycle state) when a PreFilter before it rejected the pod. The framework joins the
  Unschedulable answers, so kube 1.35's FitError reads "... no new claims to deallocate, preemption: ...".
- Queueing: claim events with kube's hint (a deallocated claim, or the pod's own claim created or changed),
  slice, class and node events always.

Not done here: the extended resources of DRAExtendedResource (off by default), and binding conditions (off by
default).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

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
from crane_scheduler.plugins.dynamicresources.allocator import (
    AllocationError,
    AllocationTimeout,
    Allocator,
    FailedOnNode,
    Plan,
    claim_ref,
)
from crane_scheduler.plugins.dynamicresources.binding import ClaimWriter, Conflict, LazyApiClaims, bind_claim
from crane_scheduler.plugins.dynamicresources.claims import (
    FINALIZER,
    ClaimError,
    ClaimGetter,
    ClaimTracker,
    claim_key,
    is_reserved_for_pod,
    pod_claims,
)
from crane_scheduler.plugins.dynamicresources.nodeview import DeviceCache
from crane_scheduler.plugins.dynamicresources.pools import PoolError, node_selector_matches
from crane_scheduler.podinfo import NodeInfo, PodInfo
from crane_shared.durations import parse_duration
from crane_shared.logs import get_logger

log = get_logger("crane.scheduler.dynamicresources")

NAME = "DynamicResources"
STATE_KEY = NAME
DEFAULT_FILTER_TIMEOUT = 10.0

REASON_CANNOT_ALLOCATE = "cannot allocate all claims"
REASON_NOT_AVAILABLE = "resourceclaim not available on the node"
REASON_TIMEOUT = "timed out trying to allocate devices"

Raw = Mapping[str, Any]


class DraObjects(Protocol):
    """What the plugin reads: claims by namespace/name, every ResourceSlice, DeviceClasses by name."""

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
class _State:
    claims: list[Raw]
    available_on: list[Raw | None]  # the allocated claims' node selectors
    allocator: Allocator | None = None
    plan: Plan | None = None  # the claims to allocate as a count of devices of one shape (Allocator.plan)
    to_allocate: list[int] = field(default_factory=list)  # indexes of the unallocated claims
    allocations: Allocations = field(default_factory=Allocations)  # node -> results
    chosen: dict[int, dict[str, Any]] = field(default_factory=dict)  # claim index -> allocation (Reserve)
    score_error: bool = False
    unavailable: set[int] = field(default_factory=set)  # allocated claims some node's selector refused


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
    ) -> None:
        self.objects = objects
        self.writer = writer
        self.filter_timeout = filter_timeout
        self.clock = clock
        changed_keys = getattr(objects, "changed_keys", None)  # Listers: only changed claims are recounted
        self.tracker = ClaimTracker(changed_keys("resourceclaims") if changed_keys is not None else None)
        self.devices = DeviceCache()  # node views and selector verdicts, kept while slices and classes are
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def _get(self) -> ClaimGetter:
        return self.tracker.get(self.objects.resource_claim)

    # ------------------------------------------------------------------------------------------ queueing

    def events_to_register(self) -> ClusterEvent:
        """kube's: Node Add/Update, ResourceClaim Add/Update (hinted), DeviceClass and ResourceSlice Add/Update;
        the pod's own update naming its claims is the queue's (``SchedulingQueue.update``)."""
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
        """kube's ``isSchedulableAfterClaimChange``: a deallocated claim may free devices for anyone; otherwise only
        the pod's own claims matter, when created or when their status changed."""
        new, old = change.new_object, change.old_object
        if new is None:
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
        try:
            claims = pod_claims(pod.raw, self._get)
        except ClaimError as err:
            return PreFilterResult(unschedulable(str(err), unresolvable=True))
        if not claims:
            return PreFilterResult(SKIP)
        available_on: list[Raw | None] = [None] * len(claims)
        to_allocate: list[int] = []
        classes = self.objects.device_classes()
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
            status = _validate_requests(claim, classes)
            if status is not None:
                return PreFilterResult(status)
        if to_allocate:
            allocated = self.tracker.allocated(self.objects.resource_claims_by_key())
            st.allocator = Allocator(
                classes, self.objects.resource_slices(), allocated, clock=self.clock, cache=self.devices
            )
            st.plan = st.allocator.plan([claims[i] for i in to_allocate])
            st.allocations = Allocations(st.allocator, [claims[i] for i in to_allocate])
        st.claims, st.available_on, st.to_allocate = claims, available_on, to_allocate
        return PreFilterResult()

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> list[Rejection]:
        st: _State | None = state.get(STATE_KEY)
        if st is None or not st.claims:
            return []
        masks: dict[tuple[str, bool], np.ndarray[Any, Any]] = {}
        deadline = self.clock() + self.filter_timeout if self.filter_timeout > 0 else None
        to_allocate = [st.claims[i] for i in st.to_allocate]
        nodes = table.nodes
        # Claims of one shape: every node answered by a count at once (Allocator.fits_nodes); the others search.
        fits = None
        if st.allocator is not None and st.plan is not None:
            fits = st.allocator.fits_nodes(nodes, st.plan, table.nodes_version)
        if fits is not None and all(selector is None for selector in st.available_on):
            for row in fits.search.tolist():
                node = nodes[row]
                assert node is not None  # a present row
                verdict = self._filter_node(st, node, to_allocate, deadline, None)
                if verdict is not None:
                    masks.setdefault(verdict, np.zeros(table.n_rows, dtype=bool))[row] = True
            st.allocations.defer_rows(fits.fit, nodes, table.rows)
            if fits.cannot.any():
                mask = masks.setdefault((REASON_CANNOT_ALLOCATE, False), np.zeros(table.n_rows, dtype=bool))
                mask[: len(fits.cannot)] |= fits.cannot
        else:
            for row, node in enumerate(nodes):
                if node is None:
                    continue
                fit = fits.answer(row) if fits is not None else None
                verdict = self._filter_node(st, node, to_allocate, deadline, fit)
                if verdict is not None:
                    masks.setdefault(verdict, np.zeros(table.n_rows, dtype=bool))[row] = True
        return [Rejection(reason, mask, unresolvable=True, error=failed) for (reason, failed), mask in masks.items()]

    def _filter_node(
        self, st: _State, node: NodeInfo, to_allocate: list[Raw], deadline: float | None, fits: bool | None
    ) -> tuple[str, bool] | None:
        """None when the node fits, else (reason, whether it is kube's Error rather than a rejection); ``fits``:
        the count's answer for the node (``Allocator.fits_nodes``), None when the search must answer."""
        # kube allocates before it looks at the unavailable claims, so a broken selector wins over them.
        results = None
        if fits is False:
            return REASON_CANNOT_ALLOCATE, False
        if st.allocator is not None and fits is None:
            try:
                results = st.allocator.allocate(node, to_allocate, deadline)
            except AllocationTimeout:
                return REASON_TIMEOUT, False
            except FailedOnNode as err:
                return str(err), False
            except AllocationError as err:
                return str(err), True
            if results is None or len(results) != len(to_allocate):
                return REASON_CANNOT_ALLOCATE, False
        unavailable = []
        for index, selector in enumerate(st.available_on):
            if selector is None:
                continue
            try:
                if not node_selector_matches(node, selector):
                    unavailable.append(index)
            except PoolError as err:
                return str(err), True
        if unavailable:
            st.unavailable.update(unavailable)
            return REASON_NOT_AVAILABLE, False
        if results is not None:
            st.allocations.found(node.name, results)
        elif fits:
            st.allocations.defer(node)
        return None

    def post_filter(self, state: CycleState, pod: PodInfo, diagnosis: Diagnosis) -> Status:
        st: _State | None = state.get(STATE_KEY)
        if st is None:
            return error("not found")  # kube: its cycle state cannot be read (a PreFilter before it rejected)
        if not st.claims:
            return Status(Code.UNSCHEDULABLE, ("no new claims to deallocate",))
        for index in sorted(st.unavailable):  # kube walks a set: any of them
            claim = st.claims[index]
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            if not reserved or (len(reserved) == 1 and reserved[0].get("uid") == pod.uid):
                if self.writer is not None:
                    self._spawn(self._deallocate(self.writer, claim))
                return Status(Code.UNSCHEDULABLE, ("deallocation of ResourceClaim completed",))
        return Status(Code.UNSCHEDULABLE, ("still not schedulable",))

    async def _deallocate(self, writer: ClaimWriter, claim: Raw) -> None:
        try:
            await writer.deallocate(claim)
        except (ClaimError, Conflict) as err:  # the pod is retried; the claim is looked at again then
            log.warning("deallocate", claim=claim_ref(claim), error=str(err))

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, rows: Rows) -> IntArray:
        out = np.zeros(len(rows), dtype=np.int64)
        st: _State | None = state.get(STATE_KEY)
        if st is None or not st.allocations:  # no claim to allocate (most pods): 0 everywhere, as kube
            return out
        if st.plan is not None:  # exactly requests only: 0 everywhere, without asking for the deferred results
            if len(st.to_allocate) < len(st.claims):
                names = [n.name for n in (table.nodes[int(row)] for row in rows) if n is not None]
                st.score_error = any(name in st.allocations for name in names)
            return out
        for i, row in enumerate(rows):
            node = table.nodes[int(row)]
            results = st.allocations.get(node.name) if node is not None else None
            if results is None:
                continue
            if len(results) < len(st.claims):
                st.score_error = True  # kube: "number of allocations %d is smaller than number of claims"
                continue
            out[i] = _prioritized_list_score(st.claims, results)
        return out

    def normalize_score(self, state: CycleState, pod: PodInfo, scores: IntArray) -> IntArray:
        st: _State | None = state.get(STATE_KEY)
        if st is not None and st.score_error:
            return np.full(len(scores), -1, dtype=np.int64)  # out of range: the framework fails the attempt
        return default_normalize(scores)

    def reserve(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        st: _State | None = state.get(STATE_KEY)
        if st is None or st.allocator is None:  # no claims, or all allocated
            return SUCCESS
        results = st.allocations.get(node)
        if not results or len(results) != len(st.to_allocate):
            return error("claim allocation not found for node")
        for index, allocation in zip(st.to_allocate, results, strict=True):
            st.chosen[index] = allocation
            claim = _with_allocation(st.claims[index], allocation)
            self.tracker.signal_pending(claim)
        return SUCCESS

    def unreserve(self, state: CycleState, pod: PodInfo, node: str) -> None:
        st: _State | None = state.get(STATE_KEY)
        if st is None:
            return
        for claim in st.claims:
            if self.tracker.remove_pending(str((claim.get("metadata") or {}).get("uid", ""))):
                self.tracker.restore(claim_key(claim))
            allocated = (claim.get("status") or {}).get("allocation") is not None
            if allocated and is_reserved_for_pod(pod.raw, claim) and self.writer is not None:
                self._spawn(self._unreserve(self.writer, claim, pod.uid))

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

    async def pre_bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        st: _State | None = state.get(STATE_KEY)
        if st is None:
            return SUCCESS
        if self.writer is None:
            return error("DynamicResources has no API client")
        for index, claim in enumerate(st.claims):
            if is_reserved_for_pod(pod.raw, claim):
                continue
            try:
                st.claims[index] = await bind_claim(self.writer, claim, st.chosen.get(index), pod.raw, self.tracker)
            except (ClaimError, Conflict) as err:
                return error(str(err))
        return SUCCESS


FIRST_AVAILABLE_MAX_SIZE = 8
"""``resourceapi.FirstAvailableDeviceRequestMaxSize``."""


def _prioritized_list_score(claims: Sequence[Raw], allocations: Sequence[Raw]) -> int:
    """kube's ``computeScore`` (claims and allocations paired by position, as kube does)."""
    score = 0
    for claim, allocation in zip(claims, allocations, strict=False):
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
    ``bindingTimeout`` (binding conditions, off by default in 1.35: accepted and unused)."""
    problems: list[tuple[str, str]] = []
    timeout = DEFAULT_FILTER_TIMEOUT
    for key, value in args.items():
        if key in ("apiVersion", "kind", "bindingTimeout"):
            continue
        if key != "filterTimeout":
            problems.append((key, "unknown field"))
            continue
        try:
            timeout = parse_duration(str(value)).total_seconds()
        except ValueError as err:
            problems.append((key, str(err)))
            continue
        if timeout < 0:
            problems.append((key, "must be zero or positive"))
    if problems:
        raise ArgsError(problems)
    return DynamicResources(handle.listers, LazyApiClaims(handle), filter_timeout=timeout)
