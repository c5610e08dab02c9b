"""Round planning: what is due, when, and how failures and overruns move the next round."""

from __future__ import annotations

import pytest

from crane_annotator import schedule

PERIODS = {"cpu_5m": 180.0, "mem_5m": 180.0, "cpu_1h": 900.0, "cpu_1d": 10800.0}


def test_everything_is_due_at_start() -> None:
    plan = schedule.start(PERIODS, now=1000.0)
    assert schedule.due(plan, 1000.0) == tuple(PERIODS)


def test_after_a_round_each_metric_is_due_one_period_later() -> None:
    plan = schedule.start(PERIODS, now=0.0)
    plan = schedule.after_round(plan, 0.0, 2.0, PERIODS, [])
    assert schedule.due(plan, 100.0) == ()
    assert schedule.wake_at(plan) == 180.0
    assert schedule.due(plan, 180.0) == ("cpu_5m", "mem_5m")


def test_aligned_periods_share_a_round_so_a_node_gets_one_patch() -> None:
    plan = schedule.start(PERIODS, now=0.0)
    for _ in range(5):  # five 3m rounds, each a little late
        now = schedule.wake_at(plan) + 0.3
        plan = schedule.after_round(plan, now, now + 1, schedule.due(plan, now), [])
    now = schedule.wake_at(plan)
    assert now == 900.0
    assert schedule.due(plan, now) == ("cpu_5m", "mem_5m", "cpu_1h")


def test_an_overrunning_round_skips_missed_ticks_instead_of_bursting() -> None:
    plan = schedule.start({"m": 10.0}, now=0.0)
    plan = schedule.after_round(plan, 0.0, 35.0, ["m"], [])  # the round took 35 s
    assert plan.next_due["m"] == 10.0  # due at once after the overrun...
    plan = schedule.after_round(plan, 35.0, 36.0, ["m"], [])
    assert plan.next_due["m"] == 40.0  # ...then back on the grid, 20 and 30 skipped


def test_failed_metric_is_retried_with_doubling_backoff_capped_at_its_period() -> None:
    plan = schedule.start({"m": 60.0, "ok": 60.0}, now=0.0)
    waits = []
    now = 0.0
    for _ in range(6):
        plan = schedule.after_round(plan, now, now + 1, ["ok"] if now == 0 else [], ["m"], retry_base=5.0)
        waits.append(plan.next_due["m"] - (now + 1))
        now = plan.next_due["m"]
    assert waits == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    plan = schedule.after_round(plan, now, now + 1, ["m"], [])
    assert plan.failures["m"] == 0
    assert plan.next_due["ok"] == 60.0  # the other metric kept its own schedule


def test_periods_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        schedule.start({"m": 0.0}, now=0.0)
