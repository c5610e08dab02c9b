"""The scheduler <-> writer wire format: msgpack objects back to back on the child's stdin / stdout.

Scheduler -> writer: first a map, the ``Connection`` (how to reach the API server; on the pipe, so no token or
kubeconfig appears on a command line), then arrays:

- ``[REQUEST, id, method, path, body, content_type, term, deadline]``: write ``body`` as JSON (events, status
  patches). ``term`` is the leadership term's number (0: tied to no term) and ``deadline`` a ``time.monotonic()``
  instant (CLOCK_MONOTONIC is one clock for every process of the host) after which the request must not leave:
  the writer refuses it then;
- ``[BIND, id, namespace, name, uid, node, term, deadline]``: POST the pod's ``binding`` (the body is built by
  the writer from a template: four strings to pack instead of a nested map); binds have their own connections
  and rate limit in the writer, so events and status patches never queue behind a burst of binds;
- ``[BIND_REPORTED, id, namespace, name, uid, node, event_id, scheduler, instance, at, term, deadline]``: as
  ``BIND``, and once the bind answered 2xx, the pod's one ``Scheduled`` event (``crane_shared.events.
  once_scheduled_event``, named by the UID, ``eventTime`` ``at``) as a report (the events' lane and gate, tied to no
  term: it reports a bind that happened); the event's reply comes as ``[event_id, status, text]``, ``REFUSED`` when
  the bind did not answer 2xx (nothing to report). The scheduling process then builds, packs and awaits nothing
  per pod for the event;
- ``[URGENT, id, method, path, body, content_type, term, deadline]``: as ``REQUEST``, on the binds' connections
  and rate limit: preemption's writes (the preemptor's nomination, its victims' condition and deletion) are on
  the preemptor's way to its bind, so they do not queue behind the events and status patches of a burst of
  failed attempts;
- ``[OBJECT, id, method, path, body, content_type, term, deadline]``: as ``URGENT``, in JSON both ways, and the
  reply's ``text`` is the response body also on success (DynamicResources' claim writes: the written claim is
  what its next write and the scheduler's assume cache need);
- ``[EVICT, id, namespace, name, uid, condition, term, deadline]``: preemption's eviction of a victim, as kube's
  ``PreemptPod``: PATCH the pod's status with ``condition`` (``DisruptionTarget``), then, once that is written,
  DELETE it with the UID precondition; both urgent; one reply, the deletion's (or the condition's when it failed),
  so the deletion does not wait for a round trip through the scheduling loop;
- ``[CANCEL, id]``: the caller gave up (its binding cycle was dropped); not sent if not sent yet;
- ``[END_TERM, term]``: the term ended; every request of it not yet sent is refused, at once.
- ``[RENEW, term, deadline]``: the term was renewed: its requests not yet sent may leave until ``deadline`` (a
  request carries its term's deadline as it was when it was queued; one that waits longer than that for a token or
  a connection is refused unless a renewal moved it).

Writer -> scheduler: ``[READY_ID, READY, ""]`` once, when its client is built (the scheduler waits for it
before its first decision, so the first writes do not wait in the pipe for the process's start); then
``[id, status, text]``: the HTTP status, ``UNSENT`` for a transport error (``text`` says
which), ``REFUSED`` when it was not sent (term ended, deadline passed, cancelled); ``text`` is the error body
(for ``OBJECT``, the body whatever the status).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

REQUEST, CANCEL, END_TERM, BIND, URGENT, EVICT, OBJECT, BIND_REPORTED, RENEW = 0, 1, 2, 3, 4, 5, 6, 7, 8
READY_ID = 0
"""the reply id of the writer's readiness (request ids start at 1)"""
READY = 1
UNSENT = 0
REFUSED = -1
JSON = "application/json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
NO_DEADLINE = float("inf")
DEADLINE_PASSED = "leadership term deadline passed"
"""the text of a ``REFUSED`` reply whose term's deadline passed before it could leave"""
NOT_BOUND = "not bound"
"""the text of a ``BIND_REPORTED`` event's ``REFUSED`` reply when its bind did not succeed (nothing to report)"""
SUPERSEDED = "superseded by the pod's binding"
"""the text of a pod-status patch's ``REFUSED`` reply when a bind of that pod reached the writer before it left"""


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    text: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status <= 299

    @property
    def refused(self) -> bool:
        return self.status == REFUSED

    def describe(self) -> str:
        if self.status == REFUSED:
            return f"not sent: {self.text}"
        if self.status == UNSENT:
            return f"request failed: {self.text}"
        return f"HTTP {self.status}: {self.text[:300]}"


@dataclass(frozen=True)
class Connection:
    """How the writer reaches the API server: a kubeconfig file (or in-cluster config when none), or an in-memory
    kubeconfig (tests, sandbox); its own client-side rate limit (kube-scheduler's binds and events go through
    rate-limited clients too) and request timeout; at most ``connections`` binds in flight, so a burst reuses
    that many keep-alive connections instead of opening (and TLS-handshaking) one per bind; events and status
    patches have ``report_connections`` of their own (the reporter's workers: none waits for a connection), so
    they never queue behind a burst of binds, and their own rate limit (as kube-scheduler's event client)."""

    kubeconfig: str | None = None
    context: str | None = None
    kubeconfig_dict: dict[str, object] | None = None
    qps: float = 50.0
    burst: int = 100
    request_timeout: float = 30.0
    connections: int = 64
    report_connections: int = 64
    reports_while_binds_wait: int = 4
    """events in flight at most while binds wait for a connection (``process.ReportGate``): binds first"""

    def to_wire(self) -> dict[str, object]:
        return {
            "kubeconfig": self.kubeconfig,
            "context": self.context,
            "kubeconfig_dict": self.kubeconfig_dict,
            "qps": self.qps,
            "burst": self.burst,
            "request_timeout": self.request_timeout,
            "connections": self.connections,
            "report_connections": self.report_connections,
            "reports_while_binds_wait": self.reports_while_binds_wait,
        }

    @classmethod
    def from_wire(cls, data: dict[str, object]) -> Connection:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)  # type: ignore[arg-type]


def flush_after(delay: float, flushed_at: float, flush: Callable[[], None]) -> asyncio.TimerHandle:
    """The timer of a buffer's next pipe write: ``delay`` after the last one (``flushed_at``, the loop's clock), or
    at once (the loop's next turn) when that is past. Both ends' pipe writes (``client``, ``process``): at most one
    per ``delay`` in a burst, none delayed after a pause."""
    loop = asyncio.get_running_loop()
    return loop.call_at(max(flushed_at + delay, loop.time()), flush)
