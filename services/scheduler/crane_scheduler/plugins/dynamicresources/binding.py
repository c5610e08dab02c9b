"""DynamicResources' binding cycle against the API (resource.k8s.io/v1 ResourceClaims): kube's ``bindClaim`` as a
function over a ``ClaimWriter`` (so it is tested without a server), the binding conditions' checks (kube's
``isClaimReadyForBinding``, ``isClaimTimeout``), and the adapters: ``ApiClaims`` on the scheduler's API client,
and ``LazyApiClaims``, the plugin's, whose writes go through the API writer process (the binds' connections and
leadership term, ``protocol.OBJECT``) once the service has one, so the scheduling process only decides (its reads,
the claim re-read after a conflict, stay on the client)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_scheduler.framework import Handle
from crane_scheduler.plugins.dynamicresources.allocator import claim_ref
from crane_scheduler.plugins.dynamicresources.claims import FINALIZER, ClaimError, ClaimTracker
from crane_shared.kube import raw_json

Raw = Mapping[str, Any]


class Conflict(Exception):
    """The API answered 409 (the claim changed since it was read)."""


class ClaimWriter(Protocol):
    """The API calls of PreBind (resource.k8s.io/v1 ResourceClaims); each returns the object the API answered."""

    async def get(self, namespace: str, name: str) -> Raw: ...

    async def update(self, claim: Raw) -> Raw: ...

    async def update_status(self, claim: Raw) -> Raw: ...

    async def unreserve(self, claim: Raw, pod_uid: str) -> None:
        """Take the pod out of the claim's ``status.reservedFor``."""

    async def deallocate(self, claim: Raw) -> None:
        """Clear the claim's ``reservedFor``, ``allocation`` and ``devices`` (UpdateStatus)."""

    async def create(self, claim: Raw) -> Raw:
        """Create the claim (the extended resources' claim, ``generateName``); the API's object."""

    async def delete(self, claim: Raw) -> None:
        """kube's ``deleteClaim``: the finalizer taken off (Update, on conflict re-read), then Delete (a claim
        already gone is fine)."""

    async def pod_extended_status(self, pod: Raw, claim: Raw, mappings: Sequence[Any]) -> None:
        """Write the pod's ``status.extendedResourceClaimStatus`` (a strategic-merge patch of the pod's status)."""


class NotFound(ClaimError):
    """The API answered 404."""


class BindingFailed(Exception):
    """A device's binding failed (a failure condition true) or timed out: PreBind's error, PostFilter's hint."""


def _device_status(claim: Raw, result: Raw) -> Raw | None:
    for status in (claim.get("status") or {}).get("devices") or ():
        if (status.get("driver"), status.get("pool"), status.get("device")) == (
            result.get("driver"),
            result.get("pool"),
            result.get("device"),
        ):
            return status  # type: ignore[no-any-return]
    return None


def _condition_true(status: Raw, kind: str) -> Raw | None:
    for condition in status.get("conditions") or ():
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition  # type: ignore[no-any-return]
    return None


def ready_for_binding(claim: Raw) -> bool:
    """kube's ``isClaimReadyForBinding``: every allocated device with binding conditions has them all true in
    ``status.devices``; ``BindingFailed`` when a failure condition is true."""
    allocation = (claim.get("status") or {}).get("allocation")
    if allocation is None:
        return False
    for result in (allocation.get("devices") or {}).get("results") or ():
        wanted = result.get("bindingConditions") or ()
        if not wanted:
            continue
        status = _device_status(claim, result)
        if status is None:
            return False
        for kind in result.get("bindingFailureConditions") or ():
            failed = _condition_true(status, kind)
            if failed is not None:
                name = (claim.get("metadata") or {}).get("name", "")
                raise BindingFailed(
                    f"device binding failed: claim={name}, reason={failed.get('reason', '')}, "
                    f"message={json.dumps(failed.get('message', ''))}"
                )
        if any(_condition_true(status, kind) is None for kind in wanted):
            return False
    return True


def binding_timed_out(claim: Raw, timeout: float, now: float) -> bool:
    """kube's ``isClaimTimeout``: allocated at ``allocationTimestamp`` longer than ``timeout`` seconds ago, with a
    device that has binding conditions."""
    allocation = (claim.get("status") or {}).get("allocation")
    stamp = (allocation or {}).get("allocationTimestamp")
    if not stamp:
        return False
    results = ((allocation or {}).get("devices") or {}).get("results") or ()
    if not any(r.get("bindingConditions") is not None for r in results):
        return False
    try:
        at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return False
    return at + timeout < now


