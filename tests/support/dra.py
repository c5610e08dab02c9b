"""DRA objects (resource.k8s.io/v1) for tests: ResourceSlices, DeviceClasses, ResourceClaims, as the API serves them."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.example.com"


def device(name: str, capacity: dict[str, str] | None = None, **attributes: Any) -> dict[str, Any]:
    """A v1 device; attribute values by Python type (str, bool, int), or typed as the API has them
    (``{"version": "1.2.3"}``)."""
    attrs: dict[str, Any] = {}
    for key, value in attributes.items():
        if isinstance(value, dict):
            attrs[key] = value
            continue
        kind = "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "string"
        attrs[key] = {kind: value}
    out: dict[str, Any] = {"name": name, "attributes": attrs}
    if capacity:
        out["capacity"] = {k: {"value": v} for k, v in capacity.items()}
    return out


def resource_slice(
    name: str,
    devices: list[dict[str, Any]],
    *,
    node: str | None = None,
    all_nodes: bool = False,
    node_selector: dict[str, Any] | None = None,
    driver: str = DRIVER,
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool or node or name, "generation": generation, "resourceSliceCount": count},
        "devices": devices,
    }
    if node is not None:
        spec["nodeName"] = node
    if all_nodes:
        spec["allNodes"] = True
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def device_class(name: str, *expressions: str, config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in expressions]}
    if config:
        spec["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def exactly(
    name: str,
    class_name: str,
    *expressions: str,
    count: int = 1,
    mode: str = "ExactCount",
    admin_access: bool | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"deviceClassName": class_name, "allocationMode": mode}
    if mode == "ExactCount":
        spec["count"] = count
    if expressions:
        spec["selectors"] = [{"cel": {"expression": e}} for e in expressions]
    if admin_access is not None:
        spec["adminAccess"] = admin_access
    return {"name": name, "exactly": spec}


def sub_request(
    name: str, class_name: str, *expressions: str, count: int = 1, mode: str = "ExactCount"
) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "deviceClassName": class_name, "allocationMode": mode}
    if mode == "ExactCount":
        out["count"] = count
    if expressions:
        out["selectors"] = [{"cel": {"expression": e}} for e in expressions]
    return out


def first_available(name: str, *subs: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": list(subs)}


def claim(
    name: str,
    *requests: dict[str, Any],
    namespace: str = "default",
    constraints: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
        "spec": {"devices": devices},
    }


def opaque(driver: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"opaque": {"driver": driver, "parameters": parameters}}
