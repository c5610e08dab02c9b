"""Load-aware scheduling: crane's Dynamic policy (Filter and Score over node load annotations).

``register(registry)`` adds the ``Dynamic`` plugin, enabled in the default profile with score weight 3 (as
upstream crane-scheduler's shipped configuration), so ``crane-scheduler`` is load-aware out of the box.
"""

from __future__ import annotations

from crane_scheduler.framework.registry import Registry

DYNAMIC_WEIGHT = 3


def register(registry: Registry) -> None:
    from crane_scheduler.loadaware import plugin

    registry.register(plugin.NAME, plugin.new, enabled_by_default=True, weight=DYNAMIC_WEIGHT)
