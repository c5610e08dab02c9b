"""FitError message formatting and node sampling (percentageOfNodesToScore), as kube-scheduler 1.35."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from crane_scheduler.algorithm import (
    ScheduleResult,
    num_feasible_nodes_to_find,
    sample_all,
    sample_feasible,
)
from crane_scheduler.framework import Diagnosis, fit_error_message
from crane_scheduler.podinfo import parse_pod
from crane_scheduler.reporting import truncate_note
from tests.support.scheduler import node, pod, simulator, table


def test_histogram_is_sorted_as_strings_joined_and_ended_with_a_period() -> None:
    d = Diagnosis(13, Counter({"node(s) had untolerated taint(s)": 2, "Insufficient cpu": 10, "Too many pods": 1}))
    # Go sorts "10 ..." before "2 ..." (string order), and so do we.
    assert fit_error_message(d) == (
        "0/13 nodes are available: 1 Too many pods, 10 Insufficient cpu, 2 node(s) had untolerated taint(s)."
    )


def test_prefilter_message_replaces_the_histogram_and_postfilter_is_appended() -> None:
    d = Diagnosis(3, Counter({"x": 3}), pre_filter_msg="pod affinity terms conflict", post_filter_msg="preemption: no")
    assert fit_error_message(d) == "0/3 nodes are available: pod affinity terms conflict. preemption: no"


def test_no_nodes_at_all() -> None:
    assert fit_error_message(Diagnosis(0)) == "no nodes available to schedule pods"


def test_notes_are_cut_at_1024_characters() -> None:
    assert truncate_note("x" * 1024) == "x" * 1024
    cut = truncate_note("y" * 2000)
    assert len(cut) == 1024 and cut.endswith("y ...")


@pytest.mark.parametrize(
    ("pct", "nodes", "expected"),
    [
        (0, 50, 50),  # fewer than 100: all
        (0, 99, 99),
        (0, 1000, 420),  # 50 - 1000/125 = 42 %
        (0, 5000, 500),  # 50 - 40 = 10 %
        (0, 6000, 300),  # 50 - 48 = 2 % -> floor 5 %
        (0, 150, 100),  # 49 % of 150 = 73 -> at least 100
        (30, 1000, 300),
        (100, 1000, 1000),
    ],
)
def test_num_feasible_nodes_to_find(pct: int, nodes: int, expected: int) -> None:
    assert num_feasible_nodes_to_find(pct, nodes) == expected


def test_sampling_rotates_and_reports_the_nodes_examined() -> None:
    candidates = np.arange(10)
    feasible = np.array([True, False, True, True, False, True, True, True, False, True])
    rows, processed = sample_feasible(candidates, feasible, start=3, want=3)
    assert rows.tolist() == [3, 5, 6] and processed == 4  # examined 3, 4, 5, 6
    rows, processed = sample_feasible(candidates, feasible, start=8, want=100)
    assert sorted(rows.tolist()) == [0, 2, 3, 5, 6, 7, 9] and processed == 10


@pytest.mark.parametrize("n", [0, 1, 7, 10])
def test_sampling_when_every_candidate_is_feasible_is_the_general_sampling(n: int) -> None:
    candidates = np.arange(0, 3 * n, 3)  # not every row is a candidate
    for start in range(2 * n + 1):
        for want in range(1, n + 3):
            rows, processed = sample_all(candidates, start, want)
            expected, examined = sample_feasible(candidates, np.ones(3 * n, dtype=bool), start, want)
            assert (rows.tolist(), processed) == (expected.tolist(), examined)


def test_successive_pods_are_scored_over_rotating_windows_of_nodes() -> None:
    t = table(*(node(f"n{i:03d}") for i in range(200)))  # 200 nodes: 48 % -> 100 nodes scored
    sim = simulator(t)
    algo, prof = sim.algorithm, sim.profiles["crane-scheduler"]
    first = algo.schedule(prof, parse_pod(pod("a")), {})
    assert isinstance(first, ScheduleResult) and first.feasible == 100 and first.evaluated == 100
    assert algo.next_start == 100
    second = algo.schedule(prof, parse_pod(pod("b")), {})
    assert isinstance(second, ScheduleResult) and int(second.node[1:]) >= 100
    assert algo.next_start == 0


def test_a_decisions_explain_record_holds_small_copies_not_views_of_the_whole_table() -> None:
    """The scored rows are a slice of the decision's array of every candidate row; the explain log keeps 2,000
    records, so a record holding that view kept the whole array alive per decision (234 MiB at 15,000 nodes). The
    record holds its own copies: the rows as int32, each plugin's scores as uint8."""
    t = table(*(node(f"n{i:03d}") for i in range(400)))
    state: dict[str, Any] = {}
    sim = simulator(t)
    result = sim.algorithm.schedule(sim.profiles["crane-scheduler"], parse_pod(pod()), state)
    assert isinstance(result, ScheduleResult) and result.feasible < 400  # sampled: a slice of the rotation
    rows, explained = state["explain.scores"]
    assert rows.base is None and rows.dtype == np.int32 and len(rows) == result.feasible
    assert explained and all(
        s.dtype == np.uint8 and s.base.nbytes <= len(rows) * len(explained) for _, _, s in explained
    )
