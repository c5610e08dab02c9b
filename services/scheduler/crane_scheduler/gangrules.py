"""The gang cycle's rules, pure: which group a pod is in, when a group's quorum is met or out of reach, and what a
member that found no place is told about preemption. Shared by the live gang cycle (``gangcycle``, with the
per-pod cycle in ``schedule_one``) and the offline one (``simulate.Simulator.schedule_gang``), so the two decide
alike; nothing here touches the queue, the cache or the API."""

from __future__ import annotations

from collections.abc import Iterable

from crane_scheduler.framework.interface import GangPlugin
from crane_scheduler.podinfo import PodInfo


def gang_of(plugins: Iterable[GangPlugin], pod: PodInfo) -> tuple[GangPlugin, str] | None:
    """The first of a profile's gang plugins (Coscheduling's PodGroup label, GangScheduling's ``workloadRef``)
    that puts the pod in a group, with that group; None for a pod of no gang."""
    for plugin in plugins:
        gang = plugin.gang_of(pod)
        if gang is not None:
            return plugin, gang
    return None


def quorum_met(placed: int, found: int, quorum: int) -> bool:
    """All or nothing: the members placed already (bound or assumed) plus those this cycle found places for reach
    the quorum; a cycle that found none places nothing."""
    return found > 0 and placed + found >= quorum


def quorum_out_of_reach(placed: int, members: int, failed: int, quorum: int) -> bool:
    """So many members failed this cycle that the others can no longer reach the quorum: stop deciding."""
    return placed + members - failed < quorum


def no_preemption(gang: str) -> str:
    """PostFilter's part of a member's message: the gang cycle never preempts for one."""
    return f"preemption: not attempted for a member of pod group {gang} (gang preemption is not supported)"
