"""VolumeRestrictions, VolumeZone and NodeVolumeLimits with kube-scheduler 1.37's reasons."""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import Diagnosis
from crane_scheduler.plugins.nodevolumelimits import NodeVolumeLimits, attachable_volumes
from crane_scheduler.podinfo import parse_pod
from tests.support.scheduler import node, pod, table
from tests.support.volumes import decide, listers, pod_with_claims, profile, pv, pvc, storage_class

ZONE = "topology.kubernetes.io/zone"


def test_same_read_write_disk_conflicts_and_read_only_shares() -> None:
    target = {"iqn": "iqn.2026-01.example:disk-1", "targetPortal": "10.0.0.1", "lun": 0}
    disk = {"name": "d", "iscsi": target}
    on_a = pod("old", node_name="a", spec={"volumes": [disk]})
    t = table(node("a"), node("b"), bound=[on_a])
    result = decide(t, listers(), pod("new", spec={"volumes": [disk]}))
    assert isinstance(result, ScheduleResult) and result.node == "b"
    t1 = table(node("a"), bound=[on_a])
    result = decide(t1, listers(), pod("new", spec={"volumes": [disk]}))
    assert isinstance(result, Diagnosis)
    assert result.message == "0/1 nodes are available: 1 node(s) had no available disk."
    ro = {"name": "d", "iscsi": {**target, "readOnly": True}}
    t2 = table(node("a"), bound=[pod("old", node_name="a", spec={"volumes": [ro]})])
    assert isinstance(decide(t2, listers(), pod("new", spec={"volumes": [ro]})), ScheduleResult)


def test_read_write_once_pod_claim_in_use_blocks_every_node() -> None:
    claim = pvc("rwop", volume="pv1", bound=True, modes=("ReadWriteOncePod",))
    ls = listers(pvcs=[claim], pvs=[pv("pv1", claim="rwop", phase="Bound", modes=("ReadWriteOncePod",))])
    user = pod_with_claims("user", "rwop", node_name="a")
    t = table(node("a"), node("b"), bound=[user])
    result = decide(t, ls, pod_with_claims("second", "rwop"))
    assert isinstance(result, Diagnosis)
    assert result.message == (
        "0/2 nodes are available: 2 node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod "
        "access mode already in-use by another pod."
    )
    free = table(node("a"), node("b"))
    assert isinstance(decide(free, ls, pod_with_claims("second", "rwop")), ScheduleResult)


def test_volume_zone_keeps_pod_in_its_pvs_zone() -> None:
    ls = listers(pvcs=[pvc("d", volume="pv1", bound=True)], pvs=[pv("pv1", claim="d", phase="Bound", zone="z2")])
    t = table(node("a", labels={ZONE: "z1"}), node("b", labels={ZONE: "z2"}), node("nolabel"))
    prof = profile(t, ls)
    seen = set()
    for seed_pod in range(6):
        result = decide(t, ls, pod_with_claims(f"p{seed_pod}", "d"), prof=prof)
        assert isinstance(result, ScheduleResult)
        seen.add(result.node)
    assert seen <= {"b", "nolabel"}  # a node without topology labels has no constraint (kube)
    only_a = table(node("a", labels={ZONE: "z1"}))
    result = decide(only_a, ls, pod_with_claims("p", "d"))
    assert isinstance(result, Diagnosis)
    assert result.message == "0/1 nodes are available: 1 node(s) had no available volume zone."


def test_volume_zone_multi_zone_label_and_missing_pv() -> None:
    multi = pv("pv1", claim="d", phase="Bound")
    multi["metadata"]["labels"] = {ZONE: "z1__z3"}
    ls = listers(pvcs=[pvc("d", volume="pv1", bound=True)], pvs=[multi])
    t = table(node("a", labels={ZONE: "z3"}))
    assert isinstance(decide(t, ls, pod_with_claims("p", "d")), ScheduleResult)
    gone = listers(pvcs=[pvc("d", volume="pv1", bound=True)])
    cfg = {
        "profiles": [
            {"schedulerName": "crane-scheduler", "plugins": {"preFilter": {"disabled": [{"name": "VolumeBinding"}]}}}
        ]
    }
    result = decide(t, gone, pod_with_claims("p", "d"), prof=profile(t, gone, cfg))
    assert (
        isinstance(result, Diagnosis) and result.message == '0/1 nodes are available: persistentvolume "pv1" not found.'
    )


