"""Per-test isolation on the shared API server: each test's nodes carry its own label, and its pods its own
schedulerName, so the scheduler under test sees only that test's nodes and pods (fixtures in
``tests.support.scheduler_cluster``, shared with the fault suite)."""

from tests.support.scheduler_cluster import group, priorities, scheduler_name, selector

__all__ = ["group", "priorities", "scheduler_name", "selector"]
