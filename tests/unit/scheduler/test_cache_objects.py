"""The cache's storage and policy objects: informer events feed the listers (and drop assumptions), requeue the
pods whose rejecting plugins registered them, and nominations of any scheduler's pods are tracked."""

from __future__ import annotations

from crane_scheduler.framework import ClusterEvent
from crane_scheduler.internal.cache import Cache
from crane_scheduler.internal.queue import SchedulingQueue
from crane_scheduler.plugins.queuesort import PrioritySort
from crane_scheduler.podinfo import parse_pod
from tests.support.scheduler import node, pod, table
from tests.support.volumes import pv, pvc


def make(events: dict[str, ClusterEvent]) -> Cache:
    q = SchedulingQueue(PrioritySort().sort_key, events_of=lambda plugin: events.get(plugin, ClusterEvent.ALL))
    return Cache(table(node("a")), q, {"crane-scheduler"}, clock=lambda: 0.0)


def test_claim_added_requeues_a_pod_volume_binding_rejected() -> None:
    cache = make({"VolumeBinding": ClusterEvent.PVC_CHANGE, "NodePorts": ClusterEvent.NODE_ADD})
    waiting = parse_pod(pod("needs-claim"))
    other = parse_pod(pod("ports"))
    for p, plugin in ((waiting, "VolumeBinding"), (other, "NodePorts")):
        cache.queue.add(p, 0.0)
        qp = cache.queue.pop(0.0)
        assert qp is not None
        cache.queue.add_unschedulable(qp, frozenset({plugin}), 0.0)
    cache.listers.apply("pvcs", "ADDED", pvc("data"))
    assert cache.listers.pvc("ns", "data") is not None
    moved = cache.queue.pop(100.0)
    assert moved is not None and moved.pod.name == "needs-claim"
    assert cache.queue.pop(100.0) is None  # NodePorts did not register claims


def test_storage_deletions_do_not_requeue_but_pdb_and_attachment_deletions_do() -> None:
    cache = make({"X": ClusterEvent.PV_CHANGE | ClusterEvent.PDB_CHANGE | ClusterEvent.VOLUME_ATTACHMENT_DELETE})
    p = parse_pod(pod("p"))
    cache.queue.add(p, 0.0)
    qp = cache.queue.pop(0.0)
    assert qp is not None
    cache.queue.add_unschedulable(qp, frozenset({"X"}), 0.0)
    cache.listers.apply("pvs", "ADDED", pv("v"))
    cache.queue.pop(100.0)  # requeued by the PV add
    cache.queue.add_unschedulable(qp, frozenset({"X"}), 100.0)
    cache.listers.apply("pvs", "DELETED", pv("v"))
    cache.listers.apply("volumeattachments", "ADDED", {"metadata": {"name": "va"}, "spec": {}})
    assert cache.queue.pop(200.0) is None
    cache.listers.apply("volumeattachments", "DELETED", {"metadata": {"name": "va"}, "spec": {}})
    assert cache.queue.pop(300.0) is not None


def test_storage_capacity_changes_and_csidriver_updates_requeue() -> None:
    """kube's VolumeBinding registers CSIStorageCapacity Add/Update and CSIDriver Update."""
    cache = make({"X": ClusterEvent.CSI_STORAGE_CAPACITY_CHANGE | ClusterEvent.CSIDRIVER_UPDATE})
    p = parse_pod(pod("p"))
    cache.queue.add(p, 0.0)
    qp = cache.queue.pop(0.0)
    assert qp is not None
    cache.queue.add_unschedulable(qp, frozenset({"X"}), 0.0)
    driver = {"metadata": {"name": "d"}, "spec": {"storageCapacity": True}}
    cache.listers.apply("csidrivers", "ADDED", driver)  # a new driver: not registered by kube
    assert cache.queue.pop(100.0) is None
    cache.listers.apply("csidrivers", "MODIFIED", {**driver, "spec": {}}, driver)
    assert cache.queue.pop(200.0) is not None
    cache.queue.add_unschedulable(qp, frozenset({"X"}), 200.0)
    cap = {"metadata": {"name": "c", "namespace": "ns"}, "storageClassName": "csi", "capacity": "1Gi"}
    cache.listers.apply("csistoragecapacities", "ADDED", cap)
    assert cache.queue.pop(300.0) is not None


def test_informer_version_supersedes_an_assumption() -> None:
    cache = make({})
    cache.listers.apply("pvs", "ADDED", pv("v"))
    assumed = pv("v", claim="c")
    cache.listers.assume_pv(assumed)
    assert cache.listers.pv("v") is assumed and cache.listers.api_pv("v") is not assumed
    newer = pv("v", claim="c", phase="Bound", rv="2")
    cache.listers.apply("pvs", "MODIFIED", newer)
    assert cache.listers.pv("v") is newer and not cache.listers.is_assumed("pvs", "v")


def test_nominated_pods_of_any_scheduler_are_tracked_until_bound_or_deleted() -> None:
    cache = make({})
    theirs = pod("theirs", scheduler="default-scheduler")
    theirs["status"] = {"nominatedNodeName": "a"}
    cache.on_pod(theirs)
    uid = theirs["metadata"]["uid"]
    assert cache.table.nominated[uid][1] == "a"
    assert uid not in cache.pending  # not ours to schedule
    bound = dict(theirs, spec={**theirs["spec"], "nodeName": "a"})
    cache.on_pod(bound)
    assert uid not in cache.table.nominated
    ours = pod("ours")
    ours["status"] = {"nominatedNodeName": "a"}
    cache.on_pod(ours)
    assert ours["metadata"]["uid"] in cache.table.nominated
    cache.on_pod_deleted(ours)
    assert ours["metadata"]["uid"] not in cache.table.nominated


def test_an_update_that_does_not_touch_the_nomination_keeps_the_one_made_in_memory() -> None:
    """kube's UpdateNominatedPod: preemption nominates before its status patch lands; an update in between (the
    PodScheduled condition) keeps the node reserved, one that clears ``nominatedNodeName`` frees it."""
    cache = make({})
    raw = pod("preemptor")
    cache.on_pod(raw)
    uid = raw["metadata"]["uid"]
    cache.table.nominated[uid] = (cache.pending[uid], "a")  # DefaultPreemption's nomination, in memory
    cache.on_pod({**raw, "status": {"conditions": [{"type": "PodScheduled", "status": "False"}]}})
    assert cache.table.nominated[uid][1] == "a"
    cache.on_pod({**raw, "status": {"nominatedNodeName": "a"}})
    assert cache.table.nominated[uid][1] == "a"
    cache.on_pod({**raw, "status": {}})  # the nomination cleared through the API
    assert uid not in cache.table.nominated
