"""A simulated fleet of nodes whose load follows the pods bound to them.

The sandbox's kubelets are simulated (KWOK): nodes are API objects only, and their "real" usage is computed here
from the pods that run on them. The exporter serves these numbers as node-exporter series, so the whole chain
(Prometheus rules, annotator, scheduler) sees load that reacts to scheduling decisions, which is what a
load-aware scheduler has to be tested against.

Everything in this module is pure apart from the injectable clock; time is always an explicit argument.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from crane_shared.batch import BATCH_RESOURCES
from crane_shared.quantity import parse_quantity

InstanceStyle = Literal["ip", "ip:port", "name"]
LoadShape = Literal["uneven", "even"]

USAGE_ANNOTATION = "sandbox.crane.io/usage"
"""Pod annotation with the pod's simulated usage, e.g. ``cpu=2,memory=20Gi`` (either key may be left out)."""

DEFAULT_USAGE_FRACTION = 0.5
"""Usage of a pod without the annotation, as a fraction of its requests: busy enough that requests and real
usage differ (the point of load-aware scheduling) without making every node hot."""

NODE_EXPORTER_PORT = 9100
GI = 1024**3

# ---------------------------------------------------------------------------------------------- quantities


def parse_cpu(text: str | int | float) -> float:
    """CPU quantity in cores (``500m`` -> 0.5); negative quantities are refused."""
    return float(_non_negative(parse_quantity(text), text))


def parse_memory(text: str | int | float) -> int:
    """Memory quantity in bytes, rounded up like Kubernetes does (``1Gi``, ``1G``, ``512``)."""
    return math.ceil(_non_negative(parse_quantity(text), text))


def _non_negative(value: Decimal, text: str | int | float) -> Decimal:
    if value < 0:
        raise ValueError(f"invalid quantity {text!r}: resources cannot be negative")
    return value


def parse_usage(text: str) -> tuple[float | None, int | None]:
    """The usage annotation, ``cpu=2,memory=20Gi`` -> (cores, bytes); keys left out are None."""
    cpu: float | None = None
    memory: int | None = None
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep:
            raise ValueError(f"expected key=value, got {part.strip()!r}")
        if key == "cpu":
            cpu = parse_cpu(value)
        elif key == "memory":
            memory = parse_memory(value)
        else:
            raise ValueError(f"unknown resource {key!r} (expected cpu or memory)")
    return cpu, memory


# ---------------------------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class SimNode:
    """One simulated node: the API object's facts and the load it carries before any pod lands on it."""

    name: str
    internal_ip: str
    cpu_cores: float
    memory_bytes: int
    base_cpu_fraction: float = 0.0
    base_mem_fraction: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    instance_style: InstanceStyle = "ip"

    @property
    def instance_label(self) -> str:
        """The ``instance`` label of this node's series; the annotator must map all three styles back."""
        if self.instance_style == "ip":
            return self.internal_ip
        if self.instance_style == "ip:port":
            return f"{self.internal_ip}:{NODE_EXPORTER_PORT}"
        return self.name


def sim_ip(index: int) -> str:
    """Deterministic 10.x.y.z address for node ``index`` (1-based); a label only, never contacted."""
    if not 1 <= index < 250 * 65536:
        raise ValueError(f"node index {index} out of range")
    host = index - 1
    return f"10.{host // 250 // 256}.{host // 250 % 256}.{host % 250 + 1}"


def make_fleet(
    n: int,
    *,
    cpu_cores: float = 8.0,
    memory_bytes: int = 32 * GI,
    base_cpu_fraction: float = 0.1,
    base_mem_fraction: float = 0.2,
    instance_styles: Sequence[InstanceStyle] = ("ip",),
    labels: Mapping[str, str] | None = None,
    prefix: str = "node-",
    base_loads: Sequence[tuple[float, float]] | None = None,
) -> list[SimNode]:
    """``n`` nodes ``node-0001``... with IPs 10.0.0.1...; instance styles cycle over ``instance_styles`` so one
    fleet can exercise every node-to-series mapping. ``base_loads`` gives each node its own (cpu, memory) base
    fractions; without it every node has ``base_cpu_fraction``/``base_mem_fraction``."""
    if not instance_styles:
        raise ValueError("instance_styles must not be empty")
    if base_loads is not None and len(base_loads) != n:
        raise ValueError(f"base_loads has {len(base_loads)} entries for {n} nodes")
    loads = base_loads or [(base_cpu_fraction, base_mem_fraction)] * n
    width = max(4, len(str(n)))
    return [
        SimNode(
            name=f"{prefix}{i:0{width}d}",
            internal_ip=sim_ip(i),
            cpu_cores=cpu_cores,
            memory_bytes=memory_bytes,
            base_cpu_fraction=loads[i - 1][0],
            base_mem_fraction=loads[i - 1][1],
            labels=dict(labels or {}),
            instance_style=instance_styles[(i - 1) % len(instance_styles)],
        )
        for i in range(1, n + 1)
    ]


