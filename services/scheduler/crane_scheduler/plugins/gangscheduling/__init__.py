"""GangScheduling: Kubernetes 1.35's Workload API gangs, placed all or nothing by the scheduler's gang cycle.

A ``Workload`` (``scheduling.k8s.io/v1alpha1``, served by kube-apiserver with the ``GenericWorkload`` gate and
``--runtime-config=scheduling.k8s.io/v1alpha1=true``) lists pod groups, each with a policy: ``basic`` (no gang) or
``gang`` with ``minCount``. A pod joins with ``spec.workloadRef{name, podGroup, podGroupReplicaKey}``; each
(workload, podGroup, replicaKey) is one gang. Enable it in a profile (kube enables it by default with its gate)::

    plugins:
      multiPoint:
        enabled: [{name: GangScheduling}]

Semantics as kube's plugin (``pkg/scheduler/framework/plugins/gangscheduling``), with its messages: no Workload
(``waiting for pods's workload "w" to appear in scheduling queue``), no such pod group (``pod group "g" doesn't
exist for a workload "w"``), fewer pods known than ``minCount`` (``waiting for minCount pods from a gang to appear
in scheduling queue``), all UnschedulableAndUnresolvable; kube checks these in PreEnqueue, here in PreFilter (a pod
is tried, refused at no cost, and retried when a sibling arrives or the Workload appears). Where kube waits at
Permit (``waiting for minCount pods from a gang to be waiting on permit``) holding the capacity of the assumed
members, here the gang is decided whole in one cycle: a member that fits while the gang does not hears that
message and holds nothing. A group waiting longer than its timeout (kube's fixed 300 s; here the crane arg
``schedulingTimeoutSeconds``, default 300, no cap) hears ``rejected due to timeout after waiting 5m0s at plugin
GangScheduling`` and a new wait starts. ``basic`` groups and pods without ``workloadRef`` pass through.

A profile without this plugin refuses pods with ``spec.workloadRef`` through the unsupported-field gate (never
places them one by one as if the field were absent).
"""

from __future__ import annotations

from crane_scheduler.framework import Registry

NAME = "GangScheduling"


def register(registry: Registry) -> None:
    """Make the plugin available (not in the default profile: it watches an alpha API)."""
    from crane_scheduler.plugins.gangscheduling import plugin

    registry.register(NAME, plugin.new)
