"""Differential testing against kube-scheduler's own plugins: the judge process, our side, and the comparison.

A *case* is a cluster (nodes, assigned pods, and the objects plugins read through listers: PVCs, PVs,
StorageClasses, CSINodes, CSIDrivers, CSIStorageCapacities, VolumeAttachments, PDBs), one incoming pod and a
KubeSchedulerConfiguration (the same dict for both sides); with ``preempt``, DefaultPreemption's decision for a
pod no node fits is compared too (``compare_preemption``). ``Judge`` keeps one ``judge --serve`` process
(sandbox/kube/cmd/judge, built from the pinned Kubernetes release by kubebin) and asks it what kube-scheduler's
framework decides; ``ours`` asks crane-scheduler's framework the same questions, plugin by plugin; ``compare``
lists every difference:

- each PreFilter plugin's status (code, reasons) and PreFilterResult node set;
- every Filter plugin's own verdict on every node (code and reasons), not only the first rejection per node;
- the framework outcome: the feasible nodes, or kube-scheduler's "0/N nodes are available" message verbatim;
- which PreScore plugins skip, and each Score plugin's raw and normalised score on every feasible node;
- our Algorithm's choice is one of the judge's top-scored nodes.

This module is the only place that knows both sides' shapes: it touches the scheduler only through its public
pieces (``parse_node``/``parse_pod``, ``NodeTable``, the offline scheduler ``crane_scheduler.simulate`` that
builds the profiles and the algorithm), so the framework's internals can move without breaking the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, settings

from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import Code, Diagnosis, Status
from crane_scheduler.framework.runtime import Profile
from crane_scheduler.listers import Listers
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.plugins import DEFAULT_MULTIPOINT
from crane_scheduler.plugins.defaultpreemption.plugin import Choice, DefaultPreemption
from crane_scheduler.podinfo import parse_node, parse_pod
from crane_scheduler.simulate import Simulator

Json = dict[str, Any]

SCHEDULER_NAME = "default-scheduler"


def config_for(plugin_config: list[Json] | None = None) -> Json:
    """A KubeSchedulerConfiguration enabling exactly crane's built-in plugins (kube's default set minus the ones
    not shipped yet), with kube-scheduler's weights, on both sides."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {
                "schedulerName": SCHEDULER_NAME,
                "plugins": {
                    "multiPoint": {
                        "enabled": [
                            {"name": name, **({"weight": weight} if weight else {})}
                            for name, weight in DEFAULT_MULTIPOINT
                        ],
                        "disabled": [{"name": "*"}],
                    }
                },
                "pluginConfig": plugin_config or [],
            }
        ],
    }


# The judge's request fields for the objects plugins read through listers, and our Listers' kind for each.
LISTER_KINDS = {
    "pvcs": "pvcs",
    "pvs": "pvs",
    "storageClasses": "storageclasses",
    "csiNodes": "csinodes",
    "volumeAttachments": "volumeattachments",
    "pdbs": "pdbs",
    "csiDrivers": "csidrivers",
    "csiStorageCapacities": "csistoragecapacities",
    "resourceClaims": "resourceclaims",
    "resourceSlices": "resourceslices",
    "deviceClasses": "deviceclasses",
    "deviceTaintRules": "devicetaintrules",
}


@dataclass
class Case:
    nodes: list[Json]
    pods: list[Json]
    incoming: Json
    config: Json
    objects: dict[str, list[Json]] = field(default_factory=dict)
    """PVCs, PVs, StorageClasses, CSINodes, CSIDrivers, CSIStorageCapacities, VolumeAttachments, PDBs by the
    judge's field name (``LISTER_KINDS``)."""
    preempt: bool = False
    """Also compare DefaultPreemption's decision when no node fits."""

    def request(self) -> Json:
        req: Json = {"config": self.config, "nodes": self.nodes, "pods": self.pods, "incoming": [self.incoming]}
        req.update({k: v for k, v in self.objects.items() if v})
        if self.preempt:
            req["preempt"] = True
        return req

    def dump(self) -> str:
        """The case as JSON a human can paste into ``judge --snapshot`` (the request format)."""
        return json.dumps(self.request(), indent=1, sort_keys=True)


# ---------------------------------------------------------------------------------------------- the judge


def ci_settings(examples: int) -> settings:
    """CI's hypothesis settings for a judge suite: a fixed, derandomised set of ``examples`` cases, no example
    database, no deadline (the judge answers through a subprocess); ``python -m bench.differential`` sweeps more."""
    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        report_multiple_bugs=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def judge_binary() -> Path:
    """The judge built by kubebin next to the newest release's kube-apiserver (built on first use; cached per pin),
    or the binary named by ``CRANE_JUDGE`` (while changing the judge itself: ``go build -o /tmp/judge ./cmd/judge``
    in sandbox/kube)."""
    from crane_sandbox.kubebin import ensure_judge

    if os.environ.get("CRANE_JUDGE"):
        return Path(os.environ["CRANE_JUDGE"])
    return ensure_judge(quiet=True)


