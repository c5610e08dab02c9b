"""The sandbox's Karpenter, its pure parts: what it takes from its chart, the NodePool it applies, the sandbox's
policies under ``--autoscaler``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from crane_sandbox.karpenter import INSTANCE_CPU, INSTANCE_TYPE, NodePoolSettings, chart_rbac, nodepool_manifest
from crane_sandbox.sandbox import SANDBOX_POLICY, Sandbox, sandbox_scheduler_config

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


def test_dynamic_args_reach_every_profile_of_the_sandbox_configuration() -> None:
    text = sandbox_scheduler_config(("default-scheduler", "crane-scheduler"), {"scoringStrategy": "x"})
    config = yaml.safe_load(text)
    args = [p["args"] for prof in config["profiles"] for p in prof["pluginConfig"] if p["name"] == "Dynamic"]
    assert len(args) == 2 and all(a["scoringStrategy"] == "x" and "policyConfigPath" in a for a in args)
    assert text.startswith("# crane-scheduler's configuration in the sandbox")


def test_without_an_autoscaler_or_its_signals_the_sandbox_policies_are_the_defaults(tmp_path: Path) -> None:
    assert Sandbox(nodes=1, run_dir=tmp_path).policy == SANDBOX_POLICY
    assert Sandbox(nodes=1, run_dir=tmp_path, autoscaler="karpenter", load_signals=False).policy == SANDBOX_POLICY
    own = "apiVersion: scheduler.policy.crane.io/v1alpha1\nkind: DynamicSchedulerPolicy\nspec: {}\n"
    sandbox = Sandbox(nodes=1, run_dir=tmp_path, autoscaler="karpenter", policy=own)
    assert sandbox.policy == own  # a caller's own text is kept
