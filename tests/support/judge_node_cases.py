"""Hypothesis strategies for kube 1.37's node-side features, one per differential suite:

- ``declared_features_cases``: NodeDeclaredFeatures, nodes declaring subsets of kube's registry (and names it
  does not know) in ``status.declaredFeatures``, pods needing a feature through a container restart rule
  restarting all containers, a host-network pod in a user namespace, or bind mount options;
- ``pod_level_cases``: pod-level resources (``spec.resources``: cpu, memory, hugepages requests and limits) on the
  incoming pod and the pods on the nodes, with containers stating only some requests (the scoring defaults fill
  in per kube's rules), under NodeResourcesFit's three strategies and BalancedAllocation's resources; a third of
  them with preemption (priorities, full nodes);
- ``resize_cases``: pods resizing in place (InPlacePodVerticalScaling GA, InPlacePodLevelResourcesVerticalScaling
  beta and on): container statuses' ``allocatedResources`` and ``resources.requests`` above or below the spec,
  the kubelet's pod-level ``status.allocatedResources`` and ``status.resources``, Infeasible and Deferred
  ``PodResizePending`` conditions; what a node holds follows kube's ``PodRequests`` with the status.

Pools are small so that a request just fits or just does not, and scores tie or differ by one.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from crane_scheduler.plugins.nodedeclaredfeatures.features import NAMES
from tests.support.judge import Case, Json, config_for
from tests.support.judge_cases import IMAGES, _node, _plugin_config

CPU = ("100m", "250m", "500m", "1", "1500m", "2")
MEMORY = ("64Mi", "200Mi", "512Mi", "1Gi", "2Gi")
HUGEPAGES = "hugepages-2Mi"
UNKNOWN_FEATURES = ("AFutureFeature", "ZFutureFeature", "SomeVendorFeature")
START_TIMES = ("2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z", "2026-01-02T00:00:00Z")


def _pod(name: str, spec: Json, *, bound_to: str = "", priority: int = 0, start: str = START_TIMES[0]) -> Json:
    spec = {"schedulerName": "default-scheduler", "priority": priority, **spec}
    status: Json = {"phase": "Pending"}
    if bound_to:
        spec["nodeName"] = bound_to
        status = {"phase": "Running", "startTime": start}
    ns = "default"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"},
        "spec": spec,
        "status": status,
    }


def _requests(draw: Any, pool: tuple[str, ...] = ("cpu", "memory")) -> Json:
    """Some of cpu and memory (each may be left out, so the scoring defaults matter)."""
    out: Json = {}
    for name in pool:
        if draw(st.integers(0, 2)) > 0:
            out[name] = draw(st.sampled_from(CPU if name == "cpu" else MEMORY))
    return out


def _container(draw: Any, name: str) -> Json:
    requests = _requests(draw)
    c: Json = {"name": name, "image": draw(st.sampled_from(IMAGES))}
    if requests:
        c["resources"] = {"requests": requests}
    return c


def _containers(draw: Any) -> Json:
    spec: Json = {"containers": [_container(draw, f"c{i}") for i in range(draw(st.integers(1, 2)))]}
    if draw(st.integers(0, 3)) == 0:
        init = _container(draw, "init")
        if draw(st.booleans()):
            init["restartPolicy"] = "Always"
        spec["initContainers"] = [init]
    if draw(st.integers(0, 5)) == 0:
        spec["overhead"] = {"cpu": "50m", "memory": "32Mi"}
    return spec


def _pod_level(draw: Any, spec: Json) -> None:
    """``spec.resources``: pod-level requests (a subset of cpu, memory, hugepages) and limits, as API defaulting
    leaves them (a limit without a request gives the request)."""
    requests = _requests(draw)
    limits: Json = {}
    if draw(st.integers(0, 3)) == 0:
        limits["cpu"] = draw(st.sampled_from(CPU[3:]))
        requests.setdefault("cpu", limits["cpu"])
    if draw(st.integers(0, 3)) == 0:
        limits["memory"] = draw(st.sampled_from(MEMORY[3:]))
        requests.setdefault("memory", limits["memory"])
    if draw(st.integers(0, 5)) == 0:
        requests[HUGEPAGES] = limits[HUGEPAGES] = draw(st.sampled_from(("2Mi", "4Mi")))
    resources: Json = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    if resources:
        spec["resources"] = resources


def _nodes(draw: Any, max_nodes: int) -> list[Json]:
    nodes = [_node(i, draw) for i in range(draw(st.integers(1, max_nodes)))]
    for n in nodes:  # no cordons or taints here: the suites are about resources and features
        n["spec"] = {}
        if draw(st.integers(0, 3)) == 0:
            n["status"]["allocatable"][HUGEPAGES] = draw(st.sampled_from(("4Mi", "8Mi")))
    return nodes


# ---------------------------------------------------------------------------------------------- NodeDeclaredFeatures


def _declared(draw: Any) -> list[str]:
    features: list[str] = draw(st.lists(st.sampled_from((*NAMES, *UNKNOWN_FEATURES)), max_size=4, unique=True))
    if draw(st.integers(0, 9)) == 0:
        return features  # out of order (the API server refuses it; kube's merge reads it its way)
    return sorted(features)


def _needing(draw: Any, spec: Json) -> None:
    """Now and then each of the three things a pod can need a node feature for, or a near miss."""
    target = draw(st.sampled_from(("containers", "containers", "initContainers")))
    if target == "initContainers" and "initContainers" not in spec:
        spec["initContainers"] = [{"name": "init", "image": IMAGES[0]}]
    kind = draw(st.sampled_from(("none", "restart-all", "restart-one", "userns", "hostnet", "bind", "bind-empty")))
    container = spec[target][0]
    if kind in ("restart-all", "restart-one"):
        action = "RestartAllContainers" if kind == "restart-all" else "Restart"
        container["restartPolicyRules"] = [{"action": action, "exitCodes": {"operator": "In", "values": [42]}}]
    elif kind in ("userns", "hostnet"):
        spec["hostNetwork"] = True
        spec["hostUsers"] = draw(st.sampled_from((False, True))) if kind == "userns" else None
        if spec["hostUsers"] is None:
            del spec["hostUsers"]
    elif kind in ("bind", "bind-empty"):
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        mount: Json = {"name": "scratch", "mountPath": "/scratch"}
        if kind == "bind":
            mount["bindMountOptions"] = draw(st.lists(st.sampled_from(("noexec", "nodev", "nosuid")), min_size=1))
        if draw(st.integers(0, 3)) == 0:
            spec["ephemeralContainers"] = [{"name": "debug", "image": IMAGES[0], "volumeMounts": [mount]}]
        else:
            container["volumeMounts"] = [mount]


@st.composite
def declared_features_cases(draw: Any, max_nodes: int = 6, max_pods: int = 4) -> Case:
    nodes = _nodes(draw, max_nodes)
    for n in nodes:
        if draw(st.integers(0, 3)) > 0:
            n["status"]["declaredFeatures"] = _declared(draw)
    names = [n["metadata"]["name"] for n in nodes]
    pods = [
        _pod(f"bound-{i}", _containers(draw), bound_to=draw(st.sampled_from(names)))
        for i in range(draw(st.integers(0, max_pods)))
    ]
    spec = _containers(draw)
    _needing(draw, spec)
    if draw(st.integers(0, 4)) == 0:
        _needing(draw, spec)  # two needs at once
    return Case(nodes, pods, _pod("incoming", spec), config_for())


# ---------------------------------------------------------------------------------------------- pod-level resources


def _fit_config(draw: Any) -> list[Json]:
    """``_plugin_config``'s Least/MostAllocated variations, or RequestedToCapacityRatio, with hugepages scored."""
    if draw(st.integers(0, 3)) > 0:
        return list(_plugin_config(draw))
    resources = [{"name": n, "weight": draw(st.integers(1, 3))} for n in ("cpu", "memory", HUGEPAGES)]
    shape = [{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}]
    if draw(st.booleans()):
        shape = [{"utilization": 0, "score": 10}, {"utilization": 60, "score": 3}, {"utilization": 100, "score": 0}]
    strategy = {
        "type": "RequestedToCapacityRatio",
        "resources": resources,
        "requestedToCapacityRatio": {"shape": shape},
    }
    return [{"name": "NodeResourcesFit", "args": {"scoringStrategy": strategy}}]


