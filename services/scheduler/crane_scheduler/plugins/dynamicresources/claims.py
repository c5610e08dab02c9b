"""A pod's ResourceClaims (kube's ``resourceclaim`` helpers) and the claims being allocated (kube's claim tracker).

``pod_claims`` resolves ``spec.resourceClaims``: ``resourceClaimName`` names a shared claim; a
``resourceClaimTemplateName`` claim is created by kube-controller-manager's resourceclaim controller, which writes
its name in ``status.resourceClaimStatuses`` (until then: "ResourceClaim not created yet") and makes the pod its
controlling owner (else: "(Pod is not owner)"); an entry with a null name there needs no claim. Errors carry
kube's messages verbatim.

``ClaimTracker`` holds the allocations decided in Reserve and not yet written by PreBind (kube's
``SignalClaimPendingAllocation``) and the claims PreBind wrote, until the informer shows them (kube's assume
cache): the devices of both count as allocated, so two pods in flight never get the same device. ``Held`` is the
set of devices held whole, kept as each claim changes, with the log of its changes that the shape columns follow;
the shares of devices allocated several times (``shareID``, consumable capacity) are gathered apart
(``ClaimTracker.shared``): few claims have them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from crane_scheduler.plugins.dynamicresources.allocator import (
    NO_SHARES,
    DeviceID,
    Share,
    SharedState,
    allocated_devices,
    shared_state,
    shares_of,
)

Raw = Mapping[str, Any]
ClaimGetter = Callable[[str, str], Raw | None]
"""(namespace, name) -> the claim as the scheduler sees it (assumed version first), None when absent."""

FINALIZER = "resource.kubernetes.io/delete-protection"


class ClaimError(Exception):
    """A pod's claim cannot be used yet; the message is kube's (the pod stays Pending, UnschedulableAndUnresolvable)."""


def _meta(obj: Raw) -> Raw:
    return obj.get("metadata") or {}


def claim_name(pod: Raw, pod_claim: Raw) -> tuple[str | None, bool]:
    """kube's ``resourceclaim.Name``: (the claim's name or None when none is needed, whether the pod must own it)."""
    meta = _meta(pod)
    if pod_claim.get("resourceClaimName") is not None:
        return pod_claim["resourceClaimName"], False
    if pod_claim.get("resourceClaimTemplateName") is not None:
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or ():
            if status.get("name") == pod_claim.get("name"):
                return status.get("resourceClaimName"), True
        raise ClaimError(f'pod "{meta.get("namespace", "")}/{meta.get("name", "")}": ResourceClaim not created yet')
    raise ClaimError(
        f'pod "{meta.get("namespace", "")}/{meta.get("name", "")}", spec.resourceClaim "{pod_claim.get("name", "")}": '
        "none of the supported fields are set"
    )


def is_for_pod(pod: Raw, claim: Raw) -> bool:
    """kube's ``IsForPod``: same namespace and the pod is the claim's controlling owner."""
    return not_for_pod(pod, claim) is None


def not_for_pod(pod: Raw, claim: Raw) -> str | None:
    """Why the claim was not made for the pod (kube 1.37's ``IsForPod`` messages), None when it was."""
    pod_meta, claim_meta = _meta(pod), _meta(claim)
    ns, name = claim_meta.get("namespace", ""), claim_meta.get("name", "")
    pod_ref = f"{pod_meta.get('namespace', '')}/{pod_meta.get('name', '')}"
    if ns != pod_meta.get("namespace"):
        return f"ResourceClaim {ns}/{name} is not in the same namespace as Pod {pod_ref}"
    if not any(
        ref.get("controller") and ref.get("uid") == pod_meta.get("uid")
        for ref in claim_meta.get("ownerReferences") or ()
    ):
        return f"ResourceClaim {ns}/{name} was not created for Pod {pod_ref} (Pod is not owner)"
    return None


def is_reserved_for_pod(pod: Raw, claim: Raw) -> bool:
    uid = _meta(pod).get("uid")
    return any(r.get("uid") == uid for r in (claim.get("status") or {}).get("reservedFor") or ())


def pod_claims(pod: Raw, get: ClaimGetter) -> list[Raw]:
    """The pod's claims in ``spec.resourceClaims`` order (kube's ``foreachPodResourceClaim``); ``ClaimError``."""
    namespace = _meta(pod).get("namespace", "")
    out: list[Raw] = []
    for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or ():
        name, must_own = claim_name(pod, pod_claim)
        if name is None:
            continue
        claim = get(namespace, name)
        if claim is None:
            raise ClaimError(f'could not find ResourceClaim "{namespace}/{name}"')  # kube's assume cache
        if _meta(claim).get("deletionTimestamp"):
            raise ClaimError(f'resourceclaim "{name}" is being deleted')
        if must_own:
            problem = not_for_pod(pod, claim)
            if problem is not None:
                raise ClaimError(problem)
        out.append(claim)
    return out


def claim_key(claim: Raw) -> str:
    meta = _meta(claim)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class ClaimTracker:
    """In-flight allocations (by claim uid) and written-but-not-yet-seen claims (by namespace/name), and ``held``,
    the devices they and the lister's claims hold, kept up to date as each of them changes (not recomputed per
    cycle: a burst keeps hundreds of claims in flight)."""

    def __init__(self, changed: set[str] | None = None) -> None:
        self.pending: dict[str, Raw] = {}
        self.assumed: dict[str, Raw] = {}
        self.held = Held()
        self.index = HeldIndex(changed, self.held)
        self._pending_devices: dict[str, tuple[DeviceID, ...]] = {}
        self._pending_shares: dict[str, tuple[Share, ...]] = {}
        self._assumed_shares: dict[str, tuple[Share, ...]] = {}
        self._effects: dict[str, tuple[tuple[DeviceID, ...], tuple[DeviceID, ...]]] = {}
        """assumed key -> (its devices, the devices of the lister's older version it stands in for)"""
        self._dirty: set[str] = set()  # assumed since the last cycle: compared with the lister's version then
        self._created: set[str] = set()  # assumed claims PreBind created, the informer has not shown yet

    def signal_pending(self, claim: Raw) -> None:
        """Reserve: ``claim`` carries the allocation this pod's binding cycle is about to write."""
        uid = str(_meta(claim).get("uid", ""))
        self.remove_pending(uid)
        self.pending[uid] = claim
        devices = self._pending_devices[uid] = tuple(allocated_devices([claim]))
        self.held.add(devices, 1, 0)
        shares = shares_of(claim)
        if shares:
            self._pending_shares[uid] = shares

    def has_pending(self, uid: str) -> bool:
        return uid in self.pending

    def remove_pending(self, uid: str) -> bool:
        if self.pending.pop(uid, None) is None:
            return False
        self._pending_shares.pop(uid, None)
        self.held.add(self._pending_devices.pop(uid), -1, 0)
        return True

    def assume(self, claim: Raw, created: bool = False) -> None:
        """PreBind wrote ``claim``: answer it until the informer delivers this or a newer version. ``created``:
        PreBind made the claim (the extended resources'): until the informer shows it at all, it is not taken as
        deleted, and its devices count as held."""
        key = claim_key(claim)
        self.assumed[key] = claim
        self._dirty.add(key)
        if created:
            self._created.add(key)
        shares = shares_of(claim)
        if shares:
            self._assumed_shares[key] = shares
        else:
            self._assumed_shares.pop(key, None)

    def restore(self, key: str) -> None:
        if self.assumed.pop(key, None) is not None:
            self._effect(key, None)
        self._dirty.discard(key)
        self._created.discard(key)
        self._assumed_shares.pop(key, None)

    def shared(self, claims: Mapping[str, Raw]) -> SharedState:
        """The shares of devices allocated several times, from the lister's claims (an assumed newer version in
        place) and the pending allocations (kube's ``AllocatedSharedDeviceIDs`` and ``AggregatedCapacity``); call
        after ``allocated``, which brings the index up to date."""
        listed = self.index.shares
        if not listed and not self._assumed_shares and not self._pending_shares:
            return NO_SHARES
        out: list[Share] = []
        for key, shares in listed.items():
            if key not in self.assumed:
                out.extend(shares)
        for key in list(self.assumed):
            newest = self.newest(key, claims.get(key))
            if newest is None:
                continue
            out.extend(self._assumed_shares.get(key, ()) if newest is self.assumed.get(key) else shares_of(newest))
        for shares in self._pending_shares.values():
            out.extend(shares)
        return shared_state(out)

    def newest(self, key: str, seen: Raw | None) -> Raw | None:
        """The informer's version ``seen`` unless an assumed one is newer (kube's assume cache compares
        resourceVersions as integers); an assumed version the informer caught up with, or whose claim the informer
        saw deleted, is dropped."""
        mine = self.assumed.get(key)
        if mine is None:
            return seen
        if seen is None and key in self._created:  # not listed yet
            return mine
        if seen is None or resource_version(seen) >= resource_version(mine):  # deleted, or caught up
            self.restore(key)
            return seen
        return mine

    def get(self, lister: ClaimGetter) -> ClaimGetter:
        """A getter answering the newest of the informer's and the assumed version."""

        def get(namespace: str, name: str) -> Raw | None:
            return self.newest(f"{namespace}/{name}", lister(namespace, name))

        return get

    def allocated(self, claims: Mapping[str, Raw]) -> Held:
        """Devices held by ``claims`` (the lister's, by key; newer assumed versions in place) and by the pending
        allocations. The lister's claims are counted incrementally (``HeldIndex``): a claim object is read once,
        not once per pod, as kube's DRA manager keeps its allocated-devices set from claim events; an assumed
        claim is compared with the lister's version when either changed."""
        changed = self.index.update(claims)
        keys = self._dirty | (set(self.assumed) if changed is None else self.assumed.keys() & changed)
        self._dirty = set()
        counted = self.index.counted
        for key in keys:
            if key not in self.assumed:
                continue
            seen = claims.get(key)
            newest = self.newest(key, seen)
            if seen is None and newest is not None:  # created by PreBind, not listed yet
                self._effect(key, (tuple(allocated_devices([newest])), ()))
                continue
            if newest is seen or seen is None or newest is None:
                continue
            entry = counted.get(key)
            replaced = entry[1] if entry is not None and entry[0] is seen else tuple(allocated_devices([seen]))
            self._effect(key, (tuple(allocated_devices([newest])), replaced))
        self.held.trim()
        return self.held

    def _effect(self, key: str, effect: tuple[tuple[DeviceID, ...], tuple[DeviceID, ...]] | None) -> None:
        old = self._effects.pop(key, None)
        if old is not None:
            self.held.add(old[0], -1, 0)
            self.held.add(old[1], 0, -1)
        if effect is not None:
            self._effects[key] = effect
            self.held.add(effect[0], 1, 0)
            self.held.add(effect[1], 0, 1)


class Held:
    """The devices held now (``nodeview.HeldLog``): by the lister's claims (``counts``, kept by ``HeldIndex``)
    less those an assumed newer version replaces (``minus``), plus the assumed and pending allocations
    (``plus``); ``log`` lists each device that became held (+1) or free (-1), in order (the shape columns follow
    it), trimmed after ``LOG_MAX`` entries, which makes its readers count again."""

    LOG_MAX = 1 << 16

    def __init__(self) -> None:
        self.counts: dict[DeviceID, int] = {}
        self.plus: dict[DeviceID, int] = {}
        self.minus: dict[DeviceID, int] = {}
        self.devices: set[DeviceID] = set()
        self.log: list[tuple[DeviceID, int]] = []
        self.log_base = 0

    def __contains__(self, device: object) -> bool:
        return device in self.devices

    def add(self, devices: tuple[DeviceID, ...], plus: int, minus: int) -> None:
        for device in devices:
            if plus:
                _bump(self.plus, device, plus)
            if minus:
                _bump(self.minus, device, minus)
            self.recheck(device)

    def recheck(self, device: DeviceID) -> None:
        """``device``'s counts changed: log it if that changed whether it is held."""
        now = device in self.plus or self.counts.get(device, 0) > self.minus.get(device, 0)
        if now != (device in self.devices):
            if now:
                self.devices.add(device)
            else:
                self.devices.discard(device)
            self.log.append((device, 1 if now else -1))

    def trim(self) -> None:
        if len(self.log) > self.LOG_MAX:
            self.log_base += len(self.log)
            self.log = []


def _bump(counts: dict[DeviceID, int], device: DeviceID, step: int) -> None:
    n = counts.get(device, 0) + step
    if n:
        counts[device] = n
    else:
        del counts[device]


class HeldIndex:
    """How many of the lister's claims hold each device (``held.counts``), kept up to date by comparing each
    claim object with the one last counted (the informer replaces an object on every change, so identity is its
    version). With ``changed`` (the lister's ``changed_keys``), only the claims changed since the last update
    are compared; without it, all of them."""

    def __init__(self, changed: set[str] | None = None, held: Held | None = None) -> None:
        self.held = held if held is not None else Held()
        self.counts = self.held.counts
        self.changed = changed
        self.counted: dict[str, tuple[Raw, tuple[DeviceID, ...]]] = {}
        """key -> (the claim object counted, the devices it holds)"""
        self.shares: dict[str, tuple[Share, ...]] = {}
        """key -> the claim's shares of devices allocated several times (claims with some only)"""
        self._seen = False  # the first update reads every claim (those listed before ``changed`` existed)

    def update(self, claims: Mapping[str, Raw]) -> list[str] | None:
        """Count the changed claims; returns their keys, or None when every claim was compared."""
        if self.changed is not None and self._seen:
            keys = list(self.changed)
            self.changed.clear()
            for key in keys:
                claim = claims.get(key)
                if claim is None:
                    entry = self.counted.pop(key, None)
                    self.shares.pop(key, None)
                    if entry is not None:
                        self._add(entry[1], -1)
                else:
                    self._count(key, claim)
            return keys
        if self.changed is not None:
            self.changed.clear()
            self._seen = True
        for key, claim in claims.items():
            self._count(key, claim)
        counted = self.counted
        if len(counted) != len(claims):
            for key in [k for k in counted if k not in claims]:
                self._add(counted.pop(key)[1], -1)
                self.shares.pop(key, None)
        return None

    def _count(self, key: str, claim: Raw) -> None:
        entry = self.counted.get(key)
        if entry is not None and entry[0] is claim:
            return
        if entry is not None:
            self._add(entry[1], -1)
        devices = tuple(allocated_devices([claim]))
        self.counted[key] = (claim, devices)
        self._add(devices, 1)
        shares = shares_of(claim)
        if shares:
            self.shares[key] = shares
        else:
            self.shares.pop(key, None)

    def _add(self, devices: tuple[DeviceID, ...], step: int) -> None:
        counts, recheck = self.counts, self.held.recheck
        for device in devices:
            _bump(counts, device, step)
            recheck(device)


def resource_version(claim: Raw) -> int:
    try:
        return int(_meta(claim).get("resourceVersion") or 0)
    except ValueError:
        return 0
