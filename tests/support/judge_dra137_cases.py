"""Hypothesis strategies for the DRA features kube 1.37 turns on by default, one per feature (``FEATURES``):

- ``partitionable``: physical GPUs published as partitions (whole, halves, quarters) consuming a GPU's shared
  counters (``sharedCounters`` in a counter slice, ``consumesCounters`` on the devices), some partitions held by
  other claims, pools spread over nodes with ``perDeviceNodeSelection``, incomplete and invalid pools;
- ``taints``: device taints (NoSchedule, NoExecute, None) in the slices and from DeviceTaintRules, requests with
  tolerations (Exists, Equal, by effect);
- ``consumable``: devices allocated several times (``allowMultipleAllocations``) with capacities and request
  policies (default, validRange min/max/step, validValues), requests of capacity, shares held by other claims,
  ``distinctAttribute``;
- ``binding``: devices with binding conditions, failure conditions and ``bindsToNode`` (their pools searched last),
  and allocated claims whose devices are bound, failed or timed out;
- ``extended``: pods asking for extended resources a DeviceClass maps (``extendedResourceName`` and the implicit
  ``deviceclass.resource.kubernetes.io/<class>``) in app, sidecar and init containers, on nodes with and without a
  device plugin publishing the resource, beside a claim of their own; an earlier attempt's claim.

Every node's devices sit in pools whose order kube fixes (sorted by name since 1.36), so the chosen devices are
compared, not only the verdicts. Share IDs are random on both sides (``tests.support.judge`` masks them).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.support.dra import claim, device, device_class, exactly, first_available, resource_slice, sub_request
from tests.support.judge import Case, Json, config_for

DRIVER = "gpu.example.com"
NET = "net.example.com"
OLD = "2000-01-01T00:00:00Z"  # an allocation long past any binding timeout
NEW = "2099-01-01T00:00:00Z"  # one that cannot have timed out


def rare(draw: Any, n: int) -> bool:
    """True about once in ``n + 1`` draws (hypothesis favours a strategy's simplest values, so the common choice
    comes first and is what shrinking goes back to)."""
    return bool(draw(st.sampled_from((False,) * n + (True,))))


def _node(i: int, allocatable: Json | None = None) -> Json:
    name = f"node-{i}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "rack": "r0" if i % 2 else "r1"}},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110", **(allocatable or {})}},
    }


def _pod(claims: list[Json], containers: list[Json] | None = None, init: list[Json] | None = None) -> Json:
    spec: Json = {
        "schedulerName": "default-scheduler",
        "containers": containers or [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "100m"}}}],
    }
    if init:
        spec["initContainers"] = init
    if claims:
        spec["resourceClaims"] = [
            {"name": f"c{k}", "resourceClaimName": c["metadata"]["name"]} for k, c in enumerate(claims)
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "incoming", "namespace": "default", "uid": "uid-incoming"},
        "spec": spec,
    }


def _held(
    node: str, dev: str, *, request: str = "gpu", pool: str | None = None, driver: str = DRIVER, **extra: Any
) -> Json:
    """A claim of another pod holding a device."""
    c = claim(f"held-{pool or node}-{dev}", exactly(request, "gpu"), namespace="other")
    result = {"request": request, "driver": driver, "pool": pool or node, "device": dev, **extra}
    c["status"] = {"allocation": {"devices": {"results": [result]}}}
    return c


def _case(
    nodes: list[Json], slices: list[Json], classes: list[Json], claims: list[Json], pod: Json, **more: Any
) -> Case:
    objects: dict[str, list[Json]] = {"resourceClaims": claims, "resourceSlices": slices, "deviceClasses": classes}
    objects.update(more)
    return Case(nodes=nodes, pods=[], incoming=pod, config=config_for(), objects=objects)


def _counter(value: str) -> Json:
    return {"value": value}


# ---------------------------------------------------------------------------------------------- partitionable

PART_CLASSES: tuple[Json, ...] = (
    device_class("gpu", f'device.driver == "{DRIVER}"'),
    device_class("whole", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].partition == "whole"'),
    device_class("half", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].partition == "half"'),
    device_class("quarter", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].partition == "quarter"'),
)


def _partitions(gpu: int, layout: str, node_name: str | None = None) -> list[Json]:
    """The partitions of physical GPU ``gpu``: whole (all 4 slices), halves (2), quarters (1), each consuming the
    GPU's counter set."""
    out = []
    sizes = {"whole": (("w", 4),), "halves": (("h0", 2), ("h1", 2)), "quarters": tuple((f"q{k}", 1) for k in range(4))}
    kinds = {"whole": "whole", "halves": "half", "quarters": "quarter"}
    chosen = ("whole", "halves", "quarters") if layout == "all" else (layout,)
    for part in chosen:
        for suffix, n in sizes[part]:
            d = device(f"gpu-{gpu}-{suffix}", partition=kinds[part], parent=gpu)
            d["consumesCounters"] = [
                {
                    "counterSet": f"gpu-{gpu}",
                    "counters": {"slices": _counter(str(n)), "memory": _counter(f"{10 * n}Gi")},
                }
            ]
            if node_name is not None:
                d["nodeName"] = node_name
            out.append(d)
    return out


