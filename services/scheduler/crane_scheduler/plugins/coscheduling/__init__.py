"""Coscheduling: scheduler-plugins' gang contract (``PodGroup``, ``scheduling.x-k8s.io/v1alpha1``), all or nothing.

Pods join a group with the label ``scheduling.x-k8s.io/pod-group: <name>``; the ``PodGroup`` of that name in the
pod's namespace says how many must run together (``spec.minMember``), what the cluster must have free for them
(``spec.minResources``) and how long a group may wait (``spec.scheduleTimeoutSeconds``; default the plugin's
``permitWaitingTimeSeconds``, 60). Enable it in a profile in place of PrioritySort (its QueueSort orders a
group's pods together), as scheduler-plugins' README does::

    plugins:
      queueSort: {enabled: [{name: Coscheduling}], disabled: [{name: "*"}]}
      multiPoint: {enabled: [{name: Coscheduling}]}
    pluginConfig:
      - name: Coscheduling
        args: {permitWaitingTimeSeconds: 60, podGroupBackoffSeconds: 0}

How it differs from the reference, on purpose (docs/architecture.md, "Gangs"):

- All or nothing in one cycle. When a member is popped, the scheduler takes the group's other pending members
  with it and finds places for them one after another, each decision seeing the previous members assumed; only
  when the members placed already plus those found reach ``minMember`` are they all assumed and bound, else none
  is. Members never wait at Permit holding capacity, so two gangs cannot each hold part of the cluster waiting for
  each other (scheduler-plugins #114/#117), and a waiting gang starves nobody (#713).
- The timeout is a group's wait for room: a group whose members fit only in part for longer than its timeout has
  its members rejected with kube's ``rejected due to timeout after waiting <d> at plugin Coscheduling`` and
  starts a new wait; the timeout has no upper cap (kube caps Permit waits at 15 minutes).
- ``podGroupBackoffSeconds`` holds a group back after a failed gang cycle (``podGroup <g> failed recently``);
  ``podGroupRejectPercentage`` is accepted and has no effect (no member is ever waiting to be rejected).
- A missing PodGroup is refused in PreFilter (``PodGroup not found``), before any capacity is assumed, where the
  reference refuses it at Permit.
- The sibling count (``current pods number``) counts the group's pending and placed pods the scheduler sees
  (non-terminal pods); the reference counts every pod with the label.
- Gang preemption is not supported: a gang member never preempts (its FailedScheduling message says so).

The PodGroup status (phase, scheduled/running/succeeded/failed, occupiedBy, scheduleStartTime) is kept up to
date by the scheduler's leader, one step of scheduler-plugins' PodGroup controller per change.

Metrics: ``crane_scheduler_gangs_waiting{plugin}``, ``crane_scheduler_gangs_placed_total{plugin}``,
``crane_scheduler_gangs_timed_out_total{plugin}`` (``plugins.gangwait``, shared with GangScheduling),
``crane_scheduler_podgroups_malformed_total``, ``crane_scheduler_podgroup_status_writes_total{result}``.
"""

from __future__ import annotations

from crane_scheduler.framework import Registry

NAME = "Coscheduling"


def register(registry: Registry) -> None:
    """Make the plugin available (not in the default profile: it replaces PrioritySort as QueueSort)."""
    from crane_scheduler.plugins.coscheduling import plugin

    registry.register(NAME, plugin.new)
