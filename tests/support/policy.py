"""The upstream metric names and the policy documents tests write, written once.

``UPSTREAM_METRICS`` are the six series of upstream's ``deploy/manifests/dynamic/policy.yaml`` in its order (kept
literal here: tests check the product's default policy against them, never the reverse). ``policy_yaml`` renders
a DynamicSchedulerPolicy document from a ``spec`` mapping; ``fast_policy`` is the policy of the integration stacks:
every metric synced on a seconds scale, upstream's cpu predicate and hot-value windows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from crane_shared.policy import default_policy, dump_policy

UPSTREAM_METRICS = (
    "cpu_usage_avg_5m",
    "cpu_usage_max_avg_1h",
    "cpu_usage_max_avg_1d",
    "mem_usage_avg_5m",
    "mem_usage_max_avg_1h",
    "mem_usage_max_avg_1d",
)
UPSTREAM_HOT_VALUE = ({"timeRange": "5m", "count": 5}, {"timeRange": "1m", "count": 2})


def policy_yaml(spec: Mapping[str, Any]) -> str:
    """A DynamicSchedulerPolicy document with this ``spec`` (the fields as a policy file spells them)."""
    document = {
        "apiVersion": "scheduler.policy.crane.io/v1alpha1",
        "kind": "DynamicSchedulerPolicy",
        "spec": _plain(spec),
    }
    return yaml.safe_dump(document, sort_keys=False)


def fast_policy(periods: Mapping[str, str]) -> str:
    """Sync each metric at its period (e.g. ``"2s"``); predicate cpu_usage_avg_5m above 0.65, that metric as the
    only priority, upstream's hot-value windows."""
    return policy_yaml(
        {
            "syncPolicy": [{"name": name, "period": period} for name, period in periods.items()],
            "predicate": [{"name": "cpu_usage_avg_5m", "maxLimitPecent": 0.65}],
            "priority": [{"name": "cpu_usage_avg_5m", "weight": 1}],
            "hotValue": UPSTREAM_HOT_VALUE,
        }
    )


def write_policy(path: Path, spec: Mapping[str, Any]) -> Path:
    path.write_text(policy_yaml(spec))
    return path


def default_policy_with(path: Path, **sections: Any) -> Path:
    """The product's default policy with these ``spec`` sections set (``newNodes={"estimate": True}``), written to
    ``path`` (a plugin's ``policyConfigPath``)."""
    spec = yaml.safe_load(dump_policy(default_policy()))["spec"]
    spec.update(sections)
    return write_policy(path, spec)


def _plain(value: Any) -> Any:
    """Mappings and sequences as dicts and lists (what ``yaml.safe_dump`` accepts)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
