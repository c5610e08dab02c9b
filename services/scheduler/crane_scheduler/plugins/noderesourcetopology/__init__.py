"""NodeResourceTopologyMatch: crane's NUMA-aware placement of pods with exclusive CPUs.

crane-agent publishes one cluster-scoped ``NodeResourceTopology`` (``topology.crane.io/v1alpha1``, CRD in
``deploy/crds/``) per node: its NUMA zones with allocatable resources and the node's manager policies. For pods
with *target containers* (whole CPUs, requests == limits) the plugin keeps the pod on nodes whose zones can hold
it, prefers nodes where it fits in one zone, and writes the chosen zones on the pod
(``topology.crane.io/topology-result``) for the agent to pin.

Enable it in a profile (upstream ships it with Score weight 2)::

    plugins:
      multiPoint:
        enabled: [{name: NodeResourceTopologyMatch, weight: 2}]
    pluginConfig:
      - name: NodeResourceTopologyMatch
        args: {topologyAwareResources: [cpu]}

Metrics: ``crane_scheduler_nrt_placements_total{policy}`` (results written, by the topology policy applied),
``crane_scheduler_nrt_rejections_total{reason}`` (nodes rejected), ``crane_scheduler_nrt_malformed_total{kind}``
(NRT objects / result annotations skipped), ``crane_scheduler_nrt_objects{policy}``. ``cranectl explain`` shows
the zones chosen for a pod.

Modules: ``model`` (wire formats), ``args``, ``podspec`` (which pods, what they need), ``fit`` (zone choice, per
node and vectorised), ``zones`` (zone accounting and row tensors), ``plugin`` (the framework adapter).

Differences from upstream, each deliberate (reference: crane-scheduler c2c0533):

- Memory (and every other resource) is recorded in its own unit, not with the CPU's number; the annotation keeps
  upstream's keys and canonical quantity syntax, and crane-agent reads only ``cpu`` from it.
- A pod that may span zones (not aware) but whose zones cannot hold it is rejected
  (``node(s) had insufficient resource across NUMA nodes``), where upstream passed it with a partial result
  (the agent pinned fewer CPUs than the limit) or an empty one (Score divided by zero and crashed the
  scheduler; with one node Reserve failed). Score never divides by zero.
- Free capacity is clamped at 0 (upstream let an overcommitted zone grow the remaining request); scalar
  resources are ordinary per-zone resources (upstream panicked on a nil map).
- The cycle state is per cycle (upstream's ``Clone`` returned the same pointer).
- Start-up never waits for the NRT list. While it has not completed (CRD missing, RBAC), pods with target
  containers get a retriable error naming the cause; other pods schedule normally; the watch retries.
- Only ``Node`` zones are candidates (upstream also used Socket/Core zones, which the agent cannot parse).
- The fit checks the aware resources (upstream also checked cpu/memory/ephemeral-storage at 0 request).
- Ties between zones keep NRT order for any number of zones (upstream: only up to 6, by accident of Go's sort).
- A stale result annotation on a pod placed without a result is cleared in PreBind (upstream left it, and it
  was counted and pinned). Invalid ``topology-awareness``/``cpu-policy`` values are refused with a reason
  naming the annotation (upstream fell back silently).
- The assumed-result cache is dropped as soon as the bound pod carries its result (upstream: 30 min TTL);
  results on bound pods count whichever scheduler placed them, so replicas and profiles share the accounting.

Kept as upstream, on purpose: a node without an NRT rejects every pod with targets (fail closed, so a pod is
never pinned by guesswork); both rejections are plain Unschedulable (preemption may try those nodes);
kubelet-managed nodes (``cpuManagerPolicy: None``) score 0 against 100 for a one-zone fit; pods with the
``numa``/``immovable`` cpu-policy count fully against their zones; one NRT watch per profile.
"""

from __future__ import annotations

from crane_scheduler.framework import Registry

NAME = "NodeResourceTopologyMatch"


def register(registry: Registry) -> None:
    """Make the plugin available (not enabled by default: without crane-agent's NRTs it would refuse every
    pod with whole-CPU containers)."""
    from crane_scheduler.plugins.noderesourcetopology import plugin

    registry.register(NAME, plugin.new)
