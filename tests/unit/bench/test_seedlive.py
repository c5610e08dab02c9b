import argparse

import pytest

from bench.seedlive.__main__ import DESCHEDULED, DESCHEDULER_POLICY, fractions, policy_with_reclaim
from bench.seedlive.batchphase import CHUNKS, BatchRun, table
from crane_descheduler.policy import parse_policy as parse_descheduler_policy
from crane_shared.policy import parse_policy


def test_the_reclaim_thresholds_reach_the_policy_the_services_read() -> None:
    policy = parse_policy(policy_with_reclaim(0.85, 0.8))
    assert policy.reclaim is not None
    assert (policy.reclaim.cpu.reclaim_threshold, policy.reclaim.memory.reclaim_threshold) == (0.85, 0.8)
    # the regular pods' Dynamic threshold stays
    assert {p.name: p.max_limit_percent for p in policy.predicate}["mem_usage_avg_5m"] == 0.65


def test_the_descheduler_acts_on_the_crane_groups_only() -> None:
    policy = parse_descheduler_policy(DESCHEDULER_POLICY, parse_policy(policy_with_reclaim(0.85, 0.85)))
    assert [pool.selector for pool in policy.pools] == [{"seed": group} for group in DESCHEDULED]
    assert policy.pools[0].high["mem_usage_avg_5m"] == 0.65


def test_bad_reclaim_flags_are_refused() -> None:
    assert fractions("0.85,0.9") == (0.85, 0.9)
    for bad in ("0.85", "0.85,1.5", "x,y"):
        with pytest.raises(argparse.ArgumentTypeError):
            fractions(bad)


def test_the_table_says_when_nothing_sheds_without_a_descheduler() -> None:
    crane = BatchRun("crane-mem", "crane-scheduler", ["a", "b", "c"], 1, CHUNKS["mem"], descheduled=True)
    crane.hot_batch_pods, crane.shed_seconds, crane.evicted = 2, 31.0, 2
    kube = BatchRun("kube-mem", "default-scheduler", ["d", "e", "f"], 1, CHUNKS["mem"])
    kube.hot_batch_pods = kube.hot_batch_end = 2
    text = table([crane, kube])
    assert "| 31 s | 2 / 0 | 2 | 0 |" in text
    assert "| not shed (no descheduler) | 2 / 2 | 0 (no descheduler) | 0 |" in text


def test_a_hot_node_without_batch_pods_has_nothing_to_shed() -> None:
    run = BatchRun("kube-cpu", "default-scheduler", ["d", "e", "f"], 0, CHUNKS["cpu"])
    run.shed_seconds = 0.0
    assert "| - (none there) | 0 / 0 |" in table([run])
