"""DynamicResources and kube's structured-parameters allocator against kube-scheduler's own (the judge, with
kube-scheduler's DRA manager over the case's claims, slices and classes): PreFilter and per-node Filter verdicts
with kube's messages, the FitError message, the devices each feasible node would get (kube's first solution,
through its Reserve) and the prioritized-list scores.

CI runs a fixed, derandomised set; ``python -m bench.differential`` can sweep more the same way."""

from __future__ import annotations

from hypothesis import given

from tests.support.judge import Case, Judge, check, ci_settings
from tests.support.judge_dra_cases import dra_cases

CI_EXAMPLES = 150


@ci_settings(CI_EXAMPLES)
@given(case=dra_cases())
def test_dynamic_resources_agree_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)
