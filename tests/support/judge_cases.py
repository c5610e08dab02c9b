"""Hypothesis strategies for differential cases: small clusters and one incoming pod that use every field the
built-in plugins read (NodeResourcesFit, BalancedAllocation, TaintToleration, NodeAffinity, NodePorts, NodeName,
NodeUnschedulable).

Values come from small pools so that collisions (the same label value, the same host port, a request that just
fits) are frequent: differential testing finds boundaries, not random noise. Objects look like what the API server
stores: requests default to limits where only limits are given, as API defaulting does.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.support.judge import Case, Json, config_for

ZONES = ("zone-a", "zone-b", "zone-c")
LABEL_KEYS = ("disk", "tier", "gpu-count", "example.com/rack")
LABEL_VALUES = ("ssd", "hdd", "1", "5", "10", "-3", "007", "abc", "")
TAINT_KEYS = ("dedicated", "gpu", "node.kubernetes.io/unschedulable", "example.com/maint")
TAINT_VALUES = ("", "a", "b")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
EXTENDED = "example.com/gpu"
HUGEPAGES = "hugepages-2Mi"
CPU = ("100m", "250m", "500m", "1", "1500m", "2", "3500m", "4", "8")
MEMORY = ("64Mi", "128Mi", "200Mi", "512Mi", "1Gi", "1500Mi", "2Gi", "4Gi", "8Gi")
EPHEMERAL = ("100Mi", "1Gi", "5Gi", "10Gi")
IMAGES = ("registry.local/app:1", "registry.local/db:2", "registry.local/big:3")
# One size per image name, as on real nodes (a name pulls one digest): kube-scheduler keeps the size of whichever
# node it saw first, so per-node sizes for one name would make ImageLocality depend on the judge's cache order.
IMAGE_SIZES = {
    "registry.local/app:1": 10_000_000,
    "registry.local/db:2": 300_000_000,
    "registry.local/big:3": 1_000_000_000,
}


def _node(i: int, draw: Any) -> Json:
    name = f"node-{i}"
    labels = {"kubernetes.io/hostname": name}
    if draw(st.booleans()):
        labels["topology.kubernetes.io/zone"] = draw(st.sampled_from(ZONES))
    for key in draw(st.lists(st.sampled_from(LABEL_KEYS), max_size=3, unique=True)):
        labels[key] = draw(st.sampled_from(LABEL_VALUES))
    taints = [
        {"key": k, "value": draw(st.sampled_from(TAINT_VALUES)), "effect": draw(st.sampled_from(EFFECTS))}
        for k in (draw(st.lists(st.sampled_from(TAINT_KEYS), max_size=2, unique=True)) if draw(st.booleans()) else ())
    ]
    allocatable = {
        # hypothesis favours the first choice of a pool (and shrinks towards it): generous nodes come first
        "cpu": draw(st.sampled_from(CPU[3:][::-1])),
        "memory": draw(st.sampled_from(MEMORY[4:][::-1])),
        "pods": str(draw(st.sampled_from((110, 110, 110, 3, 2, 1)))),
    }
    if draw(st.booleans()):
        allocatable["ephemeral-storage"] = draw(st.sampled_from(EPHEMERAL[::-1]))
    if draw(st.integers(0, 3)) == 0:
        allocatable[EXTENDED] = str(draw(st.sampled_from((2, 1, 0))))
    if draw(st.integers(0, 5)) == 0:
        allocatable[HUGEPAGES] = draw(st.sampled_from(("4Mi", "2Mi", "0")))
    images = [
        {"names": [img], "sizeBytes": IMAGE_SIZES[img]}
        for img in draw(st.lists(st.sampled_from(IMAGES), max_size=2, unique=True))
    ]
    spec: Json = {"taints": taints} if taints else {}
    if draw(st.integers(0, 7)) == 0:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
        "status": {"allocatable": allocatable, "capacity": dict(allocatable), "images": images},
    }


def _resources(draw: Any, *, rich: bool) -> Json:
    """requests/limits of one container; API defaulting copies a limit into a missing request."""
    requests: Json = {}
    limits: Json = {}
    if draw(st.integers(0, 3)) > 0:
        requests["cpu"] = draw(st.sampled_from(CPU[:5]))
    if draw(st.integers(0, 3)) > 0:
        requests["memory"] = draw(st.sampled_from(MEMORY[:6]))
    if rich and draw(st.integers(0, 5)) == 0:
        requests["ephemeral-storage"] = draw(st.sampled_from(EPHEMERAL[:3]))
    if rich and draw(st.integers(0, 5)) == 0:
        requests[EXTENDED] = str(draw(st.integers(1, 2)))
        limits[EXTENDED] = requests[EXTENDED]  # extended resources: request must equal limit
    if rich and draw(st.integers(0, 9)) == 0:
        requests[HUGEPAGES] = limits[HUGEPAGES] = "2Mi"
    if draw(st.integers(0, 3)) == 0:
        limits["cpu"] = draw(st.sampled_from(CPU[3:]))
        requests.setdefault("cpu", limits["cpu"])
    if draw(st.integers(0, 3)) == 0:
        limits["memory"] = draw(st.sampled_from(MEMORY[4:]))
        requests.setdefault("memory", limits["memory"])
    out: Json = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _ports(draw: Any) -> list[Json]:
    ports = []
    for _ in range(draw(st.integers(0, 2))):
        port: Json = {"containerPort": 8080, "hostPort": draw(st.sampled_from((80, 443, 8080)))}
        protocol = draw(st.sampled_from((None, "TCP", "UDP")))
        if protocol:
            port["protocol"] = protocol
        ip = draw(st.sampled_from((None, "0.0.0.0", "10.0.0.1", "10.0.0.2")))
        if ip:
            port["hostIP"] = ip
        ports.append(port)
    return ports


def _container(draw: Any, name: str, *, rich: bool, ports: bool) -> Json:
    c: Json = {"name": name, "image": draw(st.sampled_from(IMAGES)), "resources": _resources(draw, rich=rich)}
    if ports and draw(st.booleans()):
        c["ports"] = _ports(draw)
    return c


def _pod_spec(draw: Any, *, rich: bool) -> Json:
    spec: Json = {
        "containers": [_container(draw, f"c{i}", rich=rich, ports=True) for i in range(draw(st.integers(1, 2)))],
        "schedulerName": "default-scheduler",
    }
    if rich and draw(st.integers(0, 2)) == 0:
        inits = []
        for i in range(draw(st.integers(1, 2))):
            c = _container(draw, f"init{i}", rich=False, ports=True)
            if draw(st.booleans()):
                c["restartPolicy"] = "Always"  # a sidecar: counted with the app containers, its ports too
            inits.append(c)
        spec["initContainers"] = inits
    _unique_host_ports(spec)
    if rich and draw(st.integers(0, 4)) == 0:
        spec["overhead"] = {"cpu": draw(st.sampled_from(CPU[:3])), "memory": draw(st.sampled_from(MEMORY[:3]))}
    return spec


def _unique_host_ports(spec: Json) -> None:
    """API validation refuses a pod using one (protocol, hostPort) twice: keep the first use."""
    seen: set[tuple[str, int]] = set()
    for c in [*spec.get("initContainers", ()), *spec["containers"]]:
        kept = []
        for p in c.get("ports", ()):
            key = (p.get("protocol", "TCP"), p["hostPort"])
            if key not in seen:
                seen.add(key)
                kept.append(p)
        if "ports" in c:
            c["ports"] = kept


def _requirement(draw: Any, node_names: list[str]) -> Json:
    key = draw(st.sampled_from((*LABEL_KEYS, "topology.kubernetes.io/zone", "kubernetes.io/hostname")))
    op = draw(st.sampled_from(("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")))
    if op in ("In", "NotIn"):
        pool = (*LABEL_VALUES, *ZONES, *node_names)
        return {"key": key, "operator": op, "values": draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))}
    if op in ("Gt", "Lt"):
        # API validation: exactly one integer value (an unparsable one never reaches a scheduler)
        return {"key": key, "operator": op, "values": [draw(st.sampled_from(("0", "3", "5", "9", "-5")))]}
    return {"key": key, "operator": op}


def _term(draw: Any, node_names: list[str]) -> Json:
    term: Json = {}
    exprs = [_requirement(draw, node_names) for _ in range(draw(st.sampled_from((0, 1, 1, 2))))]
    if exprs:
        term["matchExpressions"] = exprs
    if draw(st.integers(0, 3)) == 0:
        op = draw(st.sampled_from(("In", "NotIn")))
        value = draw(st.sampled_from((*node_names, "node-x")))  # API validation: exactly one value
        term["matchFields"] = [{"key": "metadata.name", "operator": op, "values": [value]}]
    return term


def _toleration(draw: Any) -> Json:
    t: Json = {}
    if draw(st.integers(0, 4)) > 0:
        t["key"] = draw(st.sampled_from(TAINT_KEYS))
    op = draw(st.sampled_from(("Equal", "Exists", None)))
    if op == "Exists" or ("key" not in t and op is not None):
        t["operator"] = "Exists"  # an empty key is only valid with Exists
    else:
        if op:
            t["operator"] = op
        t["value"] = draw(st.sampled_from(TAINT_VALUES))
    effect = draw(st.sampled_from(("", *EFFECTS)))
    if effect:
        t["effect"] = effect
    return t


@st.composite
def cases(draw: Any, max_nodes: int = 6, max_pods: int = 8) -> Case:
    nodes = [_node(i, draw) for i in range(draw(st.integers(1, max_nodes)))]
    names = [n["metadata"]["name"] for n in nodes]
    pods = []
    for i in range(draw(st.integers(0, max_pods))):
        spec = _pod_spec(draw, rich=draw(st.integers(0, 3)) == 0)
        spec["nodeName"] = draw(st.sampled_from(names))
        ns = draw(st.sampled_from(("default", "team-a", "team-b")))
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"bound-{i}", "namespace": ns, "uid": f"uid-bound-{i}"},
                "spec": spec,
                "status": {"phase": "Running"},
            }
        )
    spec = _pod_spec(draw, rich=True)
    if draw(st.integers(0, 5)) == 0:
        spec["nodeSelector"] = {
            draw(st.sampled_from((*LABEL_KEYS, "topology.kubernetes.io/zone"))): draw(
                st.sampled_from((*LABEL_VALUES, *ZONES))
            )
        }
    affinity: Json = {}
    if draw(st.integers(0, 5)) == 0:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [_term(draw, names) for _ in range(draw(st.integers(1, 2)))]
        }
    if draw(st.integers(0, 1)) == 0:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": draw(st.integers(1, 100)), "preference": _term(draw, names)}
            for _ in range(draw(st.integers(1, 3)))
        ]
    if affinity:
        spec["affinity"] = {"nodeAffinity": affinity}
    tolerations = [_toleration(draw) for _ in range(draw(st.integers(0, 3)))]
    if tolerations:
        spec["tolerations"] = tolerations
    if draw(st.integers(0, 14)) == 0:
        spec["nodeName"] = draw(st.sampled_from((*names, "node-x")))
    incoming = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "incoming", "namespace": "default", "uid": "uid-incoming"},
        "spec": spec,
        "status": {"phase": "Pending"},
    }
    return Case(nodes, pods, incoming, config_for(_plugin_config(draw)))


def _plugin_config(draw: Any) -> list[Json]:
    """NodeResourcesFit's strategy and resources, BalancedAllocation's resources: defaults or a variation."""
    out: list[Json] = []
    pool = ("cpu", "memory", "ephemeral-storage", EXTENDED, HUGEPAGES)
    if draw(st.booleans()):
        strategy: Json = {"type": draw(st.sampled_from(("LeastAllocated", "MostAllocated")))}
        if draw(st.booleans()):
            names = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))
            strategy["resources"] = [{"name": n, "weight": draw(st.integers(1, 5))} for n in names]
        args: Json = {"scoringStrategy": strategy}
        if draw(st.integers(0, 3)) == 0:
            args["ignoredResources"] = [EXTENDED]
        if draw(st.integers(0, 3)) == 0:
            args["ignoredResourceGroups"] = ["example.com"]
        out.append({"name": "NodeResourcesFit", "args": args})
    if draw(st.integers(0, 2)) == 0:
        names = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))
        out.append(
            {
                "name": "NodeResourcesBalancedAllocation",
                "args": {"resources": [{"name": n, "weight": 1} for n in names]},
            }
        )
    return out
