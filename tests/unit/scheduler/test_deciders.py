"""Decider workers' pure parts: the conflict check (which answers may be taken without filtering) and which pods
and profiles go to a worker at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from crane_scheduler.algorithm import Hint, ScheduleResult
from crane_scheduler.deciders.cpus import default_workers, quota_cpus, usable_cpus
from crane_scheduler.deciders.eligible import pod_refusal, profile_refusal
from crane_scheduler.deciders.pool import DeciderPool
from crane_scheduler.deciders.versions import RowVersions
from crane_scheduler.framework.runtime import Profile
from crane_scheduler.framework.types import Code
from crane_scheduler.simulate import Simulator, parse_pod
from tests.support.scheduler import HOST, container, node, pod, simulator, table

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


async def test_a_deleted_nodes_row_version_goes_and_an_answer_naming_it_is_never_taken() -> None:
    """Node names churn under an autoscaler: a deleted node's entry is dropped; a worker's late answer naming it
    finds no row in the scheduling process's table (the hint is not taken), and the name added again steps anew."""
    pool = DeciderPool(1, None, out_of_tree=False)
    pool._send = lambda message: None  # type: ignore[method-assign]  # no worker process here
    raw = node("gone", cpu="4", memory="8Gi")
    pool.node_event("ADDED", raw)
    seen = pool.versions.sent
    pool.node_event("DELETED", raw)
    assert "gone" not in pool.versions._changed
    pool.node_event("ADDED", raw)  # the same name again: not fresh for an answer from before
    assert not pool.versions.fresh("gone", seen, 0)


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


# ---- checking a worker's answer: the PreFilters that read only the pod are not run again ---------------------------

ELIGIBLE_PODS = [
    pod(spec={"volumes": [{"name": "token", "projected": {"sources": []}}, {"name": "t", "emptyDir": {}}]}),
    pod(spec={"nodeSelector": {"disk": "ssd"}}),
    pod(containers=[container("1", "1Gi", ports=[{"containerPort": 80, "hostPort": 8080}])]),
    pod(spec={"hostNetwork": True, "hostUsers": False}),
    pod(containers=[{"name": "c", "resources": {"requests": {"crane.io/batch-cpu": "500"}}}]),
    pod(
        spec={
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}
                        ]
                    }
                }
            }
        }
    ),
]


class Counting:
    """Wraps a PreFilter plugin, counting its calls."""

    def __init__(self, plugin: Any) -> None:
        self.plugin, self.name, self.calls = plugin, plugin.name, 0
        self.decider_pre_filter = getattr(plugin, "decider_pre_filter", "")

    def pre_filter(self, *args: Any) -> Any:
        self.calls += 1
        return self.plugin.pre_filter(*args)


def _sim() -> tuple[Simulator, Profile]:
    t = table(node("a", labels={"disk": "ssd"}), node("b", labels={"disk": "ssd"}))
    sim = simulator(t)
    return sim, next(iter(sim.profiles.values()))


def test_the_prefilters_marked_skip_answer_skip_for_every_pod_a_worker_may_decide() -> None:
    """What the ``"skip"`` marker claims, checked against the plugins themselves (a plugin whose PreFilter stops
    skipping such pods must lose its marker, or a worker's answer would be taken without its check)."""
    sim, prof = _sim()
    marked = [p for p in prof.pre_filter if getattr(p, "decider_pre_filter", "") == "skip"]
    assert {p.name for p in marked} == {"VolumeRestrictions", "NodeVolumeLimits", "VolumeBinding", "VolumeZone"}
    for raw in ELIGIBLE_PODS:
        info = parse_pod(raw)
        assert pod_refusal(info) is None
        for plugin in marked:
            assert plugin.pre_filter({}, info, sim.table).status.code is Code.SKIP


def test_a_fresh_answer_is_checked_without_the_pod_only_prefilters_and_with_the_others() -> None:
    sim, prof = _sim()
    counting = [Counting(p) for p in prof.pre_filter]
    prof.pre_filter = counting  # type: ignore[assignment]
    prof.__dict__.pop("decider_pre_filter", None)
    result = sim.algorithm.schedule(prof, parse_pod(ELIGIBLE_PODS[1]), {}, hint=Hint("b", fresh=True))
    assert isinstance(result, ScheduleResult) and result.node == "b"
    ran = {c.name for c in counting if c.calls}
    assert ran == {"InterPodAffinity", "PodTopologySpread", "DynamicResources"}  # they read other pods or objects


def test_a_fresh_answer_not_taken_as_it_is_gets_every_prefilter_and_the_same_decision_as_without_a_hint() -> None:
    """A pod with a spread constraint (PodTopologySpread reads other nodes: no shortcut): the left-out PreFilters
    run, NodeAffinity's restriction to node b included, and the answer is what the whole cycle gives."""
    spread = {"maxSkew": 1, "topologyKey": HOST, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {}}
    raw = ELIGIBLE_PODS[5]
    raw = {**raw, "spec": {**raw["spec"], "topologySpreadConstraints": [spread]}}
    for hinted in ("a", "b"):
        sim, prof = _sim()
        counting = [Counting(p) for p in prof.pre_filter]
        prof.pre_filter = counting  # type: ignore[assignment]
        prof.__dict__.pop("decider_pre_filter", None)
        result = sim.algorithm.schedule(prof, parse_pod(raw), {}, hint=Hint(hinted, fresh=True))
        assert isinstance(result, ScheduleResult) and result.node == "b"  # a is outside NodeAffinity's names
        assert all(c.calls == 1 for c in counting), [(c.name, c.calls) for c in counting]
