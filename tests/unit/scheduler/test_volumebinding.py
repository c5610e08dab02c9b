"""VolumeBinding against kube-scheduler 1.37's behaviour: PreFilter messages, Filter reasons, storage capacity
scoring, assume/revert, PreBind's writes and wait."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import pytest

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import Diagnosis
from crane_scheduler.framework.runtime import Profile
from crane_scheduler.listers import Listers
from crane_scheduler.plugins.volumebinding import plugin as vb_plugin
from crane_scheduler.podinfo import PodInfo, parse_pod
from crane_scheduler.writer import Reply
from tests.support.scheduler import node, table
from tests.support.volumes import decide, listers, pod_with_claims, profile, pv, pvc, storage_class

ZONE = "topology.kubernetes.io/zone"


def nodes3() -> Any:
    return table(node("a", labels={ZONE: "z1"}), node("b", labels={ZONE: "z1"}), node("c", labels={ZONE: "z2"}))


def test_missing_claim_stays_pending_with_kube_reason() -> None:
    result = decide(nodes3(), listers(), pod_with_claims("p", "data"))
    assert isinstance(result, Diagnosis)
    assert result.message == '0/3 nodes are available: persistentvolumeclaim "data" not found.'
    # VolumeRestrictions' PreFilter runs first and refuses it with the same message, as in kube-scheduler
    assert result.rejectors == {"VolumeRestrictions"}
    only_binding = {
        "profiles": [
            {
                "schedulerName": "crane-scheduler",
                "plugins": {"multiPoint": {"disabled": [{"name": "VolumeRestrictions"}]}},
            }
        ]
    }
    t = nodes3()
    again = decide(t, listers(), pod_with_claims("p", "data"), prof=profile(t, listers(), only_binding))
    assert isinstance(again, Diagnosis) and again.rejectors == {"VolumeBinding"}
    assert again.message == result.message


def test_deleting_and_lost_claims_are_refused() -> None:
    deleting = pvc("data")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    result = decide(nodes3(), listers(pvcs=[deleting]), pod_with_claims("p", "data"))
    assert isinstance(result, Diagnosis) and 'persistentvolumeclaim "data" is being deleted' in result.message
    lost = pvc("data", volume="gone")
    lost["status"]["phase"] = "Lost"
    result = decide(nodes3(), listers(pvcs=[lost]), pod_with_claims("p", "data"))
    assert isinstance(result, Diagnosis)
    assert 'persistentvolumeclaim "data" bound to non-existent persistentvolume "gone"' in result.message


def test_unbound_immediate_claim_waits_for_the_pv_controller() -> None:
    ls = listers(storageclasses=[storage_class("fast", wffc=False)], pvcs=[pvc("data", cls="fast")])
    result = decide(nodes3(), ls, pod_with_claims("p", "data"))
    assert isinstance(result, Diagnosis)
    assert result.message == "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims."


def test_bound_claim_follows_its_pv_node_affinity() -> None:
    ls = listers(pvcs=[pvc("data", volume="pv1", bound=True)], pvs=[pv("pv1", node="b", claim="data", phase="Bound")])
    result = decide(nodes3(), ls, pod_with_claims("p", "data"))
    assert isinstance(result, ScheduleResult) and result.node == "b"
    ls = listers(pvcs=[pvc("data", volume="pv1", bound=True)], pvs=[pv("pv1", node="x", claim="data", phase="Bound")])
    result = decide(nodes3(), ls, pod_with_claims("p", "data"))
    assert isinstance(result, Diagnosis)
    assert result.message == "0/3 nodes are available: 3 node(s) didn't match PersistentVolume's node affinity."


def test_bound_claim_whose_pv_is_gone() -> None:
    ls = listers(pvcs=[pvc("data", volume="pv1", bound=True)])
    result = decide(nodes3(), ls, pod_with_claims("p", "data"))
    assert isinstance(result, Diagnosis)  # VolumeZone's PreFilter looks the PV up first
    assert result.message == '0/3 nodes are available: persistentvolume "pv1" not found.'
    no_zone = {
        "profiles": [
            {"schedulerName": "crane-scheduler", "plugins": {"multiPoint": {"disabled": [{"name": "VolumeZone"}]}}}
        ]
    }
    t = nodes3()
    result = decide(t, ls, pod_with_claims("p", "data"), prof=profile(t, ls, no_zone))
    assert isinstance(result, Diagnosis)
    assert result.message == (
        "0/3 nodes are available: 3 node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)."
    )


def test_wait_for_first_consumer_claim_goes_where_an_available_pv_is() -> None:
    ls = listers(storageclasses=[storage_class("local")], pvcs=[pvc("data")], pvs=[pv("pv-c", node="c")])
    result = decide(nodes3(), ls, pod_with_claims("p", "data"))
    assert isinstance(result, ScheduleResult) and result.node == "c"


def test_static_matching_takes_the_smallest_fitting_pv_and_not_one_twice() -> None:
    ls = listers(
        storageclasses=[storage_class("local")],
        pvcs=[pvc("d1", size="1Gi"), pvc("d2", size="1Gi")],
        pvs=[pv("small-a", node="a", size="1Gi"), pv("big-a", node="a", size="5Gi"), pv("small-b", node="b")],
    )
    # Two claims: only node a has two PVs; b has one; c none.
    t = nodes3()
    state: dict[str, Any] = {}
    result = decide(t, ls, pod_with_claims("p", "d1", "d2"), state)
    assert isinstance(result, ScheduleResult) and result.node == "a"
    too_small = listers(storageclasses=[storage_class("local")], pvcs=[pvc("d", size="2Gi")], pvs=[pv("x", node="a")])
    result = decide(t, too_small, pod_with_claims("p", "d"))
    assert isinstance(result, Diagnosis)
    assert result.message == "0/3 nodes are available: 3 node(s) didn't find available persistent volumes to bind."


def test_reserve_assumes_the_pv_for_the_next_pod_and_unreserve_gives_it_back() -> None:
    t = nodes3()
    ls = listers(storageclasses=[storage_class("local")], pvcs=[pvc("d1"), pvc("d2")], pvs=[pv("only", node="c")])
    prof = profile(t, ls)
    first = parse_pod(pod_with_claims("p1", "d1"))
    state: dict[str, Any] = {}
    result = decide(t, ls, first, state, prof)
    assert isinstance(result, ScheduleResult) and result.node == "c"
    assert prof.run_reserve(state, first, "c").success
    assumed = ls.pv("only")
    assert assumed is not None and assumed["spec"]["claimRef"]["name"] == "d1"
    assert assumed["metadata"]["annotations"]["pv.kubernetes.io/bound-by-controller"] == "yes"
    second = decide(t, ls, pod_with_claims("p2", "d2"), {}, prof)
    assert isinstance(second, Diagnosis)  # the PV is taken by the first pod's assumption
    prof.run_unreserve(state, first, "c")
    assert "claimRef" not in (ls.pv("only") or {})["spec"]
    again = decide(t, ls, pod_with_claims("p2", "d2"), {}, prof)
    assert isinstance(again, ScheduleResult) and again.node == "c"


def test_dynamic_provisioning_respects_allowed_topologies_and_selected_node() -> None:
    topo = [{"matchLabelExpressions": [{"key": ZONE, "values": ["z2"]}]}]
    ls = listers(
        storageclasses=[storage_class("csi", provisioner="csi.example.com", topologies=topo)],
        pvcs=[pvc("d", cls="csi")],
    )
    t = nodes3()
    prof = profile(t, ls)
    p = parse_pod(pod_with_claims("p", "d"))
    state: dict[str, Any] = {}
    result = decide(t, ls, p, state, prof)
    assert isinstance(result, ScheduleResult) and result.node == "c"
    assert prof.run_reserve(state, p, "c").success
    claim = ls.pvc("ns", "d")
    assert claim is not None and claim["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == "c"
    # A claim already given a node fits only there.
    ls2 = listers(
        storageclasses=[storage_class("csi", provisioner="csi.example.com")],
        pvcs=[pvc("d", cls="csi", annotations={"volume.kubernetes.io/selected-node": "b"})],
    )
    result = decide(t, ls2, pod_with_claims("p", "d"))
    assert isinstance(result, ScheduleResult) and result.node == "b"


def test_provisioning_needs_storage_capacity_when_the_csi_driver_tracks_it() -> None:
    """kube's hasEnoughCapacity: a driver with ``storageCapacity: true`` provisions only where a CSIStorageCapacity
    of the class reaches the node with room for the claim (maximumVolumeSize before capacity)."""
    driver = {"metadata": {"name": "csi.example.com"}, "spec": {"storageCapacity": True}}

    def capacity(name: str, zone: str | None, size: str, max_size: str | None = None) -> dict[str, Any]:
        cap: dict[str, Any] = {"metadata": {"name": name, "namespace": "kube-system"}, "storageClassName": "csi"}
        cap["capacity"] = size
        if zone is not None:
            cap["nodeTopology"] = {"matchLabels": {ZONE: zone}}
        if max_size is not None:
            cap["maximumVolumeSize"] = max_size
        return cap

    caps = [capacity("z1", "z1", "1Gi"), capacity("z2", "z2", "10Gi", max_size="1Gi"), capacity("x", None, "9Gi")]
    ls = listers(
        storageclasses=[storage_class("csi", provisioner="csi.example.com")],
        pvcs=[pvc("d", cls="csi", size="2Gi")],
        csidrivers=[driver],
        csistoragecapacities=caps,
    )
    result = decide(nodes3(), ls, pod_with_claims("p", "d"))
    assert isinstance(result, Diagnosis)
    assert result.message == "0/3 nodes are available: 3 node(s) did not have enough free storage."
    ls.apply("csistoragecapacities", "ADDED", capacity("z2-big", "z2", "5Gi"))
    result = decide(nodes3(), ls, pod_with_claims("p", "d"))
    assert isinstance(result, ScheduleResult) and result.node == "c"
    # Without capacity tracking the driver's capacity is not checked.
    ls.apply("csidrivers", "MODIFIED", {**driver, "spec": {"storageCapacity": False}}, driver)
    ls.apply("csistoragecapacities", "DELETED", capacity("z2-big", "z2", "5Gi"))
    result = decide(nodes3(), ls, pod_with_claims("p", "d"))
    assert isinstance(result, ScheduleResult)


def test_no_provisioner_and_no_pv_is_a_bind_conflict() -> None:
    ls = listers(storageclasses=[storage_class("local")], pvcs=[pvc("d")])
    result = decide(nodes3(), ls, pod_with_claims("p", "d"))
    assert isinstance(result, Diagnosis)
    assert result.message == "0/3 nodes are available: 3 node(s) didn't find available persistent volumes to bind."


def test_args_are_checked() -> None:
    from crane_scheduler.framework import ArgsError, Handle

    assert vb_plugin.new({}, Handle(table())).shape == ((0, 100), (100, 0))  # kube 1.37's default, scaled
    shaped = vb_plugin.new(
        {"shape": [{"utilization": 0, "score": 0}, {"utilization": 100, "score": 10}]}, Handle(table())
    )
    assert shaped.shape == ((0, 0), (100, 100))
    with pytest.raises(ArgsError, match=r"shape\[1\]\.utilization"):
        vb_plugin.new({"shape": [{"utilization": 50, "score": 1}, {"utilization": 10, "score": 2}]}, Handle(table()))
    with pytest.raises(ArgsError, match=r"shape\[0\]\.score"):
        vb_plugin.new({"shape": [{"utilization": 0, "score": 11}]}, Handle(table()))
    with pytest.raises(ArgsError, match="bindTimeoutSeconds"):
        vb_plugin.new({"bindTimeoutSeconds": -1}, Handle(table()))


def _scores(t: Any, ls: Listers, p: dict[str, Any]) -> list[int]:
    """VolumeBinding's PreScore verdict and Score on every node, after its PreFilter and Filter."""
    import numpy as np

    from crane_scheduler.framework import Handle

    plugin = vb_plugin.new({}, Handle(t, listers=ls))
    info, state = parse_pod(p), {}  # type: ignore[var-annotated]
    plugin.pre_filter(state, info, t)
    plugin.filter(state, info, t)
    rows = np.array(sorted(t.rows.values()))
    assert plugin.pre_score(state, info, t, rows).success  # kube 1.37 scores every pod (1.35 skipped)
    scores: list[int] = plugin.score(state, info, t, rows).tolist()
    return scores


