"""The API writer process: the scheduler's writes reach the API server from a child process, and never after
their leadership term ended or its deadline passed; a dead writer is restarted and its writes answer UNSENT."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from crane_sandbox.cluster import LocalCluster
from crane_scheduler.writer import ApiWriter, Connection, Reply, ScheduledReport
from crane_scheduler.writer.kubeproto import PROTOBUF
from crane_scheduler.writer.protocol import JSON, NOT_BOUND, REFUSED, STRATEGIC_MERGE_PATCH, SUPERSEDED, UNSENT
from crane_shared.events import scheduled_event_name
from crane_shared.leader import Term
from tests.support import kubeproto
from tests.support.fakeapi import kubeconfig_for
from tests.support.scheduler import api_writer
from tests.support.waiting import eventually


class _Api:
    """Records every request; answers ``status`` (or holds the request until ``release`` is set)."""

    def __init__(self, status: int = 201) -> None:
        self.seen: list[tuple[str, str, str, str, Any]] = []
        self.status = status
        self.arrived = asyncio.Event()
        self.release: asyncio.Event | None = None
        self.hold: str | tuple[str, ...] = ""  # only requests whose path ends so are held until ``release``
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self._handle)

    async def _handle(self, request: web.Request) -> web.Response:
        self.seen.append(
            (
                request.method,
                request.path,
                request.headers.get("Authorization", ""),
                request.headers.get("Content-Type", ""),
                kubeproto.binding(await request.read())
                if request.headers.get("Content-Type") == PROTOBUF
                else await request.json(),
            )
        )
        self.arrived.set()
        if self.release is not None and request.path.endswith(self.hold):
            await self.release.wait()
        return web.json_response({"kind": "Status", "code": self.status}, status=self.status)


async def test_a_bind_reaches_the_api_server_from_the_writer_process_with_the_token() -> None:
    fake, conflict = _Api(), _Api(status=409)
    async with TestServer(fake.app) as server, api_writer(str(server.make_url(""))) as writer:
        reply = await writer.bind("ns", "p", "uid-1", "n1")
    assert reply.ok and reply.status == 201
    assert fake.seen == [
        (
            "POST",
            "/api/v1/namespaces/ns/pods/p/binding",
            "Bearer fake",
            PROTOBUF,
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
            },
        )
    ]
    async with TestServer(conflict.app) as server, api_writer(str(server.make_url(""))) as writer:
        reply = await writer.write("POST", "/apis/events.k8s.io/v1/namespaces/ns/events", {"a": 1}, None)
    assert reply.status == 409 and not reply.ok and '"code": 409' in reply.text


async def test_a_write_object_answers_the_object_the_api_server_wrote_and_an_error_its_status() -> None:
    """``OBJECT`` (DynamicResources' claim writes): on the binds' lane, the reply's text is the response body on
    success too (the claim's next write needs its resourceVersion); an error is answered as any write's."""
    fake, conflict = _Api(status=200), _Api(status=409)
    path = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    async with TestServer(fake.app) as server, api_writer(str(server.make_url(""))) as writer:
        reply = await writer.write_object("PUT", path, {"status": {"reservedFor": []}}, None)
    assert reply.ok and json.loads(reply.text) == {"kind": "Status", "code": 200}
    assert fake.seen == [("PUT", path, "Bearer fake", JSON, {"status": {"reservedFor": []}})]
    async with TestServer(conflict.app) as server, api_writer(str(server.make_url(""))) as writer:
        refused = await writer.write_object("PUT", path, {}, None)
    assert refused.status == 409 and not refused.ok and json.loads(refused.text)["code"] == 409


async def test_an_eviction_is_the_condition_patch_then_the_delete_with_the_uid_precondition() -> None:
    """``EVICT`` as the writer process sends it (kube's ``PreemptPod``): the victim's status patched with the
    condition (strategic merge), then, once that is written, the delete with the UID precondition; a failed
    condition patch deletes nothing and its reply says which step failed."""
    condition = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "m"}
    fake, failing = _Api(status=200), _Api(status=500)
    async with TestServer(fake.app) as server, api_writer(str(server.make_url(""))) as writer:
        evicted = await writer.evict("ns", "low", "uid-1", condition)
    assert evicted.ok, evicted.describe()
    assert fake.seen == [
        (
            "PATCH",
            "/api/v1/namespaces/ns/pods/low/status",
            "Bearer fake",
            STRATEGIC_MERGE_PATCH,
            {"status": {"conditions": [condition]}},
        ),
        ("DELETE", "/api/v1/namespaces/ns/pods/low", "Bearer fake", JSON, {"preconditions": {"uid": "uid-1"}}),
    ]
    async with TestServer(failing.app) as server, api_writer(str(server.make_url(""))) as writer:
        refused = await writer.evict("ns", "low", "uid-1", condition)
    assert refused.status == 500 and refused.text.startswith("the DisruptionTarget condition: "), refused.describe()
    assert [(method, path) for method, path, *_ in failing.seen] == [("PATCH", "/api/v1/namespaces/ns/pods/low/status")]


async def test_the_writer_process_runs_as_sched_batch_so_its_wake_ups_do_not_preempt_decisions() -> None:
    async with TestServer(_Api().app) as server, api_writer(str(server.make_url(""))) as writer:
        assert await writer.wait_ready(30) and writer._proc is not None
        assert os.sched_getscheduler(writer._proc.pid) == os.SCHED_BATCH
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the scheduling loop's own process is left as it was


async def test_a_write_of_an_ended_term_or_past_its_deadline_is_refused_and_never_sent() -> None:
    fake = _Api()
    async with TestServer(fake.app) as server, api_writer(str(server.make_url(""))) as writer:
        # a term whose holder has not seen its deadline pass (its loop blocked): the process refuses by itself
        writer.term = late = Term(deadline=time.monotonic() - 0.001, clock=lambda: -math.inf)
        assert (await writer.bind("ns", "late", "u", "n1")).status == REFUSED
        writer.term = ended = Term()
        writer.end_term(ended)
        assert (await writer.bind("ns", "ended", "u", "n1")).status == REFUSED
        writer.term = current = Term(deadline=time.monotonic() + 60)
        assert (await writer.bind("ns", "current", "u", "n1")).ok
        assert late.held and current.held  # the writer judged by deadline and END_TERM alone
    assert [s[1] for s in fake.seen] == ["/api/v1/namespaces/ns/pods/current/binding"]


async def test_writes_that_reach_the_writer_with_their_terms_end_are_answered_refused() -> None:
    """Binds still buffered when the term ends go out in one pipe write with END_TERM, so the writer cancels
    them before they ever ran: each still gets its answer (a caller waiting forever would hold a preemptor or a
    reporter worker for good)."""
    fake = _Api()
    async with TestServer(fake.app) as server, api_writer(str(server.make_url(""))) as writer:
        writer.term = term = Term()
        pending = [asyncio.create_task(writer.bind("ns", f"p{i}", "u", "n1")) for i in range(5)]
        await asyncio.sleep(0)  # each is buffered for FLUSH_DELAY, not sent yet
        writer.end_term(term)  # flushes them together with END_TERM
        replies = await asyncio.wait_for(asyncio.gather(*pending), 10)
    assert [r.status for r in replies] == [REFUSED] * 5
    assert fake.seen == []


async def test_reported_binds_cancelled_before_they_ran_answer_their_reports_too() -> None:
    """As above with each bind's Scheduled event: the report's wait ends (not bound) with the bind's refusal, not
    at the writer's restart (each one held its pod until then)."""
    fake = _Api()
    heard: list[Reply] = []
    async with TestServer(fake.app) as server, api_writer(str(server.make_url(""))) as writer:
        writer.term = term = Term()
        report = ScheduledReport("crane-scheduler", "me", 0.0, heard.append)
        pending = [asyncio.create_task(writer.bind("ns", f"p{i}", "u", "n1", report)) for i in range(5)]
        await asyncio.sleep(0)  # each is buffered for FLUSH_DELAY, not sent yet
        writer.end_term(term)
        replies = await asyncio.wait_for(asyncio.gather(*pending), 10)
        await eventually(lambda: len(heard) == 5, 10, "every report answered")
        assert not writer._pending
    assert [r.status for r in replies] == [REFUSED] * 5
    assert [r.status for r in heard] == [REFUSED] * 5


async def test_a_writer_process_alive_but_silent_while_requests_wait_is_restarted() -> None:
    """A process that reads its requests and never answers (a credential plugin that hangs, a wait outside every
    request's timeout): its requests are answered UNSENT (retried as after a crash) and it is restarted, instead
    of every binding cycle waiting for ever."""
    restarts: list[int] = []
    writer = ApiWriter(
        Connection(kubeconfig_dict=kubeconfig_for("http://127.0.0.1:9")), on_restart=lambda: restarts.append(1)
    )
    writer._argv = [sys.executable, "-c", "import sys, time\nwhile True: sys.stdin.buffer.read(1) or time.sleep(1)"]
    writer.silence_limit = 1.0
    async with writer:
        reply = await asyncio.wait_for(writer.write("PATCH", "/api/v1/namespaces/ns/pods/p/status", {}, None), 30)
        assert reply.status == UNSENT and "exited" in reply.text
        await eventually(lambda: restarts, 30, "the writer restarted")


PROBE = "/api/v1/namespaces/ns/pods/probe/status"


async def _in_the_writer(writer: ApiWriter) -> None:
    """Returns once every write sent before has reached the writer process and started there: the process takes
    its messages in order and starts each one's task at once, so a status patch (the reports' lane: its own token
    bucket and connections) answered after them shows that the earlier ones are waiting there, for a token or a
    connection. An awaited event instead of a sleep: on a loaded machine a sleep could end before they arrive."""
    reply = await asyncio.wait_for(writer.write("PATCH", PROBE, {}, None), 30)
    assert reply.ok, reply.describe()


def _sent(fake: _Api) -> list[str]:
    return [path for _, path, *_ in fake.seen if path != PROBE]


async def test_ending_the_term_refuses_its_writes_waiting_for_a_rate_limit_token() -> None:
    fake = _Api()
    async with TestServer(fake.app) as server:
        # one token, then one per 100 s: the binds after the first wait for tokens for the whole test
        conn = Connection(kubeconfig_dict=kubeconfig_for(str(server.make_url(""))), qps=0.01, burst=1)
        async with ApiWriter(conn) as writer:
            writer.term = term = Term()
            first = await writer.bind("ns", "first", "u", "n1")  # takes the one token
            waiting = [asyncio.create_task(writer.bind("ns", f"w{i}", "u", "n1")) for i in range(3)]
            await _in_the_writer(writer)  # they wait for tokens there
            writer.end_term(term)
            # at once, not after their tokens (the first of which is 100 s away: a loaded machine has margin)
            replies = await asyncio.wait_for(asyncio.gather(*waiting), 60)
    assert first.ok
    # cancelled while waiting (had they waited for their tokens, the term's check after it would say so)
    assert [(r.status, r.text) for r in replies] == [(REFUSED, "cancelled")] * 3
    assert _sent(fake) == ["/api/v1/namespaces/ns/pods/first/binding"]


async def test_a_pod_status_patch_its_pods_bind_overtook_in_the_writer_is_refused_and_never_sent() -> None:
    """A failed attempt's PodScheduled=False patch waits for a token on the reports' lane while the pod's next
    attempt binds it on the binds' lane: sent after the bind, the patch would leave the bound pod
    PodScheduled=False. As kube's API dispatcher lets the binding overwrite the queued patch, it is refused; another
    pod's patch is not, and gets the token back."""
    fake = _Api()
    condition = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    async with TestServer(fake.app) as server:
        # each lane: one token, then one a second (the patches wait for theirs on the reports' lane)
        conn = Connection(kubeconfig_dict=kubeconfig_for(str(server.make_url(""))), qps=1, burst=1)
        async with ApiWriter(conn) as writer:
            writer.term = term = Term()
            events = "/apis/events.k8s.io/v1/namespaces/ns/events"
            assert (await writer.write("POST", events, {}, term)).ok  # takes the reports' token
            stale, other = (
                asyncio.create_task(writer.write("PATCH", f"/api/v1/namespaces/ns/pods/{pod}/status", condition, term,
                                                 STRATEGIC_MERGE_PATCH))
                for pod in ("p", "q")
            )  # fmt: skip
            await asyncio.sleep(0)  # both buffered: they reach the process before the bind below
            assert (await writer.bind("ns", "p", "u", "n1")).ok
            replies = await asyncio.wait_for(asyncio.gather(stale, other), 30)
    assert (replies[0].status, replies[0].text) == (REFUSED, SUPERSEDED)
    assert replies[1].ok
    assert _sent(fake) == [events, "/api/v1/namespaces/ns/pods/p/binding", "/api/v1/namespaces/ns/pods/q/status"]


async def test_a_bind_waits_for_its_pods_status_patch_already_on_the_wire() -> None:
    """One call of a pod at a time, as kube's API dispatcher: a status patch already sent is answered before the
    pod's bind goes (on the other lane it could land after the binding); another pod's bind does not wait."""
    fake = _Api()
    fake.release, fake.hold = asyncio.Event(), "/pods/p/status"
    condition = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    async with TestServer(fake.app) as server, api_writer(str(server.make_url(""))) as writer:
        writer.term = term = Term()
        patch = asyncio.create_task(
            writer.write("PATCH", "/api/v1/namespaces/ns/pods/p/status", condition, term, STRATEGIC_MERGE_PATCH)
        )
        await asyncio.wait_for(fake.arrived.wait(), 30)  # on the wire, held by the API server
        bind = asyncio.create_task(writer.bind("ns", "p", "u", "n1"))
        assert (await writer.bind("ns", "r", "u", "n1")).ok  # sent after p's bind, answered while p's waits
        assert _sent(fake) == ["/api/v1/namespaces/ns/pods/p/status", "/api/v1/namespaces/ns/pods/r/binding"]
        fake.release.set()
        assert (await patch).ok and (await bind).ok
    assert _sent(fake)[2:] == ["/api/v1/namespaces/ns/pods/p/binding"]


async def test_a_write_refused_after_its_rate_limit_token_gives_the_token_to_the_next() -> None:
    """A backlog of writes whose deadline passes while they wait for tokens must not take the tokens of the writes
    that can still go out (a burst beyond qps x renew deadline, retried with backoff, took every token: nothing
    was bound for a minute)."""
    fake = _Api()
    async with TestServer(fake.app) as server:
        # one token, then one per 4 s
        conn = Connection(kubeconfig_dict=kubeconfig_for(str(server.make_url(""))), qps=0.25, burst=1)
        async with ApiWriter(conn) as writer:
            writer.term = Term()
            assert (await writer.bind("ns", "first", "u", "n1")).ok  # takes the one token
            writer.term = Term(deadline=time.monotonic() + 1)
            late = asyncio.create_task(writer.bind("ns", "late", "u", "n1"))  # its token comes after its deadline
            await _in_the_writer(writer)
            writer.term = Term()
            started = time.monotonic()
            fresh = await writer.bind("ns", "fresh", "u", "n1")  # waits behind it for a token
            took = time.monotonic() - started
            assert (await late).status == REFUSED
    assert fresh.ok
    # the late write's token, given back (without it: one more refill, 4 s later)
    assert took < 6, f"the write after a refused one waited {took:.1f} s: the refused one kept its token"
    assert _sent(fake) == ["/api/v1/namespaces/ns/pods/first/binding", "/api/v1/namespaces/ns/pods/fresh/binding"]


async def test_a_renewal_lets_the_writes_of_its_term_waiting_for_a_token_leave_after_their_first_deadline() -> None:
    """A write carries its term's deadline as it was when queued; a renewal while it waits for its token moves it
    (without, a burst longer than qps x renew deadline had its later binds refused while the term held, and a
    gang's refused member could find its room taken: a gang left partly bound)."""
    fake = _Api()
    async with TestServer(fake.app) as server:
        conn = Connection(kubeconfig_dict=kubeconfig_for(str(server.make_url(""))), qps=0.25, burst=1)
        async with ApiWriter(conn) as writer:
            writer.term = term = Term(deadline=time.monotonic() + 60)
            assert (await writer.bind("ns", "first", "u", "n1")).ok  # takes the one token; the next in 4 s
            term.deadline = time.monotonic() + 1
            waiting = asyncio.create_task(writer.bind("ns", "renewed", "u", "n1"))
            await _in_the_writer(writer)
            term.deadline = time.monotonic() + 60  # the elector renewed the lease
            writer.renew(term)
            reply = await asyncio.wait_for(waiting, 60)
            assert reply.ok, reply.describe()
            ended = Term(deadline=time.monotonic() + 60)  # an ended term's renewal lets nothing out
            writer.term = ended
            writer.end_term(ended)
            writer.renew(ended)
            assert (await writer.bind("ns", "after-end", "u", "n1")).refused
    assert _sent(fake) == ["/api/v1/namespaces/ns/pods/first/binding", "/api/v1/namespaces/ns/pods/renewed/binding"]


async def test_a_write_refused_for_its_deadline_is_sent_again_when_its_term_was_renewed_meanwhile() -> None:
    """The bind carries its Scheduled event (``BIND_REPORTED``): the event of the attempt that went out is written
    and reported, once; the refused attempt's "not bound" is not."""
    fake = _Api()
    heard: list[Reply] = []
    report = ScheduledReport("crane-test", "instance-1", time.time(), heard.append)
    async with TestServer(fake.app) as server:
        conn = Connection(kubeconfig_dict=kubeconfig_for(str(server.make_url(""))), qps=0.25, burst=1)
        async with ApiWriter(conn) as writer:
            writer.term = term = Term(deadline=time.monotonic() + 60)
            assert (await writer.bind("ns", "first", "u", "n1")).ok  # takes the one token; the next in 4 s
            term.deadline = time.monotonic() + 1
            waiting = asyncio.create_task(writer.bind("ns", "again", "u", "n1", report))
            await _in_the_writer(writer)
            term.deadline = time.monotonic() + 60  # renewed, and the process not told (no RENEW): it refuses
            reply = await asyncio.wait_for(waiting, 60)
            assert reply.ok, reply.describe()
            await eventually(lambda: heard, 30, "the event's report")
            term.deadline = time.monotonic() - 0.001  # not renewed: the refusal stands
            assert (await writer.bind("ns", "late", "u", "n1")).refused
    assert [r.ok for r in heard] == [True]
    binds = [path for path in _sent(fake) if path.endswith("/binding")]
    assert binds == ["/api/v1/namespaces/ns/pods/first/binding", "/api/v1/namespaces/ns/pods/again/binding"]
    assert [path for path in _sent(fake) if path.endswith("/events")] == ["/apis/events.k8s.io/v1/namespaces/ns/events"]


async def test_a_status_patch_refused_for_its_deadline_is_not_sent_again_once_its_pods_bind_started() -> None:
    """A write refused for its deadline goes again after a renewal as a new request, which the process cannot tell
    from a patch queued after the pod's bind: the caller is asked first (``wanted``). A patch whose pod's bind
    started meanwhile is refused as superseded and never sent; another pod's goes."""
    fake = _Api()
    condition = {"status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    wanted = {"p": True, "q": True}
    async with TestServer(fake.app) as server:
        conn = Connection(kubeconfig_dict=kubeconfig_for(str(server.make_url(""))), qps=0.25, burst=1)
        async with ApiWriter(conn) as writer:
            writer.term = term = Term(deadline=time.monotonic() + 60)
            events = "/apis/events.k8s.io/v1/namespaces/ns/events"
            assert (await writer.write("POST", events, {}, term)).ok  # takes the reports' token; the next in 4 s
            term.deadline = time.monotonic() + 2
            patches = [
                asyncio.create_task(
                    writer.write(
                        "PATCH", f"/api/v1/namespaces/ns/pods/{pod}/status", condition, term, STRATEGIC_MERGE_PATCH,
                        wanted=lambda pod=pod: wanted[pod],  # type: ignore[misc]
                    )
                )
                for pod in ("p", "q")
            ]  # fmt: skip
            assert (await writer.bind("ns", "r", "u", "n1")).ok  # the binds' lane: the patches wait in the process
            wanted["p"] = False  # p's bind started in the scheduler (it reaches the process after the refusal)
            term.deadline = time.monotonic() + 60  # renewed, and the process not told (no RENEW): it refuses both
            replies = await asyncio.wait_for(asyncio.gather(*patches), 60)
    assert (replies[0].status, replies[0].text) == (REFUSED, SUPERSEDED)
    assert replies[1].ok, replies[1].describe()
    assert [path for path in _sent(fake) if path.endswith("/status")] == ["/api/v1/namespaces/ns/pods/q/status"]


async def test_a_cancelled_caller_withdraws_its_write_from_the_writer() -> None:
    """``stop_binding`` cancels its binding cycles: a bind waiting in the writer process (here for the one
    connection, held by the API server) is withdrawn and never sent, though its connection frees up later."""
    fake = _Api()
    fake.release, fake.hold = asyncio.Event(), "first/binding"
    async with TestServer(fake.app) as server:
        conn = Connection(kubeconfig_dict=kubeconfig_for(str(server.make_url(""))), qps=0, connections=1)
        async with ApiWriter(conn) as writer:
            writer.term = Term()
            first = asyncio.create_task(writer.bind("ns", "first", "u", "n1"))  # holds the one connection
            await asyncio.wait_for(fake.arrived.wait(), 30)
            cancelled = asyncio.create_task(writer.bind("ns", "cancelled", "u", "n1"))
            await _in_the_writer(writer)  # it waits for the connection there
            cancelled.cancel()
            await _in_the_writer(writer)  # its CANCEL has reached the writer too
            fake.release.set()
            assert (await first).ok
            assert (await writer.bind("ns", "after", "u", "n1")).ok  # the connection, once free, goes to this one
    assert cancelled.cancelled()
    assert _sent(fake) == ["/api/v1/namespaces/ns/pods/first/binding", "/api/v1/namespaces/ns/pods/after/binding"]


async def test_events_do_not_queue_behind_binds_the_api_server_is_slow_to_answer() -> None:
    """Binds and reports have connections of their own: a burst of binds held by the API server leaves the
    ``Scheduled`` events free to go (kube-scheduler's events have their own client, too)."""
    fake = _Api()
    fake.release, fake.hold = asyncio.Event(), "/binding"
    async with TestServer(fake.app) as server:
        conn = Connection(
            kubeconfig_dict=kubeconfig_for(str(server.make_url(""))), qps=0, connections=2, report_connections=2
        )
        async with ApiWriter(conn) as writer:
            binds = [asyncio.create_task(writer.bind("ns", f"p{i}", "u", "n1")) for i in range(8)]
            await eventually(lambda: len(fake.seen) == 2, 10, "two binds held by the API server")
            events = [
                writer.write("POST", "/apis/events.k8s.io/v1/namespaces/ns/events", {"e": i}, None) for i in range(4)
            ]
            replies = await asyncio.wait_for(asyncio.gather(*events), 10)
            assert [r.status for r in replies] == [201] * 4
            assert not any(b.done() for b in binds)
            fake.release.set()
            assert all(r.ok for r in await asyncio.gather(*binds))
    assert sum(s[1].endswith("/binding") for s in fake.seen) == 8


async def test_preemption_writes_take_the_binds_lane_and_events_yield_to_them() -> None:
    """Urgent writes (a preemption's nomination, condition, delete) do not queue behind reports holding every
    report connection; while one is in flight, events past the gate's limit wait for it (the API server serves
    what is in flight at once, so events would slow the evictions down), and a status patch does not wait."""
    fake = _Api()
    fake.release, fake.hold = asyncio.Event(), "/events"
    async with TestServer(fake.app) as server:
        conn = Connection(
            kubeconfig_dict=kubeconfig_for(str(server.make_url(""))),
            qps=0,
            connections=2,
            report_connections=4,
            reports_while_binds_wait=1,
        )
        async with ApiWriter(conn) as writer:
            assert await writer.wait_ready(30)
            events = "/apis/events.k8s.io/v1/namespaces/ns/events"
            held = [asyncio.create_task(writer.write("POST", events, {"e": i}, None)) for i in range(4)]
            await eventually(lambda: len(fake.seen) == 4, 10, "four events held by the API server")
            delete = writer.write("DELETE", "/api/v1/namespaces/ns/pods/low", {"x": 1}, None, urgent=True)
            assert (await asyncio.wait_for(delete, 10)).ok  # not behind the reports' busy connections
            fake.release.set()
            assert all(r.ok for r in await asyncio.gather(*held))

            fake.release, fake.hold = asyncio.Event(), ("/low", "/events")
            urgent = asyncio.create_task(
                writer.write("DELETE", "/api/v1/namespaces/ns/pods/low", {"x": 2}, None, urgent=True)
            )
            await eventually(lambda: len(fake.seen) == 6, 10, "the urgent write held by the API server")
            first = asyncio.create_task(writer.write("POST", events, {"e": "within the limit"}, None))
            await eventually(lambda: len(fake.seen) == 7, 10, "one event let through")
            late = asyncio.create_task(writer.write("POST", events, {"e": "late"}, None))
            patch = writer.write("PATCH", "/api/v1/namespaces/ns/pods/p/status", {"status": {}}, None)
            assert (await asyncio.wait_for(patch, 10)).ok  # a status patch does not wait for the urgent write
            assert not late.done() and [b for *_, b in fake.seen[6:]] == [{"e": "within the limit"}, {"status": {}}]
            fake.release.set()
            assert all(r.ok for r in await asyncio.gather(urgent, first, asyncio.wait_for(late, 10)))
    assert fake.seen[-1][4] == {"e": "late"}


async def test_a_write_whose_deadline_passes_while_it_waits_for_a_connection_is_refused() -> None:
    fake = _Api()
    fake.release, fake.hold = asyncio.Event(), "/binding"
    async with TestServer(fake.app) as server:
        conn = Connection(kubeconfig_dict=kubeconfig_for(str(server.make_url(""))), qps=0, connections=1)
        async with ApiWriter(conn) as writer:
            writer.term = Term(deadline=time.monotonic() + 600)
            first = asyncio.create_task(writer.bind("ns", "first", "u", "n1"))  # holds the one connection
            await asyncio.wait_for(fake.arrived.wait(), 30)
            # the second bind must reach the writer before its deadline (else it is refused on arrival, another
            # path): a longer allowance each time the machine was too slow for the last one
            for allowance in (1.0, 4.0, 16.0, 64.0):
                writer.term = term = Term(deadline=time.monotonic() + allowance)
                second = asyncio.create_task(writer.bind("ns", "second", "u", "n1"))  # waits for the connection
                await _in_the_writer(writer)
                if time.monotonic() < term.deadline:
                    break
                assert (await second).status == REFUSED  # refused on arrival: try again
            # until its deadline has passed while it waits (nothing but the deadline would stop it)
            await asyncio.sleep(max(0.0, term.deadline - time.monotonic()))
            fake.release.set()
            assert (await first).ok
            reply = await second
    assert reply.status == REFUSED and "deadline" in reply.text
    assert _sent(fake) == ["/api/v1/namespaces/ns/pods/first/binding"]


async def test_a_dead_writer_answers_unsent_and_is_restarted() -> None:
    fake = _Api()
    fake.release = asyncio.Event()
    restarts: list[int] = []
    async with TestServer(fake.app) as server:
        conn = Connection(kubeconfig_dict=kubeconfig_for(str(server.make_url(""))), qps=0)
        async with ApiWriter(conn, on_restart=lambda: restarts.append(1)) as writer:
            held = asyncio.create_task(writer.bind("ns", "held", "u", "n1"))
            await asyncio.wait_for(fake.arrived.wait(), 10)
            assert writer.alive and writer._proc is not None and await writer.wait_ready(10)
            writer._proc.kill()
            reply = await asyncio.wait_for(held, 10)
            assert reply.status == UNSENT and "exited" in reply.text
            assert not writer.ready.is_set()  # until the restarted process says so
            fake.release.set()
            await eventually(lambda: writer.alive, 30, "the writer process restarted")
            assert await writer.wait_ready(30)  # the new process says when it can send
            assert restarts == [1]
            assert (await writer.bind("ns", "after", "u", "n1")).ok
        assert not writer.alive
        assert (await writer.bind("ns", "closed", "u", "n1")).status == UNSENT


async def test_the_writer_process_dies_with_the_scheduler_even_with_a_write_in_flight() -> None:
    """kill -9 of the scheduler leaves no writer behind to send writes of a term nobody holds (PR_SET_PDEATHSIG;
    a closed stdin alone would let it finish the write it holds first)."""
    script = (
        "import asyncio, sys\n"
        "from crane_scheduler.writer import ApiWriter, Connection\n"
        "from tests.support.fakeapi import kubeconfig_for\n"
        "async def main():\n"
        "    w = ApiWriter(Connection(kubeconfig_dict=kubeconfig_for(sys.argv[1]), qps=0))\n"
        "    await w.start()\n"
        "    bind = asyncio.create_task(w.bind('ns', 'p', 'u', 'n1'))\n"
        "    print(w._proc.pid, flush=True)\n"
        "    await bind\n"
        "asyncio.run(main())\n"
    )
    fake = _Api()
    fake.release = asyncio.Event()  # the bind is held by the API server until the end
    async with TestServer(fake.app) as server:
        scheduler = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, str(server.make_url("")), stdout=asyncio.subprocess.PIPE
        )
        assert scheduler.stdout is not None
        writer_pid = int(await asyncio.wait_for(scheduler.stdout.readline(), 60))
        await asyncio.wait_for(fake.arrived.wait(), 30)
        assert _running(writer_pid)
        scheduler.kill()
        await scheduler.wait()
        await eventually(lambda: not _running(writer_pid), 10, "the writer process to be gone")
        fake.release.set()


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan is reaped by init, so a killed writer leaves no entry behind for long)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


class _HoldingApi(_Api):
    """Holds binds until ``binds_go`` and events until ``events_go`` (answers anything else at once); counts the
    events in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.binds_go, self.events_go = asyncio.Event(), asyncio.Event()
        self.events_in_flight = 0
        self.most_events_in_flight = 0
        self.binds_arrived = 0

    async def _handle(self, request: web.Request) -> web.Response:
        if request.path.endswith("/binding"):
            self.binds_arrived += 1
            await self.binds_go.wait()
            return web.json_response({"kind": "Status"}, status=201)
        if not request.path.endswith("/events"):
            return web.json_response({"kind": "Pod"}, status=200)
        self.events_in_flight += 1
        self.most_events_in_flight = max(self.most_events_in_flight, self.events_in_flight)
        try:
            await self.events_go.wait()
        finally:
            self.events_in_flight -= 1
        return web.json_response({"kind": "Event"}, status=201)


async def test_events_yield_to_binds_waiting_for_a_connection_and_every_one_is_written() -> None:
    """While binds queue for a connection (the API server is the bottleneck) at most ``reports_while_binds_wait``
    events are in flight (status patches are not held); once the binds stop queueing the waiting events go at the
    report lane's concurrency, and none is lost."""
    fake = _HoldingApi()
    async with TestServer(fake.app) as server:
        conn = Connection(
            kubeconfig_dict=kubeconfig_for(str(server.make_url(""))),
            qps=0,
            connections=1,
            report_connections=8,
            reports_while_binds_wait=2,
        )
        async with ApiWriter(conn) as writer:
            binds = [asyncio.create_task(writer.bind("ns", f"p{i}", "u", "n1")) for i in range(3)]  # 1 sent, 2 wait
            # the first bind holds the one connection; the other two, received with it, wait for it by now
            await eventually(lambda: fake.binds_arrived == 1, 10, "the first bind at the API server")
            events = [
                asyncio.create_task(writer.write("POST", "/apis/events.k8s.io/v1/namespaces/ns/events", {"e": i}, None))
                for i in range(6)
            ]
            await eventually(lambda: fake.events_in_flight == 2, 10, "two events in flight")
            # a pod-status patch shares the report lane but does not wait for binds; sent after the events, its
            # round trip is over only once the events the gate had let through were sent too
            status: dict[str, Any] = {"status": {"conditions": []}}
            patched = await asyncio.wait_for(
                writer.write("PATCH", "/api/v1/namespaces/ns/pods/q/status", status, None, STRATEGIC_MERGE_PATCH), 10
            )
            assert patched.ok and not any(b.done() for b in binds)
            assert fake.most_events_in_flight == 2
            fake.binds_go.set()  # the binds drain: no bind waits any more
            await eventually(lambda: fake.events_in_flight == 6, 10, "every event in flight once binds stop queueing")
            assert all(r.ok for r in await asyncio.gather(*binds))
            fake.events_go.set()
            replies = await asyncio.wait_for(asyncio.gather(*events), 10)
    assert [r.status for r in replies] == [201] * 6


async def test_binds_go_in_protobuf_to_the_real_api_server_and_a_refused_one_says_why_in_json(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str
) -> None:
    """The writer's protobuf Binding is what the API server expects (the pod gets the node), and its protobuf
    Status replies come back as the JSON Status the callers and logs read (UID precondition, already bound, gone)."""
    core = client.CoreV1Api(kube)
    spec = {"schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    name = "p-" + "x" * 150  # a name whose length needs two varint bytes
    created = await core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": spec})
    async with ApiWriter(Connection(kubeconfig_dict=cluster.kubeconfig_dict(), qps=0)) as writer:
        wrong_uid = await writer.bind(namespace, name, "not-its-uid", "node-a")
        bound = await writer.bind(namespace, name, created.metadata.uid, "node-a")
        again = await writer.bind(namespace, name, created.metadata.uid, "node-b")
        gone = await writer.bind(namespace, "no-such-pod", "u", "node-a")
    assert bound.status == 201, bound.describe()
    assert (await core.read_namespaced_pod(name, namespace)).spec.node_name == "node-a"
    conflict, already, missing = (json.loads(r.text) for r in (wrong_uid, again, gone))
    assert wrong_uid.status == 409 and conflict["kind"] == "Status" and conflict["reason"] == "Conflict"
    assert conflict["code"] == 409 and "UID" in conflict["message"], conflict
    assert again.status == 409 and "already assigned" in already["message"], already
    assert gone.status == 404 and missing["reason"] == "NotFound" and missing["details"]["name"] == "no-such-pod"


async def test_an_eviction_writes_the_condition_then_deletes_the_pod_with_its_uid_on_the_real_api_server(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str
) -> None:
    """Preemption's ``EVICT``: the victim's DisruptionTarget condition, then its deletion, in one request to the
    writer; a UID that no longer matches deletes nothing, a missing pod says the condition step failed."""
    core = client.CoreV1Api(kube)
    spec = {"schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    created = await core.create_namespaced_pod(namespace, {"metadata": {"name": "victim"}, "spec": spec})
    condition = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "m"}
    async with ApiWriter(Connection(kubeconfig_dict=cluster.kubeconfig_dict(), qps=0)) as writer:
        wrong = await writer.evict(namespace, "victim", "not-its-uid", condition)
        kept = await core.read_namespaced_pod("victim", namespace)
        evicted = await writer.evict(namespace, "victim", created.metadata.uid, condition)
        missing = await writer.evict(namespace, "no-such-pod", "u", condition)
    assert wrong.status == 409 and "UID" in wrong.text, wrong.describe()
    assert kept.metadata.deletion_timestamp is None
    assert [(c.type, c.reason) for c in kept.status.conditions or []] == [("DisruptionTarget", "PreemptionByScheduler")]
    assert evicted.ok, evicted.describe()
    pods = await core.list_namespaced_pod(namespace)
    assert [p.metadata.name for p in pods.items if p.metadata.deletion_timestamp is None] == []
    assert missing.status == 404 and missing.text.startswith("the DisruptionTarget condition: "), missing.describe()


async def test_a_bind_carries_its_scheduled_event_written_once_the_bind_succeeded(
    cluster: LocalCluster, kube: client.ApiClient, namespace: str
) -> None:
    """``BIND_REPORTED``: the pod is bound, then its one ``Scheduled`` event (named by the UID, as the reporter
    writes it) is written by the writer process and its reply reaches the caller's ``done``; a bind that fails
    (409: already bound) writes no event and answers the report ``REFUSED``/``NOT_BOUND``."""
    core = client.CoreV1Api(kube)
    spec = {"schedulerName": "nobody", "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}
    created = await core.create_namespaced_pod(namespace, {"metadata": {"name": "p"}, "spec": spec})
    uid = created.metadata.uid
    heard: list[Reply] = []
    report = ScheduledReport("crane-test", "instance-1", time.time(), heard.append)
    async with ApiWriter(Connection(kubeconfig_dict=cluster.kubeconfig_dict(), qps=0)) as writer:
        bound = await writer.bind(namespace, "p", uid, "node-a", report)
        again = await writer.bind(namespace, "p", uid, "node-b", report)
        await eventually(lambda: len(heard) == 2, 10, "both reports answered")
    assert bound.status == 201 and again.status == 409
    assert sorted((r.status, r.text) for r in heard) == [(REFUSED, NOT_BOUND), (201, "")]
    events = client.EventsV1Api(kube)
    listed = (await events.list_namespaced_event(namespace, field_selector="reason=Scheduled")).items
    assert [e.metadata.name for e in listed] == [scheduled_event_name("p", uid)]
    event = listed[0]
    assert event.regarding.uid == uid and event.reporting_controller == "crane-test"
    assert event.reporting_instance == "instance-1" and event.note == f"Successfully assigned {namespace}/p to node-a"
