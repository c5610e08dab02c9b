"""``NodeResourceTopologyMatchArgs``: which resources are placed on NUMA zones.

Upstream's single field, so an upstream scheduler configuration carries over unchanged::

    pluginConfig:
      - name: NodeResourceTopologyMatch
        args:
          topologyAwareResources: [cpu, memory]   # default [cpu]

Pods are chosen by their whole-CPU request, so without ``cpu`` the plugin never acts (accepted, as upstream, but
logged). Upstream silently dropped names its Resource type does not know (e.g. ``pods``); they are refused here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crane_scheduler.framework import ArgsError

DEFAULT_RESOURCES = ("cpu",)
_FIXED = ("cpu", "memory", "ephemeral-storage")


@dataclass(frozen=True)
class TopologyArgs:
    resources: tuple[str, ...] = DEFAULT_RESOURCES

    @property
    def has_cpu(self) -> bool:
        return "cpu" in self.resources


def _valid_name(name: str) -> bool:
    """cpu, memory, ephemeral-storage, or a scalar resource (hugepages-*, extended ``a.b/c``, kubernetes.io/*)."""
    return name in _FIXED or name.startswith("hugepages-") or ("/" in name and not name.startswith("/"))


def parse_args(raw: Mapping[str, Any]) -> TopologyArgs:
    problems: list[tuple[str, str]] = [
        (k, "unknown field") for k in raw if k not in ("topologyAwareResources", "apiVersion", "kind")
    ]
    names = raw.get("topologyAwareResources")
    resources: list[str] = []
    if names is None:
        names = []
    if not isinstance(names, list):
        problems.append(("topologyAwareResources", "must be a list of resource names"))
        names = []
    for i, name in enumerate(names):
        if not isinstance(name, str) or not _valid_name(name):
            problems.append(
                (
                    f"topologyAwareResources[{i}]",
                    f"{name!r} is not a resource a NUMA zone can hold "
                    "(cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource)",
                )
            )
        elif name in resources:
            problems.append((f"topologyAwareResources[{i}]", f"{name!r} is listed twice"))
        else:
            resources.append(name)
    if problems:
        raise ArgsError(problems)
    return TopologyArgs(tuple(resources) or DEFAULT_RESOURCES)
