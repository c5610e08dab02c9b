"""Lease-based leader election (coordination.k8s.io/v1), usable by any service.

Our own implementation rather than kubernetes-asyncio's, whose module writes naive local time with a ``Z`` and so
breaks whenever a candidate's TZ is not UTC. Like client-go, expiry is judged by when *this* candidate last saw
the record change (a monotonic clock), never by comparing the holder's timestamps with our wall clock, so clock
skew between candidates cannot elect two leaders. Timestamps written into the Lease are real UTC MicroTime.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_shared.events import micro_time
from crane_shared.kube import raw_json
from crane_shared.logs import get_logger
from crane_shared.retry import sleep_unless

log = get_logger("crane.leader")


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class LeaderElector:
    """Contend for a Lease; run ``lead`` while holding it, cancel it as soon as the lease may be lost."""

    def __init__(self, api: client.ApiClient, config: LeaseConfig, clock: Callable[[], float] = time.monotonic):
        self._api = client.CoordinationV1Api(api)
        self.config = config
        self._clock = clock
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._observed_duration = config.lease_duration
        self.is_leader = False
        self.on_change: Callable[[bool], None] = lambda leading: None

    async def _read(self) -> dict[str, Any] | None:
        try:
            lease: dict[str, Any] = await raw_json(
                self._api.read_namespaced_lease(self.config.name, self.config.namespace, _preload_content=False)
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return lease

    def _body(self, lease: dict[str, Any] | None, *, release: bool = False) -> dict[str, Any]:
        now = micro_time(time.time())
        spec = dict((lease or {}).get("spec", {}))
        transitions = int(spec.get("leaseTransitions", 0))
        if spec.get("holderIdentity") != self.config.identity:
            transitions += 1 if lease else 0
            spec["acquireTime"] = now
        spec.update(
            holderIdentity="" if release else self.config.identity,
            leaseDurationSeconds=1 if release else max(1, round(self.config.lease_duration)),
            renewTime=now,
            leaseTransitions=transitions,
        )
        metadata: dict[str, Any] = {"name": self.config.name, "namespace": self.config.namespace}
        if lease:
            metadata["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when we hold the lease afterwards. Conflicts and API errors count as not holding."""
        try:
            lease = await self._read()
            if lease is None:
                await self._api.create_namespaced_lease(self.config.namespace, self._body(None))
                self._observe(self.config.identity, "created", self.config.lease_duration)
                return True
            spec = lease.get("spec", {})
            holder = spec.get("holderIdentity") or ""
            self._observe(holder, str(spec.get("renewTime")), float(spec.get("leaseDurationSeconds") or 0))
            if holder and holder != self.config.identity and not self._expired():
                return False
            await self._api.replace_namespaced_lease(self.config.name, self.config.namespace, self._body(lease))
            self._observe(self.config.identity, "renewed", self.config.lease_duration)
            return True
        except ApiException as err:
            if err.status not in (409, 404):
                log.warning("lease update failed", lease=self.config.name, status=err.status, reason=err.reason)
            return False
        except (TimeoutError, OSError) as err:
            log.warning("lease update failed", lease=self.config.name, error=str(err))
            return False

    def _observe(self, holder: str, renew: str, duration: float) -> None:
        if (holder, renew) != self._observed:
            self._observed = (holder, renew)
            self._observed_at = self._clock()
            self._observed_duration = duration

    def _expired(self) -> bool:
        return self._clock() > self._observed_at + self._observed_duration

    def _set_leader(self, leading: bool) -> None:
        if leading != self.is_leader:
            self.is_leader = leading
            log.info("leadership changed", lease=self.config.name, identity=self.config.identity, leading=leading)
            self.on_change(leading)

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]], stopping: asyncio.Event) -> None:
        """Until ``stopping``: acquire, run ``lead`` while renewing, cancel it when renewal misses its deadline."""
        while not stopping.is_set():
            if not await self.try_acquire_or_renew():
                await sleep_unless(stopping, self.config.retry_period)
                continue
            self._set_leader(True)
            task = asyncio.create_task(lead())
            try:
                await self._renew_until_lost(task, stopping)
            finally:
                self._set_leader(False)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self.release()

    async def _renew_until_lost(self, task: asyncio.Task[None], stopping: asyncio.Event) -> None:
        last_renew = self._clock()
        while not stopping.is_set() and not task.done():
            await sleep_unless(stopping, self.config.retry_period, until=task)
            if stopping.is_set() or task.done():
                return
            if await self.try_acquire_or_renew():
                last_renew = self._clock()
            elif self._clock() - last_renew > self.config.renew_deadline or (
                self._observed and self._observed[0] not in ("", self.config.identity)
            ):
                log.warning("leadership lost", lease=self.config.name, identity=self.config.identity)
                return

    async def release(self) -> None:
        """Give the lease up on shutdown so a standby takes over at once instead of after the lease duration."""
        with contextlib.suppress(Exception):
            lease = await self._read()
            if lease and lease.get("spec", {}).get("holderIdentity") == self.config.identity:
                await self._api.replace_namespaced_lease(
                    self.config.name, self.config.namespace, self._body(lease, release=True)
                )
