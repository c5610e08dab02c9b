"""What users see: ``Scheduled`` and ``FailedScheduling`` events and the PodScheduled condition.

All writes go through a small worker pool to the API writer process (``crane_scheduler.writer``, with its own
connections and rate limit, as kube-scheduler gives events a separate client), so reporting never delays a
decision or a bind; reads (the pod behind a 409, the recovery list) use the scheduler's client.

- ``Scheduled`` is written exactly once per pod UID, also across crashes and failovers: the event name is derived
  from the UID (a second create is a harmless 409), and a new leader writes the ones a crashed leader bound but
  did not get to report (pods bound recently for our profiles without a ``Scheduled`` event). The
  event-recorder counts these events for hot values, so a missing or doubled one would skew placement.
- ``FailedScheduling`` (Warning) and PodScheduled=False carry kube-scheduler's message. The condition is only
  patched when it changes; an unchanged message is repeated as an event at most once per ``repeat_after``
  seconds per pod, so a stuck pod retried on every cluster event does not flood the API.
- A PodScheduled=False patch still queued when the pod's bind starts, or when the informer sees it bound or gone,
  is not sent (``superseded``), nor one the writer process holds when the bind reaches it (``SUPERSEDED``): kube's
  API dispatcher (``SchedulerAsyncAPICalls``) lets a pod's binding call overwrite its queued status patch the same
  way. Sent late, it would land on the bound pod and leave it PodScheduled=False for good, which also hides it from
  a new leader's recovery of missing ``Scheduled`` events. Counted as ``result="superseded"``.
- A pod's nominated node (kube 1.37's life of it): a failure that ends the nomination clears
  ``status.nominatedNodeName`` in its status patch, with the condition (``failed(..., clear_nomination=True)``);
  before a PreBind that works the binding cycle writes the node there (``expect_on``, kind ``nomination``).
- ``FailedScheduling`` events and condition patches belong to the leadership term they were queued in
  (``term``): when it ends, the ones still queued are dropped at once (``drop_lost``), like the binds, counted as
  ``crane_scheduler_api_writes_total{result="dropped"}``; the next leader judges those pods itself. A ``Scheduled``
  event reports a bind that happened: it is still written (idempotent, one name per UID), and the next leader's
  recovery writes any that did not make it.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from crane_scheduler.metrics import SchedulerMetrics
from crane_scheduler.nodetable import PodRecord
from crane_scheduler.podinfo import PodInfo, unscheduled_condition
from crane_scheduler.writer import ApiWriter, Reply, ScheduledReport
from crane_scheduler.writer.protocol import JSON, NOT_BOUND, STRATEGIC_MERGE_PATCH, SUPERSEDED, UNSENT
from crane_shared.events import SCHEDULED_REASON, event_body, once_scheduled_event
from crane_shared.kube import ApiCallError, api_failure, raw_json
from crane_shared.leader import Term
from crane_shared.logs import LogOnce, get_logger
from crane_shared.retry import Backoff, retry
from crane_shared.worker import cancel_and_wait

log = get_logger("crane.scheduler.reporting")
RECOVERY_WINDOW = timedelta(minutes=10)
SCHEDULED_ATTEMPTS = 8  # with backoff 0.5 s .. 8 s: about 40 s, longer than an API server restart
NOTE_LENGTH_LIMIT = 1024
_CLAIMED = object()
"""``Reporter._conditions``' token of a pod whose condition a plugin writes itself (``condition_claimed``)"""


def truncate_note(message: str) -> str:
    """Event notes are cut at 1024 characters, ending in " ..." (kube's ``truncateMessage``)."""
    if len(message) <= NOTE_LENGTH_LIMIT:
        return message
    return message[: NOTE_LENGTH_LIMIT - 4] + " ..."


