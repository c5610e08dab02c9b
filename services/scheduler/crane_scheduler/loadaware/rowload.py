"""Per node row and metric columns of load that Dynamic's Filter adds or takes out (the nominated pods' estimate,
preemption victims' usage): one growable shape shared by ``nominated.py`` and ``leaving.py``."""

from __future__ import annotations

import numpy as np

from crane_scheduler.loadaware.columns import FloatArray, LoadColumns, Mask
from crane_shared.loadaware.dynamic import resource_of


class RowLoad:
    """``extra[metric]``: a fraction of the row's allocatable, for every policy metric of a known resource;
    ``alloc_cpu``/``alloc_memory``: the row's allocatable those fractions are taken of."""

    def __init__(self, cols: LoadColumns, capacity: int = 64) -> None:
        self.cols = cols
        self._cap = capacity
        self.extra: dict[str, FloatArray] = {
            metric: np.zeros(capacity) for metric in cols.metrics if resource_of(metric) is not None
        }
        self.judged: dict[str, Mask] = {metric: np.zeros(capacity, dtype=bool) for metric in self.extra}
        """rows of new nodes (no metric annotated) that these pods judge (``recent.RecentEffects.judged``)"""
        self.alloc_cpu = np.zeros(capacity)
        self.alloc_memory = np.zeros(capacity)

    def ensure(self, row: int) -> None:
        """Grow every column (doubling) so ``row`` is in range."""
        if row < self._cap:
            return
        cap = max(row + 1, 2 * self._cap)
        for name, arr in self.extra.items():
            self.extra[name] = grown(arr, cap)
        for name, mask in self.judged.items():
            bigger = np.zeros(cap, dtype=bool)
            bigger[: len(mask)] = mask
            self.judged[name] = bigger
        self.alloc_cpu = grown(self.alloc_cpu, cap)
        self.alloc_memory = grown(self.alloc_memory, cap)
        self._cap = cap


def grown(arr: FloatArray, cap: int) -> FloatArray:
    out = np.zeros(cap)
    out[: len(arr)] = arr
    return out
