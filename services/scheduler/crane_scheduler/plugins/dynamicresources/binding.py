"""DynamicResources' binding cycle against the API (resource.k8s.io/v1 ResourceClaims): kube's ``bindClaim`` as a
function over a ``ClaimWriter`` (so it is tested without a server), and its adapters: ``ApiClaims`` on the
scheduler's API client, and ``LazyApiClaims``, the plugin's, whose writes go through the API writer process (the
binds' connections and leadership term, ``protocol.OBJECT``) once the service has one, so the scheduling process
only decides (its reads, the claim re-read after a conflict, stay on the client)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
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
) -> Raw:
    """kube's ``bindClaim``: finalizer by Update, then allocation and the pod's reservation by UpdateStatus, the
    whole retried on conflict (re-reading the claim); the written claim is assumed in ``tracker``."""
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
                written = await _write_claim(writer, current, allocation, meta)
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


async def _write_claim(writer: ClaimWriter, claim: Raw, allocation: dict[str, Any] | None, pod_meta: Raw) -> Raw:
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


CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


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
        self, what: str, claim: Raw, method: str, suffix: str, body: Any, content_type: str = "application/json"
    ) -> Raw | None:
        """The write through the API writer process, or None when there is none (the caller uses the client)."""
        writer = self.handle.writer
        if writer is None:
            return None
        if not self.may_write():
            raise ClaimError(f"{what} claim {claim_ref(claim)}: the leadership term ended")
        m = claim.get("metadata") or {}
        path = CLAIM_PATH.format(namespace=m.get("namespace", ""), name=m.get("name", "")) + suffix
        reply = await writer.write_object(method, path, body, writer.term, content_type)
        if reply.status == 409:
            raise Conflict(f"{what} claim {claim_ref(claim)}: conflict")
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


def _unreserve_patch(claim: Raw, pod_uid: str) -> dict[str, Any]:
    """The pod out of ``status.reservedFor`` (strategic merge), on the claim's uid."""
    uid = (claim.get("metadata") or {}).get("uid")
    return {"metadata": {"uid": uid}, "status": {"reservedFor": [{"$patch": "delete", "uid": pod_uid}]}}


def _deallocated_status(claim: Raw) -> dict[str, Any]:
    return {k: v for k, v in (claim.get("status") or {}).items() if k not in ("reservedFor", "allocation", "devices")}
