"""DynamicResources (DRA): ``plugin`` (the extension points), ``claims`` (a pod's claims, in-flight allocations),
``allocator`` and ``pools`` (kube's structured-parameters allocator), ``celenv`` (kube's DRA CEL environment)."""

from crane_scheduler.plugins.dynamicresources.plugin import NAME, DynamicResources, new

__all__ = ["NAME", "DynamicResources", "new"]