def _counter_sets(gpus: int) -> list[Json]:
    return [
        {"name": f"gpu-{g}", "counters": {"slices": _counter("4"), "memory": _counter("40Gi")}} for g in range(gpus)
    ]


@st.composite
def partitionable_cases(draw: Any) -> Case:
    n_nodes = draw(st.integers(1, 3))
    nodes = [_node(i) for i in range(n_nodes)]
    slices: list[Json] = []
    held: list[Json] = []
    for i in range(n_nodes):
        name = f"node-{i}"
        if rare(draw, 5):
            continue
        gpus = draw(st.integers(1, 2))
        layout = draw(st.sampled_from(("all", "all", "halves", "quarters", "whole")))
        devices = [d for g in range(gpus) for d in _partitions(g, layout)]
        counters = _counter_sets(gpus)
        problem = draw(st.sampled_from(("none",) * 12 + ("foreign set", "missing slice", "set twice")))
        if problem == "foreign set":  # a device consuming a counter set the pool does not declare: invalid
            devices[0]["consumesCounters"][0]["counterSet"] = "gpu-9"
        count = 2
        if problem == "missing slice":  # the counter slice is missing: incomplete
            count = 3
        ctr = resource_slice(f"counters-{i}", [], node=name, driver=DRIVER, pool=name, count=count)
        del ctr["spec"]["devices"]
        ctr["spec"]["sharedCounters"] = counters
        if problem == "set twice":  # a counter set twice: invalid
            ctr["spec"]["sharedCounters"] = counters + counters[:1]
        slices.append(ctr)
        slices.append(resource_slice(f"devices-{i}", devices, node=name, driver=DRIVER, pool=name, count=count))
        for d in devices:
            if rare(draw, 6):
                held.append(_held(name, d["name"]))
    if n_nodes > 1 and rare(draw, 3):
        # one pool over the nodes: its counters everywhere, each partition on one node (perDeviceNodeSelection)
        ctr = resource_slice("shared-counters", [], all_nodes=True, driver=DRIVER, pool="shared", count=2)
        del ctr["spec"]["devices"]
        ctr["spec"]["sharedCounters"] = _counter_sets(1)
        devices = _partitions(0, "halves")
        for k, d in enumerate(devices):
            d["nodeName"] = f"node-{k % n_nodes}"
        devices.append({**_partitions(0, "whole")[0], "allNodes": True})
        per = resource_slice("shared-devices", devices, driver=DRIVER, pool="shared", count=2)
        per["spec"]["perDeviceNodeSelection"] = True
        slices += [ctr, per]
        if draw(st.booleans()):
            held.append(_held("shared", devices[0]["name"], pool="shared"))
    mine: list[Json] = []
    for k in range(draw(st.integers(1, 2))):
        if rare(draw, 3):
            subs = [sub_request(s, s, count=draw(st.sampled_from((1, 1, 2)))) for s in ("whole", "half", "quarter")]
            requests = [first_available("gpu", *subs[draw(st.integers(0, 2)) :])]
        else:
            requests = [
                exactly(
                    f"r{r}",
                    draw(st.sampled_from(("gpu", "whole", "half", "quarter"))),
                    count=draw(st.sampled_from((1, 1, 2, 3))),
                )
                for r in range(draw(st.integers(1, 2)))
            ]
        constraints = None
        pick = draw(st.sampled_from(("none",) * 4 + ("match", "distinct")))
        if pick == "match":
            constraints = [{"matchAttribute": f"{DRIVER}/parent"}]
        elif pick == "distinct":
            constraints = [{"distinctAttribute": f"{DRIVER}/parent"}]
        mine.append(claim(f"claim-{k}", *requests, constraints=constraints))
    return _case(nodes, slices, list(PART_CLASSES), held + mine, _pod(mine))


