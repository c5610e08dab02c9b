"""The drift scenario's score, pure: the fewest evictions that cool a node, and the side-by-side table.

Kept apart from the live run (``__main__``) so the arithmetic is unit-tested without a sandbox.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


def minimum_evictions(base_cpu: float, pod_cores: Iterable[float], cores: float, threshold: float) -> int:
    """The fewest pods to move off a node so its CPU usage ``base_cpu + sum(pods) / cores`` is at or under
    ``threshold``: the biggest users first (no choice of victims does better). A replacement lands elsewhere with
    its template's usage, so this is the lower bound for any descheduler; ``-1`` when even moving every pod is not
    enough (the base load alone is over)."""
    remaining = sorted(pod_cores, reverse=True)
    usage = base_cpu + sum(remaining) / cores
    moved = 0
    while usage > threshold:
        if not remaining:
            return -1
        usage -= remaining.pop(0) / cores
        moved += 1
    return moved


@dataclass
class Outcome:
    """One backend's run of the scenario, as the bench observed it (ground truth: the fleet's real usage and the
    API server's pods)."""

    backend: str
    interval_s: float
    hot_at: float | None = None
    """seconds from the drift until both drifted nodes are over the threshold"""
    first_eviction_at: float | None = None
    cool_at: float | None = None
    """seconds from the drift until no node is over the threshold (None: never, within the run)"""
    evictions: int = 0
    minimum: int = 0
    returns_to_hot: int = 0
    """replacements bound to a node that was over the threshold at that moment"""
    pdb_violations: int = 0
    """samples where a workload had fewer available pods than its PodDisruptionBudget requires"""
    pending: int = 0
    """workload pods not Running at the end of the drift phase"""
    evictions_all_hot: int = 0
    evictions_stale: int = 0
    notes: list[str] = field(default_factory=list)

    def rounds_to_cool(self) -> int | None:
        """Descheduling rounds from the first eviction (the node detected and acted on) until no node is hot."""
        if self.cool_at is None or self.first_eviction_at is None:
            return None
        return max(1, math.ceil((self.cool_at - self.first_eviction_at) / self.interval_s))


def _minutes(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds / 60:.1f}"


def table(outcomes: Sequence[Outcome]) -> str:
    """The side-by-side Markdown table, one column per backend, targets in the first column."""
    rows: list[tuple[str, Callable[[Outcome], str]]] = [
        ("minutes until no node is hot (from the drift)", lambda o: _minutes(o.cool_at)),
        ("seconds from the drift to the first eviction", lambda o: _seconds(o.first_eviction_at)),
        ("rounds from the first eviction until no node is hot (target <= 3)", _rounds),
        ("evictions (minimum needed; target <= minimum + 1)", lambda o: f"{o.evictions} ({o.minimum})"),
        ("replacements bound to a hot node (target 0)", lambda o: str(o.returns_to_hot)),
        ("PodDisruptionBudget violations (target 0)", lambda o: str(o.pdb_violations)),
        ("pods left Pending", lambda o: str(o.pending)),
        ("evictions while every node is hot (target 0)", lambda o: str(o.evictions_all_hot)),
        ("evictions on stale metrics (target 0)", lambda o: str(o.evictions_stale)),
    ]
    lines = ["| | " + " | ".join(o.backend for o in outcomes) + " |", "|---" * (len(outcomes) + 1) + "|"]
    lines += [f"| {name} | " + " | ".join(cell(o) for o in outcomes) + " |" for name, cell in rows]
    return "\n".join(lines)


def _seconds(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.0f}"


def _rounds(outcome: Outcome) -> str:
    rounds = outcome.rounds_to_cool()
    return "never" if rounds is None else str(rounds)
