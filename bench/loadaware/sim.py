"""A virtual-time replay of the seed experiment: three nodes, replicas added one by one, three schedulers.

The decisions are made by the real scheduler (``crane_scheduler.simulate``: the built-in plugins and ``Dynamic``,
each placed replica assumed and reserved as the scheduler's cycle does); only the world around it is simulated,
second by second on a virtual clock:

- real usage of a node = its base load + the real usage of the replicas on it;
- Prometheus: ``*_avg_5m`` is the mean of real usage over the last 5 minutes, ``*_max_avg_1h|1d`` the maximum of
  that mean over the last hour/day (as the recording rules);
- the annotator stamps each metric every sync period (3m / 15m / 3h, the default policy) and the hot value:
  upstream recomputes it only after a metric sync (every 3m), ours every 15 s from the binding records.

Strategies: ``requests`` (kube-scheduler's default plugins only), ``upstream`` (plus Dynamic with upstream's
behaviour: no own bindings, no estimates, hot value every 3m), ``ours`` (Dynamic as shipped).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from crane_scheduler.simulate import Simulator
from crane_shared.annotations import encode_hot_value, encode_usage
from crane_shared.hotvalue import hot_value
from crane_shared.policy import default_policy

GI = 1024**3
THRESHOLD = 0.65
POLICY = default_policy()


@dataclass(frozen=True)
class Service:
    name: str
    real_cpu: float
    real_mem_gi: float
    req_cpu: float
    req_mem_gi: float


MEMORY_HEAVY = Service("memory-heavy", 2, 20, 5, 40)
CPU_HEAVY = Service("cpu-heavy", 8, 8, 12, 12)


@dataclass
class SimNode:
    name: str
    cpu: float
    mem_gi: float
    base_cpu: float
    base_mem: float
    requested_cpu: float = 0.0  # requests of pods already there (not ours)
    requested_mem_gi: float = 0.0
    replicas: list[float] = field(default_factory=list)  # bind times of our replicas
    history: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=86_400 // 15 + 1))

    def real(self, svc: Service) -> tuple[float, float]:
        n = len(self.replicas)
        return (
            min(1.0, self.base_cpu + n * svc.real_cpu / self.cpu),
            min(1.0, self.base_mem + n * svc.real_mem_gi / self.mem_gi),
        )


def three_nodes() -> list[SimNode]:
    """Uneven real load that requests do not show: node-3 is busiest in reality but has the fewest requests."""
    return [
        SimNode("node-1", 48, 192, base_cpu=0.10, base_mem=0.15, requested_cpu=16, requested_mem_gi=64),
        SimNode("node-2", 48, 192, base_cpu=0.20, base_mem=0.25, requested_cpu=8, requested_mem_gi=32),
        SimNode("node-3", 48, 192, base_cpu=0.35, base_mem=0.45, requested_cpu=0, requested_mem_gi=0),
    ]


def _node_obj(n: SimNode, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": n.name, "labels": {"kubernetes.io/hostname": n.name}, "annotations": annotations},
        "spec": {},
        "status": {"allocatable": {"cpu": str(n.cpu), "memory": f"{int(n.mem_gi)}Gi", "pods": "110"}},
    }


def _pod_obj(name: str, cpu: float, mem_gi: float, node: str = "") -> dict[str, Any]:
    requests = {"cpu": str(cpu), "memory": f"{mem_gi}Gi"}
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": "crane-scheduler",
            "nodeName": node or None,
            "containers": [{"name": "c", "image": "stress", "resources": {"requests": requests}}],
        },
    }


@dataclass
class Outcome:
    strategy: str
    service: str
    placed: int
    before_overload: int | None
    """replicas placed while every node stayed under the threshold; None: no node ever went over"""
    final_cpu: list[float]
    final_mem: list[float]
    per_node: list[int]
    first_unschedulable: str = ""

    @property
    def peak(self) -> float:
        return max(self.final_mem if self.service == MEMORY_HEAVY.name else self.final_cpu)

    @property
    def spread(self) -> float:
        used = self.final_mem if self.service == MEMORY_HEAVY.name else self.final_cpu
        return max(used) - min(used)

    @property
    def stdev(self) -> float:
        used = self.final_mem if self.service == MEMORY_HEAVY.name else self.final_cpu
        return statistics.pstdev(used)


def run(
    strategy: str, svc: Service, *, replicas: int = 20, interval: float = 60.0, settle: float = 1800.0, seed: int = 0
) -> Outcome:
    """Scale a Deployment to ``replicas``, one more every ``interval`` seconds (as the experiment did); pending
    replicas are retried every interval until ``settle`` seconds after the last one was created."""
    nodes = three_nodes()
    clock = [1_800_000_000.0]
    own = strategy == "ours"
    load_aware = strategy != "requests"
    enabled = [{"name": "Dynamic", "weight": 3}] if load_aware else []
    args = {} if own else {"ownBindingsInHotValue": False, "estimate": {"enabled": False}}
    config = {
        "profiles": [
            {
                "schedulerName": "crane-scheduler",
                "plugins": {"multiPoint": {"enabled": enabled}},
                "pluginConfig": [{"name": "Dynamic", "args": args}] if enabled else [],
            }
        ]
    }
    # requests-only: kube-scheduler's plugins (no Dynamic); the others: Dynamic on the virtual clock
    sim = Simulator(config, clock=lambda: clock[0], seed=seed, out_of_tree=load_aware)
    for i, n in enumerate(nodes):
        if n.requested_cpu:
            sim.add(_pod_obj(f"existing-{i}", n.requested_cpu, n.requested_mem_gi, n.name), kind="Pod")

    annotations: dict[str, dict[str, str]] = {n.name: {} for n in nodes}
    last_sync: dict[str, float] = {}
    hot_period = 15.0 if own else 180.0
    last_hot = -1e18
    bindings: list[tuple[float, str]] = []

    def publish(now: float) -> None:
        nonlocal last_hot
        changed = False
        stamp = datetime.fromtimestamp(now, UTC)
        for sync in POLICY.sync_policy:
            if now - last_sync.get(sync.name, -1e18) < sync.period.total_seconds():
                continue
            last_sync[sync.name] = now
            changed = True
            for n in nodes:
                annotations[n.name][sync.name] = encode_usage(_metric(n, sync.name, now), stamp)
        # upstream refreshes the hot value only together with a metric sync; ours on its own 15 s interval
        if now - last_hot >= hot_period:
            last_hot = now
            changed = True
            for n in nodes:
                counts = {
                    r.time_range: sum(
                        1 for t, node in bindings if node == n.name and t > now - r.time_range.total_seconds()
                    )
                    for r in POLICY.hot_value
                }
                annotations[n.name]["node_hot_value"] = encode_hot_value(hot_value(counts, POLICY.hot_value), stamp)
        if changed:
            for n in nodes:
                sim.update(_node_obj(n, dict(annotations[n.name])), kind="Node")

    def step(seconds: float) -> None:
        end = clock[0] + seconds
        while clock[0] < end:
            clock[0] += 15.0
            for n in nodes:
                n.history.append((clock[0], *n.real(svc)))  # type: ignore[arg-type]
            publish(clock[0])

    # an hour of history before the experiment starts
    step(3600.0)
    placed = 0
    before_overload: int | None = None
    first_fail = ""
    pending = 0
    deadline = clock[0] + replicas * interval + settle
    created = 0
    while clock[0] < deadline and (created < replicas or pending):
        if created < replicas:  # the Deployment is scaled up by one replica per interval
            created += 1
            pending += 1
        while pending:
            placement = sim.schedule(_pod_obj(f"{svc.name}-{placed}", svc.req_cpu, svc.req_mem_gi))
            if placement.node is None:
                first_fail = first_fail or placement.message
                break  # stays Pending; retried next interval, when the metrics may have caught up
            node = next(n for n in nodes if n.name == placement.node)
            node.replicas.append(clock[0])
            bindings.append((clock[0], node.name))
            placed += 1
            pending -= 1
            if before_overload is None and any(max(n.real(svc)) > THRESHOLD for n in nodes):
                before_overload = placed - 1
        step(interval)
    final = [n.real(svc) for n in nodes]
    return Outcome(
        strategy,
        svc.name,
        placed,
        before_overload,
        [c for c, _ in final],
        [m for _, m in final],
        [len(n.replicas) for n in nodes],
        first_fail,
    )


def _metric(n: SimNode, name: str, now: float) -> float:
    """The recording rules over the node's real-usage history (percent in Prometheus; fractions here)."""
    column = 1 if name.startswith("cpu") else 2
    window = 300.0

    def avg_at(t: float) -> float:
        values = [h[column] for h in n.history if t - window < h[0] <= t]
        return sum(values) / len(values) if values else 0.0

    if "_max_avg_" in name:
        span = 3600.0 if name.endswith("1h") else 86400.0
        points = [h[0] for h in n.history if h[0] > now - span][::4]  # every minute is plenty
        return max((avg_at(t) for t in points), default=avg_at(now))
    return avg_at(now)