def _with_preemption(draw: Any, case: Case) -> Case:
    """Full nodes: priorities on the pods there (and their start times, which break ties), a higher one on the
    incoming pod, sometimes preemptionPolicy Never."""
    for p in case.pods:
        p["spec"]["priority"] = draw(st.sampled_from((0, 1, 5, 10, 1000)))
        p["status"]["startTime"] = draw(st.sampled_from(START_TIMES))
    case.incoming["spec"]["priority"] = draw(st.sampled_from((5, 100, 100)))
    if draw(st.integers(0, 6)) == 0:
        case.incoming["spec"]["preemptionPolicy"] = "Never"
    for n in case.nodes:
        n["status"]["allocatable"]["cpu"] = draw(st.sampled_from(("1", "2")))
        n["status"]["allocatable"]["memory"] = draw(st.sampled_from(("1Gi", "2Gi")))
    case.preempt = True
    return case


@st.composite
def pod_level_cases(draw: Any, max_nodes: int = 5, max_pods: int = 8) -> Case:
    nodes = _nodes(draw, max_nodes)
    names = [n["metadata"]["name"] for n in nodes]
    pods = []
    for i in range(draw(st.integers(0, max_pods))):
        spec = _containers(draw)
        if draw(st.booleans()):
            _pod_level(draw, spec)
        pods.append(_pod(f"bound-{i}", spec, bound_to=draw(st.sampled_from(names))))
    spec = _containers(draw)
    if draw(st.integers(0, 4)) > 0:
        _pod_level(draw, spec)
    case = Case(nodes, pods, _pod("incoming", spec), config_for(_fit_config(draw)))
    return _with_preemption(draw, case) if draw(st.integers(0, 2)) == 0 else case


