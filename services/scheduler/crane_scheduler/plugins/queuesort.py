"""PrioritySort: higher ``spec.priority`` first, then earlier arrival in the queue."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crane_scheduler import framework as fwk


class PrioritySort(fwk.QueueSortPlugin):
    name = "PrioritySort"

    def sort_key(self, qp: fwk.QueuedPod) -> tuple[Any, ...]:
        return (-qp.pod.priority, qp.timestamp)


def new(args: Mapping[str, Any], handle: fwk.Handle) -> PrioritySort:
    fwk.no_args(PrioritySort.name)(args)
    return PrioritySort()
