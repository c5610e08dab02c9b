"""NodeDeclaredFeatures: ``features`` (kube's feature-inference library, pure) and ``plugin``."""

from crane_scheduler.plugins.nodedeclaredfeatures.plugin import NAME, REASON, NodeDeclaredFeatures, new

__all__ = ["NAME", "REASON", "NodeDeclaredFeatures", "new"]
