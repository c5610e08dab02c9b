"""VolumeBinding (kube-scheduler 1.37): a pod's PersistentVolumeClaims must be bound, or bindable on the node.

- PreFilter: a missing, lost or deleting claim keeps the pod Pending with kube's message
  (``persistentvolumeclaim "data" not found``), UnschedulableAndUnresolvable; an unbound claim of an Immediate
  class waits for the PV controller ("pod has unbound immediate PersistentVolumeClaims"); a pod without claims
  skips the plugin.
- Filter: bound claims need their PV to exist and its node affinity to match; WaitForFirstConsumer claims need
  an available PV on the node (static binding) or a provisioner whose class's ``allowedTopologies`` admit it
  (dynamic provisioning); a claim already given a node (``volume.kubernetes.io/selected-node``) only fits there.
- Reserve assumes the decision (PV claimRef, claim's selected-node) so the next pod sees it; PreBind writes it
  through the API and waits for the PV controller to finish the binding (``bindTimeoutSeconds``, default 600);
  Unreserve drops the assumptions when anything later fails.

- Score (StorageCapacityScoring: beta and on since 1.37; 1.35 skipped it): per storage class, the utilization the
  pod's volumes would bring (its claims' requests over the matched PVs' capacity, or over the CSIStorageCapacity
  that admitted a provisioning), through ``shape`` (default ``(0, 10), (100, 0)``: the emptier the better),
  averaged over the classes; 0 on a node where the pod binds or provisions nothing with a known capacity, so every
  pod gets the plugin's (weight 1) Score, as in kube.

Dynamic provisioning through a CSI driver whose CSIDriver says ``storageCapacity: true`` needs a
CSIStorageCapacity of the class, reaching the node, with room for the claim ("node(s) did not have enough free
storage"), as kube's ``hasEnoughCapacity``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from kubernetes_asyncio import client

from crane_scheduler.framework import (
    SKIP,
    SUCCESS,
    ArgsError,
    ClusterEvent,
    Code,
    CycleState,
    Handle,
    PreFilterResult,
    Rejection,
    Rows,
    Status,
    unschedulable,
)
from crane_scheduler.framework.interface import (
    EnqueueExtensions,
    FilterPlugin,
    PreBindPlugin,
    PreFilterPlugin,
    PreScorePlugin,
    ReservePlugin,
    ScorePlugin,
)
from crane_scheduler.listers import Obj
from crane_scheduler.nodetable import IntArray, Mask, NodeTable
from crane_scheduler.plugins.noderesources import broken_linear, parse_shape
from crane_scheduler.plugins.volumebinding import binder
from crane_scheduler.plugins.volumebinding.binder import (
    REASON_BIND_CONFLICT,
    REASON_NODE_CONFLICT,
    REASON_NOT_ENOUGH_SPACE,
    REASON_PV_NOT_EXIST,
    REASON_UNBOUND_IMMEDIATE,
    ClaimError,
    meta,
)
from crane_scheduler.podinfo import PodInfo
from crane_shared.kube import ApiCallError, raw_json

NAME = "VolumeBinding"
STATE_KEY = NAME
DEFAULT_BIND_TIMEOUT = 600.0
DEFAULT_SHAPE = ((0, 100), (100, 0))
"""kube's default ``shape`` with StorageCapacityScoring on ((0, 10), (100, 0)), scores scaled to 0..100"""
POLL_INTERVAL = 1.0  # kube's wait.PollUntilContextTimeout period in BindPodVolumes
REQUEST_TIMEOUT = 30.0


@dataclass
class PodVolumes:
    """What the pod needs on its node: PVs to bind (with the claim) and claims to provision."""

    static: list[tuple[Obj, Obj]] = field(default_factory=list)  # (pv with claimRef set, claim)
    provision: list[Obj] = field(default_factory=list)


@dataclass
class _State:
    claims: binder.PodVolumeClaims
    matches: list[tuple[Obj, list[Obj], Any]] = field(default_factory=list)
    all_bound: bool = False
    assumed: PodVolumes | None = None