def test_storage_capacity_scoring_prefers_the_emptier_volume_or_pool_as_kube_137() -> None:
    # static binding: the claim over the PV each node would bind (a: 1Gi of 4Gi -> 75, b: 1Gi of 1Gi -> 0)
    ls = listers(
        storageclasses=[storage_class("local")],
        pvcs=[pvc("d", size="1Gi")],
        pvs=[pv("pv-a", node="a", size="4Gi"), pv("pv-b", node="b", size="1Gi")],
    )
    assert _scores(nodes3(), ls, pod_with_claims("p", "d"))[:2] == [75, 0]
    # provisioning with tracked capacity: the claim over the capacity that admitted it (z1: 2 of 8 -> 75, z2: 50)
    driver = {"metadata": {"name": "csi.example.com"}, "spec": {"storageCapacity": True}}
    caps = [
        {
            "metadata": {"name": n},
            "storageClassName": "csi",
            "capacity": size,
            "nodeTopology": {"matchLabels": {ZONE: z}},
        }
        for n, z, size in (("z1", "z1", "8Gi"), ("z2", "z2", "4Gi"))
    ]
    ls = listers(
        storageclasses=[storage_class("csi", provisioner="csi.example.com")],
        pvcs=[pvc("d", cls="csi", size="2Gi")],
        csidrivers=[driver],
        csistoragecapacities=caps,
    )
    assert _scores(nodes3(), ls, pod_with_claims("p", "d")) == [75, 75, 50]
    # a pod without claims: kube's PreScore still passes, every node scores 0
    assert _scores(nodes3(), listers(), {"metadata": {"name": "q", "namespace": "ns"}, "spec": {}}) == [0, 0, 0]