# ---------------------------------------------------------------------------------------------- taints

TAINT_KEYS = ("maintenance", "degraded")
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
GPU_CLASSES: tuple[Json, ...] = (
    device_class("gpu", f'device.driver == "{DRIVER}"'),
    device_class("a100", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].model == "A100"'),
)


@st.composite
def _taint(draw: Any) -> Json:
    out = {"key": draw(st.sampled_from(TAINT_KEYS)), "effect": draw(st.sampled_from(TAINT_EFFECTS))}
    value = draw(st.sampled_from(("", "yes", "no")))
    if value:
        out["value"] = value
    return out


@st.composite
def _toleration(draw: Any) -> Json:
    out: Json = {}
    if not rare(draw, 3):
        out["key"] = draw(st.sampled_from(TAINT_KEYS))
    operator = draw(st.sampled_from(("Exists", "Equal", "")))
    if operator:
        out["operator"] = operator
    if operator != "Exists" and draw(st.booleans()):
        out["value"] = draw(st.sampled_from(("yes", "no")))
    if draw(st.booleans()):
        out["effect"] = draw(st.sampled_from(TAINT_EFFECTS))
    return out


@st.composite
def taint_cases(draw: Any) -> Case:
    n_nodes = draw(st.integers(1, 3))
    nodes = [_node(i) for i in range(n_nodes)]
    slices: list[Json] = []
    held: list[Json] = []
    names: list[tuple[str, str]] = []
    for i in range(n_nodes):
        name = f"node-{i}"
        if rare(draw, 5):
            continue
        devices = []
        for j in range(draw(st.integers(1, 4))):
            d = device(f"gpu-{j}", model=draw(st.sampled_from(("A100", "H100"))))
            taints = draw(st.lists(_taint(), max_size=2))
            if taints and not rare(draw, 2):
                d["taints"] = taints
            devices.append(d)
            names.append((name, d["name"]))
            if rare(draw, 7):
                held.append(_held(name, d["name"]))
        slices.append(resource_slice(f"slice-{i}", devices, node=name, driver=DRIVER))
    rules: list[Json] = []
    for r in range(draw(st.integers(0, 2))):
        selector: Json | None = {}
        assert selector is not None
        if not rare(draw, 2):
            selector["driver"] = draw(st.sampled_from((DRIVER, DRIVER, "other.example.com")))
        if names and draw(st.booleans()):
            node_name, dev = draw(st.sampled_from(names))
            selector["pool"] = node_name
            if draw(st.booleans()):
                selector["device"] = dev
        if rare(draw, 6):
            selector = None  # a rule without a selector taints nothing
        spec: Json = {"taint": draw(_taint())}
        if selector is not None:
            spec["deviceSelector"] = selector
        rules.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceTaintRule",
                "metadata": {"name": f"rule-{r}"},
                "spec": spec,
            }
        )
    mine: list[Json] = []
    for k in range(draw(st.integers(1, 2))):
        requests = []
        for r in range(draw(st.integers(1, 2))):
            tolerations = draw(st.lists(_toleration(), max_size=2))
            if rare(draw, 4):
                sub = sub_request("s0", draw(st.sampled_from(("gpu", "a100"))))
                if tolerations:
                    sub["tolerations"] = tolerations
                requests.append(first_available(f"r{r}", sub, sub_request("s1", "gpu")))
                continue
            req = exactly(f"r{r}", draw(st.sampled_from(("gpu", "a100"))), count=draw(st.sampled_from((1, 1, 2))))
            if tolerations:
                req["exactly"]["tolerations"] = tolerations
            requests.append(req)
        mine.append(claim(f"claim-{k}", *requests))
    extra = {"deviceTaintRules": rules} if rules else {}
    return _case(nodes, slices, list(GPU_CLASSES), held + mine, _pod(mine), **extra)


