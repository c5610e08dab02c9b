"""``python -m bench.scheduler.preemption_cost``: the in-process cost of PreemptionBasic's pod, by phase.

The node table of ``bench.scheduler.preemption`` (N nodes, 4 cpu each, full with 4 low-priority 900m pods per
node, crane's load annotations) and M high-priority 900m pods. Each pod goes the way it goes in the scheduler:
a first decision (no node fits), the PostFilter (DefaultPreemption: eligibility, dry run, choice, nomination),
then its victims leave the table (the informer's deletion events) and a second decision binds it to the
nominated node (assume + Reserve). Reports CPU ms per pod per phase (process time: other processes on a shared
machine do not count) and the victims; ``--profile`` prints cProfile's top functions.

The profile is built by ``crane_scheduler.simulate`` from the scheduler's own registry (the built-in plugins plus
Dynamic from its entry point), so ``--plugins default`` includes Dynamic as the real run does (before wave 6 this bench
used the built-in registry only: its "default" had no Dynamic). A preemptor whose second decision fails (its
nominated node refused it, Dynamic's extra-victim case) preempts again, its new victims leave, and it is retried;
those rounds count in "second decision".

    .venv/bin/python -m bench.scheduler.preemption_cost --nodes 100 --pods 100

``--pod-usage``: every node also carries the annotator's ``crane.io/pod-usage`` (each low pod measured at 0.1
core, not enough to make a node hot), so Dynamic's what-if takes every victim's usage out: the cost of preemption
that sees real load where every pod is measured.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import pstats
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np

from bench.scheduler.affinity_cost import build, node_json
from bench.scheduler.preemption import PER_NODE, POD
from crane_scheduler.algorithm import ScheduleResult
from crane_scheduler.framework import Diagnosis
from crane_scheduler.nodetable import NodeTable
from crane_scheduler.podinfo import PodInfo, parse_node, parse_pod
from crane_shared.batch import POD_USAGE_KEY, PodUsage, encode_pod_usage

SCHEDULER = "crane-bench"


def pod(name: str, priority: int, node: str | None = None) -> PodInfo:
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "priority": priority,
        "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": POD}}],
    }
    if node:
        spec["nodeName"] = node
    namespace = "low" if node else "high"
    return parse_pod({"metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}/{name}"}, "spec": spec})


def preempted(table: NodeTable, uid: str) -> None:
    """A victim leaves as the informer shows it: its ``DisruptionTarget`` condition, then its deletion."""
    record = table.pods.get(uid)
    if record is not None and record.pod is not None:
        raw = copy.deepcopy(record.pod.raw)
        raw["status"] = {
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
        }
        table.add_pod(parse_pod(raw))
    table.remove_pod(uid)


RETRIES = 3
"""second-decision rounds a preemptor gets (each failed one preempts again) before the bench gives up on it"""


def run(
    nodes: int, pods: int, plugins: str, prof: cProfile.Profile | None, burst: bool = False, pod_usage: bool = False
) -> tuple[dict[str, list[float]], int]:
    """CPU seconds per pod per phase, and the victims evicted."""
    sim = build(nodes, plugins, out_of_tree=True)
    table, profile, algorithm = sim.table, sim.profiles[SCHEDULER], sim.algorithm  # the dry run's internals, timed
    for i in range(nodes * PER_NODE):
        table.add_pod(pod(f"low-{i:05d}", 1, f"node-{i % nodes:05d}"))
    if pod_usage:
        now = datetime.now(UTC)
        for n in range(nodes):
            raw = node_json(n)
            measured = {f"low/low-{i:05d}": PodUsage(0.1, 1e8) for i in range(n, nodes * PER_NODE, nodes)}
            raw["metadata"]["annotations"][POD_USAGE_KEY] = encode_pod_usage(measured, now)
            table.upsert_node(parse_node(raw))
    phases: dict[str, list[float]] = {"first decision": [], "post filter": [], "second decision": []}
    plugin: Any = profile.plugins["DefaultPreemption"]
    victims: list[str] = []
    evicted = 0
    nominate = plugin._nominate

    def spy(p: PodInfo, best: Any, message: str) -> None:
        nonlocal evicted
        victims.extend(v.uid for v in best.victims)
        evicted += len(best.victims)
        nominate(p, best, message)

    plugin._nominate = spy
    preemptors = [pod(f"high-{i:05d}", 1000) for i in range(pods)]
    groups = [preemptors] if burst else [[p] for p in preemptors]
    for group in groups:
        firsts: list[tuple[PodInfo, list[str]]] = []
        for preemptor in group:
            if prof is not None:
                prof.enable()
            state: dict[str, Any] = {}
            t0 = time.process_time()
            result = algorithm.schedule(profile, preemptor, state)
            t1 = time.process_time()
            assert isinstance(result, Diagnosis), result
            victims.clear()
            profile.run_post_filter(state, preemptor, result)
            t2 = time.process_time()
            if prof is not None:
                prof.disable()
            firsts.append((preemptor, list(victims)))
            phases["first decision"].append(t1 - t0)
            phases["post filter"].append(t2 - t1)
        for _, gone in firsts:
            for uid in gone:  # the informer sees the victims deleted
                preempted(table, uid)
        for preemptor, _ in firsts:
            if prof is not None:
                prof.enable()
            t3 = time.process_time()
            for _ in range(RETRIES):
                state = {}
                again = algorithm.schedule(profile, preemptor, state)
                if isinstance(again, ScheduleResult):
                    table.assume(preemptor, again.node)
                    profile.run_reserve(state, preemptor, again.node)
                    table.nominated.pop(preemptor.uid, None)
                    break
                assert isinstance(again, Diagnosis), again
                victims.clear()  # refused on its nominated node: it preempts again, and its victims leave
                profile.run_post_filter(state, preemptor, again)
                for uid in victims:
                    preempted(table, uid)
            else:
                raise AssertionError(f"{preemptor.key} not placed after {RETRIES} rounds")
            t4 = time.process_time()
            if prof is not None:
                prof.disable()
            phases["second decision"].append(t4 - t3)
    return phases, evicted


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler.preemption_cost", description=__doc__)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--plugins", choices=("default", "kube"), default="default")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    parser.add_argument(
        "--burst",
        action="store_true",
        help="as the real run goes: every pod's first decision and PostFilter first (the nominations pile up while "
        "the victims are still there), then the victims leave and the second decisions follow",
    )
    parser.add_argument("--pod-usage", action="store_true", help="every node's pods measured (crane.io/pod-usage)")
    args = parser.parse_args()
    prof = cProfile.Profile() if args.profile else None
    phases, evicted = run(args.nodes, args.pods, args.plugins, prof, args.burst, args.pod_usage)
    total = np.sum([np.array(v) for v in phases.values()], axis=0) * 1e3
    for name, values in phases.items():
        ms = np.array(values) * 1e3
        p50, p99 = np.percentile(ms, 50), np.percentile(ms, 99)
        print(f"{name:<16} mean {ms.mean():7.3f} ms  p50 {p50:7.3f} ms  p99 {p99:7.3f} ms")
    print(
        f"{'per pod':<16} mean {total.mean():7.3f} ms  ({args.nodes} nodes, {args.pods} preemptors, {args.plugins}"
        f"{', burst' if args.burst else ''}); {evicted} victims"
    )
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
