"""Lease-based leader election (coordination.k8s.io/v1), usable by any service, as kube-scheduler does it.

Our own implementation rather than kubernetes-asyncio's, whose module writes naive local time with a ``Z`` and so
breaks whenever a candidate's TZ is not UTC. Like client-go, expiry is judged by when *this* candidate last saw
the record change (a monotonic clock), never by comparing the holder's timestamps with our wall clock, so clock
skew between candidates cannot elect two leaders. Timestamps written into the Lease are real UTC MicroTime.

What client-go's ``leaderelection`` package and kube-scheduler add, and this module copies:

- lease traffic on its own API client (``make_lease_client``): its own connection pool and rate limiter, so a
  burst of binds or patches queued on the service's limiter cannot delay a renewal, and a request timeout of
  ``renew_deadline / 2`` (at least 1 s) as ``resourcelock.NewFromKubeconfig`` sets;
- the renew deadline enforced *while* a renewal is in flight: every attempt runs under an asyncio timeout that
  ends at ``last successful renewal + renew_deadline`` (monotonic clock), so a blackholed connection costs the
  lease at the deadline, before a standby can take over after ``lease_duration``;
- a clear signal when leadership ends: each stretch of leadership is a ``Term`` whose ``lost`` event is set, and
  ``on_change(False)`` is called, *before* the lead task is cancelled, so writers stop at once;
- errors of any kind (disconnects, timeouts, 5xx, bad JSON, a malformed Lease) only fail the attempt: they are
  retried every ``retry_period``, logged once per streak, never fatal.

Every attempt is counted in ``crane_leader_election_attempts_total{result}`` (acquired, renewed, held_by_other,
conflict, failed) on the service's registry: a standby's ``held_by_other`` rising says it reaches the API server
and sees the leader's Lease; ``failed`` rising, that it does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry

from crane_shared.events import micro_time
from crane_shared.kube import ApiCallError, KubeSettings, api_failure, make_api_client, raw_json
from crane_shared.logs import get_logger
from crane_shared.metrics import MetricSet
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

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retryPeriod < renewDeadline < leaseDuration, got "
                f"retryPeriod={self.retry_period}, renewDeadline={self.renew_deadline}, "
                f"leaseDuration={self.lease_duration}"
            )

    @property
    def request_timeout(self) -> float:
        """Timeout of one lease request, as client-go's ``NewFromKubeconfig``: half the renew deadline, >= 1 s."""
        return max(1.0, self.renew_deadline / 2)


async def make_lease_client(settings: KubeSettings, lease: LeaseConfig) -> client.ApiClient:
    """The API client for lease traffic only: its own connection pool and rate limiter (same QPS/burst as the
    service's, as kube-scheduler's leader-election client), every request bounded by ``lease.request_timeout``."""
    return await make_api_client(settings, request_timeout=lease.request_timeout)


class LeaseMetrics(MetricSet):
    prefix = "crane_leader_election_"

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.attempts = self.counter(
            "attempts_total",
            "Lease acquire/renew attempts by result (acquired, renewed, held_by_other, conflict, failed).",
            ["result"],
        )


_term_numbers = itertools.count(1)


@dataclass
class Term:
    """One stretch of leadership. ``lost`` is set the moment it ends (lease lost, shutdown): a writer that took
    the term when it started checks ``held`` before every write, so a write queued before the loss never leaves
    after it, even if this process becomes leader again later (that is a new term)."""

    number: int = field(default_factory=lambda: next(_term_numbers))
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    deadline: float = math.inf
    """``time.monotonic()`` instant by which the term ends unless the lease is renewed (the last successful renewal
    attempt's start + the renew deadline): a writer in another process of this host, which cannot see ``lost``,
    refuses a write after it (CLOCK_MONOTONIC is one clock for the host)."""
    clock: Callable[[], float] = time.monotonic
    """the clock ``deadline`` is on (the elector's)"""

    @property
    def held(self) -> bool:
        """Not ended, and its deadline not passed: a loop blocked past the deadline (a long synchronous round)
        sees the term gone at once, before the elector's task could run and end it, and a standby can take the
        lease only after the deadline (it waits for the lease duration, longer than the renew deadline)."""
        return not self.lost.is_set() and self.clock() < self.deadline