class VolumeBinding(
    PreFilterPlugin, FilterPlugin, PreScorePlugin, ScorePlugin, ReservePlugin, PreBindPlugin, EnqueueExtensions
):
    name = NAME
    decider_pre_filter = "skip"  # DeciderPreFilterPlugin: for a pod a worker may decide, no claim to bind

    def __init__(
        self, handle: Handle, bind_timeout: float = DEFAULT_BIND_TIMEOUT, shape: tuple[tuple[int, int], ...] = ()
    ) -> None:
        self.handle = handle
        self.listers = handle.listers
        self.bind_timeout = bind_timeout
        self.shape = shape or DEFAULT_SHAPE

    # ------------------------------------------------------------------------------------------ scheduling cycle

    def pre_filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> PreFilterResult:
        if not binder.pod_claim_names(pod):
            return PreFilterResult(SKIP)
        try:
            claims = binder.pod_claims(pod, self.listers)
        except ClaimError as err:
            return PreFilterResult(unschedulable(str(err), unresolvable=True))
        classified = binder.classify_claims(claims, self.listers)
        if classified.unbound_immediate:
            return PreFilterResult(unschedulable(REASON_UNBOUND_IMMEDIATE, unresolvable=True))
        state[STATE_KEY] = _State(classified)
        return PreFilterResult()

    def filter(self, state: CycleState, pod: PodInfo, table: NodeTable) -> list[Rejection]:
        st: _State | None = state.get(STATE_KEY)
        if st is None:
            return []
        n = table.n_rows
        node_conflict = np.zeros(n, dtype=bool)
        pv_missing = np.zeros(n, dtype=bool)
        done = np.zeros(n, dtype=bool)
        for pvc in st.claims.bound:  # checkBoundClaims: per node, stops at the first missing or misfit PV
            pv = self.listers.pv((pvc.get("spec") or {}).get("volumeName", ""))
            if pv is None:
                pv_missing |= ~done
                break
            misfit = ~binder.pv_affinity_mask(table, pv) & ~done
            node_conflict |= misfit
            done |= misfit
        bind_conflict = np.zeros(n, dtype=bool)
        no_space = np.zeros(n, dtype=bool)
        if st.claims.unbound_delayed:
            bind_conflict, no_space = self._filter_delayed(st, table)
        return [
            Rejection(reason, mask, unresolvable=True)
            for reason, mask in (
                (REASON_NODE_CONFLICT, node_conflict),
                (REASON_BIND_CONFLICT, bind_conflict),
                (REASON_NOT_ENOUGH_SPACE, no_space),
                (REASON_PV_NOT_EXIST, pv_missing),
            )
            if mask.any()
        ]

    def _filter_delayed(self, st: _State, table: NodeTable) -> tuple[Mask, Mask]:
        """Rows where some delayed claim can be neither matched to a PV nor provisioned (bind conflict), and rows
        where provisioning lacks storage capacity; per row the first claim to provision that fails decides, as
        kube's ``checkVolumeProvisions`` returns at it."""
        n = table.n_rows
        conflict = np.zeros(n, dtype=bool)
        to_match: list[Obj] = []
        selected: list[Obj] = []
        for pvc in st.claims.unbound_delayed:
            node = binder.annotations_of(pvc).get(binder.ANN_SELECTED_NODE)
            if node is None:
                to_match.append(pvc)
                continue
            selected.append(pvc)
            row = table.rows.get(node)
            others = np.ones(n, dtype=bool)
            if row is not None:
                others[row] = False
            conflict |= others  # kube: the selected node only (and stops looking on other nodes)
        if to_match:
            st.matches = binder.match_volumes(table, to_match, st.claims.pvs_by_class)
        # Claims to provision per row: the selected-node ones everywhere, unmatched ones where unmatched.
        not_provisionable = np.zeros(n, dtype=bool)
        no_space = np.zeros(n, dtype=bool)
        claims = [(pvc, np.ones(n, dtype=bool)) for pvc in selected]
        claims += [(pvc, chosen < 0) for pvc, _, chosen in st.matches]
        for pvc, needs in claims:
            undecided = needs & ~(not_provisionable | no_space)
            provisionable, sufficient = self._provision_masks(table, pvc)
            not_provisionable |= undecided & ~provisionable
            no_space |= undecided & provisionable & ~sufficient
        return conflict | not_provisionable, no_space & ~conflict

    def _provision_masks(self, table: NodeTable, pvc: Obj) -> tuple[Mask, Mask]:
        """``checkVolumeProvisions`` for one claim: (a real provisioner whose class admits the node, enough
        CSIStorageCapacity there)."""
        n = table.n_rows
        cls = self.listers.storage_class(binder.claim_class(pvc))
        if cls is None:
            return np.zeros(n, dtype=bool), np.ones(n, dtype=bool)
        provisioner = cls.get("provisioner") or ""
        if not provisioner or provisioner == binder.NOT_SUPPORTED_PROVISIONER:
            return np.zeros(n, dtype=bool), np.ones(n, dtype=bool)
        return binder.allowed_topologies_mask(table, cls), binder.capacity_mask(table, pvc, cls, self.listers)

    def pre_score(self, state: CycleState, pod: PodInfo, table: NodeTable, rows: Rows) -> Status:
        """kube 1.37 scores every pod (StorageCapacityScoring on); 1.35 skipped (no scorer without the gate)."""
        return SUCCESS

    def score(self, state: CycleState, pod: PodInfo, table: NodeTable, rows: Rows) -> IntArray:
        """kube's ``Score``: per row, the classes of the PVs the pod's claims would bind to there (requests over
        the PVs' capacity, summed per class) or, with no such PV, of its provisionings whose capacity is tracked
        (requests summed per class over the CSIStorageCapacity's ``capacity``, the class's last one); then the
        shape of each class's utilization, averaged and rounded."""
        out = np.zeros(len(rows), dtype=np.int64)
        st: _State | None = state.get(STATE_KEY)
        if st is None or not st.claims.unbound_delayed:
            return out
        selected = [p for p in st.claims.unbound_delayed if binder.ANN_SELECTED_NODE in binder.annotations_of(p)]
        # kube's claimsToProvision: the claims with a selected node, then those no PV matched (smallest first)
        provisions = [(pvc, None, self._capacities(table, pvc)) for pvc in selected]
        provisions += [(pvc, chosen, self._capacities(table, pvc)) for pvc, _, chosen in st.matches]
        for i, row in enumerate(rows.tolist()):
            classes: dict[str, list[int]] = {}  # class -> [requested, capacity]
            for pvc, pvs, chosen in st.matches:
                if chosen[row] >= 0:
                    pv = pvs[int(chosen[row])]
                    entry = classes.setdefault(str((pv.get("spec") or {}).get("storageClassName") or ""), [0, 0])
                    entry[0] += binder.storage_request(pvc)
                    entry[1] += binder.pv_capacity(pv)
            if not classes:  # no static binding here: the provisionings with a tracked capacity
                for pvc, unmatched, caps in provisions:
                    if caps is None or (unmatched is not None and unmatched[row] >= 0) or caps[1][row] < 0:
                        continue
                    entry = classes.setdefault(str((pvc.get("spec") or {}).get("storageClassName") or ""), [0, 0])
                    entry[0] += binder.storage_request(pvc)
                    entry[1] = caps[0][int(caps[1][row])]  # kube assigns: the class's last provisioning's
            out[i] = self._class_score(classes)
        return out

    def _capacities(self, table: NodeTable, pvc: Obj) -> tuple[list[int], IntArray] | None:
        cls = self.listers.storage_class(binder.claim_class(pvc))
        return None if cls is None else binder.node_capacities(table, pvc, cls, self.listers)

    def _class_score(self, classes: Mapping[str, list[int]]) -> int:
        """kube's ``buildScorerFunction``: each class's utilization (100 when over or of no capacity) through the
        shape, averaged and rounded half away from zero."""
        if not classes:
            return 0
        utilization = np.array(
            [100 if cap == 0 or req > cap else req * 100 // cap for req, cap in classes.values()], dtype=np.int64
        )
        total = int(broken_linear(self.shape, utilization).sum())
        return math.floor(total / len(classes) + 0.5)

    def reserve(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        """``AssumePodVolumes``: the node's static bindings and provisionings, assumed in the listers."""
        st: _State | None = state.get(STATE_KEY)
        if st is None:
            return SUCCESS
        if self._all_bound(pod):
            st.all_bound = True
            return SUCCESS
        row = self.handle.table.rows.get(node)
        volumes = PodVolumes()
        provision = [pvc for pvc in st.claims.unbound_delayed if binder.ANN_SELECTED_NODE in binder.annotations_of(pvc)]
        for pvc, pvs, chosen in st.matches:
            index = int(chosen[row]) if row is not None and row < len(chosen) else -1
            if index < 0:
                provision.append(pvc)
                continue
            pv, dirty = binder.bind_volume_to_claim(pvs[index], pvc)
            if dirty:
                self.listers.assume_pv(pv)
            volumes.static.append((pv, pvc))
        for pvc in provision:
            claim = binder.with_selected_node(pvc, node)
            self.listers.assume_pvc(claim)
            volumes.provision.append(claim)
        st.assumed = volumes
        return SUCCESS

    def unreserve(self, state: CycleState, pod: PodInfo, node: str) -> None:
        st: _State | None = state.get(STATE_KEY)
        if st is None or st.assumed is None:
            return
        for pv, _ in st.assumed.static:
            self.listers.restore_pv(meta(pv).get("name", ""))
        for pvc in st.assumed.provision:
            self.listers.restore_pvc(meta(pvc).get("namespace", ""), meta(pvc).get("name", ""))
        st.assumed = None

    def _all_bound(self, pod: PodInfo) -> bool:
        for name, _ in binder.pod_claim_names(pod):
            pvc = self.listers.pvc(pod.namespace, name)
            if pvc is None or not binder.fully_bound(pvc):
                return False
        return True

    # ------------------------------------------------------------------------------------------ binding cycle

    def pre_bind_pre_flight(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        """kube's ``PreBindPreFlight``: PreBind works unless every claim is bound already."""
        st: _State | None = state.get(STATE_KEY)
        if st is None or st.all_bound:
            return SKIP
        if st.assumed is None:
            return Status(Code.ERROR, (f'no pod volume found for node "{node}"',), self.name)
        return SUCCESS

    async def pre_bind(self, state: CycleState, pod: PodInfo, node: str) -> Status:
        """``BindPodVolumes``: write the PVs' claimRefs and the claims' selected node, then wait until the PV
        controller reports every claim bound (or the timeout)."""
        st: _State | None = state.get(STATE_KEY)
        if st is None or st.all_bound:
            return SUCCESS
        volumes = st.assumed
        if volumes is None:
            return Status(Code.ERROR, (f'no pod volume found for node "{node}"',), self.name)
        core = client.CoreV1Api(self.handle.api)
        what = ""  # the write in flight, named in the error
        try:
            for i, (pv, pvc) in enumerate(volumes.static):
                what = f"persistentvolume {meta(pv)['name']}"
                written = await raw_json(
                    core.replace_persistent_volume(
                        meta(pv)["name"], pv, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
                    )
                )
                volumes.static[i] = (written or pv, pvc)
            for i, pvc in enumerate(volumes.provision):
                m = meta(pvc)
                what = f"persistentvolumeclaim {m['namespace']}/{m['name']}"
                written = await raw_json(
                    core.replace_namespaced_persistent_volume_claim(
                        m["name"], m["namespace"], pvc, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
                    )
                )
                volumes.provision[i] = written or pvc
        except Exception as err:
            return Status(Code.ERROR, (f"binding volumes: {ApiCallError.of('update', what, err)}",), self.name)
        deadline = time.monotonic() + self.bind_timeout
        while True:
            try:
                if self.check_bindings(pod, node, volumes):
                    return SUCCESS
            except ClaimError as err:
                return Status(Code.ERROR, (f"binding volumes: {err}",), self.name)
            left = deadline - time.monotonic()
            if left <= 0:
                return Status(Code.ERROR, ("binding volumes: context deadline exceeded",), self.name)
            await self.listers.wait_change(min(left, POLL_INTERVAL))

    def check_bindings(self, pod: PodInfo, node: str, volumes: PodVolumes) -> bool:
        """``checkBindings`` against the API's view: True when all bound; ``ClaimError`` when the binding
        cannot complete any more (claimRef reset, provisioning given up, node affinity lost)."""
        table = self.handle.table
        row = table.rows.get(node)
        if row is None:
            raise ClaimError(f'failed to get node "{node}"')
        for pv, pvc in volumes.static:
            api_pv = self.listers.api_pv(meta(pv).get("name", ""))
            m = meta(pvc)
            api_pvc = self.listers.api_pvc(m.get("namespace", ""), m.get("name", ""))
            if api_pv is None or api_pvc is None:
                raise ClaimError("failed to check binding: object not found")
            if _older(api_pv, pv):
                return False  # our write has not come back through the informer yet
            if not binder.pv_affinity_mask(table, api_pv)[row]:
                raise ClaimError(f'pv "{meta(api_pv).get("name")}" node affinity doesn\'t match node "{node}"')
            ref = (api_pv.get("spec") or {}).get("claimRef") or {}
            if not ref.get("uid"):
                raise ClaimError(f'ClaimRef got reset for pv "{meta(api_pv).get("name")}"')
            if not binder.fully_bound(api_pvc):
                return False
        for pvc in volumes.provision:
            m = meta(pvc)
            api_pvc = self.listers.api_pvc(m.get("namespace", ""), m.get("name", ""))
            if api_pvc is None:
                raise ClaimError(f'failed to check provisioning pvc: persistentvolumeclaim "{m.get("name")}" not found')
            if _older(api_pvc, pvc):
                return False
            if binder.annotations_of(api_pvc).get(binder.ANN_SELECTED_NODE) != node:
                raise ClaimError(f'provisioning failed for PVC "{m.get("name")}"')
            volume = (api_pvc.get("spec") or {}).get("volumeName")
            if volume:
                api_pv = self.listers.api_pv(volume)
                if api_pv is None:
                    return False
                if not binder.pv_affinity_mask(table, api_pv)[row]:
                    raise ClaimError(f'pv "{volume}" node affinity doesn\'t match node "{node}"')
            if not binder.fully_bound(api_pvc):
                return False
        return True

    def events_to_register(self) -> ClusterEvent:
        return (
            ClusterEvent.STORAGE_CLASS_CHANGE
            | ClusterEvent.PVC_CHANGE
            | ClusterEvent.PV_CHANGE
            | ClusterEvent.NODE_ADD
            | ClusterEvent.NODE_UPDATE
            | ClusterEvent.CSINODE_CHANGE
            | ClusterEvent.CSIDRIVER_UPDATE
            | ClusterEvent.CSI_STORAGE_CAPACITY_CHANGE
        )


def _older(seen: Obj, written: Obj) -> bool:
    """Is the informer's copy older than what we wrote? (kube compares resourceVersions as integers too.)"""
    try:
        return int(meta(seen).get("resourceVersion") or 0) < int(meta(written).get("resourceVersion") or 0)
    except ValueError:
        return False


def new(args: Mapping[str, Any], handle: Handle) -> VolumeBinding:
    """VolumeBindingArgs: ``bindTimeoutSeconds`` (default 600); ``shape`` (default ``(0, 10), (100, 0)``, validated
    as kube's ``validateFunctionShape``: utilization 0..100 increasing, score 0..10)."""
    problems: list[tuple[str, str]] = []
    timeout = args.get("bindTimeoutSeconds", int(DEFAULT_BIND_TIMEOUT))
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
        problems.append(("bindTimeoutSeconds", "must be a non-negative integer"))
    shape = parse_shape(args["shape"], "shape", problems) if "shape" in args else DEFAULT_SHAPE
    for key in args:
        if key not in ("bindTimeoutSeconds", "shape", "apiVersion", "kind"):
            problems.append((key, "unknown field"))
    if problems:
        raise ArgsError(problems)
    return VolumeBinding(handle, float(timeout), shape)
