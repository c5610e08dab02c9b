"""Hypothesis strategies for the volume plugins (VolumeBinding, VolumeRestrictions, VolumeZone, NodeVolumeLimits)
and DefaultPreemption: clusters with StorageClasses, PVs, PVCs, CSINodes, PDBs and pod priorities.

Objects are consistent as the API server and the PV controller leave them: a bound claim names its volume and
carries ``pv.kubernetes.io/bind-completed``, its PV's ``claimRef`` points back; pod priorities are the resolved
``spec.priority`` (admission copies it from the PriorityClass: both schedulers read only that field). Pools are
small so that claims compete for the same PVs, PVs pin the same nodes and zones, and victims tie.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tests.support.judge import Case, Json, config_for

ZONE = "topology.kubernetes.io/zone"
ZONES = ("zone-a", "zone-b")
DRIVER = "example.com/csi"
SIZES = ("1Gi", "2Gi", "5Gi")
CPU = ("500m", "1", "2")
START_TIMES = ("2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z", "2026-01-02T00:00:00Z")
CLASSES: tuple[Json, ...] = (
    {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "local"},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    },
    {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "csi-wffc"},
        "provisioner": DRIVER,
        "volumeBindingMode": "WaitForFirstConsumer",
        "allowedTopologies": [{"matchLabelExpressions": [{"key": ZONE, "values": ["zone-a"]}]}],
    },
    {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "csi-immediate"},
        "provisioner": DRIVER,
        "volumeBindingMode": "Immediate",
    },
)


def _node(i: int, draw: Any, cpu: str = "4") -> Json:
    name = f"node-{i}"
    labels = {"kubernetes.io/hostname": name}
    if draw(st.integers(0, 3)) > 0:
        labels[ZONE] = draw(st.sampled_from(ZONES))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}},
    }


def _pv(j: int, draw: Any, names: list[str]) -> Json:
    cls = draw(st.sampled_from(("local", "csi-wffc", "csi-immediate")))
    spec: Json = {
        "storageClassName": cls,
        "capacity": {"storage": draw(st.sampled_from(SIZES))},
        "accessModes": [draw(st.sampled_from(("ReadWriteOnce", "ReadWriteOnce", "ReadWriteOncePod")))],
        "persistentVolumeReclaimPolicy": "Retain",
    }
    if cls == "local":
        spec["local"] = {"path": f"/mnt/pv-{j}"}
    else:
        spec["csi"] = {"driver": DRIVER, "volumeHandle": f"handle-{j}"}
    pin = draw(st.sampled_from(("node", "zone", "none")))
    if cls == "local" or pin == "node":
        spec["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/hostname",
                                "operator": "In",
                                "values": [draw(st.sampled_from(names))],
                            }
                        ]
                    }
                ]
            }
        }
    elif pin == "zone":
        zone = draw(st.sampled_from(ZONES))
        spec["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "In", "values": [zone]}]}]
            }
        }
    labels = {ZONE: draw(st.sampled_from(ZONES))} if draw(st.integers(0, 2)) == 0 else {}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"pv-{j}", "labels": labels, "resourceVersion": "1"},
        "spec": spec,
        "status": {"phase": "Available"},
    }


def _claim(name: str, cls: str, size: str, modes: list[str], volume: str = "") -> Json:
    spec: Json = {"accessModes": modes, "resources": {"requests": {"storage": size}}, "storageClassName": cls}
    meta: Json = {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "1"}
    status: Json = {"phase": "Pending"}
    if volume:
        spec["volumeName"] = volume
        meta["annotations"] = {"pv.kubernetes.io/bind-completed": "yes"}
        status = {"phase": "Bound", "accessModes": modes, "capacity": {"storage": size}}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec, "status": status}


def _pod(name: str, spec: Json, *, bound_to: str = "", priority: int = 0, start: str | None = None) -> Json:
    spec = {"schedulerName": "default-scheduler", "priority": priority, **spec}
    status: Json = {"phase": "Pending"}
    if bound_to:
        spec["nodeName"] = bound_to
        status = {"phase": "Running", "startTime": start or START_TIMES[0]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": spec,
        "status": status,
    }


def _container(cpu: str = "100m") -> Json:
    return {"name": "c", "image": "registry.local/app:1", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}


def _volumes(claims: list[str]) -> list[Json]:
    return [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)]


def _capacities(draw: Any, names: list[str]) -> dict[str, list[Json]]:
    """The driver's CSIDriver (storage capacity tracking on or off, or none) and CSIStorageCapacities per zone,
    per node or for every node, with room for some claim sizes only."""
    tracking = draw(st.sampled_from((True, True, False, None)))
    if tracking is None:
        return {}
    driver = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": DRIVER},
        "spec": {"storageCapacity": tracking, "attachRequired": True},
    }
    capacities = []
    # one ``capacity`` per class: kube 1.37 scores a provisioning by the capacity of whichever matching
    # CSIStorageCapacity its lister (a map) yields first, so two of one class must not differ in it
    per_class = {cls: draw(st.sampled_from(("1Gi", "3Gi", "10Gi"))) for cls in ("csi-wffc", "csi-immediate")}
    for k in range(draw(st.integers(0, 3))):
        scope = draw(st.sampled_from(("zone", "node", "all", "none")))
        topology: Json | None = {}
        if scope == "zone":
            topology = {"matchLabels": {ZONE: draw(st.sampled_from(ZONES))}}
        elif scope == "node":
            host = draw(st.sampled_from(names))
            topology = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}]}
        elif scope == "none":
            topology = None
        capacity: Json = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIStorageCapacity",
            "metadata": {"name": f"cap-{k}", "namespace": draw(st.sampled_from(("kube-system", "default")))},
            "storageClassName": (cls := draw(st.sampled_from(("csi-wffc", "csi-wffc", "csi-immediate")))),
            "capacity": per_class[cls],
        }
        if topology is not None:
            capacity["nodeTopology"] = topology
        if draw(st.booleans()):
            capacity["maximumVolumeSize"] = draw(st.sampled_from(("1Gi", "2Gi", "5Gi")))
        capacities.append(capacity)
    return {"csiDrivers": [driver], "csiStorageCapacities": capacities}


@st.composite
def storage_cases(draw: Any, max_nodes: int = 4) -> Case:
    nodes = [_node(i, draw) for i in range(draw(st.integers(1, max_nodes)))]
    names = [n["metadata"]["name"] for n in nodes]
    pvs = [_pv(j, draw, names) for j in range(draw(st.integers(0, 5)))]
    claims: list[Json] = []
    for pv in pvs:  # some PVs are bound already (by the PV controller), to a claim of their own
        if draw(st.integers(0, 2)) == 0:
            name = f"claim-{pv['metadata']['name']}"
            pv_spec = pv["spec"]
            claims.append(
                _claim(
                    name,
                    pv_spec["storageClassName"],
                    pv_spec["capacity"]["storage"],
                    pv_spec["accessModes"],
                    pv["metadata"]["name"],
                )
            )
            pv_spec["claimRef"] = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": "default",
                "name": name,
                "uid": f"uid-{name}",
            }
            pv["status"] = {"phase": "Bound"}
    for k in range(draw(st.integers(0, 3))):  # unbound claims, waiting for a consumer or for provisioning
        cls = draw(st.sampled_from(("local", "csi-wffc", "local", "csi-wffc", "csi-immediate")))
        mode = draw(st.sampled_from(("ReadWriteOnce", "ReadWriteOnce", "ReadWriteOncePod")))
        claims.append(_claim(f"new-{k}", cls, draw(st.sampled_from(SIZES)), [mode]))
    claim_names = [c["metadata"]["name"] for c in claims]
    pods = []
    for i in range(draw(st.integers(0, 4))):  # bound pods: some use claims (RWOP conflicts, attach counts)
        used = draw(st.lists(st.sampled_from(claim_names), max_size=2, unique=True)) if claim_names else []
        spec: Json = {"containers": [_container()]}
        if used:
            spec["volumes"] = _volumes(used)
        pods.append(_pod(f"bound-{i}", spec, bound_to=draw(st.sampled_from(names))))
    csi_nodes = []
    for name in names:
        if draw(st.booleans()):
            count = draw(st.integers(0, 3))
            csi_nodes.append(
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "CSINode",
                    "metadata": {"name": name},
                    "spec": {"drivers": [{"name": DRIVER, "nodeID": name, "allocatable": {"count": count}}]},
                }
            )
    wanted = draw(
        st.lists(st.sampled_from((*claim_names, *claim_names, "missing")), min_size=1, max_size=3, unique=True)
        if claim_names
        else st.just(["missing"] if draw(st.booleans()) else [])
    )
    spec = {"containers": [_container()]}
    if wanted:
        spec["volumes"] = _volumes(wanted)
    objects = {
        "pvcs": claims,
        "pvs": pvs,
        "storageClasses": list(CLASSES),
        "csiNodes": csi_nodes,
        **_capacities(draw, names),
    }
    return Case(nodes, pods, _pod("incoming", spec), config_for(), objects)


@st.composite
def preemption_cases(draw: Any, max_nodes: int = 4, max_pods: int = 8) -> Case:
    """Full nodes, victims of several priorities (ties in priority and start time), PDBs, and now and then an
    incoming pod whose anti-affinity or spread constraint only an eviction can satisfy."""
    nodes = [_node(i, draw, cpu=draw(st.sampled_from(("1", "2")))) for i in range(draw(st.integers(1, max_nodes)))]
    names = [n["metadata"]["name"] for n in nodes]
    pods = []
    for i in range(draw(st.integers(0, max_pods))):
        p = _pod(
            f"bound-{i}",
            {"containers": [_container(draw(st.sampled_from(CPU)))]},
            bound_to=draw(st.sampled_from(names)),
            priority=draw(st.sampled_from((0, 1, 5, 10, 1000))),
            start=draw(st.sampled_from(START_TIMES)),
        )
        app = draw(st.sampled_from(("web", "db", None)))
        if app:
            p["metadata"]["labels"] = {"app": app}
        pods.append(p)
    pdbs = []
    for app in draw(st.lists(st.sampled_from(("web", "db")), max_size=2, unique=True)):
        disrupted = {}
        if draw(st.integers(0, 3)) == 0 and pods:
            disrupted = {draw(st.sampled_from([p["metadata"]["name"] for p in pods])): "2026-01-01T00:00:00Z"}
        pdbs.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": f"pdb-{app}", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": app}}},
                "status": {
                    "disruptionsAllowed": draw(st.integers(0, 2)),
                    "disruptedPods": disrupted,
                    "currentHealthy": 0,
                    "desiredHealthy": 0,
                    "expectedPods": 0,
                },
            }
        )
    spec: Json = {"containers": [_container(draw(st.sampled_from(("2", "1", "2", "500m"))))]}
    if draw(st.integers(0, 6)) == 0:
        spec["preemptionPolicy"] = "Never"
    labels = {"app": "web"} if draw(st.booleans()) else {}
    kind = draw(st.sampled_from(("none", "none", "anti", "spread")))
    if kind == "anti":
        key = draw(st.sampled_from((ZONE, "kubernetes.io/hostname")))
        term = {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": key}
        spec["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    elif kind == "spread":
        labels = {"app": "web"}
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": draw(st.integers(1, 2)),
                "topologyKey": draw(st.sampled_from((ZONE, "kubernetes.io/hostname"))),
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "web"}},
            }
        ]
    objects: dict[str, list[Json]] = {"pdbs": pdbs}
    if pods and draw(st.integers(0, 4)) == 0:  # a ReadWriteOncePod claim in use by a bound pod, wanted too
        pv = _pv(0, draw, names)
        pv["spec"].update(accessModes=["ReadWriteOncePod"], storageClassName="csi-immediate")
        pv["spec"].pop("local", None)
        pv["spec"].pop("nodeAffinity", None)
        pv["spec"]["csi"] = {"driver": DRIVER, "volumeHandle": "handle-0"}
        pv["spec"]["claimRef"] = {
            "kind": "PersistentVolumeClaim",
            "namespace": "default",
            "name": "data",
            "uid": "uid-data",
        }
        pv["status"] = {"phase": "Bound"}
        claim = _claim("data", "csi-immediate", pv["spec"]["capacity"]["storage"], ["ReadWriteOncePod"], "pv-0")
        user = draw(st.sampled_from(pods))
        user["spec"]["volumes"] = _volumes(["data"])
        spec["volumes"] = _volumes(["data"])
        objects.update(pvcs=[claim], pvs=[pv], storageClasses=list(CLASSES))
    incoming = _pod("incoming", spec, priority=draw(st.sampled_from((5, 10, 100))))
    if labels:
        incoming["metadata"]["labels"] = labels
    return Case(nodes, pods, incoming, config_for(), objects, preempt=True)