class LeaderElector:
    """Contend for a Lease; run ``lead`` while holding it, end the term as soon as the lease may be lost.

    ``api`` should come from ``make_lease_client`` (its own limiter and request timeout); the renew deadline is
    enforced here regardless of the client's timeout."""

    def __init__(
        self,
        api: client.ApiClient,
        config: LeaseConfig,
        clock: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
    ):
        self._api = client.CoordinationV1Api(api)
        self._metrics = LeaseMetrics(registry or CollectorRegistry())
        self.config = config
        self._clock = clock
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._observed_duration = config.lease_duration
        self._failing = False  # inside a streak of failed attempts (logged once)
        self.term: Term | None = None  # the current term while leading, else None
        self.on_change: Callable[[bool], None] = lambda leading: None
        self.on_renew: Callable[[Term], None] = lambda term: None
        """called with the term each time a renewal moves its deadline (a writer in another process is told)"""
        self._call = "get"  # the lease call in flight (get, create, update), named when it fails

    @property
    def is_leader(self) -> bool:
        return self.term is not None and self.term.held

    async def _read(self) -> dict[str, Any] | None:
        self._call = "get"
        try:
            lease: dict[str, Any] = await raw_json(
                self._api.read_namespaced_lease(self.config.name, self.config.namespace, _preload_content=False)
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        if not isinstance(lease, dict) or not isinstance(lease.get("spec", {}), dict):
            raise ValueError(f"lease {self.config.namespace}/{self.config.name}: not a Lease object")
        return lease

    def _body(self, lease: dict[str, Any] | None, *, release: bool = False) -> dict[str, Any]:
        now = micro_time(time.time())
        spec = dict((lease or {}).get("spec") or {})
        transitions = int(spec.get("leaseTransitions") or 0)
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

    async def _try_acquire_or_renew(self) -> bool:
        """One attempt, no error handling: True when we hold the lease afterwards."""
        lease = await self._read()
        if lease is None:
            self._call = "create"
            await raw_json(
                self._api.create_namespaced_lease(self.config.namespace, self._body(None), _preload_content=False)
            )
            self._observe(self.config.identity, "created", self.config.lease_duration)
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        self._observe(holder, str(spec.get("renewTime")), float(spec.get("leaseDurationSeconds") or 0))
        if holder and holder != self.config.identity and not self._expired():
            return False
        self._call = "update"
        await raw_json(
            self._api.replace_namespaced_lease(
                self.config.name, self.config.namespace, self._body(lease), _preload_content=False
            )
        )
        self._observe(self.config.identity, "renewed", self.config.lease_duration)
        return True

    async def try_acquire_or_renew(self, timeout: float | None = None) -> bool:
        """One attempt bounded by ``timeout`` (default: the lease request timeout); True when we hold the lease
        afterwards. Every failure (conflict, 5xx, disconnect, timeout, bad JSON, malformed Lease) is False."""
        budget = self.config.request_timeout if timeout is None else timeout
        was_leader = self.is_leader
        try:
            async with asyncio.timeout(max(0.0, budget)):
                held = await self._try_acquire_or_renew()
        except ApiException as err:
            if err.status != 409:  # 409: someone else wrote first, the normal race
                self._failed(err)
            self._metrics.attempts.labels("conflict" if err.status == 409 else "failed").inc()
            return False
        except TimeoutError:
            self._failed(ApiCallError(self._call, self._object, None, f"no answer within {budget:.1f}s"))
            self._metrics.attempts.labels("failed").inc()
            return False
        except Exception as err:  # disconnects, bad JSON, malformed Lease: retried, never fatal
            self._failed(err)
            self._metrics.attempts.labels("failed").inc()
            return False
        if self._failing:
            self._failing = False
            log.info("lease requests succeed again", lease=self.config.name)
        self._metrics.attempts.labels(("renewed" if was_leader else "acquired") if held else "held_by_other").inc()
        return held

    @property
    def _object(self) -> str:
        return f"lease {self.config.namespace}/{self.config.name}"

    def _failed(self, err: BaseException) -> None:
        """Log a failed lease call (the first of a run of failures as a warning) naming the call and its status."""
        fields = api_failure(self._call, self._object, err)
        if not self._failing:
            self._failing = True
            log.warning("lease request failed; retrying", lease=self.config.name, **fields)
        else:
            log.debug("lease request failed", lease=self.config.name, **fields)

    def _observe(self, holder: str, renew: str, duration: float) -> None:
        if (holder, renew) != self._observed:
            self._observed = (holder, renew)
            self._observed_at = self._clock()
            self._observed_duration = duration

    def _expired(self) -> bool:
        return self._clock() > self._observed_at + self._observed_duration

    def _held_by_other(self) -> bool:
        return self._observed is not None and self._observed[0] not in ("", self.config.identity)

    def _begin_term(self, renewed_at: float) -> Term:
        self.term = Term(deadline=renewed_at + self.config.renew_deadline, clock=self._clock)
        log.info("leadership acquired", lease=self.config.name, identity=self.config.identity, term=self.term.number)
        self.on_change(True)
        return self.term

    def _end_term(self, reason: str) -> None:
        term, self.term = self.term, None
        if term is None or term.lost.is_set():
            return
        term.lost.set()
        log.info("leadership ended", lease=self.config.name, identity=self.config.identity, reason=reason)
        self.on_change(False)

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]], stopping: asyncio.Event) -> None:
        """Until ``stopping``: acquire, run ``lead`` while renewing, end the term and cancel ``lead`` when the
        renewal misses its deadline or another holder shows up, then wait for ``lead`` to finish and contend
        again from a clean standby."""
        try:
            while not stopping.is_set():
                attempt_started = self._clock()  # the deadline counts from here: the write happened later
                if not await self.try_acquire_or_renew():
                    await sleep_unless(stopping, self.config.retry_period)
                    continue
                self._begin_term(attempt_started)
                task = asyncio.create_task(lead())
                reason = "lead returned"
                try:
                    reason = await self._renew_until_lost(task, stopping, attempt_started)
                finally:
                    self._end_term(reason)
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
        finally:
            self._end_term("stopping")
        await self.release()

    async def _renew_until_lost(self, task: asyncio.Task[None], stopping: asyncio.Event, renewed_at: float) -> str:
        """Renew every ``retry_period``; return why the term ends. Each attempt may only run until the deadline
        ``renewed_at + renew_deadline`` (``renewed_at``: start of the last successful attempt)."""
        while True:
            await sleep_unless(stopping, self.config.retry_period, until=task)
            if stopping.is_set():
                return "stopping"
            if task.done():
                return "lead returned"
            while True:
                remaining = renewed_at + self.config.renew_deadline - self._clock()
                if remaining <= 0:
                    log.warning("leadership lost: renew deadline passed", lease=self.config.name)
                    return "renew deadline passed"
                started = self._clock()
                if await self.try_acquire_or_renew(min(remaining, self.config.request_timeout)):
                    renewed_at = started
                    if self.term is not None:
                        self.term.deadline = renewed_at + self.config.renew_deadline
                        self.on_renew(self.term)
                    break
                if self._held_by_other():
                    log.warning("leadership lost: lease held by another", lease=self.config.name)
                    return "lease held by another"
                remaining = renewed_at + self.config.renew_deadline - self._clock()
                await sleep_unless(stopping, min(self.config.retry_period, remaining), until=task)
                if stopping.is_set():
                    return "stopping"
                if task.done():
                    return "lead returned"

    async def release(self) -> None:
        """Give the lease up on shutdown so a standby takes over at once instead of after the lease duration."""
        try:
            async with asyncio.timeout(self.config.request_timeout):
                lease = await self._read()
                if lease and (lease.get("spec") or {}).get("holderIdentity") == self.config.identity:
                    self._call = "update"
                    await raw_json(
                        self._api.replace_namespaced_lease(
                            self.config.name,
                            self.config.namespace,
                            self._body(lease, release=True),
                            _preload_content=False,
                        )
                    )
        except Exception as err:  # a standby takes over once the lease expires instead
            log.warning(
                "could not release the lease", lease=self.config.name, **api_failure(self._call, self._object, err)
            )