def base_loads(shape: LoadShape, n: int, low: float = 0.10, high: float = 0.55) -> list[tuple[float, float]]:
    """(cpu, memory) base fractions of ``n`` nodes. "even": all at ``low``. "uneven" (the default of the sandbox,
    like the seed experiment's nodes at 10/15 %, 20/25 %, 35/45 %): CPU spread evenly from ``low`` to ``high``,
    memory 5 points above, in a scrambled node order so that name order does not give the answer away; every node
    stays below the default 65 % threshold."""
    if n < 1:
        raise ValueError(f"a fleet needs at least one node, got {n}")
    if shape == "even":
        return [(low, round(low + 0.05, 4))] * n
    if shape != "uneven":
        raise ValueError(f"unknown load shape {shape!r} (expected 'uneven' or 'even')")
    step = 3 if math.gcd(3, n) == 1 else 1
    fractions = [((i * step) % n) / (n - 1) if n > 1 else 0.0 for i in range(n)]
    return [(round(low + (high - low) * f, 4), round(low + 0.05 + (high - low) * f, 4)) for f in fractions]


NEW_NODE_BASE = (0.10, 0.15)
"""(cpu, memory) base fractions of a node the sandbox did not create (an autoscaler's): a fresh node's system
load, the low end of ``base_loads``."""

INSTANCE_CPU_LABEL = "karpenter.kwok.sh/instance-cpu"
INSTANCE_MEMORY_LABEL = "karpenter.kwok.sh/instance-memory"


def sim_node_of(node: Mapping[str, Any], base: tuple[float, float] = NEW_NODE_BASE) -> SimNode | None:
    """The simulated node behind a Node object someone else created (Karpenter's KWOK provider), or None while it
    has no CPUs to tell. Its size is its instance type's (the provider's ``instance-cpu``/``instance-memory``
    labels: the provider sets the node's capacity to the requests that launched it), else its capacity, else its
    allocatable (a node without both CPUs and memory is not simulated yet). Its series are exported with
    ``instance`` = the node name: such a node has no address of ours,
    and KWOK may give every node it initializes the same InternalIP."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = node.get("status") or {}
    sources: list[Mapping[str, Any]] = [
        {"cpu": labels.get(INSTANCE_CPU_LABEL), "memory": labels.get(INSTANCE_MEMORY_LABEL)},
        status.get("capacity") or {},
        status.get("allocatable") or {},
    ]
    cpu = next((c for c in (_quantity(s.get("cpu"), parse_cpu) for s in sources) if c), None)
    memory = next((m for m in (_quantity(s.get("memory"), parse_memory) for s in sources) if m), None)
    if not cpu or not memory:
        return None
    ip = next((a.get("address", "") for a in status.get("addresses") or [] if a.get("type") == "InternalIP"), "")
    return SimNode(
        name=str(meta.get("name")),
        internal_ip=str(ip),
        cpu_cores=cpu,
        memory_bytes=int(memory),
        base_cpu_fraction=base[0],
        base_mem_fraction=base[1],
        labels=dict(labels),
        instance_style="name",
    )


def _quantity(text: Any, parse: Callable[[str], float] | Callable[[str], int]) -> float | None:
    """``parse(text)``, or None when ``text`` is absent or not a quantity."""
    if text is None or text == "":
        return None
    try:
        return parse(str(text))
    except ValueError:
        return None


def node_manifest(node: SimNode) -> dict[str, Any]:
    """The Node object to create; status is a subresource and goes separately (see ``node_status``)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {**node.labels, "kubernetes.io/hostname": node.name},
        },
        "spec": {},
    }