@dataclass(frozen=True)
class _Job:
    kind: str  # the ``reports`` metric's kind: scheduled, failed, condition, ensure (and nomination, unqueued)
    pod: str  # namespace/name of the pod it reports on (named in the log line of a failure)
    term: Term | None  # None: tied to no term (no leader election, or a Scheduled event: a fact)
    write: Callable[[], Awaitable[None]]
    failure: tuple[str, str] | None = None  # (pod uid, message) of a FailedScheduling report

    @property
    def held(self) -> bool:
        return self.term is None or self.term.held


class Reporter:
    def __init__(
        self,
        writer: ApiWriter | None,
        api: client.ApiClient | None,
        instance: str,
        *,
        workers: int = 32,
        repeat_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        metrics: SchedulerMetrics | None = None,
    ) -> None:
        self.metrics = metrics or SchedulerMetrics()
        self._writer = writer
        self._api = api
        self.instance = instance
        self._workers = workers
        self.repeat_after = repeat_after
        self._clock = clock
        self._jobs: asyncio.Queue[_Job] = asyncio.Queue()
        self.term: Term | None = None
        """the leadership term reports are queued in (set by the scheduler when it starts leading)"""
        self._last_failure: dict[str, tuple[str, float]] = {}
        self._claimed: dict[str, tuple[str, str]] = {}  # uid -> (reason, message) a plugin writes itself
        self._conditions: dict[str, object] = {}  # uid -> the token of its PodScheduled=False patch not yet answered
        self._patching: dict[str, set[asyncio.Event]] = {}  # uid -> its status patches handed to the writer, unanswered
        self._closed = asyncio.Event()
        self._log_once = LogOnce(log)

    # ------------------------------------------------------------------------------------------ callers

    def scheduled(self, namespace: str, pod: str, uid: str, node: str, scheduler: str) -> None:
        self._last_failure.pop(uid, None)
        body = once_scheduled_event(
            namespace=namespace, pod=pod, pod_uid=uid, node=node, scheduler=scheduler, instance=self.instance
        )
        self._queue(  # a fact: kept
            "scheduled", f"{namespace}/{pod}", lambda: self._create_scheduled(namespace, body), of_term=False
        )

    def with_bind(self, scheduler: str, pod: PodInfo) -> ScheduledReport | None:
        """The ``Scheduled`` event for the bind of ``pod`` to carry (``ApiWriter.bind``): the writer process writes
        it once the bind succeeded, so the scheduling loop builds, queues and awaits nothing per pod for it. A
        write that failed (or never came back: the process died) falls back to ``already_bound``: the pod is read,
        and if it is bound its event is written through the reporter's own retries. None without a writer."""
        if self._writer is None:
            return None
        return ScheduledReport(scheduler, self.instance, time.time(), functools.partial(self._reported, pod, scheduler))

    def bound(self, uid: str) -> None:
        """A bind that carried its ``Scheduled`` event succeeded (``scheduled`` without the write)."""
        self._last_failure.pop(uid, None)

    def _reported(self, pod: PodInfo, scheduler: str, reply: Reply) -> None:
        if reply.ok:
            self.metrics.child(self.metrics.reports, "scheduled", "ok").inc()
        elif reply.status == 409:  # the one Scheduled event for this UID exists already
            self.metrics.child(self.metrics.reports, "scheduled", "exists").inc()
        elif reply.refused and reply.text == NOT_BOUND:  # no bind, no event (a 409 bind ensures its own)
            return
        elif reply.status != 404:  # 404: namespace gone
            self.metrics.reports.labels("scheduled", "error").inc()
            self.already_bound(pod, scheduler)

    def failed(
        self, pod: PodInfo, message: str, reason: str, scheduler: str, *, clear_nomination: bool = False
    ) -> bool:
        """Report a failed attempt, unless the same message went out for this pod less than
        ``repeat_after`` seconds ago. ``clear_nomination``: the pod has a nomination this failure ends (kube's
        ``clearNominatedNode``): the status patch sets ``nominatedNodeName`` to none with the condition, as kube's
        ``updatePod`` does, and is written even when the event is a repeat held back. Returns whether anything
        was written."""
        now = self._clock()
        claimed = self._claimed.pop(pod.uid, None)
        last = self._last_failure.get(pod.uid)
        repeated = last is not None and last[0] == message and now - last[1] < self.repeat_after
        if repeated and not clear_nomination:
            return False
        failure, term = (pod.uid, message), self.term
        if not repeated:
            self._last_failure[pod.uid] = (message, now)
            body = event_body(
                namespace=pod.namespace,
                pod=pod.name,
                pod_uid=pod.uid,
                reason="FailedScheduling",
                action="Scheduling",
                type_="Warning",
                note=truncate_note(message),
                controller=scheduler,
                instance=self.instance,
            )
            self._queue("failed", pod.key, lambda: self._create_event(pod.namespace, body, "failed", term), failure)
        condition = pod.scheduled_condition != ("False", reason, message) and claimed != (reason, message)
        if condition or clear_nomination:
            token = self._conditions[pod.uid] = object()  # a later patch for the pod supersedes this one
            self._queue(
                "condition",
                pod.key,
                lambda: self._patch_condition(pod, reason, message, term, token, condition, clear_nomination),
                None if repeated else failure,  # a repeat's event went out before: nothing to report again
            )
        return True

    async def expect_on(self, pod: PodInfo, node: str) -> bool:
        """kube's NominatedNodeNameForExpectation (beta, on since 1.35): before PreBind does its work (a volume
        or a claim to bind, which takes API round trips), the pod's ``status.nominatedNodeName`` says the node it
        is about to be bound to, so an autoscaler counts it there instead of adding a node for a pod that looks
        pending. Awaited by the binding cycle (kube writes it there, before WaitOnPermit and PreBind), on the
        binds' connections, in the current term; a failure is logged once and counted, not a failure of the
        binding (kube: "not critical enough to stop binding cycles"). A failure's status patch of the pod still on
        its way (it may clear the nomination) is answered first, so it cannot land over this one while PreBind
        works. Returns whether it was written."""
        await self.settled(pod.uid)
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        body = {"status": {"nominatedNodeName": node}}
        try:
            reply = await self._write("PATCH", path, body, self.term, STRATEGIC_MERGE_PATCH, urgent=True)
            if reply.ok:
                self.metrics.reports.labels("nomination", "ok").inc()
                return True
            if reply.refused:  # its term ended: the bind is refused too
                self.metrics.reports.labels("nomination", "dropped").inc()
            elif reply.status != 404:
                raise _failure(reply, "PATCH", path)
        except Exception as err:
            self.metrics.reports.labels("nomination", "error").inc()
            fields = api_failure("nomination", f"pod {pod.key}", err)
            self._log_once.warning(f"nomination:{fields['status']}", "report failed", pod=pod.key, **fields)
        return False

    def superseded(self, uid: str) -> None:
        """The pod's bind starts: its PodScheduled=False patch still queued is not sent (kube's binding call
        overwriting the queued status patch), and a failure after it (the bind failed) is reported afresh."""
        self._conditions.pop(uid, None)
        self._last_failure.pop(uid, None)

    def event(
        self,
        scheduler: str,
        regarding: Mapping[str, Any],
        related: Mapping[str, Any] | None,
        type_: str,
        reason: str,
        action: str,
        note: str,
    ) -> None:
        """Any other event a plugin reports (kube's ``EventRecorder().Eventf``, the profile's ``Handle.record_event``
        with ``scheduler`` bound), e.g. ``Preempted`` on a victim; ``regarding`` and ``related`` are pod references
        (namespace, name, uid)."""
        namespace = str(regarding.get("namespace") or "")
        body = event_body(
            namespace=namespace,
            pod=str(regarding.get("name") or ""),
            pod_uid=str(regarding.get("uid") or ""),
            reason=reason,
            action=action,
            type_=type_,
            note=truncate_note(note),
            controller=scheduler,
            instance=self.instance,
            related=None if related is None else {"apiVersion": "v1", "kind": "Pod", **related},
        )
        # what it reports has happened (e.g. the victim was deleted): written even if the term ends meanwhile
        self._queue(
            reason.lower(),
            f"{namespace}/{regarding.get('name') or ''}",
            lambda: self._create_event(namespace, body, reason.lower()),
            of_term=False,
        )

    def already_bound(self, pod: PodInfo, scheduler: str) -> None:
        """Our bind got 409: whoever bound it, make sure the pod has its one Scheduled event."""
        self._queue("ensure", pod.key, lambda: self._ensure_scheduled(pod, scheduler), of_term=False)

    def drop_lost(self) -> int:
        """Leadership is lost: drop every queued report of an ended term, at once. Returns how many."""
        kept: list[_Job] = []
        dropped = 0
        while not self._jobs.empty():
            job = self._jobs.get_nowait()
            self._jobs.task_done()
            if job.held:
                kept.append(job)
            else:
                self._dropped(job)
                dropped += 1
        for job in kept:
            self._jobs.put_nowait(job)
        if dropped:
            log.warning("leadership lost: dropped reports not yet written", count=dropped)
        return dropped

    def _queue(
        self,
        kind: str,
        pod: str,
        write: Callable[[], Awaitable[None]],
        failure: tuple[str, str] | None = None,
        *,
        of_term: bool = True,
    ) -> None:
        """Queue a write about ``pod`` (namespace/name); ``of_term``: it belongs to the current term (dropped when
        it ends)."""
        self._jobs.put_nowait(_Job(kind, pod, self.term if of_term else None, write, failure))

    def _dropped(self, job: _Job) -> None:
        self.metrics.reports.labels(job.kind, "dropped").inc()
        if job.failure is not None:  # never written: the next term reports it again, not after repeat_after
            self._unreported(*job.failure)

    def _unreported(self, uid: str, message: str) -> None:
        """The failure ``message`` of pod ``uid`` was not written: the next failure with it is not held back."""
        last = self._last_failure.get(uid)
        if last is not None and last[0] == message:
            del self._last_failure[uid]

    def forget(self, uid: str) -> None:
        self._last_failure.pop(uid, None)
        self._claimed.pop(uid, None)
        self._conditions.pop(uid, None)

    def condition_claimed(self, uid: str, reason: str, message: str) -> None:
        """A plugin writes this attempt's PodScheduled=False (``reason``, ``message``) itself, in a write of its
        own: preemption puts it in the nomination's patch, as kube's ``updatePod`` writes the condition and the
        nominated node in one call. The next ``failed`` for the pod with that condition does not patch it again
        (its event is still written), and an older patch of the pod still queued is not sent: landing after the
        plugin's, it would put an older condition back (or clear the new nomination)."""
        self._claimed[uid] = (reason, message)
        self._conditions[uid] = _CLAIMED

    async def settled(self, uid: str) -> None:
        """Returns once the status patches of pod ``uid`` handed to the writer are answered (``Handle.status_settled``:
        a status write of the pod's made elsewhere goes after them, not under them)."""
        for answered in list(self._patching.get(uid, ())):
            await answered.wait()

    @property
    def backlog(self) -> int:
        return self._jobs.qsize()

    # ------------------------------------------------------------------------------------------ workers

    def close(self) -> None:
        """No more reports will be queued (the scheduling loop has drained its binds)."""
        self._closed.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Write until ``stopping`` and ``close()``; then finish what is queued (the runtime's grace period
        bounds it), so binds completed during shutdown still get their events."""
        workers = [asyncio.create_task(self._worker()) for _ in range(self._workers)]
        try:
            await stopping.wait()
            await self._closed.wait()
            await self._jobs.join()
        finally:
            await cancel_and_wait(workers)

    async def drain(self) -> None:
        await self._jobs.join()

    async def _worker(self) -> None:
        while True:
            job = await self._jobs.get()
            try:
                if not job.held:  # queued in a term that has ended since
                    self._dropped(job)
                    continue
                await job.write()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                fields = api_failure(job.kind, f"pod {job.pod}", err)
                self._log_once.warning(
                    f"{job.kind}:{fields['status']}", "report failed", report=job.kind, pod=job.pod, **fields
                )
            finally:
                self._jobs.task_done()

    async def _create_scheduled(self, namespace: str, body: dict[str, Any]) -> None:
        """The one Scheduled event of a pod is retried through transient failures (an API server restart,
        429/5xx): a new leader writes missing ones, but a leader that keeps its lease never looks again."""
        await retry(
            lambda: self._create_event(namespace, body, "scheduled"),
            attempts=SCHEDULED_ATTEMPTS,
            backoff=Backoff(initial=0.5, maximum=8.0),
            retryable=_transient_or_unauthorized,
        )

    async def _write(
        self,
        method: str,
        path: str,
        body: Any,
        term: Term | None,
        content_type: str = JSON,
        wanted: Callable[[], bool] | None = None,
        *,
        urgent: bool = False,
    ) -> Reply:
        if self._writer is None:
            raise ApiCallError(method, path, None, "no API writer")
        return await self._writer.write(method, path, body, term, content_type, urgent=urgent, wanted=wanted)

    def _still_wanted(self, uid: str, token: object) -> bool:
        """Whether the pod's condition patch ``token`` is still its latest: no bind started, no newer failure, the
        pod not seen bound or gone since it was queued. Kept until its write returns, so a write the writer process
        refused for its deadline and sends again after a renewal (``ApiWriter._send``) is not sent after a bind
        that started in between (the process would take it for a new patch)."""
        return self._conditions.get(uid) is token

    async def _create_event(self, namespace: str, body: dict[str, Any], kind: str, term: Term | None = None) -> None:
        path = f"/apis/events.k8s.io/v1/namespaces/{namespace}/events"
        reply = await self._write("POST", path, body, term)
        if reply.ok:
            self.metrics.reports.labels(kind, "ok").inc()
        elif reply.status == 409:  # the one Scheduled event for this UID exists already
            self.metrics.reports.labels(kind, "exists").inc()
        elif reply.refused:  # its term ended before it left
            self.metrics.reports.labels(kind, "dropped").inc()
        elif reply.status != 404:  # 404: namespace gone
            self.metrics.reports.labels(kind, "error").inc()
            raise _failure(reply, "POST", f"{path}/{body['metadata'].get('name', '')}")

    async def _patch_condition(
        self,
        pod: PodInfo,
        reason: str,
        message: str,
        term: Term | None = None,
        token: object = None,
        condition: bool = True,
        clear_nomination: bool = False,
    ) -> None:
        """The failure's status patch: PodScheduled=False (``condition``: it changed) and, with
        ``clear_nomination``, no nominated node, in one write as kube's ``updatePod``."""
        wanted: Callable[[], bool] | None = None
        if token is not None:
            latest = self._conditions.get(pod.uid)
            if latest is not token:  # a bind, a newer patch, a plugin's own, or the pod bound or gone
                self.metrics.reports.labels("condition", "superseded").inc()
                if latest is not _CLAIMED:  # else a newer condition went in the plugin's own write
                    self._unreported(pod.uid, message)
                return
            wanted = functools.partial(self._still_wanted, pod.uid, token)  # asked before a resend (renewal)
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        status: dict[str, Any] = {}
        if condition:
            status["conditions"] = [unscheduled_condition(pod, reason, message)]
        if clear_nomination:
            status["nominatedNodeName"] = None
        body = {"status": status}
        answered = asyncio.Event()
        self._patching.setdefault(pod.uid, set()).add(answered)
        try:
            reply = await self._write("PATCH", path, body, term, STRATEGIC_MERGE_PATCH, wanted=wanted)
        finally:
            if token is not None and self._conditions.get(pod.uid) is token:
                del self._conditions[pod.uid]
            answered.set()
            patching = self._patching[pod.uid]
            patching.discard(answered)
            if not patching:
                del self._patching[pod.uid]
        if reply.ok:
            self.metrics.reports.labels("condition", "ok").inc()
        elif reply.refused and reply.text == SUPERSEDED:  # the pod's bind reached the writer process first
            self.metrics.reports.labels("condition", "superseded").inc()
            self._unreported(pod.uid, message)
        elif reply.refused:
            self.metrics.reports.labels("condition", "dropped").inc()
        elif reply.status != 404:
            self.metrics.reports.labels("condition", "error").inc()
            raise _failure(reply, "PATCH", path)

    async def _ensure_scheduled(self, pod: PodInfo, scheduler: str) -> None:
        core = client.CoreV1Api(self._api)
        try:
            live = await retry(  # the one chance to report this bind: retried like the Scheduled event itself
                lambda: raw_json(
                    core.read_namespaced_pod(pod.name, pod.namespace, _preload_content=False, _request_timeout=30)
                ),
                attempts=SCHEDULED_ATTEMPTS,
                backoff=Backoff(initial=0.5, maximum=8.0),
                retryable=_transient_or_unauthorized,
            )
        except ApiException as err:
            if err.status == 404:
                return
            raise ApiCallError.of("GET", f"pod {pod.key}", err) from err
        node = (live.get("spec") or {}).get("nodeName")
        if node and (live.get("metadata") or {}).get("uid") == pod.uid:
            self.scheduled(pod.namespace, pod.name, pod.uid, node, scheduler)

    # ------------------------------------------------------------------------------------------ recovery

    async def recover_scheduled_events(self, bound: Iterable[PodRecord], schedulers: set[str]) -> int:
        """Write the ``Scheduled`` events a previous leader bound but never reported. Returns how many."""
        horizon = datetime.now(UTC) - RECOVERY_WINDOW
        recent = [
            r
            for r in bound
            if r.scheduler_name in schedulers
            and not r.assumed
            and r.scheduled_at
            and _parse_time(r.scheduled_at) >= horizon
        ]
        if not recent:
            return 0
        reported = await self._scheduled_event_uids()
        missing = [r for r in recent if r.uid not in reported]
        for r in missing:
            self.scheduled(r.namespace, r.name, r.uid, r.node, r.scheduler_name)
        if missing:
            log.info("writing Scheduled events a previous leader did not", count=len(missing))
        return len(missing)

    async def _scheduled_event_uids(self) -> set[str]:
        uids: set[str] = set()
        cont: str | None = None
        core = client.CoreV1Api(self._api)
        while True:
            kwargs: dict[str, Any] = {"field_selector": f"reason={SCHEDULED_REASON}", "limit": 1000}
            if cont:
                kwargs["_continue"] = cont
            page = await raw_json(
                core.list_event_for_all_namespaces(**kwargs, _preload_content=False, _request_timeout=120)
            )
            uids.update((e.get("involvedObject") or {}).get("uid", "") for e in page.get("items") or ())
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return uids


def _failure(reply: Reply, method: str, path: str) -> ApiCallError:
    """The failed write ``method path`` as an error that names it, with its status (``None``: not sent, e.g. the
    writer process restarting: transient, retried)."""
    return ApiCallError(method, path, None if reply.status == UNSENT else reply.status, reply.text)


def _transient(err: Exception) -> bool:
    return not isinstance(err, ApiException) or err.status is None or err.status == 429 or err.status >= 500


def _transient_or_unauthorized(err: Exception) -> bool:
    """For the writes that report a bind that happened: a kube-apiserver just restarted answers 401/403 until its
    authenticator and RBAC caches have synced (kubernetes#101422), and a Scheduled event dropped then stays
    missing while the leader keeps its term (recovery only runs when a term starts)."""
    return _transient(err) or (isinstance(err, ApiException) and err.status in (401, 403))


def _parse_time(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.min.replace(tzinfo=UTC)
