"""crane-scheduler's built-in plugins against kube-scheduler's own (the judge), on generated clusters.

Every case compares each plugin's PreFilter status, its Filter verdict and reasons on every node, the
"0/N nodes are available" message, which plugins skip scoring, each plugin's raw and normalised score on every
feasible node, and checks that our choice is one of kube-scheduler's top-scored nodes (harness.compare). A
difference fails with hypothesis' minimal case, printed as a request ``judge --snapshot`` accepts.

CI runs a fixed, derandomised set of cases; ``python -m bench.differential`` sweeps many more with fresh seeds.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests.support.judge import Case, Judge, check
from tests.support.judge_cases import cases

CI_EXAMPLES = 800


@settings(
    max_examples=CI_EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=cases())
def test_builtin_plugins_agree_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)
