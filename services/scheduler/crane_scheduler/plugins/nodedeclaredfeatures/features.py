"""kube's node-declared-features library (``k8s.io/component-helpers/nodedeclaredfeatures``, v0.37.2), pure: the
features a node can declare in ``status.declaredFeatures`` (its kubelet's gates and runtime), and which of them a
pod needs to run there.

``FEATURES`` is kube's registry (``features.AllFeatures``), sorted by name as kube's ``Framework`` sorts it. Of its
nine features three can be needed by a pod being scheduled (``InferForScheduling``): a container restart rule
that restarts all containers (``RestartAllContainersOnContainerExits``), a host-network pod in a user namespace
(``UserNamespacesHostNetworkSupport``), a volume mount with bind mount options (``VolumeBindMountOptions``). The
others matter to pod updates only (in-place resize of pod-level resources, of non-sidecar init containers, of
memory-backed volumes) or not to pods at all; ``infer_for_update`` keeps kube's answers for those, for the
API server's side of the contract. No feature has a ``MaxVersion``, so the scheduler's version removes none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Spec = Mapping[str, Any]


def _never(spec: Spec) -> bool:
    return False


def _never_update(old: Spec, new: Spec) -> bool:
    return False


def _restart_all_containers(spec: Spec) -> bool:
    """A container or init container with a ``restartPolicyRules`` entry whose action is RestartAllContainers."""
    return any(
        rule.get("action") == "RestartAllContainers"
        for key in ("containers", "initContainers")
        for c in spec.get(key) or ()
        for rule in c.get("restartPolicyRules") or ()
    )


def _user_namespaces_host_network(spec: Spec) -> bool:
    """``hostNetwork: true`` with ``hostUsers: false`` (an unset hostUsers is not false)."""
    return bool(spec.get("hostNetwork")) and spec.get("hostUsers") is False


def _bind_mount_options(spec: Spec) -> bool:
    """A volume mount of a container, init container or ephemeral container with ``bindMountOptions``."""
    return any(
        m.get("bindMountOptions")
        for key in ("containers", "initContainers", "ephemeralContainers")
        for c in spec.get(key) or ()
        for m in c.get("volumeMounts") or ()
    )


def _pod_level_resources_resized(old: Spec, new: Spec) -> bool:
    """``spec.resources`` changed (kube compares them semantically; quantities are compared as written here)."""
    a, b = old.get("resources"), new.get("resources")
    if a is None and b is None:
        return False
    return a != b


def _non_sidecar_init_resized(old: Spec, new: Spec) -> bool:
    news = list(new.get("initContainers") or ())
    for i, c in enumerate(old.get("initContainers") or ()):
        if c.get("restartPolicy") != "Always" and i < len(news) and c.get("resources") != news[i].get("resources"):
            return True
    return False


def _memory_volume_resized(old: Spec, new: Spec) -> bool:
    olds, news = list(old.get("volumes") or ()), list(new.get("volumes") or ())
    if len(olds) != len(news):
        return False
    for was, now in zip(olds, news, strict=True):
        if was.get("name") != now.get("name"):
            continue
        dir_now, dir_was = now.get("emptyDir"), was.get("emptyDir") or {}
        if dir_now is None or dir_now.get("medium") != "Memory":
            continue
        if dir_now.get("sizeLimit") is None or dir_was.get("sizeLimit") is None:
            continue
        if dir_now["sizeLimit"] != dir_was["sizeLimit"]:
            return True
    return False


@dataclass(frozen=True)
class Feature:
    name: str
    infer_for_scheduling: Callable[[Spec], bool] = _never
    infer_for_update: Callable[[Spec, Spec], bool] = _never_update


FEATURES: tuple[Feature, ...] = tuple(
    sorted(
        (
            Feature("RestartAllContainersOnContainerExits", _restart_all_containers),
            Feature("InPlacePodLevelResourcesVerticalScaling", infer_for_update=_pod_level_resources_resized),
            Feature("ExtendWebSocketsToKubelet"),
            Feature("InPlacePodVerticalScalingInitContainers", infer_for_update=_non_sidecar_init_resized),
            Feature("InPlacePodVerticalScalingMemoryBackedVolumes", infer_for_update=_memory_volume_resized),
            Feature("UserNamespacesHostNetworkSupport", _user_namespaces_host_network),
            Feature("DRANodeAllocatableResources"),
            Feature("VolumeBindMountOptions", _bind_mount_options),
            # DRAOptionalNodeOperations: needed by an allocation, which DynamicResources checks itself
            Feature("DRAOptionalNodeOperations"),
        ),
        key=lambda f: f.name,
    )
)
NAMES: tuple[str, ...] = tuple(f.name for f in FEATURES)


_INFERRED_FOR_SCHEDULING = tuple(f for f in FEATURES if f.infer_for_scheduling is not _never)
_NONE: frozenset[str] = frozenset()


def infer_for_scheduling(spec: Spec) -> frozenset[str]:
    """``Framework.InferForPodScheduling``: the features a node must declare for the pod to run there (only the
    features with an inference are asked: PreFilter asks this of every pod)."""
    names = [f.name for f in _INFERRED_FOR_SCHEDULING if f.infer_for_scheduling(spec)]
    return frozenset(names) if names else _NONE


def infer_for_update(old: Spec, new: Spec) -> frozenset[str]:
    """``Framework.InferForPodUpdate``: the features the node must declare for the update old -> new."""
    return frozenset(f.name for f in FEATURES if f.infer_for_update(old, new))


def try_map(declared: Iterable[Any]) -> frozenset[str]:
    """``FeatureMapper.TryMap``: the registered features among a node's ``status.declaredFeatures``, by kube's
    merge of two sorted lists (unknown names skipped). The API server keeps the list sorted and unique; an
    unsorted one (never stored) reads as kube reads it, where the merge loses what it walked past."""
    names: Sequence[Any] = list(declared)
    out: set[str] = set()
    i = j = 0
    while i < len(names) and j < len(NAMES):
        name = names[i]
        if name == NAMES[j]:
            out.add(NAMES[j])
            i += 1
            j += 1
        elif str(name) < NAMES[j]:
            i += 1
        else:
            j += 1
    return frozenset(out)


def unsatisfied(required: Iterable[str], declared: frozenset[str]) -> list[str]:
    """``MatchNodeFeatureSet``'s unsatisfied requirements, in the registry's (name) order."""
    wanted = set(required)
    return [name for name in NAMES if name in wanted and name not in declared]