class JudgeError(RuntimeError):
    pass


class Judge:
    """One long-running ``judge --serve``: a request per line in, an answer per line out."""

    def __init__(self, binary: Path) -> None:
        self._proc = subprocess.Popen(
            [str(binary), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._lock = threading.Lock()

    def ask(self, request: Json) -> list[Json]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        if not line:
            stderr = self._proc.stderr.read() if self._proc.stderr else ""
            raise JudgeError(f"judge exited ({self._proc.poll()}): {stderr[-2000:]}")
        answer = json.loads(line)
        if answer.get("error"):
            raise JudgeError(answer["error"])
        results: list[Json] = answer["results"]
        return results

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def go_available() -> bool:
    return shutil.which("go") is not None


# ---------------------------------------------------------------------------------------------- our side


def _status(code: Code | str, reasons: tuple[str, ...] | list[str] = ()) -> Json:
    out: Json = {"code": code.value if isinstance(code, Code) else code}
    if reasons:
        out["reasons"] = list(reasons)
    return out


def ours(case: Case, seed: int = 0) -> Json:
    """crane-scheduler's answers for the case, in the judge's result shape (the fields ``compare`` reads)."""
    table = NodeTable(capacity=max(2, len(case.nodes)))
    for n in case.nodes:
        table.upsert_node(parse_node(n))
    for p in case.pods:
        table.add_pod(parse_pod(p))
    pod = parse_pod(case.incoming)
    listers = Listers()
    for field_name, kind in LISTER_KINDS.items():
        for obj in case.objects.get(field_name, ()):
            listers.apply(kind, "ADDED", obj)  # type: ignore[arg-type]
    sim = Simulator(case.config, table=table, listers=listers, seed=seed, out_of_tree=False)
    profile = sim.profiles[SCHEDULER_NAME]

    out: Json = {"preFilter": {}, "nodes": [], "preScore": {}}
    state: dict[str, Any] = {}
    filterable: set[str] = set()
    pre_filter_names = {pl.name for pl in profile.pre_filter}
    for pl in profile.pre_filter:
        res = pl.pre_filter(state, pod, table)
        verdict = _status(res.status.code, res.status.reasons)
        if res.node_names is not None:
            verdict["nodeNames"] = sorted(res.node_names)
        out["preFilter"][pl.name] = verdict
        if res.status.success:
            filterable.add(pl.name)
    per_plugin: dict[str, list[Any]] = {}
    for flt in profile.filter:
        if flt.name in pre_filter_names and flt.name not in filterable:
            continue
        per_plugin[flt.name] = flt.filter(state, pod, table)
    for name in (n["metadata"]["name"] for n in case.nodes):
        row = table.rows[name]
        verdicts: Json = {}
        for plugin, rejections in per_plugin.items():
            hits = [r for r in rejections if r.mask[row]]
            if not hits:
                verdicts[plugin] = _status(Code.SUCCESS)
            elif any(r.error for r in hits):
                verdicts[plugin] = _status(Code.ERROR, tuple(r.reason for r in hits if r.error))
            else:
                unresolvable = any(r.unresolvable for r in hits)
                code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE if unresolvable else Code.UNSCHEDULABLE
                verdicts[plugin] = _status(code, tuple(r.reason for r in hits))
        entry: Json = {"name": name, "filter": verdicts}
        dra = state.get("DynamicResources")
        results = dra.results(name) if dra is not None else None
        if results is not None:
            entry["dra"] = results
        out["nodes"].append(entry)

    # The decision itself, through the real Algorithm (the scores it left in the cycle state are not used: the
    # plugins are asked again below, on every feasible node, also when only one is feasible).
    decision = sim.algorithm.schedule(profile, pod, {})
    out["decision"] = decision
    if isinstance(decision, Status):  # a plugin error: the attempt fails (kube: the judge's scoreError)
        out["error"] = f"{decision.plugin}: {decision.message}"
        return out
    if isinstance(decision, Diagnosis):
        out["message"] = decision.message
        preemption = profile.plugins.get("DefaultPreemption")
        if case.preempt and isinstance(preemption, DefaultPreemption):
            out["preemption"] = preemption.select(pod, decision)
        return out
    feasible = _feasible(profile, table, pod, out)
    rows = np.array([table.rows[n] for n in feasible], dtype=np.intp)
    out["feasible"] = feasible
    score_state: dict[str, Any] = {}
    skipped_filters = set()
    for pre_filter in profile.pre_filter:  # score plugins may read their PreFilter state
        if pre_filter.pre_filter(score_state, pod, table).status.code is Code.SKIP:
            skipped_filters.add(pre_filter.name)
    for flt in profile.filter:  # ... and their Filter's (DynamicResources scores the allocation it found)
        if flt.name not in skipped_filters:
            flt.filter(score_state, pod, table)
    skipped = set()
    for pre in profile.pre_score:
        st = pre.pre_score(score_state, pod, table, rows)
        out["preScore"][pre.name] = _status(st.code)
        if st.code is Code.SKIP:
            skipped.add(pre.name)
    scores: dict[str, Json] = {}
    for scorer, weight in profile.score:
        if scorer.name in skipped:
            continue
        raw = scorer.score(score_state, pod, table, rows)
        normalize = getattr(scorer, "normalize_score", None)
        normalized = normalize(score_state, pod, raw.copy()) if normalize is not None else raw
        scores[scorer.name] = {
            name: {"raw": int(raw[i]), "normalized": int(normalized[i]), "weight": weight}
            for i, name in enumerate(feasible)
        }
    out["scores"] = scores
    return out


def _feasible(profile: Profile, table: NodeTable, pod: Any, out: Json) -> list[str]:
    """Nodes passing every Filter plugin that ran, within every PreFilterResult."""
    allowed: set[str] | None = None
    for verdict in out["preFilter"].values():
        if "nodeNames" in verdict:
            names = set(verdict["nodeNames"])
            allowed = names if allowed is None else allowed & names
    return [
        n["name"]
        for n in out["nodes"]
        if (allowed is None or n["name"] in allowed) and all(v["code"] == "Success" for v in n["filter"].values())
    ]


# ---------------------------------------------------------------------------------------------- comparison


def _norm(status: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(code, reasons) with the reasons sorted: kube's NodeResourcesFit lists them in a fixed resource order, ours
    in the pod's request order; the set (and each reason's text) is what users see in the histogram."""
    return status["code"], tuple(sorted(status.get("reasons") or ()))


def compare(kube: Json, mine: Json) -> list[str]:
    """Every difference between the judge's result and ours, as readable lines (empty: the two agree)."""
    diffs: list[str] = []
    ours_filters = {p for n in mine["nodes"] for p in n["filter"]}
    for plugin in sorted(set(kube["preFilter"]) | set(mine["preFilter"])):
        k, o = kube["preFilter"].get(plugin), mine["preFilter"].get(plugin)
        if o is None and plugin in ours_filters:
            # Our plugins implement PreFilter only where it can reject, skip or restrict nodes (kube's
            # NodeResourcesFit PreFilter just computes the requests): a missing PreFilter must mean Success.
            o = {"code": "Success"}
        if k is None or o is None:
            diffs.append(f"PreFilter {plugin}: kube {k}, ours {o}")
            continue
        if _norm(k) != _norm(o) or k.get("nodeNames") != o.get("nodeNames"):
            diffs.append(f"PreFilter {plugin}: kube {k}, ours {o}")
    ours_nodes = {n["name"]: n for n in mine["nodes"]}
    for node in kube["nodes"]:
        name = node["name"]
        theirs, mine_f = node["filter"], ours_nodes[name]["filter"]
        for plugin in sorted(set(theirs) | set(mine_f)):
            k, o = theirs.get(plugin), mine_f.get(plugin)
            if k is None or o is None or _norm(k) != _norm(o):
                diffs.append(f"Filter {plugin} on {name}: kube {k}, ours {o}")
        if node.get("feasible") and node.get("dra") is not None:
            mine_dra = ours_nodes[name].get("dra")
            if _without_empty(_share_ids(node["dra"])) != _without_empty(_share_ids(mine_dra)):
                diffs.append(f"DynamicResources' allocation on {name}:\n  kube: {node['dra']}\n  ours: {mine_dra}")
    if diffs:
        return diffs  # the outcome and scores follow from the verdicts; one root cause is enough to read

    decision = mine["decision"]
    kube_feasible = [n["name"] for n in kube["nodes"] if n["feasible"]]
    if kube.get("filterError"):
        if not isinstance(decision, Status) or decision.message != kube["filterError"]:
            return [f"outcome: kube fails filtering ({kube['filterError']}), ours: {decision}"]
        return []
    if kube["feasible"] == 0:
        if not isinstance(decision, Diagnosis):
            return [f"outcome: kube finds no node ({kube['message']!r}), ours: {decision}"]
        if decision.message != kube["message"]:
            diffs.append(f"FitError message:\n  kube: {kube['message']}\n  ours: {decision.message}")
        if kube.get("preemption") is not None:
            diffs += compare_preemption(kube["preemption"], mine.get("preemption"))
        return diffs
    if kube.get("scoreError") and len(kube_feasible) > 1:  # with one feasible node kube does not score at all
        if not isinstance(decision, Status):
            return [f"outcome: kube fails scoring ({kube['scoreError']}), ours: {decision}"]
        return []  # both fail the attempt; the error texts are each side's own
    if isinstance(decision, Status):
        return [f"outcome: kube finds {kube_feasible}, ours failed: {mine['error']}"]
    if not isinstance(decision, ScheduleResult):
        return [f"outcome: kube finds {kube_feasible}, ours is pending: {decision.message!r}"]
    if sorted(mine["feasible"]) != sorted(kube_feasible) or decision.feasible != len(kube_feasible):
        return [f"feasible nodes: kube {kube_feasible}, ours {mine['feasible']} (Algorithm: {decision.feasible})"]

    if kube.get("scoreError"):
        return diffs  # one feasible node: chosen without scoring on both sides
    kube_skips = {p for p, s in (kube.get("preScore") or {}).items() if s["code"] == "Skip"}
    our_skips = {p for p, s in mine["preScore"].items() if s["code"] == "Skip"}
    if kube_skips != our_skips:
        diffs.append(f"PreScore skips: kube {sorted(kube_skips)}, ours {sorted(our_skips)}")
    for node in kube["nodes"]:
        if not node["feasible"]:
            continue
        for plugin, k in sorted(node["scores"].items()):
            o = mine["scores"].get(plugin, {}).get(node["name"])
            if o is None:
                diffs.append(f"Score {plugin} on {node['name']}: kube {k}, ours none")
            # Exact equality, no rounding tolerance: our integer math is kube's (``x * 100 // max``), and
            # BalancedAllocation's float64 steps (fractions, |a - b| / 2 or the population std, then
            # int64((1 - std) * 100)) are the same IEEE operations in the same order, so no difference is expected
            # and none was found in the sweeps.
            elif (k["raw"], k["normalized"], k["weight"]) != (o["raw"], o["normalized"], o["weight"]):
                diffs.append(f"Score {plugin} on {node['name']}: kube {k}, ours {o}")
        for plugin in sorted(set(mine["scores"]) - set(node["scores"])):
            diffs.append(f"Score {plugin} on {node['name']}: kube none, ours {mine['scores'][plugin][node['name']]}")
    if not diffs and decision.node not in kube["best"]:
        diffs.append(f"choice: ours {decision.node}, kube's best {kube['best']}")
    return diffs


def _share_ids(value: Any) -> Any:
    """Allocation results with each ``shareID`` (a random UUID on either side) replaced by a mark that it is set."""
    if isinstance(value, dict):
        return {k: ("<set>" if k == "shareID" and v else _share_ids(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_share_ids(v) for v in value]
    return value


def _without_empty(value: Any) -> Any:
    """JSON with empty lists and maps dropped (Go's omitempty and Python's absent keys say the same)."""
    if isinstance(value, dict):
        out = {k: _without_empty(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_without_empty(v) for v in value]
    return value


def compare_preemption(kube: Json, mine: Choice | None) -> list[str]:
    """DefaultPreemption: the PostFilter message when preemption cannot help; else the candidates (node, victim
    set, PDB violations) and our choice among the ones kube's pickOneNodeForPreemption may return."""
    if mine is None:
        return [f"preemption: kube {kube}, ours did not run"]
    if kube.get("message") or mine.message:
        if kube.get("message") != mine.message:
            return [f"preemption message:\n  kube: {kube.get('message')}\n  ours: {mine.message}"]
        return []
    theirs = {c["node"]: (sorted(c["victims"]), c["pdbViolations"]) for c in kube["candidates"]}
    ours_ = {c.node: (sorted(f"{v.namespace}/{v.name}" for v in c.victims), c.pdb_violations) for c in mine.candidates}
    if theirs != ours_:
        return [f"preemption candidates:\n  kube: {theirs}\n  ours: {ours_}"]
    if mine.best is None or mine.best.node not in kube["best"]:
        return [f"preemption choice: ours {mine.best and mine.best.node}, kube's {kube['best']}"]
    return []


def check(judge: Judge, case: Case) -> tuple[Json, Json]:
    """Run both sides on ``case``; raise AssertionError listing the differences and the case (hypothesis shrinks
    it to a minimal one). Returns (kube's result, ours) for statistics."""
    kube = judge.ask(case.request())[0]
    mine = ours(case)
    diffs = compare(kube, mine)
    if diffs:
        raise AssertionError(
            "crane-scheduler differs from kube-scheduler:\n" + "\n".join(diffs) + "\ncase:\n" + case.dump()
        )
    return kube, mine