def node_status(node: SimNode, now: float, *, ready: bool = True) -> dict[str, Any]:
    """Status patch with the node's capacity and addresses, and a Ready condition if ``ready`` (without it the
    node's kubelet, KWOK, reports the conditions)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    resources = {
        "cpu": _format_cpu(node.cpu_cores),
        "memory": str(node.memory_bytes),
        "pods": "110",
        "ephemeral-storage": "100Gi",
    }
    status: dict[str, Any] = {
        "capacity": resources,
        "allocatable": resources,
        "addresses": [
            {"type": "InternalIP", "address": node.internal_ip},
            {"type": "Hostname", "address": node.name},
        ],
    }
    if ready:
        status["conditions"] = [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "simulated by crane_sandbox",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }
        ]
    return {"status": status}


def _format_cpu(cores: float) -> str:
    return str(int(cores)) if float(cores).is_integer() else f"{round(cores * 1000)}m"


# ---------------------------------------------------------------------------------------------- pods


@dataclass(frozen=True)
class BoundPod:
    """A pod's simulated usage on the node it is bound to. ``annotation_error`` is set when the usage
    annotation was malformed and the default was used instead, so the caller can tell the user."""

    uid: str
    node: str
    cpu_cores: float
    memory_bytes: int
    name: str = ""
    """``namespace/name``"""
    annotation_error: str | None = None
    container: str = ""
    """the first container's name: the pod's usage is exported as this container's cAdvisor series"""
    batch: tuple[tuple[str, float], ...] = ()
    """the batch resources its containers request (``crane.io/batch-cpu``, ...), summed: exported as
    kube-state-metrics' ``kube_pod_container_resource_requests``, which the batch recording rules select on"""


def _get(obj: Mapping[str, Any] | None, camel: str) -> Any:
    """Field from an API dict (camelCase) or a client model's ``to_dict()`` (snake_case)."""
    if not obj:
        return None
    if camel in obj:
        return obj[camel]
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()
    return obj.get(snake)


def _as_dict(pod: Mapping[str, Any] | Any) -> Mapping[str, Any]:
    if isinstance(pod, Mapping):
        return pod
    to_dict = getattr(pod, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"expected a pod dict or client model, got {type(pod).__name__}")
    result: Mapping[str, Any] = to_dict()
    return result


def pod_requests(pod: Mapping[str, Any] | Any) -> tuple[float, int]:
    """Sum of the containers' requests (cores, bytes); init containers are ignored (they have finished)."""
    spec = _get(_as_dict(pod), "spec") or {}
    cpu = 0.0
    memory = 0
    for container in _get(spec, "containers") or []:
        requests = _get(_get(container, "resources"), "requests") or {}
        if "cpu" in requests:
            cpu += parse_cpu(requests["cpu"])
        if "memory" in requests:
            memory += parse_memory(requests["memory"])
    return cpu, memory


def bound_pod(pod: Mapping[str, Any] | Any) -> BoundPod | None:
    """The usage a pod puts on its node, or None when it puts none: only a Running pod does (a bound pod its
    kubelet has not started yet, and a finished one, load nothing)."""
    data = _as_dict(pod)
    meta = _get(data, "metadata") or {}
    spec = _get(data, "spec") or {}
    node = _get(spec, "nodeName")
    phase = _get(_get(data, "status"), "phase")
    if not node or phase != "Running":
        return None
    req_cpu, req_mem = pod_requests(data)
    cpu, memory = req_cpu * DEFAULT_USAGE_FRACTION, math.ceil(req_mem * DEFAULT_USAGE_FRACTION)
    error: str | None = None
    text = (_get(meta, "annotations") or {}).get(USAGE_ANNOTATION)
    if text is not None:
        try:
            ann_cpu, ann_mem = parse_usage(text)
        except ValueError as e:
            error = f"{USAGE_ANNOTATION}: {e}"
        else:
            cpu = cpu if ann_cpu is None else ann_cpu
            memory = memory if ann_mem is None else ann_mem
    return BoundPod(
        uid=str(_get(meta, "uid") or ""),
        node=str(node),
        cpu_cores=cpu,
        memory_bytes=memory,
        name=f"{_get(meta, 'namespace') or ''}/{_get(meta, 'name') or ''}",
        annotation_error=error,
        container=str(_get((_get(spec, "containers") or [{}])[0], "name") or "main"),
        batch=batch_requests(spec),
    )


