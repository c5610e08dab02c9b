"""The volume plugins and DefaultPreemption against kube-scheduler's own (the judge), on generated clusters with
StorageClasses, PVs, PVCs, CSINodes, PDBs and priorities: per-node verdicts and scores as in
``test_builtin_plugins``; for a pod no node fits, DefaultPreemption's message, candidates (node, victim set, PDB
violations) and our choice among the ones kube may pick.

CI runs a fixed, derandomised set; ``python -m bench.differential --suite storage|preemption`` sweeps more."""

from __future__ import annotations

from hypothesis import given

from tests.support.judge import Case, Judge, check, ci_settings
from tests.support.judge_storage_cases import preemption_cases, storage_cases

CI_EXAMPLES = 150

_settings = ci_settings(CI_EXAMPLES)


@_settings
@given(case=storage_cases())
def test_volume_plugins_agree_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)


@_settings
@given(case=preemption_cases())
def test_preemption_agrees_with_kube_scheduler(judge: Judge, case: Case) -> None:
    check(judge, case)
