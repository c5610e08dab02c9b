"""Configuration: every validation error names its field; defaults and plugin resolution match kube-scheduler."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from crane_scheduler.config import ConfigError, load_config, parse_config
from crane_scheduler.framework import Handle
from crane_scheduler.framework.runtime import Profile, build_profiles
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins import builtin_registry


def problems(data: Any) -> list[str]:
    """Every problem, from parsing and from building the profiles against the registry."""
    try:
        cfg = parse_config(data)
        build_profiles(cfg, builtin_registry(), lambda name: Handle(NodeTable()))
    except ConfigError as err:
        return err.problems
    return []


def profiles(data: Any) -> dict[str, Profile]:
    return build_profiles(parse_config(data), builtin_registry(), lambda name: Handle(NodeTable()))


def one(plugins: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"profiles": [{"schedulerName": "s", **({"plugins": plugins} if plugins else {}), **extra}]}


def names(items: list[Any]) -> list[str]:
    return [x[0].name if isinstance(x, tuple) else x.name for x in items]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"apiVersion": "v2"}, "apiVersion: must be kubescheduler.config.k8s.io/v1, got 'v2'"),
        ({"kind": "Other"}, "kind: must be KubeSchedulerConfiguration, got 'Other'"),
        ({"percentageOfNodesToScore": 101}, "percentageOfNodesToScore: must be in range [0, 100], got 101"),
        ({"podInitialBackoffSeconds": 0}, "podInitialBackoffSeconds: must be >= 1, got 0"),
        (
            {"podInitialBackoffSeconds": 5, "podMaxBackoffSeconds": 2},
            "podMaxBackoffSeconds: must be >= podInitialBackoffSeconds (5), got 2",
        ),
        ({"clientConnection": {"qps": -1}}, "clientConnection.qps: must be >= 0, got -1"),
        ({"clientConnection": {"burst": 0}}, "clientConnection.burst: must be >= 1, got 0"),
        (
            {"leaderElection": {"resourceNamespace": "kube-system", "resourceName": "kube-scheduler"}},
            "leaderElection.resourceName: kube-system/kube-scheduler is the default scheduler's lease",
        ),
        (
            {"leaderElection": {"leaseDuration": "5s", "renewDeadline": "10s"}},
            "leaderElection.leaseDuration: must be greater than renewDeadline (10s), got 5s",
        ),
        ({"leaderElection": {"retryPeriod": "1d"}}, "leaderElection.retryPeriod: invalid duration '1d'"),
        ({"leaderElection": {"resourceLock": "endpoints"}}, "leaderElection.resourceLock: only 'leases' is supported"),
        ({"bogus": 1}, "bogus: unknown field"),
        ({"profiles": [{}]}, "profiles[0].schedulerName: required"),
        (
            {"profiles": [{"schedulerName": "a"}, {"schedulerName": "a"}]},
            "profiles[1].schedulerName: duplicate 'a' (also profiles[0])",
        ),
        (one(percentageOfNodesToScore=-1), "profiles[0].percentageOfNodesToScore: must be in range [0, 100], got -1"),
        (
            one({"score": {"enabled": [{"name": "NodeAffinity"}, {"name": "TaintToleration", "weight": -1}]}}),
            "profiles[0].plugins.score.enabled[1].weight: must be >= 0, got -1",
        ),
        (
            one({"filter": {"enabled": [{"name": "NodePorts", "weight": 2}]}}),
            "profiles[0].plugins.filter.enabled[0].weight: only score plugins take a weight",
        ),
        (
            one({"preScore": {"enabled": [{"name": "X"}, {"name": "X"}]}}),
            "profiles[0].plugins.preScore.enabled[1].name: plugin 'X' enabled twice",
        ),
        (one({"sideways": {}}), "profiles[0].plugins.sideways: unknown field"),
        (
            one({"score": {"enabled": [{"name": "NoSuchPlugin"}]}}),
            "profiles[0].plugins.score.enabled[0].name: unknown plugin 'NoSuchPlugin'",
        ),
        (
            one({"score": {"enabled": [{"name": "NodePorts"}]}}),
            "profiles[0].plugins.score.enabled[0].name: plugin 'NodePorts' does not implement score",
        ),
        (
            one({"queueSort": {"disabled": [{"name": "*"}]}}),
            "profiles[0].plugins.queueSort: exactly one queueSort plugin must be enabled, got 0",
        ),
        (
            one({"multiPoint": {"disabled": [{"name": "DefaultBinder"}]}}),
            "profiles[0].plugins.bind: at least one bind plugin is needed",
        ),
        (
            one(pluginConfig=[{"name": "NodeResourcesFit", "args": {"scoringStrategy": {"type": "Random"}}}]),
            "profiles[0].pluginConfig[0].args.scoringStrategy.type: unsupported value 'Random'",
        ),
        (
            one(
                pluginConfig=[
                    {
                        "name": "NodeResourcesFit",
                        "args": {"scoringStrategy": {"resources": [{"name": "cpu", "weight": 0}]}},
                    }
                ]
            ),
            "profiles[0].pluginConfig[0].args.scoringStrategy.resources[0].weight: resource weight of cpu not in "
            "valid range",
        ),
        (
            one(
                pluginConfig=[
                    {"name": "NodeResourcesBalancedAllocation", "args": {"resources": [{"name": "cpu", "weight": 2}]}}
                ]
            ),
            "profiles[0].pluginConfig[0].args.resources[0].weight: must be 1",
        ),
        (
            one(pluginConfig=[{"name": "TaintToleration", "args": {"x": 1}}]),
            "profiles[0].pluginConfig[0].args.x: unknown field (plugin TaintToleration takes no args)",
        ),
        (
            one(pluginConfig=[{"name": "NodeResourcesFit"}, {"name": "NodeResourcesFit"}]),
            "profiles[0].pluginConfig[1].name: duplicate plugin 'NodeResourcesFit'",
        ),
        (one(pluginConfig=[{"name": "Nope"}]), "profiles[0].pluginConfig[0].name: plugin 'Nope' is not enabled"),
    ],
)
def test_each_problem_names_its_field(data: dict[str, Any], expected: str) -> None:
    found = problems(data)
    assert any(p.startswith(expected) for p in found), found


def test_all_problems_are_reported_at_once() -> None:
    found = problems({"percentageOfNodesToScore": 200, "podInitialBackoffSeconds": 0, "profiles": [{}]})
    assert len(found) == 3


def test_no_file_is_the_default_crane_scheduler_profile_with_kube_weights() -> None:
    cfg = load_config(None)
    assert cfg.profiles[0].scheduler_name == "crane-scheduler"
    assert (cfg.leader_election.resource_namespace, cfg.leader_election.resource_name) == (
        "kube-system",
        "crane-scheduler",
    )
    prof = profiles({})["crane-scheduler"]
    assert [(pl.name, w) for pl, w in prof.score] == [
        ("TaintToleration", 3),
        ("NodeAffinity", 2),
        ("NodeResourcesFit", 1),
        ("VolumeBinding", 1),  # kube's too: storage-capacity scoring (StorageCapacityScoring, on since 1.37)
        ("PodTopologySpread", 2),
        ("InterPodAffinity", 2),
        ("DynamicResources", 2),
        ("NodeResourcesBalancedAllocation", 1),
        ("ImageLocality", 1),
    ]
    assert names(prof.filter) == [
        "NodeName",  # before NodeUnschedulable since kube 1.37
        "NodeUnschedulable",
        "TaintToleration",
        "NodeAffinity",
        "NodePorts",
        "NodeResourcesFit",
        "VolumeRestrictions",
        "NodeVolumeLimits",
        "VolumeBinding",
        "VolumeZone",
        "PodTopologySpread",
        "InterPodAffinity",
        "DynamicResources",
        "NodeDeclaredFeatures",  # appended by kube 1.37 (GA)
    ]
    assert prof.queue_sort.name == "PrioritySort" and names(prof.bind) == ["DefaultBinder"]


def test_specific_score_weight_overrides_multipoint_and_disabling_removes() -> None:
    prof = profiles(
        one(
            {
                "score": {
                    "enabled": [{"name": "NodeResourcesFit", "weight": 5}],
                    "disabled": [{"name": "NodeResourcesBalancedAllocation"}],
                }
            }
        )
    )["s"]
    assert [(pl.name, w) for pl, w in prof.score] == [
        ("NodeResourcesFit", 5),
        ("TaintToleration", 3),
        ("NodeAffinity", 2),
        ("VolumeBinding", 1),
        ("PodTopologySpread", 2),
        ("InterPodAffinity", 2),
        ("DynamicResources", 2),
        ("ImageLocality", 1),
    ]


def test_disable_all_then_enable_a_few() -> None:
    prof = profiles(
        one(
            {
                "multiPoint": {
                    "disabled": [{"name": "*"}],
                    "enabled": [{"name": "PrioritySort"}, {"name": "NodeResourcesFit"}, {"name": "DefaultBinder"}],
                }
            }
        )
    )["s"]
    assert names(prof.filter) == ["NodeResourcesFit"] and [(p.name, w) for p, w in prof.score] == [
        ("NodeResourcesFit", 1)
    ]


def test_yaml_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("""
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {qps: 200, burst: 400}
leaderElection: {leaderElect: false, resourceName: my-lease, leaseDuration: 20s, renewDeadline: 15s}
percentageOfNodesToScore: 30
profiles:
- schedulerName: crane-scheduler
  plugins:
    score:
      enabled: [{name: NodeResourcesFit, weight: 2}]
