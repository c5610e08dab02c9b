"""The scheduling framework, shaped like kube-scheduler's ``pkg/scheduler/framework``.

- ``types``: statuses, cycle state, rejections, cluster events, the queued pod, the FitError diagnosis;
- ``interface``: one Protocol per extension point, the optional Explain interface, the ``Handle``;
- ``registry``: plugin name -> factory;
- ``runtime``: profiles (plugins per extension point, built once) and the per-pod extension-point runners.

Import direction: ``types`` <- ``interface`` <- ``registry`` <- ``runtime``; plugins import the first three
(this package's names below), never the scheduler, the queue or the cache.
"""

from crane_scheduler.framework import interface, registry, types
from crane_scheduler.framework.interface import *  # noqa: F403
from crane_scheduler.framework.registry import *  # noqa: F403
from crane_scheduler.framework.types import *  # noqa: F403

__all__ = [*types.__all__, *interface.__all__, *registry.__all__]
