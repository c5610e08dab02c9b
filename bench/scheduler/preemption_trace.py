"""Where a PreemptionBasic preemptor waits, as the API server shows it: a watch on the preemptors' and the victims'
namespaces records, per preemptor, when its nomination, its victims' ``DisruptionTarget`` condition and deletion,
and its binding appear, for either scheduler alike (``python -m bench.scheduler.preemption --trace``).

The summary gives the phases' percentiles (nomination -> victim's condition -> victim gone -> bound) and the
time by which a share of the preemptors reached each step: when the nominations are all done long before the
binds, the second half of the pod's life (the scheduler seeing its victims go, retrying it, binding it) sets the
pace; when they trail like the binds, the first attempts do.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from crane_shared.informer import EventType, Informer


@dataclass
class Preemptor:
    created: float = float("nan")
    nominated: float = float("nan")
    nominations: list[str] = field(default_factory=list)
    unschedulable: float = float("nan")  # PodScheduled=False first seen (the first attempt reported)
    bound: float = float("nan")
    node: str = ""


@dataclass
class Victim:
    node: str
    condition: float = float("nan")  # DisruptionTarget first seen
    gone: float = float("nan")  # deletionTimestamp or DELETED first seen


class PreemptionTrace:
    """Watches ``high`` (preemptors) and ``low`` (victims); times are ``time.monotonic()`` of the bench process."""

    def __init__(self, api: client.ApiClient, high: str, low: str) -> None:
        core = client.CoreV1Api(api)
        self.preemptors: dict[str, Preemptor] = {}
        self.victims: dict[str, Victim] = {}
        self.start = float("nan")

        async def list_high(**kw: Any) -> Any:
            return await core.list_namespaced_pod(high, **kw)

        async def list_low(**kw: Any) -> Any:
            return await core.list_namespaced_pod(low, **kw)

        self.informers = [Informer("trace-high", list_high, self._high), Informer("trace-low", list_low, self._low)]
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> PreemptionTrace:
        self._tasks = [asyncio.create_task(i.run(self._stopping)) for i in self.informers]
        for informer in self.informers:
            await informer.synced.wait()
        self.start = time.monotonic()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stopping.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _high(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        now = time.monotonic()
        p = self.preemptors.setdefault(obj["metadata"]["name"], Preemptor(created=now))
        status = obj.get("status") or {}
        nominated = status.get("nominatedNodeName") or ""
        if nominated and (not p.nominations or p.nominations[-1] != nominated):
            p.nominations.append(nominated)
            if p.nominated != p.nominated:
                p.nominated = now
        if p.unschedulable != p.unschedulable:
            for cond in status.get("conditions") or ():
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    p.unschedulable = now
        node = (obj.get("spec") or {}).get("nodeName")
        if node and p.bound != p.bound:
            p.bound, p.node = now, node

    def _low(self, kind: EventType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        now = time.monotonic()
        v = self.victims.setdefault(obj["metadata"]["name"], Victim((obj.get("spec") or {}).get("nodeName") or ""))
        if v.condition != v.condition:
            for cond in (obj.get("status") or {}).get("conditions") or ():
                if cond.get("type") == "DisruptionTarget":
                    v.condition = now
        if v.gone != v.gone and (kind == "DELETED" or (obj.get("metadata") or {}).get("deletionTimestamp")):
            v.gone = now

    # ------------------------------------------------------------------------------------------ summary

    def summary(self) -> str:
        """Phase percentiles (ms) and the time (s, from the first nomination) by which shares of the preemptors
        reached each step."""
        gone_by_node: dict[str, list[float]] = {}
        for v in self.victims.values():
            if v.gone == v.gone:
                gone_by_node.setdefault(v.node, []).append(v.gone)
        phases: dict[str, list[float]] = {"nominated -> victim gone": [], "victim gone -> bound": []}
        steps: dict[str, list[float]] = {"nominated": [], "victim gone": [], "bound": []}
        for p in self.preemptors.values():
            if p.nominated == p.nominated:
                steps["nominated"].append(p.nominated)
            if p.bound != p.bound:
                continue
            steps["bound"].append(p.bound)
            gone = [t for t in gone_by_node.get(p.node, ()) if t <= p.bound]
            if gone:
                steps["victim gone"].append(max(gone))
                phases["victim gone -> bound"].append(p.bound - max(gone))
                if p.nominated == p.nominated:
                    phases["nominated -> victim gone"].append(max(gone) - p.nominated)
        origin = min(steps["nominated"], default=self.start)
        conds = [v.condition - v.gone for v in self.victims.values() if v.condition == v.condition == v.gone == v.gone]
        lines = [f"    {name:26s} {_percentiles([x * 1e3 for x in xs])} ms" for name, xs in phases.items()]
        if conds:
            lines.append(f"    {'victim condition -> gone':26s} {_percentiles([-x * 1e3 for x in conds])} ms")
        renominated = sum(1 for p in self.preemptors.values() if len(p.nominations) > 1)
        lines.append(f"    preemptors nominated to more than one node: {renominated}")
        lines.append("    seconds from the first nomination until   10%     50%     90%    100% of the preemptors:")
        n = len(self.preemptors)
        for name, ts in steps.items():
            ts = sorted(t - origin for t in ts)
            cells = [f"{ts[min(len(ts), max(1, round(q * n))) - 1]:7.2f}" if ts else "      -" for q in _QS]
            lines.append(f"      {name:16s} {' '.join(cells)}   ({len(ts)}/{n})")
        return "\n".join(lines)

    def dump(self, path: Path) -> None:
        data = {
            "preemptors": {k: vars(v) for k, v in self.preemptors.items()},
            "victims": {k: vars(v) for k, v in self.victims.items()},
        }
        path.write_text(json.dumps(data, default=float))


_QS = (0.1, 0.5, 0.9, 1.0)


def _percentiles(xs: list[float]) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    at = [xs[min(len(xs) - 1, int(q * len(xs)))] for q in (0.1, 0.5, 0.9)]
    return f"p10 {at[0]:7.1f}  p50 {at[1]:7.1f}  p90 {at[2]:7.1f}  max {xs[-1]:7.1f}  mean {statistics.fmean(xs):7.1f}"
