"""GangScheduling: Kubernetes' Workload API gangs (1.37's PodGroups and 1.35's Workloads), placed all or nothing by
the scheduler's gang cycle.

The plugin asks the API server which version of ``scheduling.k8s.io`` it serves (discovery) and watches that one:

- **1.37** (``v1beta1``, served by kube-apiserver with the ``GenericWorkload`` gate and
  ``--runtime-config=scheduling.k8s.io/v1beta1=true``): a ``PodGroup`` object is one gang, its
  ``spec.schedulingPolicy`` ``basic`` (no gang) or ``gang`` with ``minCount``; a pod joins with
  ``spec.schedulingGroup.podGroupName``.
- **1.35** (``v1alpha1``, ``GenericWorkload`` and ``--runtime-config=scheduling.k8s.io/v1alpha1=true``): a
  ``Workload`` lists pod groups with the same policies; a pod joins with
  ``spec.workloadRef{name, podGroup, podGroupReplicaKey}``; each (workload, podGroup, replicaKey) is one gang.

Enable it in a profile (kube enables it by default with its gate)::

    plugins:
      multiPoint:
        enabled: [{name: GangScheduling}]

Semantics as kube's plugin (``pkg/scheduler/framework/plugins/gangscheduling``), with its messages, all
UnschedulableAndUnresolvable; kube checks these in PreEnqueue, here in PreFilter (a pod is tried, refused at no
cost, and retried when a sibling arrives or its group object appears):

- 1.37: no PodGroup (``waiting for pods's pod group "g" to appear in scheduling queue``); a member whose priority is
  not the group's (kube's ``validatePodGroup``: ``all pods in a single pod group should have the same priority as
  the pod group's priority, got 5 and 0``); a group that sets a field crane does not read yet
  (``spec.schedulingConstraints.topology``, ``spec.parentCompositePodGroupName``, ``spec.resourceClaims``,
  ``spec.disruptionMode.all``) refuses its members naming it.
- 1.35: no Workload (``waiting for pods's workload "w" to appear in scheduling queue``), no such pod group (``pod
  group "g" doesn't exist for a workload "w"``).
- Both: fewer pods known than ``minCount`` (``waiting for minCount pods from a gang to appear in scheduling
  queue``).

A gang is decided whole in one cycle, as kube 1.37's pod group cycle does (kube 1.35 instead waits at Permit holding
the capacity of the assumed members): a member that fits while the group does not hears kube 1.37's PlacementFeasible
verdict (``minCount (3) cannot be satisfied: 2 scheduled, 0 remaining``) for a PodGroup, kube 1.35's Permit message
(``waiting for minCount pods from a gang to be waiting on permit``) for a Workload group, and holds nothing. A
Workload group waiting longer than its timeout (kube 1.35's fixed 300 s; here the crane arg
``schedulingTimeoutSeconds``, default 300, no cap) hears ``rejected due to timeout after waiting 5m0s at plugin
GangScheduling`` and a new wait starts; a PodGroup has no such timeout (kube 1.37's cycle has no Permit wait).
``basic`` groups and pods of no group pass through.

A profile without this plugin refuses pods with ``spec.schedulingGroup`` or ``spec.workloadRef`` through the
unsupported-field gate (never places them one by one as if the field were absent).
"""

from __future__ import annotations

from crane_scheduler.framework import Registry

NAME = "GangScheduling"


def register(registry: Registry) -> None:
    """Make the plugin available (not in the default profile: kube enables it only with its gate, GenericWorkload,
    off by default in 1.35 and 1.37)."""
    from crane_scheduler.plugins.gangscheduling import plugin

    registry.register(NAME, plugin.new)
