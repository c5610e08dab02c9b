"""Per-row caches of plugin results: recomputed only for the node rows whose inputs changed.

Dynamic's score of a node does not depend on the pod, and its filter depends on the pod only through the pod's
size; NodeResourcesFit's and BalancedAllocation's results depend on the pod only through its requests. Between two
decisions the inputs change for a handful of rows (the node the last pod was assumed or reserved on, a node whose
annotations were rewritten, a freshness edge or hot-value range that passed), so keeping the results per row and
refreshing those rows makes a decision a few vector operations over the table instead of a few dozen.
``RowVersions`` says which rows changed since a result was computed: a counter per row, bumped when the row's
inputs change (``touch``), or for all rows at once (``touch_all``). The node table keeps one for its resource
accounting (``NodeTable.row_versions``); Dynamic keeps its own for its load inputs.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
Codes = npt.NDArray[np.int8]
Rows = npt.NDArray[np.intp]

PASS = -1
"""filter code of a row no reason rejects"""
SIZES_KEPT = 8
"""results kept for this many pod sizes (a burst of one Deployment reuses one)"""
LOG_KEPT = 4096
"""row touches logged (then the older half is dropped: asking about them scans the version array)"""
LOG_SCAN = 256
"""more touches than this since a result was computed: the version array is scanned instead of the log"""
_NO_ROWS: Rows = np.zeros(0, dtype=np.intp)


class RowVersions:
    """A version per row, bumped when the row's inputs change; the recent touches are also logged, so asking which
    of a few thousand rows changed since the last decision (usually one or two) scans the log, not every row."""

    def __init__(self, capacity: int = 64) -> None:
        self.version = 1
        self.full = 1  # every result computed before this version is stale
        self._rows: IntArray = np.zeros(capacity, dtype=np.int64)
        # (version, row) of the touches after version ``_floor``, oldest first
        self._log_versions: list[int] = []
        self._log_rows: list[int] = []
        self._floor = 1

    def touch(self, rows: Iterable[int]) -> None:
        rows = list(rows)
        if not rows:
            return
        self._fit(max(rows))
        self.version += 1
        self._rows[rows] = self.version
        self._log_versions.extend([self.version] * len(rows))
        self._log_rows.extend(rows)
        self._trim()

    def touch_row(self, row: int) -> None:
        """``touch((row,))`` without building a list (the table calls it for every pod it accounts)."""
        if row >= len(self._rows):
            self._fit(row)
        self.version += 1
        self._rows[row] = self.version
        self._log_versions.append(self.version)
        self._log_rows.append(row)
        if len(self._log_rows) > LOG_KEPT:
            self._trim()

    def _fit(self, top: int) -> None:
        if top >= len(self._rows):
            grown = np.zeros(max(top + 1, 2 * len(self._rows)), dtype=np.int64)
            grown[: len(self._rows)] = self._rows
            self._rows = grown

    def _trim(self) -> None:
        if len(self._log_rows) > LOG_KEPT:
            cut = len(self._log_rows) - LOG_KEPT // 2
            self._floor = self._log_versions[cut - 1]  # the log now holds every touch after this version
            del self._log_versions[:cut], self._log_rows[:cut]

    def touch_all(self) -> None:
        self.version += 1
        self.full = self.version

    def stale(self, at: int, n: int) -> Rows | None:
        """Rows ``[:n]`` changed after version ``at`` (ascending); None when all must be recomputed."""
        if at < self.full:
            return None
        if at >= self.version:
            return _NO_ROWS
        if at >= self._floor:
            start = bisect.bisect_right(self._log_versions, at)
            if len(self._log_rows) - start <= LOG_SCAN:
                return np.array(sorted({r for r in self._log_rows[start:] if r < n}), dtype=np.intp)
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
    """Per pod size, one value per row (Dynamic: ``PASS`` or the index of the reason that rejects it;
    NodeResourcesFit: its reasons as bits; a score)."""

    def __init__(self, versions: RowVersions) -> None:
        self._versions = versions
        self._sizes: OrderedDict[Hashable, tuple[int, npt.NDArray[Any]]] = OrderedDict()

    def clear(self) -> None:
        self._sizes.clear()

    def get(self, size: Hashable, n: int, compute: Callable[[Rows], npt.NDArray[Any]]) -> npt.NDArray[Any]:
        """The values of rows ``[:n]`` for pods of ``size``, ``compute(rows)`` called for the changed rows."""
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
