"""DynamicResources and kube's structured-parameters allocator against kube-scheduler 1.37's own (the judge, with
kube-scheduler's DRA manager over the case's claims, slices, classes and DeviceTaintRules): PreFilter and per-node
Filter verdicts with kube's messages, NodeResourcesFit's beside them, the FitError message, the devices each
feasible node would get (kube's first solution, through its Reserve) and the scores.

One suite per feature 1.37 turns on by default (``tests/support/judge_dra137_cases.py``): partitionable devices,
device taints and DeviceTaintRules, consumable capacity, binding conditions, extended resources backed by devices;
and the suite of what 1.35 had (``judge_dra_cases``). CI runs a fixed, derandomised set of each;
``python -m bench.differential --suite <name>`` sweeps more the same way."""

from __future__ import annotations

from hypothesis import given

from tests.support.judge import Case, Judge, check, ci_settings
from tests.support.judge_dra137_cases import (
    binding_cases,
    consumable_cases,
    extended_cases,
    partitionable_cases,
    taint_cases,
)
from tests.support.judge_dra_cases import dra_cases

CI_EXAMPLES = 150


@ci_settings(CI_EXAMPLES)
@given(case=dra_cases())
def test_dynamic_resources_agree_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)


@ci_settings(CI_EXAMPLES)
@given(case=partitionable_cases())
def test_partitionable_devices_agree_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)


@ci_settings(CI_EXAMPLES)
@given(case=taint_cases())
def test_device_taints_and_tolerations_agree_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)


@ci_settings(CI_EXAMPLES)
@given(case=consumable_cases())
def test_consumable_capacity_agrees_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)


@ci_settings(CI_EXAMPLES)
@given(case=binding_cases())
def test_binding_conditions_agree_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)


@ci_settings(CI_EXAMPLES)
@given(case=extended_cases())
def test_extended_resources_backed_by_devices_agree_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)
