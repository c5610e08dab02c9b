"""Kubernetes label selectors (``matchLabels`` + ``matchExpressions``) over plain dicts; pure.

One matcher for the scheduler (volume binding, preemption's PDBs) and the descheduler (PDBs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["label_selector_matches"]


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """True when ``labels`` satisfy ``selector``; a missing selector (None) matches everything."""
    if selector is None:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or ():
        key, op, values = e.get("key", ""), e.get("operator", ""), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