def has_binding_conditions(claims: Sequence[Raw]) -> bool:
    """kube's ``hasBindingConditions``: an allocated device with binding conditions."""
    return any(
        result.get("bindingConditions")
        for claim in claims
        for result in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or ()
    )


MAX_CONFLICT_RETRIES = 5
"""client-go's ``retry.DefaultRetry``: 5 steps."""


async def bind_claim(
    writer: ClaimWriter,
    claim: Raw,
    allocation: dict[str, Any] | None,
    pod: Raw,
    tracker: ClaimTracker,
    retries: int = MAX_CONFLICT_RETRIES,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    stamp: bool = True,
) -> Raw:
    """kube's ``bindClaim``: finalizer by Update, then allocation and the pod's reservation by UpdateStatus, the
    whole retried on conflict (re-reading the claim); the written claim is assumed in ``tracker``. ``stamp``
    (DRADeviceBindingConditions, on in 1.37): the allocation gets its ``allocationTimestamp`` if it has none, and a
    claim deallocated meanwhile is an error."""
    meta = pod.get("metadata") or {}
    uid = str((claim.get("metadata") or {}).get("uid", ""))
    current: Raw = claim
    try:
        for attempt in range(retries):
            if attempt:
                current = await writer.get(
                    (claim.get("metadata") or {}).get("namespace", ""), claim["metadata"]["name"]
                )
            try:
                written = await _write_claim(writer, current, allocation, meta, stamp)
            except Conflict:
                if attempt + 1 == retries:
                    raise
                if sleep is not None:
                    await sleep(0.01 * (attempt + 1))
                continue
            tracker.assume(written)
            return written
        raise Conflict(f"claim {claim_ref(claim)}: too many conflicts")  # pragma: no cover - loop raises first
    finally:
        if allocation is not None:
            tracker.remove_pending(uid)