# ---------------------------------------------------------------------------------------------- consumable

POLICIES: tuple[Json | None, ...] = (
    None,
    {"default": "10Gi", "validRange": {"min": "5Gi", "max": "40Gi", "step": "5Gi"}},
    {"validRange": {"min": "8Gi"}},
    {"default": "10Gi", "validValues": ["10Gi", "20Gi", "40Gi"]},
    {"validRange": {"min": "4Gi", "step": "4Gi"}},
)
CAPACITY_REQUESTS = ("1Gi", "5Gi", "10Gi", "12Gi", "20Gi", "33Gi", "40Gi", "80Gi")
SHARE_IDS = ("0f1e2d3c-0000-4000-8000-000000000001", "0f1e2d3c-0000-4000-8000-000000000002")
CONSUMABLE_CLASSES: tuple[Json, ...] = (
    device_class("gpu", f'device.driver == "{DRIVER}"'),
    device_class("shared", f'device.driver == "{DRIVER}" && device.allowMultipleAllocations'),
)


@st.composite
def consumable_cases(draw: Any) -> Case:
    n_nodes = draw(st.integers(1, 3))
    nodes = [_node(i) for i in range(n_nodes)]
    slices: list[Json] = []
    held: list[Json] = []
    for i in range(n_nodes):
        name = f"node-{i}"
        if rare(draw, 5):
            continue
        devices = []
        for j in range(draw(st.integers(1, 3))):
            d = device(f"gpu-{j}", numa=draw(st.integers(0, 1)))
            multi = not rare(draw, 3)
            if multi:
                d["allowMultipleAllocations"] = True
            capacity: Json = {}
            if not rare(draw, 5):
                memory: Json = {"value": draw(st.sampled_from(("40Gi", "40Gi", "80Gi", "16Gi")))}
                policy = draw(st.sampled_from(POLICIES))
                if policy is not None:
                    memory["requestPolicy"] = policy
                capacity["memory"] = memory
            if draw(st.booleans()):
                capacity["cores"] = {"value": draw(st.sampled_from(("4", "8")))}
            if capacity:
                d["capacity"] = capacity
            devices.append(d)
            if rare(draw, 4):
                if multi:
                    consumed = {
                        "memory": draw(st.sampled_from(("10Gi", "20Gi", "35Gi"))),
                        **({"cores": "4"} if "cores" in capacity else {}),
                    }
                    extra: Json = {"shareID": SHARE_IDS[j % 2]}
                    if "memory" in capacity:
                        extra["consumedCapacity"] = {k: v for k, v in consumed.items() if k in capacity}
                    held.append(_held(name, d["name"], **extra))
                else:
                    held.append(_held(name, d["name"]))
        slices.append(resource_slice(f"slice-{i}", devices, node=name, driver=DRIVER))
    mine: list[Json] = []
    for k in range(draw(st.integers(1, 2))):
        requests = []
        for r in range(draw(st.integers(1, 2))):
            req = exactly(f"r{r}", draw(st.sampled_from(("gpu", "shared"))), count=draw(st.sampled_from((1, 1, 2))))
            if not rare(draw, 3):
                asked = {"memory": draw(st.sampled_from(CAPACITY_REQUESTS))}
                if rare(draw, 4):
                    asked["cores"] = draw(st.sampled_from(("2", "4", "16")))
                if rare(draw, 12):
                    asked = {"bandwidth": "1"}  # a capacity no device has
                req["exactly"]["capacity"] = {"requests": asked}
            requests.append(req)
        constraints = None
        if len(requests) > 1 and rare(draw, 2):
            constraints = [{draw(st.sampled_from(("distinctAttribute", "matchAttribute"))): f"{DRIVER}/numa"}]
        mine.append(claim(f"claim-{k}", *requests, constraints=constraints))
    return _case(nodes, slices, list(CONSUMABLE_CLASSES), held + mine, _pod(mine))