class _Resp:
    def __init__(self, body: dict[str, Any]) -> None:
        self.status, self.reason, self._body = 200, "OK", json.dumps(body).encode()
        self.headers: dict[str, str] = {}

    async def read(self) -> bytes:
        return self._body


class _FakeCore:
    """Records PreBind's writes; answers like the API (a new resourceVersion)."""

    writes: ClassVar[list[tuple[str, dict[str, Any]]]] = []
    wrote: ClassVar[asyncio.Event]

    def __init__(self, api: Any) -> None:
        pass

    async def replace_persistent_volume(self, name: str, body: dict[str, Any], **kw: Any) -> _Resp:
        out = json.loads(json.dumps(body))
        out["metadata"]["resourceVersion"] = "2"
        self.writes.append(("pv", out))
        self.wrote.set()
        return _Resp(out)

    async def replace_namespaced_persistent_volume_claim(
        self, name: str, ns: str, body: dict[str, Any], **kw: Any
    ) -> _Resp:
        out = json.loads(json.dumps(body))
        out["metadata"]["resourceVersion"] = "2"
        self.writes.append(("pvc", out))
        return _Resp(out)


class _FakeWriter:
    """The API writer's bind, recorded beside the PV/PVC writes (the order is what the test checks)."""

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> Reply:
        _FakeCore.writes.append(("binding", {"name": name, "node": node}))
        return Reply(201)


