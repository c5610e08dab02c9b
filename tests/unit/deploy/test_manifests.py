"""The shipped deployment files stay valid: the rendered manifests parse, configurations and policies load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from crane_scheduler.simulate import Simulator
from crane_shared.policy import default_policy, load_policy, parse_policy

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def manifests() -> list[dict[str, Any]]:
    """The plain manifests (the chart rendered by scripts/render-manifests)."""
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "crane-scheduler.yaml").read_text()) if d]


def configmap(name: str) -> dict[str, str]:
    data: dict[str, str] = next(d for d in manifests() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name)[
        "data"
    ]
    return data


def test_shipped_policies_are_upstreams_default() -> None:
    assert load_policy(DEPLOY / "policy.yaml") == default_policy()
    assert parse_policy(configmap("crane-policy")["policy.yaml"]) == default_policy()


@pytest.mark.parametrize(
    "text", [(DEPLOY / "scheduler-config.yaml").read_text(), configmap("crane-scheduler-config")["config.yaml"]]
)
def test_shipped_scheduler_configurations_are_valid(text: str) -> None:
    data = yaml.safe_load(text)
    for profile in data["profiles"]:
        for pc in profile.get("pluginConfig", []):
            pc["args"]["policyConfigPath"] = str(DEPLOY / "policy.yaml")
    profiles = Simulator(data).profiles  # as the scheduler builds them, Dynamic from its entry point
    assert "Dynamic" in profiles["crane-scheduler"].plugins
    assert data["leaderElection"].get("resourceName", "crane-scheduler") != "kube-scheduler"


def test_every_container_runs_as_non_root_with_a_read_only_root() -> None:
    for d in manifests():
        if d["kind"] != "Deployment":
            continue
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, d["metadata"]["name"]
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"], c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
