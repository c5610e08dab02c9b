"""Storage API objects (PVC, PV, StorageClass, CSINode) and a profile sharing one ``Listers`` with the test."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import CycleState, Diagnosis, Status
from crane_scheduler.framework.runtime import Profile
from crane_scheduler.listers import Listers
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import PodInfo, parse_pod
from crane_scheduler.simulate import Simulator
from tests.support.scheduler import pod


def storage_class(
    name: str, *, wffc: bool = True, provisioner: str = "kubernetes.io/no-provisioner", topologies: Any = None
) -> dict[str, Any]:
    sc: dict[str, Any] = {
        "metadata": {"name": name},
        "provisioner": provisioner,
        "volumeBindingMode": "WaitForFirstConsumer" if wffc else "Immediate",
    }
    if topologies is not None:
        sc["allowedTopologies"] = topologies
    return sc


def pvc(
    name: str,
    *,
    cls: str | None = "local",
    size: str = "1Gi",
    volume: str = "",
    bound: bool = False,
    modes: tuple[str, ...] = ("ReadWriteOnce",),
    annotations: dict[str, str] | None = None,
    rv: str = "1",
) -> dict[str, Any]:
    anns = dict(annotations or {})
    if bound:
        anns["pv.kubernetes.io/bind-completed"] = "yes"
    spec: dict[str, Any] = {"accessModes": list(modes), "resources": {"requests": {"storage": size}}}
    if cls is not None:
        spec["storageClassName"] = cls
    if volume:
        spec["volumeName"] = volume
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"pvc-uid-{name}",
            "annotations": anns,
            "resourceVersion": rv,
        },
        "spec": spec,
        "status": {"phase": "Bound" if bound else "Pending"},
    }


def pv(
    name: str,
    *,
    cls: str = "local",
    size: str = "1Gi",
    node: str | None = None,
    zone: str | None = None,
    claim: str | None = None,
    phase: str = "Available",
    csi: str | None = None,
    modes: tuple[str, ...] = ("ReadWriteOnce",),
    rv: str = "1",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"storageClassName": cls, "capacity": {"storage": size}, "accessModes": list(modes)}
    if node is not None:
        spec["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
                ]
            }
        }
    if claim is not None:
        spec["claimRef"] = {"namespace": "ns", "name": claim, "uid": f"pvc-uid-{claim}"}
    if csi is not None:
        spec["csi"] = {"driver": csi, "volumeHandle": f"h-{name}"}
    labels = {"topology.kubernetes.io/zone": zone} if zone else {}
    return {
        "metadata": {"name": name, "labels": labels, "resourceVersion": rv},
        "spec": spec,
        "status": {"phase": phase},
    }


def pod_with_claims(name: str, *claims: str, **kw: Any) -> dict[str, Any]:
    vols = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(claims)]
    return pod(name, spec={"volumes": vols, **kw.pop("spec", {})}, **kw)


def listers(**objects: list[dict[str, Any]]) -> Listers:
    out = Listers()  # the listers' own kinds (pvcs, pvs, ...): the tests read and change them directly
    for kind, items in objects.items():
        for obj in items:
            out.apply(kind, "ADDED", obj)  # type: ignore[arg-type]
    return out


_BUILT: OrderedDict[int, Simulator] = OrderedDict()
"""id(profile) -> the simulator that built it (the latest few): ``decide`` runs a profile's own search"""


def simulator(
    t: NodeTable, ls: Listers, config: dict[str, Any] | None = None, api: Any = None, writer: Any = None
) -> Simulator:
    """The offline scheduler over ``t`` and ``ls`` with the built-in plugins, its handles connected to ``api`` and
    ``writer`` (the binding cycle's PreBind and preemption's writes), as the service connects them."""
    sim = Simulator(config, table=t, listers=ls, out_of_tree=False)
    for prof in sim.profiles.values():
        if prof.handle is not None:
            prof.handle.api, prof.handle.writer = api, writer
    return sim


def profile(
    t: NodeTable, ls: Listers, config: dict[str, Any] | None = None, api: Any = None, writer: Any = None
) -> Profile:
    sim = simulator(t, ls, config, api, writer)
    prof = next(iter(sim.profiles.values()))
    _BUILT[id(prof)] = sim
    while len(_BUILT) > 32:
        _BUILT.popitem(last=False)
    return prof


def decide(
    t: NodeTable, ls: Listers, p: dict[str, Any] | PodInfo, state: CycleState | None = None, prof: Profile | None = None
) -> ScheduleResult | Diagnosis | Status:
    """The algorithm's own answer for ``p`` with ``prof`` (one of ``profile``'s; default: a new default profile),
    from a fresh search (the first node, the tie-break seeded 0)."""
    info = p if isinstance(p, PodInfo) else parse_pod(p)
    if prof is None:
        prof = profile(t, ls)
    sim = _BUILT[id(prof)]
    assert next(iter(sim.profiles.values())) is prof, "a profile built by tests.support.volumes.profile"
    sim.reseed(0)
    return sim.algorithm.schedule(prof, info, state if state is not None else {})