def batch_requests(spec: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    """(resource, amount) of each batch resource the containers request (``crane_shared.batch``)."""
    amounts: dict[str, float] = {}
    for container in _get(spec, "containers") or []:
        requests = _get(_get(container, "resources"), "requests") or {}
        for name in BATCH_RESOURCES:
            if name in requests:
                amounts[name] = amounts.get(name, 0.0) + float(parse_quantity(requests[name]))
    return tuple(sorted(amounts.items()))


def pod_uid(pod: Mapping[str, Any] | Any) -> str:
    return str(_get(_get(_as_dict(pod), "metadata"), "uid") or "")


# ---------------------------------------------------------------------------------------------- state


@dataclass(frozen=True)
class PodSample:
    """A Running pod's cAdvisor-like series: CPU seconds used so far and its memory working set."""

    namespace: str
    pod: str
    container: str
    node: str
    cpu_seconds: float
    memory_bytes: int
    batch: tuple[tuple[str, float], ...] = ()
    """batch resources requested (``BoundPod.batch``)"""


@dataclass(frozen=True)
class NodeSample:
    """What the exporter serves for one node at one instant (``at``, unix seconds, when counters were read)."""

    instance: str
    at: float
    cpu_idle_seconds: float
    cpu_user_seconds: float
    mem_total_bytes: int
    mem_available_bytes: int
    pods: tuple[PodSample, ...] = ()
    cpu_cores: float = 0.0
    """capacity (kube-state-metrics' ``kube_node_status_capacity{resource="cpu"}``)"""
    nodename: str = ""
    """the node's name (node-exporter's ``node_uname_info{nodename}``: joins pod series, labelled by node, to the
    node's ``instance``)"""


@dataclass
class _Counters:
    idle: float = 0.0
    user: float = 0.0


def _clamp(x: float) -> float:
    return min(1.0, max(0.0, x))


class FleetState:
    """Node specs, the pods bound to them, and each node's CPU-seconds counters.

    Counters are integrated piecewise: every change of usage first advances all counters to "now" at the
    old usage, so ``node_cpu_seconds_total`` stays monotonic and its rate equals the usage in force at each
    moment. One CPU series (``cpu="0"``) per node is exported with modes idle and user, and the idle counter
    grows at ``1 - cpu_fraction`` seconds per second: the upstream rule takes ``avg by (instance)`` of the
    idle rate over CPUs, so a single CPU whose idle rate is ``1 - cpu_fraction`` gives exactly the node's busy
    percentage (a real node's N CPUs average to the same number).

    Each Running pod also has a CPU-seconds counter growing at its usage, exported with its memory as cAdvisor's
    ``container_cpu_usage_seconds_total`` and ``container_memory_working_set_bytes`` (what the descheduler reads).
    A pod's ``sandbox.crane.io/usage`` annotation changed on a Running pod changes both its node's and its own
    series from that instant on.
    """

    def __init__(
        self,
        nodes: Iterable[SimNode] = (),
        *,
        now: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._last = clock() if now is None else now
        self._nodes: dict[str, SimNode] = {}
        self._counters: dict[str, _Counters] = {}
        self._pods: dict[str, BoundPod] = {}
        self._by_node: dict[str, dict[str, BoundPod]] = {}
        self._used: dict[str, tuple[float, int]] = {}
        self._pod_cpu: dict[str, float] = {}
        for node in nodes:
            self.add_node(node, now=self._last)

    @property
    def nodes(self) -> Mapping[str, SimNode]:
        return self._nodes

    @property
    def pods(self) -> Mapping[str, BoundPod]:
        return self._pods

    def add_node(self, node: SimNode, now: float | None = None) -> None:
        self.advance(now)
        self._nodes[node.name] = node
        self._counters.setdefault(node.name, _Counters())

    def remove_node(self, name: str, now: float | None = None) -> None:
        """Forget a deleted node and the pods still counted on it: its series leave the exporter."""
        if name not in self._nodes:
            return
        self.advance(now)
        for uid in list(self._by_node.get(name, {})):
            self._drop(uid)
            self._pod_cpu.pop(uid, None)
        del self._nodes[name]
        self._counters.pop(name, None)
        self._used.pop(name, None)
        self._by_node.pop(name, None)

    def on_pod(self, pod: Mapping[str, Any] | Any, now: float | None = None) -> BoundPod | None:
        """Apply an added or modified pod; returns its usage, or None when it no longer loads a node."""
        bound = bound_pod(pod)
        if bound is None:
            self.remove_pod(pod_uid(pod), now)
            return None
        self.advance(now)
        self._drop(bound.uid)
        self._pods[bound.uid] = bound
        self._by_node.setdefault(bound.node, {})[bound.uid] = bound
        self._recompute(bound.node)
        return bound

    def remove_pod(self, uid: str, now: float | None = None) -> None:
        if uid in self._pods:
            self.advance(now)
            self._drop(uid)
            self._pod_cpu.pop(uid, None)

    def pod_cpu_seconds(self, uid: str) -> float:
        """A pod's CPU-seconds counter as of the last ``advance``."""
        return self._pod_cpu.get(uid, 0.0)

    def resync(self, pods: Iterable[Mapping[str, Any] | Any], now: float | None = None) -> list[BoundPod]:
        """Replace all pods with a fresh listing (pods deleted while the watch was down disappear)."""
        self.advance(now)
        seen: set[str] = set()
        result: list[BoundPod] = []
        for pod in pods:
            bound = self.on_pod(pod, self._last)
            if bound is not None:
                seen.add(bound.uid)
                result.append(bound)
        for uid in set(self._pods) - seen:
            self._drop(uid)
            self._pod_cpu.pop(uid, None)
        return result

    def usage(self, node: str) -> tuple[float, float]:
        """(cpu_fraction, mem_fraction) of a node: base load plus its pods, clamped to [0, 1]."""
        spec = self._nodes[node]
        cpu, mem = self._used.get(node, (0.0, 0))
        return (
            _clamp(spec.base_cpu_fraction + cpu / spec.cpu_cores),
            _clamp(spec.base_mem_fraction + mem / spec.memory_bytes),
        )

    def advance(self, now: float | None = None) -> None:
        """Integrate every node's idle and busy seconds up to ``now`` at the current usage. Time never goes
        backwards: an earlier ``now`` is ignored so counters stay monotonic."""
        now = self._clock() if now is None else now
        dt = now - self._last
        if dt <= 0:
            return
        for name, counters in self._counters.items():
            if name not in self._nodes:
                continue
            busy = self.usage(name)[0]
            counters.idle += dt * (1.0 - busy)
            counters.user += dt * busy
        for uid, pod in self._pods.items():
            self._pod_cpu[uid] = self._pod_cpu.get(uid, 0.0) + dt * pod.cpu_cores
        self._last = now

    def cpu_seconds(self, node: str) -> tuple[float, float]:
        """(idle, user) counters as of the last ``advance``."""
        c = self._counters[node]
        return c.idle, c.user

    def snapshot(self, names: Iterable[str] | None = None, now: float | None = None) -> list[NodeSample]:
        """Advance to ``now`` and copy the exported values, so rendering can run outside the event loop."""
        self.advance(now)
        result = []
        for name in self._nodes if names is None else names:
            spec = self._nodes[name]
            c = self._counters[name]
            mem_fraction = self.usage(name)[1]
            result.append(
                NodeSample(
                    instance=spec.instance_label,
                    at=self._last,
                    cpu_idle_seconds=c.idle,
                    cpu_user_seconds=c.user,
                    mem_total_bytes=spec.memory_bytes,
                    mem_available_bytes=round(spec.memory_bytes * (1.0 - mem_fraction)),
                    pods=tuple(self._pod_sample(uid, p) for uid, p in self._by_node.get(name, {}).items()),
                    cpu_cores=spec.cpu_cores,
                    nodename=name,
                )
            )
        return result

    def _pod_sample(self, uid: str, pod: BoundPod) -> PodSample:
        namespace, _, name = pod.name.partition("/")
        cpu = self._pod_cpu.get(uid, 0.0)
        return PodSample(namespace, name, pod.container, pod.node, cpu, pod.memory_bytes, pod.batch)

    def _drop(self, uid: str) -> None:
        old = self._pods.pop(uid, None)
        if old is not None:
            self._by_node.get(old.node, {}).pop(uid, None)
            self._recompute(old.node)

    def _recompute(self, node: str) -> None:
        # Sum from scratch rather than add/subtract: no floating-point drift however many pods come and go.
        pods = self._by_node.get(node, {}).values()
        self._used[node] = (sum(p.cpu_cores for p in pods), sum(p.memory_bytes for p in pods))
