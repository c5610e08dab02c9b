"""What every gang plugin keeps about its waiting groups (Coscheduling, GangScheduling): which members wait, since
when, until when a group is held back, and the metrics; kube's wording for a wait that timed out.

A group waits when a gang cycle did not meet its quorum (nothing of it is assumed meanwhile). Its wait starts at the
first such cycle in which some member fit; past the group's timeout its members hear kube's waiting-pod rejection
(``rejected due to timeout after waiting <d> at plugin <P>``) and a new wait starts. The timeout has no cap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

from crane_scheduler import framework as fwk
from crane_shared.durations import format_duration


def go_duration(seconds: float) -> str:
    """Go's ``time.Duration.String()`` (``1m0s``, ``1h0m0s``, ``2.5s``): kube prints waits this way."""
    short = format_duration(timedelta(seconds=seconds))
    if "h" in short and "m" not in short:
        short = short.replace("h", "h0m", 1)
    if ("h" in short or "m" in short) and not short.endswith("s"):
        short += "0s"
    return short


def timed_out(waited: float, plugin: str) -> str:
    """kube's rejection of a pod whose wait at Permit timed out."""
    return f"rejected due to timeout after waiting {go_duration(waited)} at plugin {plugin}"


class GangMetrics:
    """The gang families, shared by every gang plugin (labelled by plugin)."""

    def __init__(self, metrics: fwk.PluginMetrics, plugin: str) -> None:
        self.waiting = metrics.gauge(
            "crane_scheduler_gangs_waiting", "Groups waiting for room for their quorum", ["plugin"]
        ).labels(plugin)
        self.placed = metrics.counter(
            "crane_scheduler_gangs_placed_total",
            "Gang cycles that met their group's quorum (members assumed and bound)",
            ["plugin"],
        ).labels(plugin)
        self.timed_out = metrics.counter(
            "crane_scheduler_gangs_timed_out_total",
            "Groups that waited longer than their timeout (their members rejected, a new wait started)",
            ["plugin"],
        ).labels(plugin)


class GangWaits:
    """One gang plugin's waiting groups; time is the handle's clock."""

    def __init__(self, handle: fwk.Handle, plugin: str) -> None:
        self.handle = handle
        self.plugin = plugin
        self.metrics = GangMetrics(handle.metrics, plugin)
        self.waiting: dict[str, set[str]] = {}
        """group -> members waiting: activated when the group changes or its wait ends"""
        self.since: dict[str, float] = {}
        self.backoff_until: dict[str, float] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def hold(self, gang: str, uid: str) -> None:
        """A member refused by the plugin itself (group unknown, too few members, held back)."""
        self.waiting.setdefault(gang, set()).add(uid)
        self.metrics.waiting.set(len(self.waiting))

    def backed_off(self, gang: str) -> bool:
        return self.backoff_until.get(gang, 0.0) > self.handle.clock()

    def placed(self, gang: str) -> None:
        self.since.pop(gang, None)
        self.settled(gang)
        self.metrics.placed.inc()

    def wait(
        self, gang: str, uids: Sequence[str], message: str, feasible: int, timeout: float | None, backoff: float = 0.0
    ) -> fwk.GangWait:
        """A gang cycle that did not meet the quorum: ``uids`` wait; ``message`` is what the members that fit hear
        until the group has waited ``timeout`` seconds (None: no timeout; a cycle where nothing fit starts none)."""
        now = self.handle.clock()
        self.waiting[gang] = set(uids)  # the group's pending members now (deleted ones drop out)
        self.metrics.waiting.set(len(self.waiting))
        held = None if self.backed_off(gang) else self._back_off(gang, now, backoff)  # never renewed while held
        if timeout is None or feasible == 0:
            return self._retry(gang, fwk.GangWait(message, held))
        since = self.since.setdefault(gang, now)
        if now - since >= timeout:
            self.since[gang] = now  # a new wait begins
            self.metrics.timed_out.inc()
            return self._retry(gang, fwk.GangWait(timed_out(timeout, self.plugin), held or float(timeout), True))
        left = since + timeout - now
        return self._retry(gang, fwk.GangWait(message, min(left, held) if held else left))

    def _retry(self, gang: str, wait: fwk.GangWait) -> fwk.GangWait:
        """One timer per group: the group's members are activated when its backoff or wait ends (so a timeout is
        reported on time, without a cluster event)."""
        if wait.retry_after is None:  # a timer already set (a backoff's end, a deadline) stays
            return wait
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a pure test): the caller retries
            return wait
        old = self._timers.pop(gang, None)
        if old is not None:
            old.cancel()
        self._timers[gang] = loop.call_later(wait.retry_after, self._fire, gang)
        return wait

    def _fire(self, gang: str) -> None:
        self._timers.pop(gang, None)
        self.activate(gang)

    def _back_off(self, gang: str, now: float, seconds: float) -> float | None:
        if seconds <= 0:
            return None
        self.backoff_until[gang] = now + seconds
        return seconds

    def activate(self, gang: str) -> None:
        """Retry the group's waiting members now."""
        for uid in sorted(self.waiting.get(gang, ())):
            self.handle.activate(uid)

    def settled(self, gang: str) -> None:
        """The group has no pending member left: it waits no more (the gauge drops it)."""
        self.waiting.pop(gang, None)
        self.metrics.waiting.set(len(self.waiting))
        timer = self._timers.pop(gang, None)
        if timer is not None:
            timer.cancel()

    def forget(self, gang: str) -> None:
        """The group's definition went away (its members wait on as refused ones)."""
        self.since.pop(gang, None)
        self.backoff_until.pop(gang, None)
