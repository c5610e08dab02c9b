"""The autoscaling scenario, pure: the load over time, the HPA that follows it, what each pod uses.

One service ("app", a Deployment) carries a total CPU demand ``work(t)`` in cores: ``base`` while the cluster
warms up, ``surge`` during the surge, ``base`` again once it falls back. A HorizontalPodAutoscaler-like rule sizes
the Deployment to ``ceil(work / target)`` replicas (``target``: the CPU each replica is meant to carry), at once
upwards and after a stabilization window downwards, as kube's HPA does (its ``scaleDown`` window). The demand is
shared by the replicas that run: each uses ``work / running`` cores, at most its CPU limit (a pod cannot use more;
demand above that goes unserved). So when the surge hits, every running replica, and every node, gets hotter at
once; the replicas the HPA adds bring the per-pod usage back to ``target`` only once they run.

Kept apart from the live run (``bench.autoscale.live``) so it is unit-tested without a sandbox.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Literal

Phase = Literal["warm", "surge", "fall"]
PHASES: tuple[Phase, ...] = ("warm", "surge", "fall")


@dataclass(frozen=True)
class Scenario:
    """Every size and duration of one run (``--smoke``: ``Scenario.smoke()``, seconds instead of minutes)."""

    nodes: int = 2
    """the sandbox's own nodes (8 CPUs each, 10 % base load; Karpenter never removes them)"""
    warm_s: float = 60.0
    surge_s: float = 180.0
    fall_s: float = 420.0
    base_work: float = 6.0
    """the service's CPU demand in cores outside the surge (15 replicas: the two nodes at 47 %, under the taint)"""
    surge_work: float = 32.0
    pod_cpu_request: float = 0.5
    pod_cpu_limit: float = 1.0
    pod_memory_request: str = "512Mi"
    pod_memory_usage: str = "256Mi"
    target: float = 0.4
    """the HPA's target CPU per replica (80 % of the request; 5 % of a node: under the gap between the sandbox's
    load taint, 0.6, and the Filter's 0.65, so a node the Filter refuses for one more replica is tainted)"""
    min_replicas: int = 2
    max_replicas: int = 120
    hpa_period_s: float = 5.0
    scale_down_window_s: float = 30.0
    tick_s: float = 2.0
    """how often the bench applies the HPA, sets the pods' usage and samples the cluster"""
    max_nodes: int = 10
    """the NodePool's limit: at most this many nodes added"""
    consolidate_after: str = "30s"
    """the NodePool's ``consolidateAfter``: how long a node stays empty before Karpenter removes it"""
    consolidation_policy: str = "WhenEmpty"

    def __post_init__(self) -> None:
        for name in ("warm_s", "surge_s", "fall_s", "tick_s", "hpa_period_s", "target", "pod_cpu_request"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 < self.base_work <= self.surge_work:
            raise ValueError(f"need 0 < base_work <= surge_work, got {self.base_work} and {self.surge_work}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if self.nodes < 1 or self.max_nodes < 1:
            raise ValueError("nodes and max_nodes must be at least 1")

    @classmethod
    def smoke(cls) -> Scenario:
        """A run of about a minute per variant: one node, a surge that needs one more, a short fall."""
        return cls(
            nodes=1,
            warm_s=5.0,
            surge_s=30.0,
            fall_s=30.0,
            base_work=2.4,
            surge_work=7.2,
            max_replicas=24,
            hpa_period_s=2.0,
            scale_down_window_s=5.0,
            tick_s=1.0,
            max_nodes=2,
            consolidate_after="5s",
        )

    def scaled(self, factor: float) -> Scenario:
        """The same scenario with every duration multiplied by ``factor`` (the demand and sizes unchanged)."""
        return replace(
            self,
            warm_s=self.warm_s * factor,
            surge_s=self.surge_s * factor,
            fall_s=self.fall_s * factor,
        )

    @property
    def duration_s(self) -> float:
        return self.warm_s + self.surge_s + self.fall_s

    @property
    def surge_start(self) -> float:
        return self.warm_s

    @property
    def fall_start(self) -> float:
        return self.warm_s + self.surge_s

    def phase(self, t: float) -> Phase:
        if t < self.surge_start:
            return "warm"
        if t < self.fall_start:
            return "surge"
        return "fall"

    def work(self, t: float) -> float:
        """The service's CPU demand (cores) at ``t`` seconds into the run."""
        return self.surge_work if self.phase(t) == "surge" else self.base_work

    def recommended(self, work: float) -> int:
        """The HPA's raw recommendation for ``work``: enough replicas to carry it at ``target`` each."""
        return min(self.max_replicas, max(self.min_replicas, math.ceil(round(work / self.target, 9))))

    @property
    def initial_replicas(self) -> int:
        return self.recommended(self.base_work)


def pod_usage(work: float, running: int, limit: float) -> float:
    """The cores each of ``running`` replicas uses when they share ``work`` evenly, at most ``limit`` each;
    rounded to the millicore (the annotation's precision)."""
    if running <= 0:
        return 0.0
    return round(min(limit, work / running), 3)


def usage_annotation(cpu: float, memory: str) -> str:
    """The sandbox's ``sandbox.crane.io/usage`` value for ``cpu`` cores and ``memory``."""
    return f"cpu={round(cpu * 1000)}m,memory={memory}"


@dataclass
class Hpa:
    """kube's HPA in small: a recommendation every ``period_s``; upwards at once, downwards to the highest
    recommendation of the last ``window_s`` (the scale-down stabilization window), so a brief dip never removes
    replicas."""

    scenario: Scenario
    replicas: int = 0
    _history: deque[tuple[float, int]] = field(default_factory=deque)
    _last: float | None = None

    def __post_init__(self) -> None:
        if self.replicas <= 0:
            self.replicas = self.scenario.initial_replicas

    def desired(self, t: float) -> int:
        """The replicas at ``t`` (call with a non-decreasing ``t``); changes only on a period boundary."""
        if self._last is not None and t - self._last < self.scenario.hpa_period_s:
            return self.replicas
        self._last = t
        raw = self.scenario.recommended(self.scenario.work(t))
        self._history.append((t, raw))
        while self._history and self._history[0][0] < t - self.scenario.scale_down_window_s:
            self._history.popleft()
        if raw >= self.replicas:
            self.replicas = raw
        else:
            self.replicas = max(r for _, r in self._history)
        return self.replicas