def csinode(name: str, driver: str, count: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"drivers": [{"name": driver, "allocatable": {"count": count}}]}}


def test_node_volume_limits_counts_attached_csi_volumes_per_driver() -> None:
    drv = "csi.example.com"
    claims = [pvc(f"c{i}", volume=f"pv{i}", bound=True) for i in range(3)]
    pvs = [pv(f"pv{i}", claim=f"c{i}", phase="Bound", csi=drv) for i in range(3)]
    ls = listers(pvcs=claims, pvs=pvs, csinodes=[csinode("a", drv, 2), csinode("b", drv, 1)])
    on_a = pod_with_claims("old", "c0", node_name="a")
    t = table(node("a"), node("b"), bound=[on_a])
    # a: 1 attached + 1 new = 2 <= 2; b: 0 + 1 = 1 <= 1
    result = decide(t, ls, pod_with_claims("p", "c1"))
    assert isinstance(result, ScheduleResult)
    # two new volumes: a would have 3 > 2, b 2 > 1
    result = decide(t, ls, pod_with_claims("p2", "c1", "c2"))
    assert isinstance(result, Diagnosis)
    assert result.message == "0/2 nodes are available: 2 node(s) exceed max volume count."
    # the same volume already attached on the node does not count twice
    result = decide(table(node("b"), bound=[pod_with_claims("x", "c1", node_name="b")]), ls, pod_with_claims("y", "c1"))
    assert isinstance(result, ScheduleResult)


def test_a_driver_that_prevents_scheduling_where_it_is_missing_must_be_on_the_node_as_kube_137() -> None:
    # VolumeLimitScaling (beta, on in 1.37): CSIDriver.spec.preventPodSchedulingIfMissing
    drv = "csi.example.com"
    driver = {"metadata": {"name": drv}, "spec": {"preventPodSchedulingIfMissing": True}}
    claims, pvs = [pvc("c0", volume="pv0", bound=True)], [pv("pv0", claim="c0", phase="Bound", csi=drv)]
    ls = listers(pvcs=claims, pvs=pvs, csidrivers=[driver], csinodes=[csinode("a", drv, 0), csinode("b", "other", 5)])
    t = table(node("a"), node("b"), node("c"))
    result = decide(t, ls, pod_with_claims("p", "c0"))
    assert isinstance(result, Diagnosis)  # a: installed but full; b: another driver only; c: no CSINode
    assert result.message == (
        "0/3 nodes are available: 1 node(s) exceed max volume count, "
        "2 csi.example.com CSI driver is not installed on the node."
    )
    ls.apply("csidrivers", "MODIFIED", {**driver, "spec": {}}, driver)  # not asked for: not checked
    result = decide(t, ls, pod_with_claims("p", "c0"))
    assert isinstance(result, ScheduleResult) and result.node in ("b", "c")


def test_node_volume_limits_counts_volume_attachments_and_unbound_claims() -> None:
    drv = "csi.example.com"
    ls = listers(
        storageclasses=[storage_class("csi", provisioner=drv)],
        pvcs=[pvc("new", cls="csi")],
        pvs=[pv("other", csi=drv, phase="Bound")],
        csinodes=[csinode("a", drv, 1)],
        volumeattachments=[
            {
                "metadata": {"name": "va"},
                "spec": {"nodeName": "a", "attacher": drv, "source": {"persistentVolumeName": "other"}},
            }
        ],
    )
    t = table(node("a"))
    cfg = {
        "profiles": [
            {"schedulerName": "crane-scheduler", "plugins": {"multiPoint": {"disabled": [{"name": "VolumeBinding"}]}}}
        ]
    }
    result = decide(t, ls, parse_pod(pod_with_claims("p", "new")), prof=profile(t, ls, cfg))
    assert isinstance(result, Diagnosis)
    assert result.message == "0/1 nodes are available: 1 node(s) exceed max volume count."


def test_volume_zone_beta_pv_label_matches_the_ga_node_label() -> None:
    beta = pv("pv1", claim="d", phase="Bound")
    beta["metadata"]["labels"] = {"failure-domain.beta.kubernetes.io/zone": "z1"}
    ls = listers(pvcs=[pvc("d", volume="pv1", bound=True)], pvs=[beta])
    t = table(node("a", labels={ZONE: "z1"}), node("b", labels={ZONE: "z2"}))
    result = decide(t, ls, pod_with_claims("p", "d"))
    assert isinstance(result, ScheduleResult) and result.node == "a"


