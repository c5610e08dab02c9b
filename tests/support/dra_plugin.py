"""DynamicResources alone for unit tests: a GPU class, pods with claims, listers holding DRA objects, the
rejections per node, and ResourceClaims kept as the API keeps them."""

from __future__ import annotations

import copy
from typing import Any

from crane_scheduler.framework import (
    CycleState,
)
from crane_scheduler.listers import Listers
from crane_scheduler.plugins.dynamicresources.binding import Conflict
from crane_scheduler.plugins.dynamicresources.plugin import DynamicResources
from crane_scheduler.podinfo import parse_pod
from tests.support.dra import DRIVER, device_class
from tests.support.scheduler import pod

GPU = device_class("gpu", f'device.driver == "{DRIVER}"')


def dra_pod(name: str, *claims: dict[str, Any], statuses: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    raw = pod(name, spec={"resourceClaims": list(claims)})
    if statuses is not None:
        raw["status"] = {"resourceClaimStatuses": statuses}
    return raw


def listers(*objects: dict[str, Any]) -> Listers:
    kinds = {"ResourceClaim": "resourceclaims", "ResourceSlice": "resourceslices", "DeviceClass": "deviceclasses"}
    out = Listers()
    for obj in objects:
        out.apply(kinds[obj["kind"]], "ADDED", obj)  # type: ignore[arg-type]
    return out


def rejections(plugin: DynamicResources, state: CycleState, raw: dict[str, Any], t: Any) -> dict[str, list[str]]:
    """reason -> rejected node names."""
    out: dict[str, list[str]] = {}
    for r in plugin.filter(state, parse_pod(raw), t):
        out[r.reason] = [t.nodes[i].name for i in r.mask.nonzero()[0]]
        assert r.unresolvable
    return out


class FakeClaims:
    """ResourceClaims as the API keeps them: resourceVersion checked on every write (409 on a stale one)."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.store = {
            c["metadata"]["name"]: copy.deepcopy({**c, "metadata": {**c["metadata"], "resourceVersion": "1"}})
            for c in claims
        }
        self.calls: list[str] = []
        self.conflicts = 0

    def _write(self, claim: Any, what: str) -> dict[str, Any]:
        self.calls.append(what)
        have = self.store[claim["metadata"]["name"]]
        if self.conflicts:
            self.conflicts -= 1
            have["metadata"]["resourceVersion"] = str(int(have["metadata"]["resourceVersion"]) + 1)
        if claim["metadata"].get("resourceVersion") != have["metadata"]["resourceVersion"]:
            raise Conflict("conflict")
        new = copy.deepcopy(dict(claim))
        if what == "update":
            new["status"] = have.get("status") or {}
        else:
            new["metadata"] = have["metadata"]
        new["metadata"] = {**new["metadata"], "resourceVersion": str(int(have["metadata"]["resourceVersion"]) + 1)}
        self.store[claim["metadata"]["name"]] = new
        return copy.deepcopy(new)

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        self.calls.append("get")
        return copy.deepcopy(self.store[name])

    async def update(self, claim: Any) -> dict[str, Any]:
        return self._write(claim, "update")

    async def update_status(self, claim: Any) -> dict[str, Any]:
        return self._write(claim, "status")

    async def deallocate(self, claim: Any) -> None:
        self.calls.append("deallocate")
        status = self.store[claim["metadata"]["name"]].setdefault("status", {})
        for key in ("reservedFor", "allocation", "devices"):
            status.pop(key, None)

    async def unreserve(self, claim: Any, pod_uid: str) -> None:
        self.calls.append("unreserve")
        status = self.store[claim["metadata"]["name"]]["status"]
        status["reservedFor"] = [r for r in status["reservedFor"] if r["uid"] != pod_uid]

    async def create(self, claim: Any) -> dict[str, Any]:
        self.calls.append("create")
        meta = dict(claim["metadata"])
        name = meta.get("name") or f"{meta['generateName']}{len(self.store):05d}"
        new = {
            **copy.deepcopy(dict(claim)),
            "metadata": {**meta, "name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        }
        self.store[name] = new
        return copy.deepcopy(new)

    async def delete(self, claim: Any) -> None:
        self.calls.append("delete")
        self.store.pop(claim["metadata"]["name"], None)

    async def pod_extended_status(self, pod: Any, claim: Any, mappings: Any) -> None:
        self.calls.append("pod status")
        self.pod_status = {"requestMappings": list(mappings), "resourceClaimName": claim["metadata"]["name"]}
