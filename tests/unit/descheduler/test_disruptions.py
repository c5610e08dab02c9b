"""PodDisruptionBudgets as the Eviction API judges an eviction (``eviction.go``): the planner passes over what the
API would refuse (429, or 500 for two budgets), and lets a not-Ready pod go without spending the allowance where
the API does."""

from __future__ import annotations

from typing import Any

import pytest

from crane_descheduler.pods import Disruptions


def budget(allowed: int, **spec_status: Any) -> dict[str, Any]:
    """The budget ``web`` selecting ``app=web``; keyword arguments go into its spec (``unhealthyPodEvictionPolicy``),
    its status (``currentHealthy``, ``desiredHealthy``, ``observedGeneration``) or its metadata (``generation``)."""
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "web"}}}
    status: dict[str, Any] = {"disruptionsAllowed": allowed}
    meta: dict[str, Any] = {"namespace": "default", "name": "web"}
    for key, value in spec_status.items():
        target = spec if key == "unhealthyPodEvictionPolicy" else meta if key == "generation" else status
        target[key] = value
    return {"metadata": meta, "spec": spec, "status": status}


POD = {"metadata": {"namespace": "default", "name": "web-1", "labels": {"app": "web"}}}


def test_an_allowance_of_one_lets_one_pod_go_and_refuses_the_next() -> None:
    d = Disruptions([budget(1)])
    budgets = d.of(POD)
    assert budgets == ("default/web",) and d.refusal(budgets) is None
    d.spend(budgets)
    assert d.refusal(budgets) == "pdb"


def test_a_budget_whose_status_has_not_observed_its_spec_allows_nothing() -> None:
    """The API answers 429 while ``observedGeneration < generation`` (the controller has not judged the new spec)."""
    d = Disruptions([budget(2, generation=3, observedGeneration=2)])
    assert d.refusal(d.of(POD)) == "pdb"
    assert Disruptions([budget(2, generation=3, observedGeneration=3)]).refusal(d.of(POD)) is None


@pytest.mark.parametrize(
    ("fields", "goes_free"),
    [
        ({"unhealthyPodEvictionPolicy": "AlwaysAllow"}, True),
        ({"currentHealthy": 3, "desiredHealthy": 2}, True),  # IfHealthyBudget (the default), the budget healthy
        ({"currentHealthy": 1, "desiredHealthy": 2}, False),
        ({"unhealthyPodEvictionPolicy": "IfHealthyBudget", "currentHealthy": 2, "desiredHealthy": 0}, False),
    ],
)
def test_a_pod_that_is_not_ready_goes_without_spending_where_the_api_lets_it(
    fields: dict[str, Any], goes_free: bool
) -> None:
    d = Disruptions([budget(0, **fields)])
    budgets = d.of(POD)
    assert d.refusal(budgets, ready=False) == (None if goes_free else "pdb")
    assert d.refusal(budgets, ready=True) == "pdb"  # a Ready pod always spends the allowance
    spent = Disruptions([budget(1, **fields)])
    spent.spend(budgets, ready=False)
    assert spent.refusal(budgets, ready=True) == ("pdb" if not goes_free else None)


def test_a_pod_two_budgets_select_is_refused() -> None:
    other = budget(1)
    other["metadata"]["name"] = "all"
    other["spec"]["selector"] = {}  # policy/v1: an empty selector selects every pod of the namespace
    d = Disruptions([budget(1), other])
    assert d.refusal(d.of(POD)) == "pdb-multiple"


def test_a_budget_with_too_many_evictions_its_controller_has_not_seen_through_is_refused() -> None:
    """The API answers 403 past 2,000 entries in ``status.disruptedPods``; each eviction planned adds one."""
    pending = {f"web-{i}": "2026-11-29T15:00:00Z" for i in range(2000)}
    at_the_limit = Disruptions([budget(5, disruptedPods=pending)])
    budgets = at_the_limit.of(POD)
    assert at_the_limit.refusal(budgets) is None  # 2,000: still allowed
    at_the_limit.spend(budgets)  # 2,001 once this one is evicted
    assert at_the_limit.refusal(budgets) == "pdb"
    assert Disruptions([budget(5, disruptedPods={**pending, "web-x": "t"})]).refusal(budgets) == "pdb"
