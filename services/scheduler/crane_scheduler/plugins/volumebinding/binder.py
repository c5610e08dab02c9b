"""VolumeBinding's pure part (kube's ``volumebinding/binder.go`` and component-helpers ``storage/volume``):
which claims a pod uses, which are bound, and which PV or provisioning would serve an unbound one on each node.

Node-dependent answers are computed for all table rows at once: a PV's node affinity and a class's
``allowedTopologies`` become row masks (``nodeaffinity.term_mask``), and static matching walks the candidate PVs
in kube's order once per claim, assigning each row its smallest fitting PV.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from crane_scheduler.listers import Listers, Obj
from crane_scheduler.nodetable import Mask, NodeTable
from crane_scheduler.plugins.nodeaffinity import term_mask
from crane_scheduler.podinfo import PodInfo, Requirement, SelectorTerm, parse_term
from crane_shared.labels import label_selector_matches as _label_selector_matches
from crane_shared.quantity import quantity

ANN_BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
ANN_BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_BETA_CLASS = "volume.beta.kubernetes.io/storage-class"
NOT_SUPPORTED_PROVISIONER = "kubernetes.io/no-provisioner"

REASON_BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
REASON_NODE_CONFLICT = "node(s) didn't match PersistentVolume's node affinity"
REASON_NOT_ENOUGH_SPACE = "node(s) did not have enough free storage"
REASON_PV_NOT_EXIST = "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)"
REASON_UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"


class ClaimError(Exception):
    """A claim problem that keeps the pod Pending whatever the node (PreFilter: UnschedulableAndUnresolvable)."""


def meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return meta(obj).get("annotations") or {}


def claim_class(pvc: Mapping[str, Any]) -> str:
    """``GetPersistentVolumeClaimClass``: the beta annotation wins over ``spec.storageClassName``."""
    ann = annotations_of(pvc)
    if ANN_BETA_CLASS in ann:
        return str(ann[ANN_BETA_CLASS])
    return str((pvc.get("spec") or {}).get("storageClassName") or "")


def volume_class(pv: Mapping[str, Any]) -> str:
    ann = annotations_of(pv)
    if ANN_BETA_CLASS in ann:
        return str(ann[ANN_BETA_CLASS])
    return str((pv.get("spec") or {}).get("storageClassName") or "")


def storage_request(pvc: Mapping[str, Any]) -> int:
    raw = (((pvc.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")
    return quantity(raw) if raw is not None else 0


def pv_capacity(pv: Mapping[str, Any]) -> int:
    raw = ((pv.get("spec") or {}).get("capacity") or {}).get("storage")
    return quantity(raw) if raw is not None else 0


def fully_bound(pvc: Mapping[str, Any]) -> bool:
    return bool((pvc.get("spec") or {}).get("volumeName")) and ANN_BIND_COMPLETED in annotations_of(pvc)


def pod_claim_names(pod: PodInfo) -> list[tuple[str, bool]]:
    """(claim name, is generic ephemeral) for every PVC-backed volume of the pod, in spec order."""
    out: list[tuple[str, bool]] = []
    for vol in (pod.raw.get("spec") or {}).get("volumes") or ():
        if vol.get("persistentVolumeClaim") is not None:
            out.append((vol["persistentVolumeClaim"].get("claimName", ""), False))
        elif vol.get("ephemeral") is not None:
            out.append((f"{pod.name}-{vol.get('name', '')}", True))
    return out


def _owned_by(pvc: Mapping[str, Any], pod: PodInfo) -> bool:
    return any(ref.get("controller") and ref.get("uid") == pod.uid for ref in meta(pvc).get("ownerReferences") or ())


def pod_claims(pod: PodInfo, listers: Listers) -> list[Obj]:
    """``podHasPVCs``: the pod's claims, or ``ClaimError`` with kube-scheduler's message."""
    claims: list[Obj] = []
    for name, ephemeral in pod_claim_names(pod):
        pvc = listers.pvc(pod.namespace, name)
        if pvc is None:
            if ephemeral:
                raise ClaimError(
                    f'waiting for ephemeral volume controller to create the persistentvolumeclaim "{name}"'
                )
            raise ClaimError(f'persistentvolumeclaim "{name}" not found')
        if (pvc.get("status") or {}).get("phase") == "Lost":
            volume = (pvc.get("spec") or {}).get("volumeName", "")
            raise ClaimError(f'persistentvolumeclaim "{name}" bound to non-existent persistentvolume "{volume}"')
        if meta(pvc).get("deletionTimestamp"):
            raise ClaimError(f'persistentvolumeclaim "{name}" is being deleted')
        if ephemeral and not _owned_by(pvc, pod):
            raise ClaimError(
                f"PVC {pod.namespace}/{name} was not created for pod {pod.namespace}/{pod.name} (pod is not owner)"
            )
        claims.append(pvc)
    return claims


@dataclass
class PodVolumeClaims:
    """``GetPodVolumeClaims``: the pod's claims by state, and the PVs each delayed claim's class offers."""

    bound: list[Obj] = field(default_factory=list)
    unbound_immediate: list[Obj] = field(default_factory=list)
    unbound_delayed: list[Obj] = field(default_factory=list)
    pvs_by_class: dict[str, list[Obj]] = field(default_factory=dict)


def classify_claims(claims: Sequence[Obj], listers: Listers) -> PodVolumeClaims:
    out = PodVolumeClaims()
    for pvc in claims:
        if fully_bound(pvc):
            out.bound.append(pvc)
            continue
        cls = listers.storage_class(claim_class(pvc)) if claim_class(pvc) else None
        delayed = cls is not None and cls.get("volumeBindingMode") == "WaitForFirstConsumer"
        if delayed and not (pvc.get("spec") or {}).get("volumeName"):
            out.unbound_delayed.append(pvc)
        else:
            out.unbound_immediate.append(pvc)
    if out.unbound_delayed:
        all_pvs = listers.pvs()
        for pvc in out.unbound_delayed:
            name = claim_class(pvc)
            out.pvs_by_class.setdefault(name, [pv for pv in all_pvs if volume_class(pv) == name])
    return out


# ---------------------------------------------------------------------------------------------- node masks


def _selector_terms(raw: Sequence[Mapping[str, Any]]) -> list[SelectorTerm | None]:
    return [parse_term(t) for t in raw]


def pv_affinity_mask(table: NodeTable, pv: Mapping[str, Any]) -> Mask:
    """``CheckNodeAffinity``: rows whose labels satisfy the PV's required node affinity (ORed terms; no
    affinity matches every node; an empty term matches none)."""
    required = (((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required")) or None
    if required is None:
        return np.ones(table.n_rows, dtype=bool)
    mask = np.zeros(table.n_rows, dtype=bool)
    for term in _selector_terms(required.get("nodeSelectorTerms") or ()):
        if term is not None:
            mask |= term_mask(table, term)
    return mask


def allowed_topologies_mask(table: NodeTable, cls: Mapping[str, Any]) -> Mask:
    """``MatchTopologySelectorTerms``: no terms match every node; a term's label requirements are ANDed, each
    the node's value In the listed values; terms are ORed."""
    terms = cls.get("allowedTopologies") or []
    if not terms:
        return np.ones(table.n_rows, dtype=bool)
    mask = np.zeros(table.n_rows, dtype=bool)
    for term in terms:
        reqs = tuple(
            Requirement(e.get("key", ""), "In", tuple(e.get("values") or ()))
            for e in term.get("matchLabelExpressions") or ()
        )
        if reqs:
            mask |= term_mask(table, SelectorTerm(reqs))
    return mask


