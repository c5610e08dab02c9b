"""Device taints and tolerations (DRADeviceTaints and DRADeviceTaintRules, GA and on in 1.37).

A device carries ``taints`` (``{key, value, effect, timeAdded}``) in its ResourceSlice, and DeviceTaintRules
(``resource.k8s.io/v1``) add one taint to every device their ``spec.deviceSelector`` names (driver, pool, device:
each set one must match; a rule without a selector taints nothing), as kube's ResourceSlice tracker patches the
slices the allocator sees (``apply_rules``). A NoSchedule or NoExecute taint keeps the device from a request
unless one of the request's ``tolerations`` tolerates it; ``None`` (and any effect kube does not know) never
does (``prevents_allocation``). A toleration matches kube's ``ToleratesTaint``: its effect (if set) and key (if
set) equal the taint's, and operator Exists, or Equal (the default) with the same value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Raw = Mapping[str, Any]

BLOCKING = ("NoSchedule", "NoExecute")


def tolerates(toleration: Raw, taint: Raw) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or ""
    if operator in ("", "Equal"):
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return operator == "Exists"


def prevents_allocation(device: Raw, tolerations: Sequence[Raw]) -> bool:
    """kube's ``taintPreventsAllocation``."""
    for taint in device.get("taints") or ():
        if taint.get("effect") in BLOCKING and not any(tolerates(t, taint) for t in tolerations):
            return True
    return False


def blocked_without_tolerations(device: Raw) -> bool:
    return any(t.get("effect") in BLOCKING for t in device.get("taints") or ())


def apply_rules(slices: Sequence[Raw], rules: Sequence[Raw]) -> list[Raw]:
    """The slices with every DeviceTaintRule's taint added to the devices it selects (kube's tracker: the rules'
    taints after the device's own; a slice no rule touches is returned as is, so caches keyed by the slice objects
    keep working)."""
    selected = [r for r in rules if ((r.get("spec") or {}).get("deviceSelector")) is not None]
    if not selected:
        return list(slices)
    out: list[Raw] = []
    for s in slices:
        spec = s.get("spec") or {}
        driver, pool = spec.get("driver"), (spec.get("pool") or {}).get("name")
        devices: list[Any] | None = None
        for rule in selected:
            rule_spec = rule.get("spec") or {}
            selector = rule_spec.get("deviceSelector") or {}
            if selector.get("driver") is not None and selector["driver"] != driver:
                continue
            if selector.get("pool") is not None and selector["pool"] != pool:
                continue
            wanted = selector.get("device")
            for i, device in enumerate(spec.get("devices") or ()):
                if wanted is not None and wanted != device.get("name"):
                    continue
                if devices is None:
                    devices = list(spec.get("devices") or ())
                patched = dict(devices[i])
                patched["taints"] = [*(patched.get("taints") or ()), rule_spec.get("taint") or {}]
                devices[i] = patched
        out.append(s if devices is None else {**s, "spec": {**spec, "devices": devices}})
    return out