async def test_pre_bind_writes_the_binding_and_waits_for_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kubernetes_asyncio.client.CoreV1Api", _FakeCore)
    _FakeCore.writes, _FakeCore.wrote = [], asyncio.Event()
    t = nodes3()
    ls = listers(storageclasses=[storage_class("local")], pvcs=[pvc("d")], pvs=[pv("only", node="c")])
    prof = profile(t, ls, api=object(), writer=_FakeWriter())
    p = parse_pod(pod_with_claims("p", "d"))
    state: dict[str, Any] = {}
    result = decide(t, ls, p, state, prof)
    assert isinstance(result, ScheduleResult)
    assert prof.run_reserve(state, p, "c").success
    binding = asyncio.create_task(prof.run_binding(state, p, "c"))
    await _FakeCore.wrote.wait()
    kind, written = _FakeCore.writes[0]
    assert kind == "pv" and written["spec"]["claimRef"]["name"] == "d"
    await asyncio.sleep(0)
    assert not binding.done()  # waits for the PV controller
    ls.apply("pvs", "MODIFIED", written)
    ls.apply("pvcs", "MODIFIED", pvc("d", volume="only", bound=True, rv="3"))
    status = await asyncio.wait_for(binding, 5)
    assert status.success, status
    assert [k for k, _ in _FakeCore.writes] == ["pv", "binding"]  # the pod is bound after its volumes


