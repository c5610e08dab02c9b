"""The scheduling queue: activeQ, backoffQ and unschedulable pods, as kube-scheduler's PriorityQueue.

- activeQ is a heap ordered by the QueueSort plugin's key (PrioritySort: priority, then arrival).
- A pod that failed with an error waits in backoffQ: 1 s after the first attempt, doubling, capped at 10 s.
- kube's ``SchedulerPopFromBackoffQ`` (on by default since 1.33): when activeQ is empty, ``pop`` takes the pod
  of backoffQ whose backoff ends first (ties: activeQ's order), unless it is there after an error (kube's
  podErrorBackoffQ: those wait their backoff out). Unlike kube, backoff ends are not aligned to 1-second windows.
- A pod no node fits waits among the unschedulable pods until a cluster event that could help it (one of the
  events registered by the plugins that rejected it, and, per object, their queueing hint answers QUEUE: kube's
  ``QueueingHintFn``) or 5 minutes at the latest; it then goes back to activeQ, or to backoffQ if its backoff has
  not expired yet.
- A refusal that can lift with time alone (``Rejection.retry_after``: a load annotation turning stale, a recent
  binding's estimate leaving its window) also retries the pod at that time, a queueing hint with a time, not
  sooner than ``MIN_TIMED_RETRY`` after the attempt (no busy loop on a refusal about to lift).

Pure and single-threaded: time is always an argument, so tests drive it without sleeping. Changes are collected
and applied on the next ``pop``/``flush``, so a burst of node updates costs one pass over the unschedulable pods.
When a pass would cost more than ``hint_budget`` hint calls (many unschedulable pods times many changes), or a
change came without its objects, the kinds concerned wake every pod that registered them, as before hints: more
wake-ups than kube, never fewer.

``hold_back`` is a group-level hint on top of the per-plugin ones: of the pods a pass would move, it names those that
stay (a gang whose group cannot be placed yet, ``gangcycle.futile_wakeups``), judged once per pass.

``gated`` is kube's PreEnqueue check: a gated pod (a preemptor whose victims are not gone yet, a gang member whose
group is incomplete) stays among the unschedulable pods when an event, its backoff or the 5-minute flush would move
it, until it is activated; ``on_gated`` hears of a pod held on entry (``add``) or on ``activate`` (and may name
the gating plugin as its rejector, kube's ``GatingPlugin``: then only that plugin's events look at it again).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from crane_scheduler.framework.types import ClusterChange, ClusterEvent, QueuedPod, QueueingHint, QueueingHints
from crane_scheduler.podinfo import PodInfo

DEFAULT_INITIAL_BACKOFF = 1.0
DEFAULT_MAX_BACKOFF = 10.0
MAX_UNSCHEDULABLE_DURATION = 300.0
HINT_BUDGET = 5_000  # hint calls per pass (a few µs each) before the pass falls back to per-kind wake-ups
NO_HINTS: QueueingHints = {}
MIN_TIMED_RETRY = 1.0
"""seconds: the soonest a timed retry comes after the attempt it follows"""


class SchedulingQueue:
    def __init__(
        self,
        sort_key: Callable[[QueuedPod], tuple[Any, ...]],
        *,
        initial_backoff: float = DEFAULT_INITIAL_BACKOFF,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
        max_unschedulable: float = MAX_UNSCHEDULABLE_DURATION,
        events_of: Callable[[str], ClusterEvent] = lambda plugin: ClusterEvent.ALL,
        hints_of: Callable[[str, str], QueueingHints] = lambda profile, plugin: NO_HINTS,
        hint_budget: int = HINT_BUDGET,
        on_hint_error: Callable[[str, BaseException], None] = lambda plugin, err: None,
        on_incoming: Callable[[str, str], None] = lambda event, queue: None,
        on_hint_skip: Callable[[str], None] = lambda plugin: None,
        gated: Callable[[PodInfo], bool] = lambda pod: False,
        hold_back: Callable[[list[PodInfo]], set[str]] = lambda pods: set(),
        on_gated: Callable[[QueuedPod], None] = lambda qp: None,
        pop_from_backoff: bool = True,
    ) -> None:
        self._sort_key = sort_key
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.max_unschedulable = max_unschedulable
        self._events_of = events_of
        self._hints_of = hints_of
        self.hint_budget = hint_budget
        self._on_hint_error = on_hint_error
        self._on_incoming = on_incoming
        self._on_hint_skip = on_hint_skip
        self._gated = gated
        self._hold_back = hold_back
        self._on_gated = on_gated
        self.pop_from_backoff = pop_from_backoff
        self._seq = itertools.count()
        self._active_heap: list[tuple[tuple[Any, ...], int, str]] = []
        self._active: dict[str, tuple[int, QueuedPod]] = {}  # uid -> (heap entry seq, pod)
        self._backoff_heap: list[tuple[float, int, str]] = []
        self._backoff: dict[str, tuple[int, QueuedPod]] = {}
        # backoffQ's pods that are there after an unschedulable attempt (not an error): what ``pop`` may take
        # early, in (backoff end, activeQ's order)
        self._early_heap: list[tuple[float, tuple[Any, ...], int, str]] = []
        self.unschedulable: dict[str, QueuedPod] = {}
        self._pending_events = ClusterEvent(0)  # every kind seen since the last pass
        self._coarse_events = ClusterEvent(0)  # kinds seen without their objects: no hint can judge them
        self._pending_changes: list[ClusterChange] = []
        self._timed: list[tuple[float, int, str]] = []  # (retry_at, seq, uid) of unschedulable pods with a time

    # ------------------------------------------------------------------------------------------ sizes

    @property
    def active_len(self) -> int:
        return len(self._active)

    @property
    def backoff_len(self) -> int:
        return len(self._backoff)

    def __contains__(self, uid: object) -> bool:
        return uid in self._active or uid in self._backoff or uid in self.unschedulable

    def __len__(self) -> int:
        return len(self._active) + len(self._backoff) + len(self.unschedulable)

    # ------------------------------------------------------------------------------------------ informer side

    def add(self, pod: PodInfo, now: float) -> None:
        """A new pending pod goes straight to activeQ, unless a PreEnqueue plugin gates it."""
        if pod.uid in self:
            self.update(pod, now)
            return
        qp = QueuedPod(pod, timestamp=now)
        if self._gated(pod):  # kube runs PreEnqueue before activeQ (a claim not created yet): wait unschedulable
            qp.unschedulable_since = now
            self.unschedulable[pod.uid] = qp
            self._on_gated(qp)
            return
        self._push_active(qp)

    def update(self, pod: PodInfo, now: float) -> None:
        """The pending pod changed: refresh it in place; an unschedulable pod whose spec changed is retried."""
        if (entry := self._active.get(pod.uid)) is not None:
            qp = entry[1]
            changed_order = qp.pod.priority != pod.priority
            qp.pod = pod
            if changed_order:
                self._push_active(qp)
        elif (entry := self._backoff.get(pod.uid)) is not None:
            entry[1].pod = pod
        elif (qp_u := self.unschedulable.get(pod.uid)) is not None:
            # kube's UpdatePodGeneratedResourceClaim: the resourceclaim controller named the pod's claims
            changed = not qp_u.pod.spec_equal(pod) or _claim_statuses(qp_u.pod) != _claim_statuses(pod)
            qp_u.pod = pod
            if changed:
                del self.unschedulable[pod.uid]
                self._requeue(qp_u, now)
        else:
            self.add(pod, now)

    def delete(self, uid: str) -> None:
        self._active.pop(uid, None)
        self._backoff.pop(uid, None)
        self.unschedulable.pop(uid, None)

    def on_event(self, event: ClusterEvent, change: ClusterChange | None = None) -> None:
        """Remember a cluster event (with its objects when ``change`` is given, for the plugins' queueing hints);
        unschedulable pods it may help move on the next pop/flush."""
        if not self.unschedulable:
            return
        self._pending_events |= event
        if change is None:
            self._coarse_events |= event
        elif not self._coarse_events & event:
            self._pending_changes.append(change)

    # ------------------------------------------------------------------------------------------ scheduler side

    def pop(self, now: float) -> QueuedPod | None:
        """The next pod to schedule (its attempt counted), or None when activeQ is empty."""
        self.flush_backoff(now)
        self._apply_events(now)
        self.flush_timed(now)
        while self._active_heap:
            _, seq, uid = heapq.heappop(self._active_heap)
            entry = self._active.get(uid)
            if entry is None or entry[0] != seq:
                continue  # stale heap entry (deleted or re-pushed)
            del self._active[uid]
            qp = entry[1]
            return self._popped(qp, now)
        if self.pop_from_backoff:
            return self._pop_backoff(now)
        return None

    def _popped(self, qp: QueuedPod, now: float) -> QueuedPod:
        qp.attempts += 1
        if qp.initial_attempt is None:
            qp.initial_attempt = now
        return qp

    def _pop_backoff(self, now: float) -> QueuedPod | None:
        """activeQ is empty: the unschedulable-backoff pod whose backoff ends first (a gated one goes back among
        the unschedulable pods instead, as kube runs PreEnqueue on entering backoffQ)."""
        while self._early_heap:
            _, _, seq, uid = heapq.heappop(self._early_heap)
            entry = self._backoff.get(uid)
            if entry is None or entry[0] != seq:
                continue  # stale: left backoffQ, or re-entered it
            del self._backoff[uid]
            qp = entry[1]
            if self._gated(qp.pod):
                self.unschedulable[uid] = qp
                continue
            self._on_incoming("PopFromBackoffQ", "active")
            return self._popped(qp, now)
        return None

    def add_unschedulable(
        self, qp: QueuedPod, rejectors: frozenset[str], now: float, retry_after: float | None = None
    ) -> None:
        """No node fits: wait for an event registered by one of ``rejectors`` (or 5 minutes), or ``retry_after``
        seconds (at least ``MIN_TIMED_RETRY``) when a refusal can lift with time alone."""
        qp.rejectors = rejectors
        qp.timestamp = now
        qp.unschedulable_since = now
        qp.retry_at = None if retry_after is None else now + max(retry_after, MIN_TIMED_RETRY)
        self.unschedulable[qp.pod.uid] = qp
        if qp.retry_at is not None:
            heapq.heappush(self._timed, (qp.retry_at, next(self._seq), qp.pod.uid))

    def flush_timed(self, now: float) -> None:
        """Unschedulable pods whose refusal could have lifted by ``now`` (their ``retry_at``) are retried, as an
        event that helps them would retry them; a gated one waits for its activation."""
        while self._timed and self._timed[0][0] <= now:
            at, _, uid = heapq.heappop(self._timed)
            qp = self.unschedulable.get(uid)
            if qp is None or qp.retry_at != at or self._gated(qp.pod):
                continue  # left meanwhile, failed again since (a newer entry), or held back by PreEnqueue
            del self.unschedulable[uid]
            qp.retry_at = None
            self._on_incoming("TimedRetry", self._requeue(qp, now))

    def next_timed_retry(self) -> float | None:
        """The earliest pending timed retry (stale entries dropped), for the loop's wake-up."""
        while self._timed:
            at, _, uid = self._timed[0]
            qp = self.unschedulable.get(uid)
            if qp is not None and qp.retry_at == at:
                return at
            heapq.heappop(self._timed)
        return None

    def add_backoff(self, qp: QueuedPod, now: float) -> None:
        """An error (bind failure, plugin error): retry after the pod's backoff."""
        qp.timestamp = now
        self._requeue(qp, now, error=True)

    def backoff_duration(self, attempts: int) -> float:
        if attempts <= 0:
            return 0.0
        return min(self.initial_backoff * 2.0 ** (attempts - 1), self.max_backoff)

    def backoff_expiry(self, qp: QueuedPod) -> float:
        return qp.timestamp + self.backoff_duration(qp.attempts)

    def flush_backoff(self, now: float) -> None:
        while self._backoff_heap and self._backoff_heap[0][0] <= now:
            _, seq, uid = heapq.heappop(self._backoff_heap)
            entry = self._backoff.get(uid)
            if entry is None or entry[0] != seq:
                continue
            del self._backoff[uid]
            qp = entry[1]
            if self._gated(qp.pod):
                self.unschedulable[uid] = qp
            else:
                self._push_active(qp)

    def flush_unschedulable(self, now: float) -> None:
        """Pods unschedulable for longer than 5 minutes are retried regardless of events."""
        expired = [qp for qp in self.unschedulable.values() if now - qp.unschedulable_since > self.max_unschedulable]
        for qp in expired:
            del self.unschedulable[qp.pod.uid]
            self._requeue(qp, now)

    def activate(self, uid: str) -> bool:
        """kube's ``Activate``: an unschedulable or backing-off pod goes straight to activeQ (preemption calls it
        once the preemptor's victims are gone, so the pod does not sit out a backoff it did not earn). A gated pod
        stays where it is."""
        qp = self.unschedulable.get(uid)
        if qp is None:
            entry = self._backoff.get(uid)
            qp = entry[1] if entry is not None else None
        if qp is None:
            return False
        if self._gated(qp.pod):
            self._on_gated(qp)
            return False
        self.unschedulable.pop(uid, None)
        self._backoff.pop(uid, None)
        self._push_active(qp)
        return True

    def take(self, uid: str, now: float) -> QueuedPod | None:
        """Take a given pod out of wherever it waits, its attempt counted (a gang's sibling scheduled with the
        member just popped); None when it is not queued."""
        entry = self._active.pop(uid, None) or self._backoff.pop(uid, None)
        qp = entry[1] if entry is not None else self.unschedulable.pop(uid, None)
        return None if qp is None else self._popped(qp, now)

    def next_backoff_expiry(self) -> float | None:
        while self._backoff_heap:
            expiry, seq, uid = self._backoff_heap[0]
            entry = self._backoff.get(uid)
            if entry is not None and entry[0] == seq:
                return float(expiry)
            heapq.heappop(self._backoff_heap)
        return None

    # ------------------------------------------------------------------------------------------ internals

    def _push_active(self, qp: QueuedPod) -> None:
        seq = next(self._seq)
        self._active[qp.pod.uid] = (seq, qp)
        heapq.heappush(self._active_heap, (self._sort_key(qp), seq, qp.pod.uid))

    def _requeue(self, qp: QueuedPod, now: float, *, error: bool = False) -> str:
        """Back to activeQ, or to backoffQ while the pod's backoff lasts (``error``: after an error, so ``pop``
        does not take it early), or kept unschedulable while gated; returns which."""
        if self._gated(qp.pod):
            self.unschedulable[qp.pod.uid] = qp
            return "gated"
        expiry = self.backoff_expiry(qp)
        if expiry <= now:
            self._push_active(qp)
            return "active"
        seq = next(self._seq)
        self._backoff[qp.pod.uid] = (seq, qp)
        heapq.heappush(self._backoff_heap, (expiry, seq, qp.pod.uid))
        if not error:
            if len(self._early_heap) > 2 * len(self._backoff) + 64:  # mostly stale (flushed, activated): rebuild
                self._early_heap = [e for e in self._early_heap if self._backoff.get(e[3], (None,))[0] == e[2]]
                heapq.heapify(self._early_heap)
            heapq.heappush(self._early_heap, (expiry, self._sort_key(qp), seq, qp.pod.uid))
        return "backoff"

    def _apply_events(self, now: float) -> None:
        events, self._pending_events = self._pending_events, ClusterEvent(0)
        coarse, self._coarse_events = self._coarse_events, ClusterEvent(0)
        changes, self._pending_changes = self._pending_changes, []
        if not events:
            return
        if len(changes) * len(self.unschedulable) > self.hint_budget:
            coarse = events
        changes = [c for c in changes if not c.event & coarse]
        moved: list[tuple[QueuedPod, ClusterEvent]] = []
        for qp in self.unschedulable.values():
            event = self._helps(qp, events, coarse, changes)
            if event and not self._gated(qp.pod):
                moved.append((qp, event))
        held = self._hold_back([qp.pod for qp, _ in moved]) if moved else set()
        for qp, event in moved:
            if qp.pod.uid in held:
                continue
            del self.unschedulable[qp.pod.uid]
            self._on_incoming(_event_name(event), self._requeue(qp, now))

    def _helps(
        self, qp: QueuedPod, events: ClusterEvent, coarse: ClusterEvent, changes: list[ClusterChange]
    ) -> ClusterEvent:
        """kube's ``isPodWorthRequeuing``: some rejector registered one of the events and, for a change with its
        objects, that rejector's hint for it answers QUEUE (a hint that raises counts as QUEUE, as in kube).
        Returns the event that moves the pod, or an empty flag."""
        if not qp.rejectors:  # e.g. no nodes at all: anything may help
            return events
        for plugin in qp.rejectors:
            registered = self._events_of(plugin)
            if not registered & events:
                continue
            if registered & coarse:
                return registered & coarse
            hints = self._hints_of(qp.pod.scheduler_name, plugin)
            for change in changes:
                if not registered & change.event:
                    continue
                hint = next((fn for kinds, fn in hints.items() if kinds & change.event), None)
                if hint is None:
                    return change.event
                try:
                    answer = hint(qp.pod, change)
                except Exception as err:  # a broken hint must not strand the pod (kube: Queue)
                    self._on_hint_error(plugin, err)
                    return change.event
                if answer is QueueingHint.QUEUE:
                    return change.event
                self._on_hint_skip(plugin)
        return ClusterEvent(0)


def _event_name(event: ClusterEvent) -> str:
    """A metric label: the event's name, or its kinds joined by ``|`` when several moved the pod at once."""
    return event.name or "|".join(e.name or "" for e in ClusterEvent if e in event and e is not ClusterEvent.ALL)


def _claim_statuses(pod: PodInfo) -> Any:
    return (pod.raw.get("status") or {}).get("resourceClaimStatuses")
