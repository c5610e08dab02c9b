"""Which pods the plugin places, and what they need: upstream's target containers, awareness and cpu policy.

- Target containers: ``spec.containers`` only (init and ephemeral containers are never pinned), the pod's
  cpu-policy is not ``none``, ``requests.cpu == limits.cpu`` as quantities, a whole number of cores, > 0. There is
  no QoS check (upstream dropped it): a Burstable pod with one ``cpu: 2/2`` container has a target.
- The request placed on zones: the sum over target containers of their requests for the aware resources
  (sidecars that are not targets, init containers and overhead are not pinned, so not placed).
- Awareness: the pod's ``topology-awareness`` annotation if set, else the node's topology manager policy.

Upstream ignored invalid annotation values (falling back to the node or the agent's default); a pod that asks
for something the scheduler cannot read is refused here with a reason naming the annotation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crane_scheduler.plugins.noderesourcetopology.model import (
    ANNOTATION_AWARENESS,
    ANNOTATION_CPU_POLICY,
    CPU_POLICY_VALUES,
    TopologyError,
    parse_go_bool,
    scheduler_value,
    whole_cores,
)
from crane_shared.quantity import parse_quantity


@dataclass(frozen=True, slots=True)
class PodTopology:
    """``request`` is aligned with the args' resources; ``aware`` None = the node decides."""

    targets: tuple[int, ...]
    request: tuple[int, ...]
    aware: bool | None

    @property
    def placed(self) -> bool:
        return bool(self.targets)


NOT_PLACED = PodTopology((), (), None)


def is_daemonset_pod(raw: Mapping[str, Any]) -> bool:
    owners = (raw.get("metadata") or {}).get("ownerReferences") or ()
    return any(o.get("kind") == "DaemonSet" for o in owners)


def _same_quantity(a: Any, b: Any) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except ValueError:
        return False


def target_containers(raw: Mapping[str, Any]) -> tuple[int, ...]:
    """Indices into ``spec.containers`` of the containers crane-agent pins to exclusive CPUs."""
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    if annotations.get(ANNOTATION_CPU_POLICY) == "none":
        return ()
    out = []
    for i, c in enumerate((raw.get("spec") or {}).get("containers") or ()):
        res = c.get("resources") or {}
        req, lim = (res.get("requests") or {}).get("cpu"), (res.get("limits") or {}).get("cpu")
        if req is None or lim is None or not _same_quantity(req, lim):
            continue
        if whole_cores(req) is not None:
            out.append(i)
    return tuple(out)


def classify(raw: Mapping[str, Any], resources: tuple[str, ...]) -> PodTopology:
    """The pod's targets, placed request and awareness; ``TopologyError`` names a bad annotation."""
    annotations = (raw.get("metadata") or {}).get("annotations") or {}
    policy = annotations.get(ANNOTATION_CPU_POLICY)
    if policy is not None and policy not in CPU_POLICY_VALUES:
        raise TopologyError(f"annotation {ANNOTATION_CPU_POLICY}: must be one of {CPU_POLICY_VALUES}, got {policy!r}")
    aware_text = annotations.get(ANNOTATION_AWARENESS)
    aware = None
    if aware_text is not None:
        aware = parse_go_bool(aware_text)
        if aware is None:
            raise TopologyError(f"annotation {ANNOTATION_AWARENESS}: must be true or false, got {aware_text!r}")
    if "cpu" not in resources or is_daemonset_pod(raw):
        return NOT_PLACED
    targets = target_containers(raw)
    if not targets:
        return NOT_PLACED
    containers = (raw.get("spec") or {}).get("containers") or ()
    request = [0] * len(resources)
    for i in targets:
        requests = (containers[i].get("resources") or {}).get("requests") or {}
        for k, name in enumerate(resources):
            if name in requests:
                request[k] += scheduler_value(name, requests[name])
    return PodTopology(targets, tuple(request), aware)
