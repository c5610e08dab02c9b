"""The scheduler's per-test isolation (own node group and schedulerName) for the fault suite."""

from tests.support.scheduler_cluster import group, scheduler_name, selector
from tests.support.scheduler_faults import stage

__all__ = ["group", "scheduler_name", "selector", "stage"]
