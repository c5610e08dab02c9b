"""Per-test isolation on the shared API server: each test's nodes carry its own label, and its pods its own
schedulerName, so the scheduler under test sees only that test's nodes and pods."""

from __future__ import annotations

import pytest


@pytest.fixture
def group(namespace: str) -> str:
    """Label value of this test's nodes (the scheduler runs with --node-selector crane.test/group=<group>)."""
    return namespace


@pytest.fixture
def selector(group: str) -> str:
    return f"crane.test/group={group}"


@pytest.fixture
def scheduler_name(namespace: str) -> str:
    return f"crane-{namespace}"[:63].rstrip("-")