async def _write_claim(
    writer: ClaimWriter, claim: Raw, allocation: dict[str, Any] | None, pod_meta: Raw, stamp: bool
) -> Raw:
    claim_meta = claim.get("metadata") or {}
    if claim_meta.get("deletionTimestamp"):
        raise ClaimError(f"claim {claim_ref(claim)} got deleted in the meantime")
    status = dict(claim.get("status") or {})
    if allocation is not None:
        if status.get("allocation") is not None:
            raise ClaimError(f"claim {claim_ref(claim)} got allocated elsewhere in the meantime")
        if FINALIZER not in (claim_meta.get("finalizers") or ()):
            claim = await writer.update(
                {**claim, "metadata": {**claim_meta, "finalizers": [*(claim_meta.get("finalizers") or ()), FINALIZER]}}
            )
            status = dict(claim.get("status") or {})
        status["allocation"] = allocation
    reserved = list(status.get("reservedFor") or ())
    reserved.append({"resource": "pods", "name": pod_meta.get("name", ""), "uid": pod_meta.get("uid", "")})
    status["reservedFor"] = reserved
    if stamp:
        current = status.get("allocation")
        if current is None:
            raise ClaimError(f"claim {claim_ref(claim)} got deallocated elsewhere in the meantime")
        if not current.get("allocationTimestamp"):
            status["allocation"] = {**current, "allocationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    return await writer.update_status({**claim, "status": status})


REQUEST_TIMEOUT = 30.0


class ApiClaims:
    """``ClaimWriter`` on the scheduler's API client (resource.k8s.io/v1); a 409 is ``Conflict``, other failures
    raise ``ClaimError`` naming the call (every response status-checked by ``raw_json``)."""

    def __init__(self, api: Any, may_write: Callable[[], bool] = lambda: True) -> None:
        self.api = api
        self.may_write = may_write

    async def _call(
        self, what: str, claim: Raw, call: Callable[..., Awaitable[Any]], *args: Any, write: bool = True, **kw: Any
    ) -> Raw:
        if write and not self.may_write():
            raise ClaimError(f"{what} claim {claim_ref(claim)}: the leadership term ended")
        try:
            out = await raw_json(call(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kw))
        except ApiException as err:
            if err.status == 409:
                raise Conflict(f"{what} claim {claim_ref(claim)}: conflict") from None
            if err.status == 404:
                raise NotFound(f"{what} claim {claim_ref(claim)}: {err.status} {err.reason}") from None
            raise ClaimError(f"{what} claim {claim_ref(claim)}: {err.status} {err.reason}") from None
        return out  # type: ignore[no-any-return]

    async def get(self, namespace: str, name: str) -> Raw:
        v1 = client.ResourceV1Api(self.api)
        ref = {"metadata": {"namespace": namespace, "name": name}}
        return await self._call("get updated", ref, v1.read_namespaced_resource_claim, name, namespace, write=False)

    async def update(self, claim: Raw) -> Raw:
        m = claim.get("metadata") or {}
        v1 = client.ResourceV1Api(self.api)
        return await self._call(
            "add finalizer to", claim, v1.replace_namespaced_resource_claim, m.get("name"), m.get("namespace"), claim
        )

    async def update_status(self, claim: Raw) -> Raw:
        m = claim.get("metadata") or {}
        v1 = client.ResourceV1Api(self.api)
        return await self._call(
            "add allocation and reservation to",
            claim,
            v1.replace_namespaced_resource_claim_status,
            m.get("name"),
            m.get("namespace"),
            claim,
        )

    async def unreserve(self, claim: Raw, pod_uid: str) -> None:
        m = claim.get("metadata") or {}
        v1 = client.ResourceV1Api(self.api)
        await self._call(
            "unreserve",
            claim,
            v1.patch_namespaced_resource_claim_status,
            m.get("name"),
            m.get("namespace"),
            _unreserve_patch(claim, pod_uid),
            _content_type="application/strategic-merge-patch+json",
        )

    async def deallocate(self, claim: Raw) -> None:
        v1 = client.ResourceV1Api(self.api)
        m = claim.get("metadata") or {}
        body = {**claim, "status": _deallocated_status(claim)}
        await self._call(
            "deallocate", claim, v1.replace_namespaced_resource_claim_status, m.get("name"), m.get("namespace"), body
        )

    async def create(self, claim: Raw) -> Raw:
        m = claim.get("metadata") or {}
        v1 = client.ResourceV1Api(self.api)
        return await self._call(
            "create claim for extended resources", claim, v1.create_namespaced_resource_claim, m.get("namespace"), claim
        )

    async def _delete_call(self, claim: Raw) -> None:
        m = claim.get("metadata") or {}
        v1 = client.ResourceV1Api(self.api)
        await self._call("delete", claim, v1.delete_namespaced_resource_claim, m.get("name"), m.get("namespace"))

    async def delete(self, claim: Raw, retries: int = MAX_CONFLICT_RETRIES) -> None:
        """kube's ``deleteClaim``: the finalizer off by Update (re-read after a conflict), then Delete."""
        m = claim.get("metadata") or {}
        current: Raw = claim
        for attempt in range(retries):
            if attempt:
                current = await self.get(m.get("namespace", ""), m.get("name", ""))
            meta = dict(current.get("metadata") or {})
            meta["finalizers"] = [f for f in meta.get("finalizers") or () if f != FINALIZER]
            try:
                await self.update({**current, "metadata": meta})
            except Conflict:
                if attempt + 1 == retries:
                    raise
                continue
            break
        with contextlib.suppress(NotFound):
            await self._delete_call(claim)

    async def pod_extended_status(self, pod: Raw, claim: Raw, mappings: Sequence[Any]) -> None:
        m = pod.get("metadata") or {}
        core = client.CoreV1Api(self.api)
        await self._call(
            "update pod ExtendedResourceClaimStatus of",
            claim,
            core.patch_namespaced_pod_status,
            m.get("name"),
            m.get("namespace"),
            _extended_status_patch(claim, mappings),
            _content_type="application/strategic-merge-patch+json",
        )


CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
CLAIMS_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
POD_STATUS_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/status"


class LazyApiClaims(ApiClaims):
    """The handle's API client and writer are set after the profiles are built (``serve``): read them at call
    time, and the leadership term before every write. With the writer, each write is one ``write_object`` in the
    writer's current term (refused by the process once the term ended or its deadline passed, as binds are);
    without it (tests without the process), on the client."""

    def __init__(self, handle: Handle) -> None:
        self.handle = handle
        self.may_write = lambda: handle.may_bind()

    @property
    def api(self) -> Any:
        return self.handle.api

    async def _through_writer(
        self,
        what: str,
        claim: Raw,
        method: str,
        suffix: str,
        body: Any,
        content_type: str = "application/json",
        path: str | None = None,
    ) -> Raw | None:
        """The write through the API writer process, or None when there is none (the caller uses the client)."""
        writer = self.handle.writer
        if writer is None:
            return None
        if not self.may_write():
            raise ClaimError(f"{what} claim {claim_ref(claim)}: the leadership term ended")
        m = claim.get("metadata") or {}
        if path is None:
            path = CLAIM_PATH.format(namespace=m.get("namespace", ""), name=m.get("name", "")) + suffix
        reply = await writer.write_object(method, path, body, writer.term, content_type)
        if reply.status == 409:
            raise Conflict(f"{what} claim {claim_ref(claim)}: conflict")
        if reply.status == 404:
            raise NotFound(f"{what} claim {claim_ref(claim)}: {reply.describe()}")
        if not reply.ok:
            raise ClaimError(f"{what} claim {claim_ref(claim)}: {reply.describe()}")
        try:
            out = json.loads(reply.text)
        except ValueError as err:
            raise ClaimError(f"{what} claim {claim_ref(claim)}: the answer is not JSON: {err}") from None
        if not isinstance(out, dict):
            raise ClaimError(f"{what} claim {claim_ref(claim)}: the answer is not an object")
        return out

    async def update(self, claim: Raw) -> Raw:
        out = await self._through_writer("add finalizer to", claim, "PUT", "", claim)
        return out if out is not None else await super().update(claim)

    async def update_status(self, claim: Raw) -> Raw:
        out = await self._through_writer("add allocation and reservation to", claim, "PUT", "/status", claim)
        return out if out is not None else await super().update_status(claim)

    async def unreserve(self, claim: Raw, pod_uid: str) -> None:
        patch = _unreserve_patch(claim, pod_uid)
        smp = "application/strategic-merge-patch+json"
        if await self._through_writer("unreserve", claim, "PATCH", "/status", patch, smp) is None:
            await super().unreserve(claim, pod_uid)

    async def deallocate(self, claim: Raw) -> None:
        body = {**claim, "status": _deallocated_status(claim)}
        if await self._through_writer("deallocate", claim, "PUT", "/status", body) is None:
            await super().deallocate(claim)

    async def create(self, claim: Raw) -> Raw:
        m = claim.get("metadata") or {}
        what = "create claim for extended resources"
        path = CLAIMS_PATH.format(namespace=m.get("namespace", ""))
        out = await self._through_writer(what, claim, "POST", "", claim, path=path)
        return out if out is not None else await super().create(claim)

    async def _delete_call(self, claim: Raw) -> None:
        if await self._through_writer("delete", claim, "DELETE", "", None) is None:
            await super()._delete_call(claim)

    async def pod_extended_status(self, pod: Raw, claim: Raw, mappings: Sequence[Any]) -> None:
        m = pod.get("metadata") or {}
        path = POD_STATUS_PATH.format(namespace=m.get("namespace", ""), name=m.get("name", ""))
        patch = _extended_status_patch(claim, mappings)
        smp = "application/strategic-merge-patch+json"
        what = "update pod ExtendedResourceClaimStatus of"
        if await self._through_writer(what, claim, "PATCH", "", patch, smp, path=path) is None:
            await super().pod_extended_status(pod, claim, mappings)


def _unreserve_patch(claim: Raw, pod_uid: str) -> dict[str, Any]:
    """The pod out of ``status.reservedFor`` (strategic merge), on the claim's uid."""
    uid = (claim.get("metadata") or {}).get("uid")
    return {"metadata": {"uid": uid}, "status": {"reservedFor": [{"$patch": "delete", "uid": pod_uid}]}}


def _extended_status_patch(claim: Raw, mappings: Sequence[Any]) -> dict[str, Any]:
    """The pod's ``status.extendedResourceClaimStatus`` (kube's ``patchPodExtendedResourceClaimStatus``)."""
    name = (claim.get("metadata") or {}).get("name", "")
    return {"status": {"extendedResourceClaimStatus": {"requestMappings": list(mappings), "resourceClaimName": name}}}


def _deallocated_status(claim: Raw) -> dict[str, Any]:
    return {k: v for k, v in (claim.get("status") or {}).items() if k not in ("reservedFor", "allocation", "devices")}
