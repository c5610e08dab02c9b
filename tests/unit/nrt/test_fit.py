"""The vectorised evaluation agrees with the per-node choice on every node (random zones, usage, requests)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from crane_scheduler.plugins.noderesourcetopology import fit

RESOURCES = ("cpu", "memory")

zone = st.tuples(
    st.integers(0, 8000),  # allocatable millicores (fractional cores included)
    st.integers(0, 16),  # allocatable memory (units)
    st.integers(0, 9000),  # used millicores (may exceed allocatable: overcommitted)
    st.integers(0, 20),
)
node = st.lists(zone, min_size=0, max_size=5)


@settings(max_examples=150, deadline=None)
@given(
    nodes=st.lists(node, min_size=1, max_size=8),
    cores=st.integers(1, 8),
    memory=st.integers(0, 8),
    aware=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_vectorised_equals_per_node(
    nodes: list[list[tuple[int, int, int, int]]], cores: int, memory: int, aware: list[bool]
) -> None:
    request = (cores * 1000, memory)
    width = max(1, max(len(n) for n in nodes))
    k = len(nodes)
    alloc = np.zeros((k, width, 2), dtype=np.int64)
    used = np.zeros((k, width, 2), dtype=np.int64)
    valid = np.zeros((k, width), dtype=bool)
    for i, zones in enumerate(nodes):
        for j, (ac, am, uc, um) in enumerate(zones):
            alloc[i, j], used[i, j], valid[i, j] = (ac, am), (uc, um), True
    ok, count = fit.evaluate(alloc, used, valid, np.array(request), np.array(aware[:k]), 0)
    for i, zones in enumerate(nodes):
        states = [fit.ZoneState(f"z{j}", (ac, am), (uc, um)) for j, (ac, am, uc, um) in enumerate(zones)]
        result = fit.assign(states, request, aware[i], RESOURCES)
        assert bool(ok[i]) == (result is not None)
        assert int(count[i]) == (len(result) if result else 0)
        if result:
            taken = [sum(e.capacity.get(r, 0) for e in result) for r in RESOURCES]
            assert taken == [v for v in request]  # never a partial result
