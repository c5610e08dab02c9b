"""VolumeBinding: see ``plugin`` (the extension points) and ``binder`` (claims, PV matching, provisioning)."""

from crane_scheduler.plugins.volumebinding.plugin import NAME, VolumeBinding, new

__all__ = ["NAME", "VolumeBinding", "new"]
