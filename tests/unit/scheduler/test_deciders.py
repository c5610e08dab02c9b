"""Decider workers' pure parts: the conflict check (which answers may be taken without filtering) and which pods
and profiles go to a worker at all."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from crane_scheduler.deciders.cpus import default_workers, quota_cpus, usable_cpus
from crane_scheduler.deciders.eligible import pod_refusal, profile_refusal
from crane_scheduler.deciders.versions import RowVersions
from crane_scheduler.simulate import Simulator, parse_pod
from tests.support.scheduler import container, pod

NODES = ["a", "b", "c"]
WORKERS = 3

# one state message: the rows it changes, and the worker whose own answered pod it assumes (None: anyone's change)
steps = st.lists(
    st.tuples(st.lists(st.sampled_from(NODES), max_size=2), st.one_of(st.none(), st.integers(0, WORKERS - 1))),
    max_size=40,
)


@settings(max_examples=300)
@given(steps, st.integers(0, 40), st.sampled_from(NODES), st.integers(0, WORKERS - 1))
def test_a_node_is_fresh_for_a_worker_exactly_when_every_later_change_to_it_was_its_own_answer(
    history: list[tuple[list[str], int | None]], seen: int, node: str, worker: int
) -> None:
    versions = RowVersions(WORKERS)
    for nodes, by in history:
        versions.step(*nodes, by=by)
    seen = min(seen, versions.sent)
    # brute force: the messages after ``seen`` that touched the node, each either the worker's own or news to it
    news = [by for nodes, by in history[seen:] if node in nodes and by != worker]
    assert versions.fresh(node, seen, worker) == (not news)


def test_two_workers_answering_the_same_node_the_second_is_checked_not_taken() -> None:
    """The race the check exists for: both saw the node empty; the first one's pod is assumed there; the second
    one's answer is no longer fresh, so the scheduling process filters the node before assuming (never twice)."""
    versions = RowVersions(2)
    seen = versions.step("a")  # the node, seen by both
    versions.step("a", by=0)  # worker 0's pod assumed on it
    assert versions.fresh("a", seen, 0)  # worker 0 counted its own pod when it answered
    assert not versions.fresh("a", seen, 1)
    assert versions.fresh("b", seen, 1)


def test_plain_pods_go_to_workers_and_pods_with_claims_volumes_nominations_or_devices_do_not() -> None:
    plain = pod(spec={"volumes": [{"name": "token", "projected": {"sources": []}}, {"name": "t", "emptyDir": {}}]})
    assert pod_refusal(parse_pod(plain)) is None
    claims = pod(spec={"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]})
    assert pod_refusal(parse_pod(claims)) == "resourceClaims"
    pvc = pod(spec={"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]})
    assert pod_refusal(parse_pod(pvc)) == "volumes"
    nominated = pod() | {"status": {"nominatedNodeName": "a"}}
    assert pod_refusal(parse_pod(nominated)) == "nominatedNodeName"
    gpu = pod(containers=[container("1", "1Gi") | {"resources": {"requests": {"example.com/gpu": "1"}}}])
    assert pod_refusal(parse_pod(gpu)) == "extended resource"
    batch = pod(containers=[{"name": "c", "resources": {"requests": {"crane.io/batch-cpu": "500"}}}])
    assert pod_refusal(parse_pod(batch)) is None


def test_profiles_with_numa_or_gang_plugins_decide_in_the_scheduling_process() -> None:
    assert profile_refusal(next(iter(Simulator().profiles.values()))) is None  # kube's plugins and Dynamic
    enabled = {"multiPoint": {"enabled": [{"name": "NodeResourceTopologyMatch"}]}}
    numa = {"profiles": [{"schedulerName": "numa", "plugins": enabled}]}
    assert profile_refusal(next(iter(Simulator(numa).profiles.values()))) == "plugin NodeResourceTopologyMatch"


def test_the_default_worker_count_follows_the_cgroup_quota_not_the_host(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert quota_cpus(tmp_path) == 2.5
    assert usable_cpus(tmp_path) in (1, 2, 3)  # 2.5 rounded up, within this process's affinity
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert quota_cpus(tmp_path) is None and usable_cpus(tmp_path) is None
    assert [default_workers(n) for n in (None, 1, 2, 3, 4, 8, 16, 64)] == [0, 0, 0, 0, 2, 6, 8, 8]
