"""A pod that names a PodGroup in a profile without a gang plugin: refused (default) or placed alone, never silently.

scheduler-plugins' gang contract is a label, ``scheduling.x-k8s.io/pod-group: <name>``, read by the Coscheduling
plugin. A profile without it would place such a pod as if the label were absent: members bound one at a time, and a
group that cannot fit whole left partly bound, holding capacity and doing nothing. What happens instead is the
scheduler's ``--pod-group-without-gang-plugin`` (``CRANE_SCHEDULER_POD_GROUP_WITHOUT_GANG_PLUGIN``):

- ``refuse`` (the default): the pod is unschedulable with a message naming the profile and the missing plugin (its
  ``FailedScheduling`` Warning event and PodScheduled condition). Whoever labelled the pod asked for all or
  nothing; a profile that cannot give it must not give a part. It is retried like any refused pod.
- ``place-alone``: the pod is placed as any other pod, with a ``PodGroupIgnored`` Warning event saying so (for
  clusters whose pods carry the label for another scheduler and may run alone).

Either way one log line per profile and group names the profile and the plugin. Kubernetes 1.35's Workload API
(``spec.workloadRef``) is refused in a profile without GangScheduling by the unsupported-field gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
PLUGIN = "Coscheduling"
"""the plugin that reads the label"""
GATE = "PodGroupWithoutGangPlugin"
"""the rejector name the queue sees (no plugin registers events under it: any cluster event retries the pod)"""
IGNORED_REASON = "PodGroupIgnored"
Mode = Literal["refuse", "place-alone"]
MODES: tuple[Mode, ...] = ("refuse", "place-alone")
FLAG = "--pod-group-without-gang-plugin"


def pod_group(pod_raw: Mapping[str, Any]) -> str | None:
    """The PodGroup the pod names by its label; None without one."""
    labels = (pod_raw.get("metadata") or {}).get("labels") or {}
    group = labels.get(POD_GROUP_LABEL)
    return str(group) if group else None


def message(profile: str, namespace: str, group: str, mode: Mode) -> str:
    """What the pod is told (its event) and the log says: the profile, the group and the missing plugin."""
    what = (
        f"refused rather than placed one pod at a time ({FLAG}=place-alone places it alone)"
        if mode == "refuse"
        else f"placed alone, not all or nothing ({FLAG}=place-alone)"
    )
    return (
        f"pod names PodGroup {namespace}/{group} (label {POD_GROUP_LABEL}) but profile {profile} has no gang "
        f"plugin ({PLUGIN} is not enabled): {what}"
    )
