"""Per-row caches of Dynamic's results: recomputed only for the node rows whose inputs changed.

Dynamic's score of a node does not depend on the pod, and its filter depends on the pod only through the pod's
size. Between two decisions the inputs change for a handful of rows (the node the last pod was reserved on, a
node whose annotations were rewritten, a freshness edge or hot-value range that passed), so keeping the results
per row and refreshing those rows makes a decision a few vector operations over the table instead of a few dozen
(~ten metrics, several operations each). ``RowVersions`` says which rows changed since a result was computed: a
counter per row, bumped when the row's inputs change (``touch``), or for all rows at once (``touch_all``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
Codes = npt.NDArray[np.int8]
Rows = npt.NDArray[np.intp]

PASS = -1
"""filter code of a row no reason rejects"""
SIZES_KEPT = 8
"""filter results kept for this many pod sizes (a burst of one Deployment reuses one)"""


class RowVersions:
    def __init__(self, capacity: int = 64) -> None:
        self.version = 1
        self.full = 1  # every result computed before this version is stale
        self._rows: IntArray = np.zeros(capacity, dtype=np.int64)

    def touch(self, rows: Iterable[int]) -> None:
        rows = list(rows)
        if not rows:
            return
        top = max(rows)
        if top >= len(self._rows):
            grown = np.zeros(max(top + 1, 2 * len(self._rows)), dtype=np.int64)
            grown[: len(self._rows)] = self._rows
            self._rows = grown
        self.version += 1
        self._rows[rows] = self.version

    def touch_all(self) -> None:
        self.version += 1
        self.full = self.version

    def stale(self, at: int, n: int) -> Rows | None:
        """Rows ``[:n]`` changed after version ``at``; None when all must be recomputed."""
        if at < self.full:
            return None
        return np.flatnonzero(self._rows[:n] > at)


class ScoreCache:
    """One value per row (Dynamic's score: the same for every pod)."""

    def __init__(self, versions: RowVersions) -> None:
        self._versions = versions
        self._at = 0
        self._values: IntArray = np.zeros(0, dtype=np.int64)

    def get(self, n: int, compute: Callable[[Rows], IntArray]) -> IntArray:
        """The values of rows ``[:n]``, ``compute(rows)`` called for the rows whose inputs changed."""
        stale = self._versions.stale(self._at, n) if len(self._values) == n else None
        if stale is None:
            self._values = compute(np.arange(n, dtype=np.intp))
        elif len(stale):
            self._values[stale] = compute(stale)
        self._at = self._versions.version
        return self._values


class FilterCache:
    """Per pod size, one filter code per row: ``PASS`` or the index of the reason that rejects it."""

    def __init__(self, versions: RowVersions) -> None:
        self._versions = versions
        self._sizes: OrderedDict[Hashable, tuple[int, Codes]] = OrderedDict()

    def clear(self) -> None:
        self._sizes.clear()

    def get(self, size: Hashable, n: int, compute: Callable[[Rows], Codes]) -> Codes:
        """The codes of rows ``[:n]`` for pods of ``size``, ``compute(rows)`` called for the changed rows."""
        cached = self._sizes.pop(size, None)
        stale = None
        if cached is not None and len(cached[1]) == n:
            stale = self._versions.stale(cached[0], n)
        if stale is None or cached is None:
            codes = compute(np.arange(n, dtype=np.intp))
        else:
            codes = cached[1]
            if len(stale):
                codes[stale] = compute(stale)
        self._sizes[size] = (self._versions.version, codes)
        while len(self._sizes) > SIZES_KEPT:
            self._sizes.popitem(last=False)
        return codes