def _reserved_on_c() -> tuple[Listers, Profile, PodInfo, dict[str, Any]]:
    """Pod ``p`` with claim ``d``, whose only PV is on node c, reserved there (PreBind next)."""
    t = nodes3()
    ls = listers(storageclasses=[storage_class("local")], pvcs=[pvc("d")], pvs=[pv("only", node="c")])
    prof = profile(t, ls, api=object())
    p = parse_pod(pod_with_claims("p", "d"))
    state: dict[str, Any] = {}
    decide(t, ls, p, state, prof)
    assert prof.run_reserve(state, p, "c").success
    return ls, prof, p, state


async def test_pre_bind_fails_when_the_claim_ref_is_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kubernetes_asyncio.client.CoreV1Api", _FakeCore)
    _FakeCore.writes, _FakeCore.wrote = [], asyncio.Event()
    ls, prof, p, state = _reserved_on_c()
    binding = asyncio.create_task(prof.run_binding(state, p, "c"))
    await _FakeCore.wrote.wait()
    ls.apply("pvs", "MODIFIED", pv("only", node="c", rv="3"))  # someone reset the claimRef
    status = await asyncio.wait_for(binding, 5)
    assert not status.success and "ClaimRef got reset" in status.message
    prof.run_unreserve(state, p, "c")
    assert not ls.is_assumed("pvs", "only")


class _ConflictingCore(_FakeCore):
    """Answers the PV update with a 409 Status, as the API server does when the PV changed meanwhile."""

    async def replace_persistent_volume(self, name: str, body: dict[str, Any], **kw: Any) -> _Resp:
        resp = _Resp({"kind": "Status", "code": 409, "message": f'Operation cannot be fulfilled on "{name}"'})
        resp.status, resp.reason = 409, "Conflict"
        return resp


async def test_a_failed_volume_write_names_the_object_the_verb_and_the_status(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kubernetes_asyncio.client.CoreV1Api", _ConflictingCore)
    _, prof, p, state = _reserved_on_c()
    status = await asyncio.wait_for(prof.run_binding(state, p, "c"), 30)
    assert not status.success
    assert (
        status.message
        == 'binding volumes: update persistentvolume only: HTTP 409: Operation cannot be fulfilled on "only"'
    )