def label_selector_mask(table: NodeTable, selector: Mapping[str, Any] | None) -> Mask:
    """Rows whose node labels match a ``metav1.LabelSelector``: None matches no node here (a CSIStorageCapacity
    without ``nodeTopology`` is unavailable), an empty one every node, an invalid one none (kube logs and
    refuses it)."""
    n = table.n_rows
    if selector is None:
        return np.zeros(n, dtype=bool)
    reqs = [Requirement(str(k), "In", (str(v),)) for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or ():
        op = expr.get("operator", "")
        values = tuple(str(v) for v in expr.get("values") or ())
        if op not in ("In", "NotIn", "Exists", "DoesNotExist") or (op in ("In", "NotIn")) != bool(values):
            return np.zeros(n, dtype=bool)
        reqs.append(Requirement(str(expr.get("key", "")), op, values))
    if not reqs:
        return table.live.copy()
    return term_mask(table, SelectorTerm(tuple(reqs)))


def node_capacities(
    table: NodeTable, pvc: Mapping[str, Any], cls: Mapping[str, Any], listers: Listers
) -> tuple[list[int], IndexArray] | None:
    """What ``hasEnoughCapacity`` hands the score (a provisioning's ``NodeCapacity``): per row, the index of the
    first CSIStorageCapacity (the lister's order) of the claim's class that reaches the node with room for it (-1:
    none), and each one's ``capacity`` in bytes; None where capacity is not tracked for the claim (no storage
    request, a driver that does not opt in: kube's ``NodeCapacity`` is nil, the claim does not score)."""
    n = table.n_rows
    requests = ((pvc.get("spec") or {}).get("resources") or {}).get("requests") or {}
    driver = listers.csi_driver(str(cls.get("provisioner") or ""))
    if "storage" not in requests or driver is None or not (driver.get("spec") or {}).get("storageCapacity"):
        return None
    size = quantity(requests["storage"])
    name = meta(cls).get("name")
    chosen = np.full(n, -1, dtype=np.int64)
    values: list[int] = []
    for capacity in listers.storage_capacities():
        if capacity.get("storageClassName") != name:
            continue
        limit = capacity.get("maximumVolumeSize")
        if limit is None:
            limit = capacity.get("capacity")
        if limit is None or quantity(limit) < size:
            continue
        reach = label_selector_mask(table, capacity.get("nodeTopology")) & (chosen < 0)
        chosen[reach] = len(values)
        raw = capacity.get("capacity")
        values.append(quantity(raw) if raw is not None else 0)
    return values, chosen


def capacity_mask(table: NodeTable, pvc: Mapping[str, Any], cls: Mapping[str, Any], listers: Listers) -> Mask:
    """``hasEnoughCapacity``: rows where the claim's class can provision its size. Checked only for a CSI driver
    that opts in (``CSIDriver.spec.storageCapacity``) and a claim that requests storage: some CSIStorageCapacity
    of the class (any namespace) must reach the node (``nodeTopology``) with ``maximumVolumeSize`` (else
    ``capacity``) at least the request."""
    n = table.n_rows
    requests = ((pvc.get("spec") or {}).get("resources") or {}).get("requests") or {}
    driver = listers.csi_driver(str(cls.get("provisioner") or ""))
    if "storage" not in requests or driver is None or not (driver.get("spec") or {}).get("storageCapacity"):
        return np.ones(n, dtype=bool)
    size = quantity(requests["storage"])
    name = meta(cls).get("name")
    mask = np.zeros(n, dtype=bool)
    for capacity in listers.storage_capacities():
        if capacity.get("storageClassName") != name:
            continue
        limit = capacity.get("maximumVolumeSize")
        if limit is None:
            limit = capacity.get("capacity")
        if limit is None or quantity(limit) < size:
            continue
        mask |= label_selector_mask(table, capacity.get("nodeTopology"))
    return mask


# ---------------------------------------------------------------------------------------------- static matching


def bound_to_claim(pv: Mapping[str, Any], pvc: Mapping[str, Any]) -> bool:
    ref = (pv.get("spec") or {}).get("claimRef")
    if not ref:
        return False
    m = meta(pvc)
    if ref.get("name") != m.get("name") or ref.get("namespace") != m.get("namespace"):
        return False
    return not ref.get("uid") or ref.get("uid") == m.get("uid")


def _node_independent_fit(pvc: Mapping[str, Any], pv: Mapping[str, Any]) -> bool:
    """``FindMatchingVolume``'s checks before the claimRef one: capacity, volume mode, attributes class,
    deletion."""
    cspec, vspec = pvc.get("spec") or {}, pv.get("spec") or {}
    if pv_capacity(pv) < storage_request(pvc):
        return False
    if (cspec.get("volumeMode") or "Filesystem") != (vspec.get("volumeMode") or "Filesystem"):
        return False
    if (cspec.get("volumeAttributesClassName") or "") != (vspec.get("volumeAttributesClassName") or ""):
        return False
    return not meta(pv).get("deletionTimestamp")


def _available_for(pvc: Mapping[str, Any], pv: Mapping[str, Any]) -> bool:
    """The checks after the claimRef one, for a PV not pre-bound to this claim."""
    if (pv.get("status") or {}).get("phase") != "Available":
        return False
    if not _label_selector_matches((pvc.get("spec") or {}).get("selector"), meta(pv).get("labels") or {}):
        return False
    if volume_class(pv) != claim_class(pvc):
        return False
    modes = set((pv.get("spec") or {}).get("accessModes") or ())
    return all(m in modes for m in (pvc.get("spec") or {}).get("accessModes") or ())


IndexArray = npt.NDArray[np.int64]


def match_volumes(
    table: NodeTable, claims: Sequence[Obj], pvs_by_class: Mapping[str, Sequence[Obj]]
) -> list[tuple[Obj, list[Obj], IndexArray]]:
    """``findMatchingVolumes`` on every row: claims smallest first, each taking its smallest fitting PV not
    taken by an earlier claim on the same row. Per claim: (claim, candidate PVs, chosen index per row, or -1
    where none fits and the claim must be provisioned)."""
    n = table.n_rows
    ordered = sorted(claims, key=storage_request)  # kube sorts by requested size
    out: list[tuple[Obj, list[Obj], IndexArray]] = []
    taken: dict[str, npt.NDArray[np.bool_]] = {}  # PV name -> rows where an earlier claim took it
    for pvc in ordered:
        pvs = list(pvs_by_class.get(claim_class(pvc), ()))
        chosen = np.full(n, -1, dtype=np.int64)
        best_cap = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        prebound_done = np.zeros(n, dtype=bool)
        for i, pv in enumerate(pvs):
            if not _node_independent_fit(pvc, pv):
                continue
            name = meta(pv).get("name", "")
            usable = ~taken.get(name, np.zeros(n, dtype=bool)) & ~prebound_done
            spec_ref = (pv.get("spec") or {}).get("claimRef")
            if spec_ref and not bound_to_claim(pv, pvc):
                continue
            affinity = pv_affinity_mask(table, pv)
            if bound_to_claim(pv, pvc):
                # kube returns at the first PV pre-bound to the claim: it if the node fits, else nothing
                chosen = np.where(usable, np.where(affinity, i, -1), chosen)
                prebound_done |= usable
                continue
            if not _available_for(pvc, pv):
                continue
            cap = pv_capacity(pv)
            better = usable & affinity & (cap < best_cap)
            chosen[better] = i
            best_cap[better] = cap
        for i, pv in enumerate(pvs):
            rows = chosen == i
            if rows.any():
                name = meta(pv).get("name", "")
                taken[name] = taken.get(name, np.zeros(n, dtype=bool)) | rows
        out.append((pvc, pvs, chosen))
    return out


# ---------------------------------------------------------------------------------------------- assume


def bind_volume_to_claim(pv: Obj, pvc: Obj) -> tuple[Obj, bool]:
    """``GetBindVolumeToClaim``: the PV with its claimRef set (and bound-by-controller), and whether it changed."""
    clone = copy.deepcopy(pv)
    dirty = False
    m = meta(pvc)
    set_by_us = not bound_to_claim(pv, pvc)
    ref = (clone.get("spec") or {}).get("claimRef") or {}
    if (ref.get("name"), ref.get("namespace"), ref.get("uid")) != (m.get("name"), m.get("namespace"), m.get("uid")):
        clone.setdefault("spec", {})["claimRef"] = {
            "kind": "PersistentVolumeClaim",
            "namespace": m.get("namespace"),
            "name": m.get("name"),
            "uid": m.get("uid"),
            "apiVersion": "v1",
            "resourceVersion": m.get("resourceVersion"),
        }
        dirty = True
    anns = clone.setdefault("metadata", {}).setdefault("annotations", {})
    if set_by_us and ANN_BOUND_BY_CONTROLLER not in anns:
        anns[ANN_BOUND_BY_CONTROLLER] = "yes"
        dirty = True
    return clone, dirty


def with_selected_node(pvc: Obj, node: str) -> Obj:
    clone = copy.deepcopy(pvc)
    clone.setdefault("metadata", {}).setdefault("annotations", {})[ANN_SELECTED_NODE] = node
    return clone
