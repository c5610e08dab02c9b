"""The differential sweep: many more generated cases than CI runs, with fresh seeds, against the judge.

Same property as ``tests/differential`` (every plugin's verdicts and scores equal kube-scheduler's, our choice
among its best nodes), on larger clusters. The first difference stops the sweep with hypothesis' minimal case;
otherwise it prints what was exercised (how many cases had a node rejected by each plugin, were pending, were
scored) and the cost per case of each side.

    .venv/bin/python -m bench.differential                  # 2,000 cases, up to 12 nodes and 20 pods
    .venv/bin/python -m bench.differential --cases 500 --seed 7
    .venv/bin/python -m bench.differential --suite storage     # volume plugins with PVs, claims, CSINodes
    .venv/bin/python -m bench.differential --suite preemption  # DefaultPreemption's candidates and choice
    .venv/bin/python -m bench.differential --suite dra --cases 1000  # DynamicResources and kube's allocator
    .venv/bin/python -m bench.differential --suite declared-features  # NodeDeclaredFeatures (kube 1.37)
    .venv/bin/python -m bench.differential --suite pod-level  # spec.resources in Fit, scores and preemption
    .venv/bin/python -m bench.differential --suite resize     # pods resizing in place, as nodes hold them
    .venv/bin/python -m bench.differential --suite dra-taints --cases 1000  # one of 1.37's DRA features:
        # dra-partitionable, dra-taints, dra-consumable, dra-binding, dra-extended
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, seed, settings

from tests.support.judge import Case, Judge, compare, judge_binary, ours
from tests.support.judge_cases import cases
from tests.support.judge_dra137_cases import FEATURES as DRA_FEATURES
from tests.support.judge_dra_cases import dra_cases
from tests.support.judge_node_cases import declared_features_cases, pod_level_cases, resize_cases
from tests.support.judge_storage_cases import preemption_cases, storage_cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--max-nodes", type=int, default=12)
    parser.add_argument("--max-pods", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random)")
    dra137 = {f"dra-{name}": strategy for name, strategy in DRA_FEATURES.items()}
    parser.add_argument(
        "--suite",
        choices=("builtin", "storage", "preemption", "dra", "declared-features", "pod-level", "resize", *dra137),
        default="builtin",
    )
    args = parser.parse_args()
    strategy = {
        "builtin": cases(max_nodes=args.max_nodes, max_pods=args.max_pods),
        "storage": storage_cases(max_nodes=args.max_nodes),
        "preemption": preemption_cases(max_nodes=args.max_nodes, max_pods=args.max_pods),
        "dra": dra_cases(),  # its own sizes (tests/differential/test_dynamic_resources.py's cases)
        "declared-features": declared_features_cases(max_nodes=args.max_nodes),
        "pod-level": pod_level_cases(max_nodes=args.max_nodes, max_pods=args.max_pods),
        "resize": resize_cases(max_nodes=args.max_nodes, max_pods=args.max_pods),
        **{name: strategy() for name, strategy in dra137.items()},
    }[args.suite]

    judge = Judge(judge_binary())
    seen: Counter[str] = Counter()
    cost = {"judge": 0.0, "ours": 0.0}

    @settings(
        max_examples=args.cases,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
        report_multiple_bugs=False,
    )
    @given(case=strategy)
    def sweep(case: Case) -> None:
        t0 = time.perf_counter()
        kube = judge.ask(case.request())[0]
        t1 = time.perf_counter()
        mine = ours(case)
        t2 = time.perf_counter()
        cost["judge"] += t1 - t0
        cost["ours"] += t2 - t1
        diffs = compare(kube, mine)
        if diffs:
            raise AssertionError("\n".join(diffs) + "\ncase:\n" + case.dump())
        _tally(seen, kube)

    if args.seed is not None:
        sweep = seed(args.seed)(sweep)
    started = time.perf_counter()
    try:
        sweep()
    except AssertionError as err:
        print(f"MISMATCH (minimal case after shrinking):\n{err}", file=sys.stderr)
        return 1
    finally:
        judge.close()
    n = seen["cases"]
    print(f"cases: {n} (all agree) in {time.perf_counter() - started:.1f} s")
    print(
        f"cost per case: judge {1000 * cost['judge'] / max(n, 1):.2f} ms (round trip, JSON both ways), "
        f"ours {1000 * cost['ours'] / max(n, 1):.2f} ms (table + profile built per case)"
    )
    for key, count in sorted(seen.items()):
        if key != "cases":
            print(f"  {key}: {count} ({100 * count / max(n, 1):.0f} %)")
    return 0


def _tally(seen: Counter[str], kube: dict[str, Any]) -> None:
    """What a case exercised, for the sweep's report (hypothesis counts all tries, shrinking included)."""
    seen["cases"] += 1
    seen["pending (no feasible node)"] += kube["feasible"] == 0
    seen["scored (>= 2 feasible nodes)"] += kube["feasible"] >= 2
    seen["several best nodes (tie)"] += len(kube["best"]) > 1
    for plugin, verdict in kube["preFilter"].items():
        if verdict["code"] not in ("Success", "Skip"):
            seen[f"PreFilter rejects: {plugin}"] += 1
        if "nodeNames" in verdict:
            seen[f"PreFilter restricts nodes: {plugin}"] += 1
    rejecting = {p for node in kube["nodes"] for p, s in node["filter"].items() if s["code"] != "Success"}
    for plugin in rejecting:
        seen[f"Filter rejects a node: {plugin}"] += 1
    varied = {
        p
        for p in {p for node in kube["nodes"] for p in (node.get("scores") or {})}
        if len({node["scores"][p]["normalized"] for node in kube["nodes"] if node["feasible"]}) > 1
    }
    for plugin in varied:
        seen[f"Score differs across nodes: {plugin}"] += 1
    dra_reasons = {
        r for node in kube["nodes"] for r in (node["filter"].get("DynamicResources") or {}).get("reasons") or ()
    }
    for reason in dra_reasons:
        seen[f"DynamicResources refuses: {reason[:70]}"] += 1
    if any(node.get("dra") for node in kube["nodes"]):
        seen["DynamicResources allocates devices on a node"] += 1
    preemption = kube.get("preemption")
    if preemption is not None:
        if preemption.get("message"):
            seen["preemption cannot help"] += 1
        else:
            seen["preemption finds candidates"] += 1
            seen["preemption: a candidate violates a PDB"] += any(c["pdbViolations"] for c in preemption["candidates"])
            seen["preemption: several best candidates (tie)"] += len(preemption["best"]) > 1


if __name__ == "__main__":
    sys.exit(main())