def test_generic_ephemeral_claim_must_exist_and_belong_to_the_pod() -> None:
    raw = pod("web", spec={"volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]})
    t = table(node("a"))
    result = decide(t, listers(), raw)
    assert isinstance(result, Diagnosis)
    assert result.message == (
        "0/1 nodes are available: waiting for ephemeral volume controller to create the persistentvolumeclaim "
        '"web-scratch".'
    )
    stranger = pvc("web-scratch", volume="pv1", bound=True)
    ls = listers(pvcs=[stranger], pvs=[pv("pv1", claim="web-scratch", phase="Bound")])
    result = decide(t, ls, raw)
    assert isinstance(result, Diagnosis) and "(pod is not owner)" in result.message
    owned = pvc("web-scratch", volume="pv1", bound=True)
    owned["metadata"]["ownerReferences"] = [{"controller": True, "uid": raw["metadata"]["uid"]}]
    ls = listers(pvcs=[owned], pvs=[pv("pv1", claim="web-scratch", phase="Bound")])
    assert isinstance(decide(t, ls, raw), ScheduleResult)


def test_node_volume_limits_columns_agree_with_the_walk_over_every_node_as_pods_come_and_go() -> None:
    """The per-row columns (refreshed for the rows whose pods changed) give kube's per-node verdict: after binds,
    deletions, assumptions, what-ifs and a node's removal, for pods with new, shared and VolumeAttachment-held
    volumes of two drivers, on nodes with and without limits."""
    drivers = ("a.csi", "b.csi")
    for seed in range(40):
        rng = random.Random(seed)
        names = [f"n{i}" for i in range(8)]
        claims = [pvc(f"c{i}", volume=f"pv{i}", bound=True) for i in range(30)]
        pvs = [pv(f"pv{i}", claim=f"c{i}", phase="Bound", csi=drivers[i % 2]) for i in range(30)]
        csinodes = [
            {
                "metadata": {"name": n},
                "spec": {
                    "drivers": [
                        {"name": d, "allocatable": {"count": rng.randint(1, 4)}} for d in drivers if rng.random() < 0.7
                    ]
                },
            }
            for n in names
            if rng.random() < 0.9
        ]
        attachments = [
            {
                "metadata": {"name": f"va{i}"},
                "spec": {
                    "nodeName": rng.choice(names),
                    "attacher": drivers[i % 2],
                    "source": {"persistentVolumeName": f"pv{i}"},
                },
            }
            for i in rng.sample(range(30), 4)
        ]
        ls = listers(pvcs=claims, pvs=pvs, csinodes=csinodes, volumeattachments=attachments)
        t = table(*(node(n) for n in names))
        plugin = NodeVolumeLimits(ls)
        bound: list[str] = []
        for step in range(30):
            op = rng.random()
            if op < 0.5 or not bound:
                claims_of = [f"c{i}" for i in rng.sample(range(30), rng.randint(1, 3))]
                p = parse_pod(pod_with_claims(f"b{step}", *claims_of, node_name=rng.choice(names)))
                if rng.random() < 0.5:
                    t.add_pod(p)
                else:
                    t.assume(p, p.node_name)
                bound.append(p.uid)
            elif op < 0.7:
                t.remove_pod(bound.pop(rng.randrange(len(bound))))
            elif op < 0.8 and len(names) > 2:
                t.remove_node(names.pop(rng.randrange(len(names))))
            what_if = t.simulate_remove(rng.sample(bound, min(len(bound), 2))) if rng.random() < 0.3 else []
            new = parse_pod(pod_with_claims(f"p{step}", *(f"c{i}" for i in rng.sample(range(30), rng.randint(1, 3)))))
            got = plugin.filter({}, new, t)
            fresh = NodeVolumeLimits(ls).filter({}, new, t)
            plugin._fresh()
            walked = plugin._exceeding_walk(t, attachable_volumes(new.raw, ls, new_pod=True), "")
            for which, found in (("kept", got), ("fresh", fresh)):
                mask = found[0].mask if found else np.zeros(t.n_rows, dtype=bool)
                assert mask.tolist() == walked.tolist(), (seed, step, which)
            t.simulate_add(what_if)