# ---------------------------------------------------------------------------------------------- in-place resize


def _resize_status(draw: Any, pod: Json) -> None:
    """What the kubelet reports for a pod resizing in place: per container the allocated and actuated requests
    (above or below the spec, or absent), pod-level totals when the pod has pod-level resources, and a
    PodResizePending condition."""
    spec, status = pod["spec"], pod["status"]
    for key, statuses in (("containers", "containerStatuses"), ("initContainers", "initContainerStatuses")):
        out = []
        for c in spec.get(key) or ():
            if draw(st.integers(0, 2)) == 0:
                continue  # no status for this container (yet)
            cs: Json = {"name": c["name"], "ready": True, "restartCount": 0, "image": c["image"], "imageID": ""}
            if draw(st.booleans()):
                cs["allocatedResources"] = _requests(draw)
            if draw(st.booleans()):
                cs["resources"] = {"requests": _requests(draw)}
            out.append(cs)
        if out:
            status[statuses] = out
    if spec.get("resources") and draw(st.booleans()):
        if draw(st.booleans()):
            status["allocatedResources"] = _requests(draw)
        status["resources"] = {"requests": _requests(draw)}
    reason = draw(st.sampled_from((None, None, "Infeasible", "Deferred")))
    if reason:
        status["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": reason}]


@st.composite
def resize_cases(draw: Any, max_nodes: int = 4, max_pods: int = 8) -> Case:
    nodes = _nodes(draw, max_nodes)
    names = [n["metadata"]["name"] for n in nodes]
    pods = []
    for i in range(draw(st.integers(1, max_pods))):
        spec = _containers(draw)
        if draw(st.integers(0, 2)) == 0:
            _pod_level(draw, spec)
        p = _pod(f"bound-{i}", spec, bound_to=draw(st.sampled_from(names)))
        if draw(st.integers(0, 3)) > 0:
            _resize_status(draw, p)
        pods.append(p)
    spec = _containers(draw)
    if draw(st.integers(0, 2)) == 0:
        _pod_level(draw, spec)
    incoming = _pod("incoming", spec)
    if draw(st.integers(0, 7)) == 0:
        _resize_status(draw, incoming)  # never seen on a pending pod; kube's Fit reads its spec, Score its status
    case = Case(nodes, pods, incoming, config_for(_fit_config(draw)))
    return _with_preemption(draw, case) if draw(st.integers(0, 2)) == 0 else case
