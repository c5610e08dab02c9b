"""Hypothesis strategies for DynamicResources: nodes with hand-made ResourceSlices, DeviceClasses with CEL
selectors, claims already allocated to other pods, and an incoming pod whose claims ask for devices (ExactCount,
All, ``firstAvailable``, selectors, ``matchAttribute``).

Each node's devices sit in one slice of one pool, so kube's first solution is deterministic (kube walks pools in
Go map order and a pool's slices in lister order): the chosen devices can be compared, not only the verdicts.
Pools are sometimes incomplete, invalid (a device name twice) or have an outdated generation beside them.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.support.dra import claim, device, device_class, exactly, first_available, resource_slice, sub_request
from tests.support.judge import Case, Json, config_for

DRIVER = "gpu.example.com"
MODELS = ("A100", "H100")
MEMORY = ("16Gi", "40Gi", "80Gi")
CLASSES: tuple[Json, ...] = (
    device_class("gpu", f'device.driver == "{DRIVER}"'),
    device_class("a100", f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].model == "A100"'),
    device_class(
        "big", f'device.driver == "{DRIVER}" && device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'
    ),
)
SELECTORS = (
    f'device.attributes["{DRIVER}"].numa == 0',
    f'device.attributes["{DRIVER}"].healthy',
    f'device.capacity["{DRIVER}"].memory.isGreaterThan(quantity("20Gi"))',
    f'"model" in device.attributes["{DRIVER}"] && device.attributes["{DRIVER}"].model.startsWith("H")',
)
CLASS_NAMES = ("gpu", "a100", "big")
COUNTS = st.sampled_from((1, 1, 1, 2))


@st.composite
def _devices(draw: Any, node: int) -> list[Json]:
    out = []
    for j in range(draw(st.sampled_from((0, 1, 2, 3, 3, 4, 4, 5)))):
        out.append(
            device(
                f"gpu-{j}",
                capacity={"memory": draw(st.sampled_from(MEMORY))},
                model=draw(st.sampled_from(MODELS)),
                numa=draw(st.integers(0, 1)),
                healthy=draw(st.booleans()),
            )
        )
    if out and draw(st.integers(0, 9)) == 0:
        out.append(dict(out[0]))  # a device name twice: kube calls the pool invalid
    return out


@st.composite
def _request(draw: Any, name: str) -> Json:
    selectors = draw(st.lists(st.sampled_from(SELECTORS), max_size=1))
    if draw(st.integers(0, 4)) == 0:
        subs = [
            sub_request(f"s{k}", draw(st.sampled_from(CLASS_NAMES)), *selectors, count=draw(COUNTS))
            for k in range(draw(st.integers(1, 3)))
        ]
        return first_available(name, *subs)
    mode = "All" if draw(st.integers(0, 5)) == 0 else "ExactCount"
    class_name = "missing" if draw(st.integers(0, 60)) == 0 else draw(st.sampled_from(CLASS_NAMES))
    return exactly(name, class_name, *selectors, count=draw(COUNTS), mode=mode)


@st.composite
def dra_cases(draw: Any) -> Case:
    n_nodes = draw(st.integers(1, 3))
    nodes = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": f"node-{i}", "labels": {"kubernetes.io/hostname": f"node-{i}"}},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}},
        }
        for i in range(n_nodes)
    ]
    slices: list[Json] = []
    devices_of: dict[str, list[str]] = {}
    for i in range(n_nodes):
        if draw(st.integers(0, 5)) == 0:
            continue
        name = f"node-{i}"
        devs = draw(_devices(i))
        count = 2 if draw(st.integers(0, 9)) == 0 else 1  # sometimes incomplete
        slices.append(resource_slice(f"slice-{i}", devs, node=name, driver=DRIVER, generation=2, count=count))
        if draw(st.integers(0, 5)) == 0:  # an outdated generation beside it: never used
            slices.append(resource_slice(f"old-{i}", [device("gpu-9")], node=name, driver=DRIVER, generation=1))
        devices_of[name] = [d["name"] for d in devs]
    held: list[Json] = []
    for name, devs in devices_of.items():
        for dev in dict.fromkeys(devs):
            if draw(st.integers(0, 5)) == 0:
                c = claim(f"held-{name}-{dev}", exactly("gpu", "gpu"), namespace="other")
                c["status"] = {
                    "allocation": {
                        "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": name, "device": dev}]}
                    }
                }
                held.append(c)
    mine: list[Json] = []
    for k in range(draw(st.integers(1, 2))):
        requests = [draw(_request(f"r{r}")) for r in range(draw(st.integers(1, 2)))]
        constraints = [{"matchAttribute": f"{DRIVER}/numa"}] if draw(st.integers(0, 3)) == 0 else None
        mine.append(claim(f"claim-{k}", *requests, constraints=constraints))
    pod_claims: list[Json] = [{"name": f"c{k}", "resourceClaimName": f"claim-{k}"} for k in range(len(mine))]
    if draw(st.integers(0, 25)) == 0:
        pod_claims.append({"name": "from-template", "resourceClaimTemplateName": "tpl"})  # not created yet
    incoming = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "incoming", "namespace": "default", "uid": "uid-incoming"},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [{"name": "c", "image": "pause", "resources": {"requests": {"cpu": "100m"}}}],
            "resourceClaims": pod_claims,
        },
    }
    objects = {"resourceClaims": held + mine, "resourceSlices": slices, "deviceClasses": list(CLASSES)}
    return Case(nodes=nodes, pods=[], incoming=incoming, config=config_for(), objects=objects)
