"""What the storage plugins (VolumeRestrictions, VolumeZone, NodeVolumeLimits) share: they read claims, volumes,
classes and CSINodes through the handle's listers, and take no args."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

from crane_scheduler import framework as fwk
from crane_scheduler.listers import Listers

Volume = Mapping[str, Any]


def volumes_of(raw: Mapping[str, Any]) -> Sequence[Volume]:
    """A raw pod's ``spec.volumes`` (empty when absent)."""
    return (raw.get("spec") or {}).get("volumes") or ()


class StoragePlugin:
    """Base of the storage plugins: holds the listers; ``new`` is the registry factory."""

    name: str

    def __init__(self, listers: Listers) -> None:
        self.listers = listers

    @classmethod
    def new(cls, args: Mapping[str, Any], handle: fwk.Handle) -> Self:
        fwk.no_args(cls.name)(args)
        return cls(handle.listers)
