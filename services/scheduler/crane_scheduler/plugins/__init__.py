"""Built-in plugins with kube-scheduler 1.37 semantics, under kube-scheduler's names.

``builtin_registry()`` returns a fresh ``Registry`` holding them; add your own with ``registry.register``.
``DEFAULT_MULTIPOINT`` is kube-scheduler's default profile restricted to the plugins implemented here, with the
same order and score weights (TaintToleration 3, NodeAffinity 2, NodeResourcesFit 1, PodTopologySpread 2,
InterPodAffinity 2, NodeResourcesBalancedAllocation 1, ImageLocality 1; 1.37 put NodeName before
NodeUnschedulable and appends NodeDeclaredFeatures); Dynamic is added by the load-aware package. Not yet here:
SchedulingGates (gated pods never reach the queue); in-tree volume sources that kube counts against CSI limits
through CSI migration are refused by the unsupported-field gate.
"""

from __future__ import annotations

import importlib.metadata

from crane_scheduler.framework.registry import Registry
from crane_scheduler.plugins import (
    defaultbinder,
    defaultpreemption,
    dynamicresources,
    imagelocality,
    interpodaffinity,
    nodeaffinity,
    nodedeclaredfeatures,
    nodename,
    nodeports,
    noderesources,
    noderesourcetopology,
    nodeunschedulable,
    nodevolumelimits,
    podtopologyspread,
    queuesort,
    tainttoleration,
    volumebinding,
    volumerestrictions,
    volumezone,
)
from crane_scheduler.plugins.coscheduling import register as register_coscheduling
from crane_scheduler.plugins.gangscheduling import register as register_gangscheduling

DEFAULT_MULTIPOINT: tuple[tuple[str, int | None], ...] = (
    ("PrioritySort", None),
    ("NodeName", None),
    ("NodeUnschedulable", None),
    ("TaintToleration", 3),
    ("NodeAffinity", 2),
    ("NodePorts", None),
    ("NodeResourcesFit", 1),
    ("VolumeRestrictions", None),
    ("NodeVolumeLimits", None),
    ("VolumeBinding", None),
    ("VolumeZone", None),
    ("PodTopologySpread", 2),
    ("InterPodAffinity", 2),
    ("DynamicResources", 2),  # applyDynamicResources inserts it before DefaultPreemption, weight 2
    ("DefaultPreemption", None),
    ("NodeResourcesBalancedAllocation", 1),
    ("ImageLocality", 1),
    ("DefaultBinder", None),
    ("NodeDeclaredFeatures", None),  # 1.37: GA, appended to the default multiPoint set (applyFeatureGates)
)


def builtin_registry() -> Registry:
    registry = Registry(
        defaults=DEFAULT_MULTIPOINT,
        factories={
            "PrioritySort": queuesort.new,
            "NodeUnschedulable": nodeunschedulable.new,
            "NodeName": nodename.new,
            "NodeDeclaredFeatures": nodedeclaredfeatures.new,
            "TaintToleration": tainttoleration.new,
            "NodeAffinity": nodeaffinity.new,
            "NodePorts": nodeports.new,
            "NodeResourcesFit": noderesources.new_fit,
            "NodeResourcesBalancedAllocation": noderesources.new_balanced_allocation,
            "VolumeRestrictions": volumerestrictions.new,
            "NodeVolumeLimits": nodevolumelimits.new,
            "VolumeBinding": volumebinding.new,
            "VolumeZone": volumezone.new,
            "DynamicResources": dynamicresources.new,
            "DefaultPreemption": defaultpreemption.new,
            "InterPodAffinity": interpodaffinity.new,
            "PodTopologySpread": podtopologyspread.new,
            "ImageLocality": imagelocality.new,
            "DefaultBinder": defaultbinder.new,
        },
    )
    noderesourcetopology.register(registry)  # crane's NUMA placement; not in the default profile
    register_coscheduling(registry)  # gangs (PodGroup); replaces PrioritySort where enabled
    register_gangscheduling(registry)  # gangs (1.35's Workload API)
    return registry


def plugin_registry() -> Registry:
    """The built-in plugins plus out-of-tree ones: every installed ``crane_scheduler.plugins`` entry point names a
    ``register(registry)`` function (e.g. ``loadaware = "crane_scheduler.loadaware:register"``)."""
    registry = builtin_registry()
    for entry in importlib.metadata.entry_points(group="crane_scheduler.plugins"):
        entry.load()(registry)
    return registry
