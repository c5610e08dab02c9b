"""Leader election against a real HTTP server on loopback that serves the Lease API and can misbehave.

The server keeps one Lease store; each ``Front`` is a separate listening socket onto it, so one candidate's
connection can be blackholed (accepted, never answered) while another's works, as a network partition would.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from crane_shared.kube import KubeSettings, api_client_from_dict, make_api_client
from crane_shared.leader import LeaderElector, LeaseConfig, Term, make_lease_client
from tests.support.waiting import eventually

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"


@dataclass
class Store:
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    writes: list[tuple[float, str]] = field(default_factory=list)  # (monotonic time, holder) of each write

    def put(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        body = dict(body)
        body["metadata"] = dict(body["metadata"], resourceVersion=str(next(self.versions)))
        self.leases[name] = body
        self.writes.append((time.monotonic(), body["spec"]["holderIdentity"]))
        return body


@dataclass
class Front:
    """One listening socket onto the store, with a fault mode: ok, blackhole, 500, badjson, disconnect, malformed."""

    store: Store
    mode: str = "ok"
    server: TestServer | None = None
    hung: int = 0  # requests accepted and never answered
    requests: int = 0  # lease requests received (any mode)
    lists: int = 0  # lists received (a service's traffic in the rate-limit test)

    async def _fault(self, request: web.Request) -> web.StreamResponse | None:
        self.requests += 1
        if self.mode == "blackhole":
            self.hung += 1
            await asyncio.Event().wait()
        if self.mode == "500":
            return web.json_response({"kind": "Status", "code": 500}, status=500)
        if self.mode == "badjson":
            return web.Response(body=b"{not json", content_type="application/json")
        if self.mode == "malformed":
            return web.json_response({"kind": "Lease", "metadata": {"resourceVersion": "1"}, "spec": "x"})
        if self.mode == "disconnect":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        return None

    async def read(self, request: web.Request) -> web.StreamResponse:
        if (fault := await self._fault(request)) is not None:
            return fault
        lease = self.store.leases.get(request.match_info["name"])
        if lease is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        return web.json_response(lease)

    async def create(self, request: web.Request) -> web.StreamResponse:
        if (fault := await self._fault(request)) is not None:
            return fault
        body = await request.json()
        if body["metadata"]["name"] in self.store.leases:
            return web.json_response({"kind": "Status", "code": 409}, status=409)
        return web.json_response(self.store.put(body["metadata"]["name"], body), status=201)

    async def replace(self, request: web.Request) -> web.StreamResponse:
        if (fault := await self._fault(request)) is not None:
            return fault
        body = await request.json()
        name = request.match_info["name"]
        current = self.store.leases.get(name)
        if current is None or current["metadata"]["resourceVersion"] != body["metadata"].get("resourceVersion"):
            return web.json_response({"kind": "Status", "code": 409}, status=409)
        return web.json_response(self.store.put(name, body))

    async def list(self, request: web.Request) -> web.StreamResponse:
        self.lists += 1
        return web.json_response({"kind": "LeaseList", "metadata": {}, "items": []})

    async def start(self) -> client.ApiClient:
        app = web.Application()
        base = LEASES.format(ns="{ns}")
        app.router.add_get(base, self.list)
        app.router.add_get(base + "/{name}", self.read)
        app.router.add_post(base, self.create)
        app.router.add_put(base + "/{name}", self.replace)
        self.server = TestServer(app, host="127.0.0.1")
        await self.server.start_server()
        url = str(self.server.make_url(""))
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        return await api_client_from_dict(kubeconfig)


CONFIG = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.25}


@dataclass
class Candidate:
    front: Front
    api: client.ApiClient
    elector: LeaderElector
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    timeline: list[tuple[float, str]] = field(default_factory=list)
    terms: list[Term] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    async def lead(self) -> None:
        assert self.elector.term is not None
        self.terms.append(self.elector.term)
        self.timeline.append((time.monotonic(), "lead started"))
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.timeline.append((time.monotonic(), "lead cancelled"))
            raise

    def start(self) -> None:
        self.elector.on_change = lambda leading: self.timeline.append((time.monotonic(), f"leading={leading}"))
        self.task = asyncio.create_task(self.elector.run(self.lead, self.stopping))

    async def leading(self) -> Term:
        while not self.terms or not self.terms[-1].held:
            assert self.task is not None and not self.task.done(), "the elector stopped"
            await asyncio.sleep(0.02)
        return self.terms[-1]

    async def stop(self) -> None:
        self.stopping.set()
        self.front.mode = "ok"
        if self.task is not None:
            await asyncio.wait_for(self.task, 10)
        await self.api.close()
        assert self.front.server is not None
        await self.front.server.close()


@pytest.fixture
async def store() -> Store:
    return Store()


@pytest.fixture
async def candidates(store: Store) -> AsyncIterator[list[Candidate]]:
    made: list[Candidate] = []
    yield made
    for c in made:
        await c.stop()


async def _make(
    store: Store,
    made: list[Candidate],
    identity: str,
    config: dict[str, float] | None = None,
    registry: CollectorRegistry | None = None,
) -> Candidate:
    front = Front(store)
    api = await front.start()
    lease = LeaseConfig("default", "lease", identity, **(config or CONFIG))
    c = Candidate(front, api, LeaderElector(api, lease, registry=registry))
    made.append(c)
    c.start()
    return c


async def _leader_and_standby(
    store: Store, made: list[Candidate], config: dict[str, float] | None = None
) -> tuple[Candidate, Term, Candidate]:
    """``a`` leading (with its term), then ``b`` started as its standby."""
    a = await _make(store, made, "a", config)
    a_term = await a.leading()
    return a, a_term, await _make(store, made, "b", config)


async def test_every_attempt_is_counted_by_result(store: Store, candidates: list[Candidate]) -> None:
    registries = {"a": CollectorRegistry(), "b": CollectorRegistry()}

    def attempts(who: str, result: str) -> float:
        return registries[who].get_sample_value("crane_leader_election_attempts_total", {"result": result}) or 0.0

    a = await _make(store, candidates, "a", registry=registries["a"])
    await a.leading()
    b = await _make(store, candidates, "b", registry=registries["b"])
    await eventually(lambda: attempts("b", "held_by_other") >= 2, 30, "the standby sees the leader's lease")
    await eventually(lambda: attempts("a", "renewed") >= 2, 30, "the leader renews")
    assert attempts("a", "acquired") == 1 and attempts("b", "acquired") == 0
    b.front.mode = "500"
    await eventually(lambda: attempts("b", "failed") >= 1, 30, "the standby's failed attempt counted")


async def test_each_renewal_that_moves_the_deadline_is_told_with_its_term(
    store: Store, candidates: list[Candidate]
) -> None:
    a = await _make(store, candidates, "a")
    renewed: list[tuple[int, float]] = []
    a.elector.on_renew = lambda term: renewed.append((term.number, term.deadline))
    term = await a.leading()
    await eventually(lambda: len(renewed) >= 3, 30, "three renewals told")
    assert {number for number, _ in renewed} == {term.number}
    deadlines = [deadline for _, deadline in renewed]
    assert deadlines == sorted(deadlines) and deadlines[-1] == term.deadline


LONG_LEASE = {"lease_duration": 30.0, "renew_deadline": 2.0, "retry_period": 0.25}
"""a lease that outlives its renew deadline by far: on a loaded machine (timers late by seconds) what happens
before the lease expires is still told apart from what happens after"""


async def test_blackholed_renewal_ends_the_term_before_the_lease_can_expire(
    store: Store, candidates: list[Candidate]
) -> None:
    leader = await _make(store, candidates, "a", LONG_LEASE)
    term = await leader.leading()
    await eventually(lambda: len(store.writes) >= 3, 30, "a few renewals")
    leader.front.mode = "blackhole"
    cut = time.monotonic()
    await asyncio.wait_for(term.lost.wait(), timeout=30)  # a bound for a failure only: when is checked below
    lost_at = time.monotonic()
    last_write = max(t for t, holder in store.writes if holder == "a")

    assert leader.front.hung >= 1, "no renewal was in flight when the term ended"
    # The deadline writers obey (the writer process refuses past it): the renew deadline after the start of the
    # last renewal, so before its write landed; on the clock the test shares, whatever the load
    assert term.deadline <= last_write + LONG_LEASE["renew_deadline"]
    # Judged from the last write the standby can have seen: loss declared before the lease could expire there,
    # half way from the renew deadline (2 s) to the lease's expiry (30 s): 14 s for timers late on a loaded machine
    assert lost_at - last_write < (LONG_LEASE["renew_deadline"] + LONG_LEASE["lease_duration"]) / 2
    # Writers are told first: the signal precedes the lead task's cancellation.
    events = [what for t, what in leader.timeline if t >= cut]
    assert events[:2] == ["leading=False", "lead cancelled"]
    assert not leader.elector.is_leader


async def test_standby_takes_over_only_after_the_partitioned_leader_stopped(
    store: Store, candidates: list[Candidate]
) -> None:
    a, a_term, b = await _leader_and_standby(store, candidates)
    await asyncio.sleep(4 * CONFIG["retry_period"])
    assert not b.terms, "the standby led while the leader renewed"

    a.front.mode = "blackhole"
    b_term = await asyncio.wait_for(b.leading(), timeout=CONFIG["lease_duration"] + 3)
    a_lost = next(t for t, what in a.timeline if what == "leading=False")
    b_won = next(t for t, what in b.timeline if what == "leading=True")
    assert not a_term.held and b_term.held
    assert a_lost < b_won, "two leaders at once"
    assert store.leases["lease"]["spec"]["holderIdentity"] == "b"
    assert store.leases["lease"]["spec"]["leaseTransitions"] == 1

    # The partition heals: the old leader sees the new holder and stays a clean standby.
    a.front.mode = "ok"
    await asyncio.sleep(4 * CONFIG["retry_period"])
    assert len(a.terms) == 1 and not a.elector.is_leader
    assert b_term.held


@pytest.mark.parametrize("mode", ["500", "badjson", "disconnect", "malformed", "blackhole"])
async def test_any_error_while_acquiring_is_retried_never_fatal(
    store: Store, candidates: list[Candidate], mode: str
) -> None:
    c = await _make(store, candidates, "a")
    c.front.mode = mode
    # several attempts fail (the blackhole: each bounded by the request timeout), and it tries again
    await eventually(lambda: c.front.requests >= 3, 30, "a third attempt")
    assert c.task is not None and not c.task.done(), "the elector died on an error"
    assert not c.terms
    c.front.mode = "ok"
    await asyncio.wait_for(c.leading(), timeout=30)  # a bound for a failure only


@pytest.mark.parametrize("mode", ["500", "badjson", "disconnect"])
async def test_errors_while_leading_end_the_term_at_the_deadline_then_it_is_won_back(
    store: Store, candidates: list[Candidate], mode: str
) -> None:
    c = await _make(store, candidates, "a")
    first = await c.leading()
    c.front.mode = mode
    await asyncio.wait_for(first.lost.wait(), timeout=30)  # a bound for a failure only (when: the blackhole test)
    c.front.mode = "ok"
    second = await asyncio.wait_for(c.leading(), timeout=30)
    assert second is not first and second.number > first.number and not first.held


async def test_shutdown_releases_the_lease_so_a_standby_takes_over_at_once(
    store: Store, candidates: list[Candidate]
) -> None:
    a, a_term, b = await _leader_and_standby(store, candidates, LONG_LEASE)
    a.stopping.set()
    assert a.task is not None
    await asyncio.wait_for(a.task, 30)
    assert not a_term.held
    assert store.leases["lease"]["spec"]["holderIdentity"] == ""
    released = max(t for t, _ in store.writes)
    await asyncio.wait_for(b.leading(), timeout=LONG_LEASE["lease_duration"])
    took_over = next(t for t, holder in store.writes if holder == "b")
    # at b's next retry, not once the old lease expired (30 s after a's last renewal): 15 s left for the load
    assert took_over - released < LONG_LEASE["lease_duration"] / 2


def test_lease_config_refuses_timings_that_allow_two_leaders() -> None:
    with pytest.raises(ValueError, match="renewDeadline"):
        LeaseConfig("ns", "n", "me", lease_duration=10, renew_deadline=10, retry_period=2)
    assert LeaseConfig("ns", "n", "me").request_timeout == 5.0
    assert LeaseConfig("ns", "n", "me", lease_duration=3, renew_deadline=1.5, retry_period=0.5).request_timeout == 1.0


async def test_request_without_timeout_gets_the_default_one() -> None:
    hung = asyncio.Event()

    async def hang(request: web.Request) -> web.StreamResponse:
        hung.set()
        await asyncio.Event().wait()
        raise AssertionError

    async def watch(request: web.Request) -> web.StreamResponse:
        # Streams its one event after longer than the default timeout, within the watch's own timeoutSeconds.
        assert request.query["watch"].lower() == "true" and request.query["timeoutSeconds"] == "2"
        resp = web.StreamResponse()
        await resp.prepare(request)
        await asyncio.sleep(1.0)
        obj = {"kind": "Lease", "metadata": {"name": "x", "resourceVersion": "1"}}
        await resp.write(json.dumps({"type": "ADDED", "object": obj}).encode() + b"\n")
        return resp

    app = web.Application()
    app.router.add_get(LEASES.format(ns="default") + "/x", hang)
    app.router.add_get(LEASES.format(ns="default"), watch)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    kubeconfig = {
        "clusters": [{"name": "c", "cluster": {"server": str(server.make_url(""))}}],
        "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    api = await api_client_from_dict(kubeconfig, request_timeout=0.5)
    try:
        leases = client.CoordinationV1Api(api)
        async with asyncio.timeout(30) as guard:  # without a default timeout the read would hang until this
            with pytest.raises(TimeoutError):
                await leases.read_namespaced_lease("x", "default")
        assert hung.is_set() and not guard.expired()

        resp = await leases.list_namespaced_lease("default", watch=True, timeout_seconds=2, _preload_content=False)
        line = await resp.content.readline()
        assert json.loads(line)["type"] == "ADDED"
    finally:
        await api.close()
        await server.close()


async def test_the_lease_client_has_its_own_rate_limit_and_the_lease_timeout(store: Store, tmp_path: Path) -> None:
    """A service client whose limiter is saturated (binds queued) does not delay lease traffic."""
    front = Front(store)
    admin = await front.start()
    await admin.close()
    assert front.server is not None
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "clusters": [{"name": "c", "cluster": {"server": str(front.server.make_url(""))}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    # each client's limiter: three tokens (the lease's read, create and blackholed read), then one per 100 s; the
    # service's default request timeout 30 s
    settings = KubeSettings(kubeconfig=str(kubeconfig), qps=0.01, burst=3)
    lease = LeaseConfig("default", "lease", "me", lease_duration=4, renew_deadline=3, retry_period=0.5)
    service, lease_api = await make_api_client(settings), await make_lease_client(settings, lease)
    try:
        busy = client.CoordinationV1Api(service)
        queued = [asyncio.create_task(busy.list_namespaced_lease("default")) for _ in range(5)]
        await eventually(lambda: front.lists == 3, 30, "the service's tokens spent")  # the others wait 100 s
        elector = LeaderElector(lease_api, lease)
        started = time.monotonic()
        assert await elector.try_acquire_or_renew()
        # behind the service's queue it would wait 100 s for a token: 50 s of that left for a loaded machine
        assert time.monotonic() - started < 50, "lease traffic waited behind the service's queue"
        assert not all(t.done() for t in queued)
        for t in queued:
            t.cancel()

        front.mode = "blackhole"
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await client.CoordinationV1Api(lease_api).read_namespaced_lease("lease", "default")
        # the lease's timeout (1.5 s), not the service's (30 s): 13 s of margin for a loaded machine
        assert lease.request_timeout - 0.1 <= time.monotonic() - started < settings.request_timeout / 2
    finally:
        front.mode = "ok"
        await service.close()
        await lease_api.close()
        await front.server.close()


async def test_a_failed_lease_call_is_logged_with_its_verb_object_and_status(
    store: Store, candidates: list[Candidate]
) -> None:
    with capture_logs() as logs:
        c = await _make(store, candidates, "a")
        c.front.mode = "500"
        await eventually(lambda: c.front.requests >= 2, 30, "a failed attempt")
    failed = [e for e in logs if e["event"] == "lease request failed; retrying"]
    assert [(e["verb"], e["object"], e["status"]) for e in failed][:1] == [("get", "lease default/lease", 500)]


async def test_a_loop_blocked_past_the_renew_deadline_sees_its_term_gone_before_the_elector_can_run(
    store: Store, candidates: list[Candidate]
) -> None:
    """A long synchronous round (a descheduler's plan, an annotator's evaluation) keeps the elector's task from
    running: its first write after it must not go out on a term whose deadline passed (a standby may lead by
    then); the elector then ends the term as usual and wins the lease back."""
    c = await _make(store, candidates, "a", LONG_LEASE)
    term = await c.leading()
    assert term.held and term.deadline < float("inf")
    _busy_until(term.deadline + 0.05)  # a synchronous round: no renewal can run meanwhile
    assert not term.held and not term.lost.is_set()  # seen at once, before the elector's task ran
    await asyncio.wait_for(term.lost.wait(), 30)  # then the elector ends it (lost set, leading=False told)
    assert any(what == "leading=False" for _, what in c.timeline)
    again = await asyncio.wait_for(c.leading(), 30)
    assert again is not term and again.held


def _busy_until(instant: float) -> None:
    """Compute until ``instant`` (monotonic), as a long synchronous round does, without yielding to the loop."""
    while time.monotonic() < instant:
        pass
