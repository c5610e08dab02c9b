"""Prometheus values (percent, as strings) to annotation values (fractions), refusing what a scheduler must not see.

The recording rules produce 0..100; annotations carry 0..1 (upstream divides by 100). Prometheus sends numbers as
strings and may send ``NaN`` (e.g. 0/0 when MemTotal is 0) or ``+Inf``; such values and negative ones are
dropped and counted instead of being written, so a broken exporter cannot make a node look idle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from crane_annotator.matching import Match

DropReason = Literal["unparseable", "non-finite", "negative"]


@dataclass(frozen=True)
class Converted:
    fractions: dict[str, float]
    """node -> usage fraction"""
    dropped: dict[str, DropReason]
    """node -> why its value was refused"""


def percent_to_fraction(raw: str) -> float | DropReason:
    """``"63.0123"`` -> 0.630123; a refused value comes back as the reason."""
    try:
        value = float(raw)
    except ValueError:
        return "unparseable"
    if not math.isfinite(value):
        return "non-finite"
    if value < 0:
        return "negative"
    return value / 100.0 + 0.0  # -0.0 -> 0.0


def convert(chosen: Mapping[str, Match]) -> Converted:
    fractions: dict[str, float] = {}
    dropped: dict[str, DropReason] = {}
    for node, match in chosen.items():
        result = percent_to_fraction(match.value)
        if isinstance(result, float):
            fractions[node] = result
        else:
            dropped[node] = result
    return Converted(fractions, dropped)
