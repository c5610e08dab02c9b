"""Kube 1.37's node-side scheduling features against kube-scheduler 1.37's own plugins (the judge), one generated
suite each: NodeDeclaredFeatures (nodes' ``status.declaredFeatures``, pods needing a feature), pod-level resources
(``spec.resources``) in NodeResourcesFit's verdicts, messages and three scoring strategies, BalancedAllocation and
preemption, and pods resizing in place (what a node holds: kube's ``PodRequests`` with the pods' status).

Per case, as ``test_builtin_plugins``: every plugin's PreFilter and Filter verdicts and reasons on every node, the
FitError message, PreScore skips, raw and normalised scores, our choice among kube's best; with preemption, its
message, candidates and choice. CI runs a fixed, derandomised set; ``python -m bench.differential --suite
declared-features|pod-level|resize`` sweeps more."""

from __future__ import annotations

from hypothesis import given

from tests.support.judge import Case, Judge, check, ci_settings
from tests.support.judge_node_cases import declared_features_cases, pod_level_cases, resize_cases

CI_EXAMPLES = 150

_settings = ci_settings(CI_EXAMPLES)


@_settings
@given(case=declared_features_cases())
def test_node_declared_features_agree_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)


@_settings
@given(case=pod_level_cases())
def test_pod_level_resources_agree_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)


@_settings
@given(case=resize_cases())
def test_resizing_pods_agree_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)
