"""The API objects plugins read besides nodes and pods (kube-scheduler's listers), with kube's assume cache.

PersistentVolumeClaims, PersistentVolumes, StorageClasses, CSINodes, VolumeAttachments and PodDisruptionBudgets,
each kept by one
``crane_shared.informer.Informer`` (``Cache.object_informers`` starts them). Objects stay raw JSON dicts.

VolumeBinding decides a claim's volume in the scheduling cycle but writes it in the binding cycle, so the decision
is *assumed* here first (kube's ``AssumeCache``): ``pv()``/``pvc()`` answer the assumed version until the informer
delivers a newer object from the API (which supersedes it) or the binding cycle fails and ``restore_*`` drops it.
The next pod's decision therefore never picks a PV another pod's bind is about to take.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args

from crane_shared.informer import EventType, Informer, ListFn, object_key

Obj = dict[str, Any]
Kind = Literal[
    "pvcs",
    "pvs",
    "storageclasses",
    "csinodes",
    "volumeattachments",
    "pdbs",
    "csidrivers",
    "csistoragecapacities",
    "resourceclaims",
    "resourceslices",
    "deviceclasses",
    "devicetaintrules",
]
KINDS: tuple[Kind, ...] = get_args(Kind)


class Listers:
    """Latest API objects by key (``namespace/name`` or ``name``) plus assumed PV/PVC versions.

    ``on_change(kind, new, old)`` is called after every informer event (the cache turns it into a queueing event);
    ``new`` is None for a deletion."""

    def __init__(self) -> None:
        self.objects: dict[Kind, dict[str, Obj]] = {kind: {} for kind in KINDS}
        self._assumed: dict[Kind, dict[str, Obj]] = {"pvs": {}, "pvcs": {}}
        self.on_change: Callable[[Kind, Obj | None, Obj | None], None] = lambda kind, new, old: None
        self.version = 0  # bumped on every change: plugins key their caches on it
        self._journals: dict[Kind, list[set[str]]] = {kind: [] for kind in KINDS}
        self._changed: asyncio.Event | None = None

    # ------------------------------------------------------------------------------------------ reads

    def pvc(self, namespace: str, name: str) -> Obj | None:
        key = f"{namespace}/{name}"
        return self._assumed["pvcs"].get(key) or self.objects["pvcs"].get(key)

    def pv(self, name: str) -> Obj | None:
        return self._assumed["pvs"].get(name) or self.objects["pvs"].get(name)

    def api_pvc(self, namespace: str, name: str) -> Obj | None:
        """The claim as the API last said, ignoring assumptions (PreBind's check of its own writes)."""
        return self.objects["pvcs"].get(f"{namespace}/{name}")

    def api_pv(self, name: str) -> Obj | None:
        return self.objects["pvs"].get(name)

    def pvs(self) -> list[Obj]:
        """All PVs, assumed versions in place of the API's."""
        assumed = self._assumed["pvs"]
        return [assumed.get(name, pv) for name, pv in self.objects["pvs"].items()]

    def storage_class(self, name: str) -> Obj | None:
        return self.objects["storageclasses"].get(name)

    def csinode(self, name: str) -> Obj | None:
        return self.objects["csinodes"].get(name)

    def volume_attachments(self) -> list[Obj]:
        return list(self.objects["volumeattachments"].values())

    def csi_driver(self, name: str) -> Obj | None:
        return self.objects["csidrivers"].get(name)

    def storage_capacities(self) -> list[Obj]:
        """CSIStorageCapacity objects of every namespace (VolumeBinding's capacity check lists them all)."""
        return list(self.objects["csistoragecapacities"].values())

    def pdbs(self) -> list[Obj]:
        return list(self.objects["pdbs"].values())

    def resource_claim(self, namespace: str, name: str) -> Obj | None:
        return self.objects["resourceclaims"].get(f"{namespace}/{name}")

    def resource_claims_by_key(self) -> Mapping[str, Obj]:
        """The claims by ``namespace/name`` (a read-only view of the informer's store, not a copy)."""
        return self.objects["resourceclaims"]

    def resource_slices(self) -> list[Obj]:
        return list(self.objects["resourceslices"].values())

    def device_classes(self) -> dict[str, Obj]:
        return self.objects["deviceclasses"]

    def device_taint_rules(self) -> list[Obj]:
        """resource.k8s.io/v1 DeviceTaintRules (watched by DynamicResources where the API server serves them)."""
        return list(self.objects["devicetaintrules"].values())

    def changed_keys(self, kind: Kind) -> set[str]:
        """A set to which every later change of ``kind`` adds the object's key; its reader empties it as it
        catches up (an index over thousands of objects then reads only the changed ones per cycle)."""
        keys: set[str] = set()
        self._journals[kind].append(keys)
        return keys

    async def wait_change(self, timeout: float) -> None:
        """Return after the next informer event, or after ``timeout`` seconds (a PreBind waiting for the PV
        controller re-checks on every change instead of polling blindly)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    # ------------------------------------------------------------------------------------------ assume cache

    def assume_pv(self, pv: Obj) -> None:
        self._assumed["pvs"][object_key(pv)] = pv
        self.version += 1

    def assume_pvc(self, pvc: Obj) -> None:
        self._assumed["pvcs"][object_key(pvc)] = pvc
        self.version += 1

    def restore_pv(self, name: str) -> None:
        if self._assumed["pvs"].pop(name, None) is not None:
            self.version += 1

    def restore_pvc(self, namespace: str, name: str) -> None:
        if self._assumed["pvcs"].pop(f"{namespace}/{name}", None) is not None:
            self.version += 1

    def is_assumed(self, kind: Kind, key: str) -> bool:
        return key in self._assumed.get(kind, {})

    # ------------------------------------------------------------------------------------------ informer side

    def handler(self, kind: Kind) -> Callable[[EventType, Obj, Obj | None], None]:
        store = self.objects[kind]
        assumed = self._assumed.get(kind)
        journals = self._journals[kind]

        def on_event(event: EventType, new: Obj, old: Obj | None) -> None:
            key = object_key(new)
            if assumed is not None:
                assumed.pop(key, None)  # the API's newer version (or its deletion) supersedes our assumption
            self.version += 1
            for keys in journals:
                keys.add(key)
            if self._changed is not None:
                self._changed.set()
                self._changed = None
            if event == "DELETED":
                store.pop(key, None)
                self.on_change(kind, None, new)
            else:
                store[key] = new
                self.on_change(kind, new, old)

        return on_event

    def apply(self, kind: Kind, event: EventType, obj: Obj, old: Obj | None = None) -> None:
        """Feed one event by hand (tests, and callers without an informer)."""
        self.handler(kind)(event, obj, old)

    def informer(self, kind: Kind, list_fn: ListFn, page_size: int = 1000) -> Informer:
        return Informer(kind, list_fn, self.handler(kind), page_size=page_size)
