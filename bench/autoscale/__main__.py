"""A hot cluster growing and emptying with a real autoscaler: ``python -m bench.autoscale``.

Karpenter (its KWOK provider, built on first use from ``sandbox/karpenter``) beside three schedulers, one fresh
sandbox each, one after the other in one run, on the same scenario (``bench.autoscale.scenario``):

- (a) kube-scheduler alone: placement by requests, the reference;
- (b) crane-scheduler as the product is, without the load taint (annotator and load-aware descheduler on);
- (c) crane-scheduler with the sandbox's ``--autoscaler`` policies: the load taint, packing, the drain strategy.

The sandbox starts with ``--nodes`` nodes of its own (8 CPUs, 10 % base load) that Karpenter never removes; its
NodePool adds nodes of the same shape (at most ``--max-nodes``) and removes one once it has been empty for
``consolidateAfter`` (policy ``WhenEmpty``). One service carries the load: a warm phase at ``base`` cores of
demand, a surge to ``surge`` cores that makes every node hot while the HPA (played by the bench) adds replicas,
then the fall back to ``base`` with the HPA removing them after its stabilization window. Per variant: pods
pending at the end of the surge and their wait, nodes added and how fast, node-minutes above the policy's
threshold, nodes removed after the fall, node-hours; then the issue's targets for (c) against (a), a plot of nodes
and utilisation over time, and the tables in ``--out`` (``autoscale.md``, ``autoscale.json``, ``autoscale.png``;
``autoscale-nodes.json``: every tick's nodes, their usage and taint).

``--smoke`` plays a tiny scenario (one node, about a minute of load per variant) to check that everything runs;
its figures mean nothing. Durations scale with ``--scale``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from bench.autoscale.live import VARIANTS, run_variant
from bench.autoscale.scenario import PHASES, Scenario
from bench.autoscale.score import (
    Figures,
    Record,
    figures,
    node_timeline,
    series,
    table,
    verdict_table,
    verdicts,
)

RESULTS = Path(__file__).resolve().parent / "results"


def plot(records: list[Record], path: Path) -> None:
    """Nodes (left axis) and CPU utilisation, mean and hottest node (right axis), over time, one panel per variant;
    the phases shaded, the threshold dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(records), figsize=(5.2 * len(records), 4.2), sharey=True, squeeze=False)
    peak = max((max(series(r)["nodes"], default=0) for r in records), default=1)
    for ax, record in zip(axes[0], records, strict=True):
        cols = series(record)
        sc = record.scenario
        ax.axvspan(sc.surge_start / 60, sc.fall_start / 60, color="orange", alpha=0.08, label="surge")
        ax.step(cols["minutes"], cols["nodes"], where="post", color="black", label="nodes")
        ax.step(cols["minutes"], cols["pending"], where="post", color="purple", linewidth=0.8, label="pending pods")
        ax.set_ylim(0, max(peak, max(cols["pending"], default=0)) + 1)
        ax.set_xlabel("minutes")
        ax.set_title(f"({record.variant}) {VARIANTS[record.variant].title}", fontsize=9)
        right = ax.twinx()
        right.plot(cols["minutes"], cols["mean_cpu"], color="tab:blue", linewidth=1, label="mean CPU %")
        right.plot(cols["minutes"], cols["max_cpu"], color="tab:red", linewidth=1, label="hottest node CPU %")
        tainted = cols["tainted"]
        ax.step(cols["minutes"], tainted, where="post", color="tab:orange", linewidth=0.8, label="load-tainted nodes")
        right.axhline(record.threshold * 100, color="red", linestyle="--", linewidth=0.8)
        right.set_ylim(0, 105)
        if ax is axes[0][-1]:
            right.set_ylabel("CPU utilisation %")
        if ax is axes[0][0]:
            ax.set_ylabel("nodes / pending pods")
            handles = ax.get_legend_handles_labels()
            rhandles = right.get_legend_handles_labels()
            ax.legend(handles[0] + rhandles[0], handles[1] + rhandles[1], fontsize=7, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(records: list[Record], rows: list[Figures], started: float, load: tuple[float, float]) -> str:
    sc = records[0].scenario
    lines = [
        f"Scenario: {sc.nodes} sandbox nodes; demand {sc.base_work:g} -> {sc.surge_work:g} -> {sc.base_work:g} cores "
        f"over {sc.warm_s:.0f} s + {sc.surge_s:.0f} s + {sc.fall_s:.0f} s; replicas request "
        f"{sc.pod_cpu_request:g} CPU (limit {sc.pod_cpu_limit:g}), HPA target {sc.target:g} CPU per replica; "
        f"NodePool: at most {sc.max_nodes} nodes, {sc.consolidation_policy} after {sc.consolidate_after}; threshold "
        f"{records[0].threshold:.0%}, one round {records[0].round_s:.0f} s.",
        f"Load average {load[0]:.1f} at the start, {load[1]:.1f} at the end; {time.time() - started:.0f} s in all.",
        "",
        table(rows),
    ]
    by = {f.variant: f for f in rows}
    if "a" in by and "c" in by:
        lines += ["", verdict_table(verdicts(by["c"], by["a"], records[0].round_s))]
    for record in records:
        for note in record.notes:
            lines.append(f"\n({record.variant}) {note}")
    return "\n".join(lines)


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.autoscale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--variants", default="a,b,c", help="which variants, in order (default a,b,c)")
    parser.add_argument("--smoke", action="store_true", help="a tiny scenario: seconds of load per variant")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every phase's duration (default 1)")
    parser.add_argument("--warm", type=float, help="seconds of the warm phase")
    parser.add_argument("--surge", type=float, help="seconds of the surge")
    parser.add_argument("--fall", type=float, help="seconds after the fall")
    parser.add_argument("--nodes", type=int, help="the sandbox's own nodes")
    parser.add_argument("--max-nodes", type=int, help="the NodePool's node limit")
    parser.add_argument("--consolidation-policy", choices=["WhenEmpty", "WhenEmptyOrUnderutilized"])
    parser.add_argument(
        "--out", type=Path, help=f"where the tables and the plot go (default {RESULTS}; --smoke: nowhere unless given)"
    )
    args = parser.parse_args()
    keys = [k.strip() for k in args.variants.split(",") if k.strip()]
    if not keys or any(k not in VARIANTS for k in keys):
        parser.error(f"--variants: pick from {', '.join(VARIANTS)}, got {args.variants!r}")
    scenario = Scenario.smoke() if args.smoke else Scenario()
    overrides = {
        "warm_s": args.warm,
        "surge_s": args.surge,
        "fall_s": args.fall,
        "nodes": args.nodes,
        "max_nodes": args.max_nodes,
        "consolidation_policy": args.consolidation_policy,
    }
    try:
        scenario = replace(scenario, **{k: v for k, v in overrides.items() if v is not None}).scaled(args.scale)
    except ValueError as err:
        parser.error(str(err))
    out = args.out if args.out is not None else (None if args.smoke else RESULTS)
    started, load_start = time.time(), _load()
    records = []
    for key in keys:
        records.append(asyncio.run(run_variant(VARIANTS[key], scenario, log=lambda m: print(m, flush=True))))
    rows = [figures(r) for r in records]
    text = report(records, rows, started, (load_start, _load()))
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "autoscale.md").write_text(text + "\n")
        data = {
            "scenario": asdict(scenario),
            "phases": {p: getattr(scenario, f"{p}_s") for p in PHASES},
            "figures": [f.as_dict() for f in rows],
            "series": {r.variant: series(r) for r in records},
        }
        (out / "autoscale.json").write_text(json.dumps(data) + "\n")
        nodes = {r.variant: node_timeline(r) for r in records}  # every tick's nodes: large, not committed
        (out / "autoscale-nodes.json").write_text(json.dumps(nodes) + "\n")
        plot(records, out / "autoscale.png")
        print(f"\nwrote {out / 'autoscale.md'}, autoscale.json, autoscale-nodes.json and autoscale.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