""")
    cfg = load_config(path)
    assert (cfg.qps, cfg.burst, cfg.percentage_of_nodes_to_score) == (200.0, 400, 30)
    assert cfg.leader_election.lease_duration == 20.0 and not cfg.leader_election.leader_elect
    path.write_text("profiles: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_a_registered_plugin_slots_in_without_touching_the_core() -> None:
    import numpy as np

    from crane_scheduler.framework import Rejection

    class NoOdd:
        name = "NoOdd"

        def filter(self, state: Any, pod: Any, table: NodeTable) -> list[Rejection]:
            return [Rejection("node(s) are odd", np.arange(table.n_rows) % 2 == 1)]

    registry = builtin_registry()
    registry.register("NoOdd", lambda args, handle: NoOdd())
    cfg = parse_config(one({"filter": {"enabled": [{"name": "NoOdd"}]}}))
    prof = build_profiles(cfg, registry, lambda name: Handle(NodeTable()))["s"]
    assert names(prof.filter)[-1] == "NoOdd"


def test_a_plugin_registered_enabled_by_default_joins_the_default_profile_with_its_weight() -> None:
    class Load:
        name = "Load"

        def score(self, state: Any, pod: Any, table: NodeTable, rows: Any) -> Any:
            return rows * 0

    registry = builtin_registry()
    registry.register("Load", lambda args, handle: Load(), enabled_by_default=True, weight=3)
    prof = build_profiles(parse_config({}), registry, lambda name: Handle(NodeTable()))["crane-scheduler"]
    assert [(p.name, w) for p, w in prof.score][-1] == ("Load", 3)
    disabled = one({"multiPoint": {"disabled": [{"name": "Load"}]}})
    prof = build_profiles(parse_config(disabled), registry, lambda name: Handle(NodeTable()))["s"]
    assert "Load" not in [p.name for p, _ in prof.score]
