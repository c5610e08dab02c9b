"""PrioritySort: higher ``spec.priority`` first, then earlier arrival in the queue."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crane_scheduler.framework import Handle, QueuedPod, no_args
from crane_scheduler.framework.interface import QueueSortPlugin


class PrioritySort(QueueSortPlugin):
    name = "PrioritySort"

    def sort_key(self, qp: QueuedPod) -> tuple[Any, ...]:
        return (-qp.pod.priority, qp.timestamp)


def new(args: Mapping[str, Any], handle: Handle) -> PrioritySort:
    no_args(PrioritySort.name)(args)
    return PrioritySort()
