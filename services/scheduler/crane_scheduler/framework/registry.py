"""Plugin name -> factory (kube-scheduler's ``framework/runtime/registry.go``).

To add a plugin: write a factory ``(args, handle) -> plugin`` and register it under a name::

    registry = builtin_registry()
    registry.register("Dynamic", lambda args, handle: Dynamic(parse_args(args), handle))

then enable it in a profile (``plugins.multiPoint.enabled: [{name: Dynamic, weight: 3}]``) and give it
``pluginConfig`` args. A factory rejects bad args by raising ``ArgsError`` with (field path, message) pairs; the
configuration loader reports them as ``profiles[i].pluginConfig[j].args.<path>: <message>``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from crane_scheduler.framework.interface import Handle, Plugin
from crane_scheduler.framework.types import ArgsError

__all__ = [
    "PluginFactory",
    "Registry",
    "no_args",
]

PluginFactory = Callable[[Mapping[str, Any], Handle], Plugin]


class Registry:
    """Plugin name -> factory, plus the default profile's ``multiPoint`` set (name, score weight).

    The built-in set comes from ``crane_scheduler.plugins.builtin_registry()``; installed packages add theirs
    through the ``crane_scheduler.plugins`` entry-point group (``crane_scheduler.plugins.plugin_registry``)."""

    def __init__(
        self, factories: Mapping[str, PluginFactory] | None = None, defaults: Iterable[tuple[str, int | None]] = ()
    ) -> None:
        self._factories: dict[str, PluginFactory] = dict(factories or {})
        self.defaults: list[tuple[str, int | None]] = list(defaults)

    def register(
        self, name: str, factory: PluginFactory, *, enabled_by_default: bool = False, weight: int | None = None
    ) -> None:
        """Add a plugin; ``enabled_by_default`` puts it in the default profile (after the built-ins), with
        ``weight`` if it scores. Profiles can still disable it like any default plugin."""
        if name in self._factories:
            raise ValueError(f"plugin {name!r} is already registered")
        self._factories[name] = factory
        if enabled_by_default:
            self.defaults.append((name, weight))

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(self._factories)

    def create(self, name: str, args: Mapping[str, Any], handle: Handle) -> Plugin:
        return self._factories[name](args, handle)


def no_args(name: str) -> Callable[[Mapping[str, Any]], None]:
    """Argument check for plugins that take none."""

    def check(args: Mapping[str, Any]) -> None:
        if args:
            raise ArgsError([(k, f"unknown field (plugin {name} takes no args)") for k in args])

    return check