# ---------------------------------------------------------------------------------------------- binding conditions

BINDING_CLASSES: tuple[Json, ...] = (
    device_class("gpu", f'device.driver == "{DRIVER}"'),
    device_class("fabric", f'device.driver == "{NET}"'),
)


def _conditioned(name: str, draw: Any) -> Json:
    d = device(name)
    if not rare(draw, 2):
        d["bindingConditions"] = ["attached"]
        if draw(st.booleans()):
            d["bindingFailureConditions"] = ["failed"]
    if rare(draw, 2):
        d["bindsToNode"] = True
    return d


@st.composite
def binding_cases(draw: Any) -> Case:
    n_nodes = draw(st.integers(1, 3))
    nodes = [_node(i) for i in range(n_nodes)]
    slices: list[Json] = []
    for i in range(n_nodes):
        name = f"node-{i}"
        if rare(draw, 4):
            continue
        plain = [device(f"gpu-{j}") for j in range(draw(st.integers(0, 2)))]
        slices.append(resource_slice(f"a-{i}", plain, node=name, driver=DRIVER, pool=f"a-{name}"))
        if draw(st.booleans()):
            conditioned = [_conditioned(f"gpu-c{j}", draw) for j in range(draw(st.integers(1, 2)))]
            slices.append(resource_slice(f"b-{i}", conditioned, node=name, driver=DRIVER, pool=f"b-{name}"))
    if draw(st.booleans()):  # network-attached devices any node reaches, bound to one when allocated
        fabric = [_conditioned(f"port-{j}", draw) for j in range(draw(st.integers(1, 3)))]
        slices.append(resource_slice("fabric", fabric, all_nodes=True, driver=NET, pool="fabric"))
    mine: list[Json] = []
    for k in range(draw(st.integers(1, 2))):
        c = claim(
            f"claim-{k}",
            exactly("r0", draw(st.sampled_from(("gpu", "fabric", "gpu"))), count=draw(st.sampled_from((1, 1, 2)))),
        )
        if rare(draw, 2):  # allocated by an earlier attempt, its device being attached
            target = f"node-{draw(st.integers(0, n_nodes - 1))}"
            result: Json = {"request": "r0", "driver": DRIVER, "pool": f"b-{target}", "device": "gpu-c0"}
            status: Json = {}
            if not rare(draw, 3):
                result["bindingConditions"] = ["attached"]
                result["bindingFailureConditions"] = ["failed"]
                conditions = []
                state = draw(st.sampled_from(("none", "pending", "attached", "failed")))
                if state != "none":
                    conditions.append(
                        {
                            "type": "failed" if state == "failed" else "attached",
                            "status": "True" if state != "pending" else "False",
                            "reason": "Test",
                            "message": f"device {state}",
                            "lastTransitionTime": OLD,
                        }
                    )
                    status["devices"] = [
                        {"driver": DRIVER, "pool": f"b-{target}", "device": "gpu-c0", "conditions": conditions}
                    ]
            allocation: Json = {
                "devices": {"results": [result]},
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [target]}]}
                    ]
                },
                "allocationTimestamp": draw(st.sampled_from((OLD, NEW))),
            }
            c["status"] = {"allocation": allocation, **status}
        mine.append(c)
    return _case(nodes, slices, list(BINDING_CLASSES), mine, _pod(mine))


