"""The sandbox's Karpenter, its pure parts: what it takes from its chart, the NodePool it applies, the sandbox's
policies under ``--autoscaler``."""

from __future__ import annotations

from pathlib import Path

import pytest

from crane_descheduler.policy import parse_policy as parse_descheduler_policy
from crane_sandbox.fleet import base_loads
from crane_sandbox.karpenter import INSTANCE_CPU, INSTANCE_TYPE, NodePoolSettings, chart_rbac, nodepool_manifest
from crane_sandbox.sandbox import SANDBOX_POLICY, Sandbox
from crane_shared.policy import parse_policy

RENDERED = """\
---
# Source: karpenter/templates/serviceaccount.yaml
apiVersion: v1
kind: ServiceAccount
metadata:
  name: karpenter
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: karpenter-core
rules:
  - apiGroups: ["karpenter.sh"]
    resources: ["nodepools"]
    verbs: ["get", "list", "watch"]
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: karpenter
"""


def test_the_chart_gives_its_account_and_roles_and_nothing_else() -> None:
    objects = chart_rbac(RENDERED)
    assert [o["kind"] for o in objects] == ["ServiceAccount", "ClusterRole"]


@pytest.mark.parametrize("drop", ["ServiceAccount", "ClusterRole"])
def test_a_chart_without_its_account_or_cluster_role_is_refused(drop: str) -> None:
    docs = [d for d in RENDERED.split("---\n") if f"kind: {drop}" not in d]
    with pytest.raises(ValueError, match="templates changed"):
        chart_rbac("---\n".join(docs))


def test_the_nodepool_limits_nodes_by_cpu_and_removes_only_empty_nodes_by_default() -> None:
    spec = nodepool_manifest(NodePoolSettings(max_nodes=4, consolidate_after="45s"))["spec"]
    assert spec["limits"] == {"cpu": str(4 * INSTANCE_CPU)}
    assert spec["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert spec["disruption"]["consolidateAfter"] == "45s"
    requirement = spec["template"]["spec"]["requirements"][0]
    assert requirement == {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [INSTANCE_TYPE]}


@pytest.mark.parametrize("settings", [{"max_nodes": 0}, {"consolidation_policy": "Always"}])
def test_bad_nodepool_settings_are_refused_naming_the_field(settings: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(settings))):
        NodePoolSettings(**settings)  # type: ignore[arg-type]


def test_with_an_autoscaler_the_policies_turn_the_taint_packing_new_nodes_and_the_drain_on(tmp_path: Path) -> None:
    sandbox = Sandbox(nodes=1, run_dir=tmp_path, autoscaler="karpenter")
    policy = parse_policy(sandbox.policy)
    assert policy.scoring.strategy == "pack"
    assert policy.new_nodes.estimate  # Karpenter's new nodes judged by their bindings' estimates
    assert policy.load_taint is not None and policy.load_taint.effect == "NoSchedule"
    thresholds = dict(policy.load_taint.thresholds)
    filters = {p.name: p.max_limit_percent for p in policy.predicate if p.max_limit_percent}
    assert set(thresholds) == set(filters)  # a node the Filter refuses on any metric can be tainted for it
    assert all(thresholds[m] <= filters[m] for m in thresholds)
    assert thresholds["cpu_usage_avg_5m"] < filters["cpu_usage_avg_5m"]  # before the Filter refuses every pod
    idle = base_loads("uneven", 10)
    assert all(cpu <= thresholds["cpu_usage_avg_5m"] and mem <= thresholds["mem_usage_avg_5m"] for cpu, mem in idle)
    drain = parse_descheduler_policy(sandbox.descheduler_policy, policy).drain
    assert drain is not None and drain.max_nodes == 2


def test_without_an_autoscaler_or_its_signals_the_sandbox_policies_are_the_defaults(tmp_path: Path) -> None:
    assert Sandbox(nodes=1, run_dir=tmp_path).policy == SANDBOX_POLICY
    assert not parse_policy(SANDBOX_POLICY).new_nodes.estimate  # upstream's fail-open
    assert Sandbox(nodes=1, run_dir=tmp_path, autoscaler="karpenter", load_signals=False).policy == SANDBOX_POLICY
    own = "apiVersion: scheduler.policy.crane.io/v1alpha1\nkind: DynamicSchedulerPolicy\nspec: {}\n"
    sandbox = Sandbox(nodes=1, run_dir=tmp_path, autoscaler="karpenter", policy=own)
    assert sandbox.policy == own  # a caller's own text is kept