# ---------------------------------------------------------------------------------------------- extended resources

EXTENDED = "example.com/gpu"
IMPLICIT = "deviceclass.resource.kubernetes.io/gpu-class"
UNBACKED = "example.com/fpga"


def _extended_classes(draw: Any) -> list[Json]:
    gpu = device_class("gpu-class", f'device.driver == "{DRIVER}"')
    gpu["spec"]["extendedResourceName"] = EXTENDED
    a100 = device_class("a100", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].model == "A100"')
    return [gpu, a100]


@st.composite
def _container(draw: Any, name: str, sidecar: bool = False) -> Json:
    requests: Json = {"cpu": "100m"}
    for resource in draw(st.lists(st.sampled_from((EXTENDED, EXTENDED, IMPLICIT, UNBACKED)), max_size=2, unique=True)):
        if resource == UNBACKED and not rare(draw, 3):
            continue
        requests[resource] = str(draw(st.sampled_from((1, 1, 2, 0))))
    out: Json = {
        "name": name,
        "image": "pause",
        "resources": {"requests": requests, "limits": {k: v for k, v in requests.items() if k != "cpu"}},
    }
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


@st.composite
def extended_cases(draw: Any) -> Case:
    n_nodes = draw(st.integers(1, 3))
    nodes = []
    slices: list[Json] = []
    for i in range(n_nodes):
        name = f"node-{i}"
        allocatable: Json = {}
        plugin = draw(st.sampled_from(("none", "none", "zero", "two", "one")))
        if plugin != "none":  # a device plugin publishes the resource here
            allocatable[EXTENDED] = {"zero": "0", "one": "1", "two": "2"}[plugin]
        if rare(draw, 5):
            allocatable[UNBACKED] = "1"
        nodes.append(_node(i, allocatable))
        if not rare(draw, 4):
            devices = [
                device(f"gpu-{j}", model=draw(st.sampled_from(("A100", "H100"))))
                for j in range(draw(st.integers(1, 3)))
            ]
            slices.append(resource_slice(f"slice-{i}", devices, node=name, driver=DRIVER))
    held: list[Json] = []
    for s in slices:
        for d in s["spec"]["devices"]:
            if rare(draw, 5):
                held.append(_held(s["spec"]["nodeName"], d["name"]))
    containers = [draw(_container(f"app-{k}")) for k in range(draw(st.integers(1, 2)))]
    init = [draw(_container(f"init-{k}", sidecar=draw(st.booleans()))) for k in range(draw(st.integers(0, 2)))]
    if not any(
        EXTENDED in c["resources"]["requests"] or IMPLICIT in c["resources"]["requests"] for c in containers + init
    ):
        containers[0]["resources"]["requests"][EXTENDED] = "1"
        containers[0]["resources"]["limits"][EXTENDED] = "1"
    mine: list[Json] = []
    if rare(draw, 3):
        mine.append(claim("claim-0", exactly("r0", draw(st.sampled_from(("gpu-class", "a100"))))))
    pod = _pod(mine, containers, init)
    claims = held + mine
    if rare(draw, 9):  # an earlier attempt's claim, written before its binding failed
        stale = claim("incoming-extended-resources-x", exactly("container-0-request-0", "gpu-class"))
        stale["metadata"]["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
        stale["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": "incoming", "uid": "uid-incoming", "controller": True}
        ]
        claims.append(stale)
    return _case(nodes, slices, _extended_classes(draw), claims, pod)


FEATURES = {
    "partitionable": partitionable_cases,
    "taints": taint_cases,
    "consumable": consumable_cases,
    "binding": binding_cases,
    "extended": extended_cases,
}
