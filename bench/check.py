"""``python -m bench.check``: fail when a benchmark ratio dropped below the last recorded figures.

Each ``bench/<name>/RESULTS.md`` ends its latest run with a fenced block tagged ``bench-figures`` holding the
figures as JSON (what ``python -m bench.<name> --json FILE`` writes). This command runs the benchmarks again at
the recorded sizes (or reads runs you made, ``--scheduler FILE`` / ``--extender FILE``) and compares the ratios
that are measured against a reference in the same run, so a busier or faster machine does not move them much:

- scheduler: crane-scheduler's pods/s / kube-scheduler's pods/s, per node count (higher is better);
- extender: JSON-only reference p50 / filter+prioritize p50 with the node cache, per node count (higher is
  better: the share of a request that is transport and decoding rather than our work).
- annotator: the bare node-patch ceiling / our full round (the median over rounds of the watched bare runs either
  side of a round divided by that round; higher is better, 1.0 is the ceiling).

A ratio more than ``--tolerance`` (default 0.25, i.e. 25 %) below the recorded one fails the check (exit 1).
The tolerance is wide because the machine is shared: repeated runs of the same code moved the scheduler ratio by
up to ~20 % under load averages of 4-8. Absolute targets (decision p99, extender p99) are printed, not enforced.

    .venv/bin/python -m bench.check                         # runs the three benchmarks (several minutes)
    .venv/bin/python -m bench.check --scheduler run.json    # compare a run you made with --json
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
FENCE = re.compile(r"```json bench-figures\n(.*?)\n```", re.S)
DEFAULT_TOLERANCE = 0.25


def recorded(name: str, root: Path | None = None) -> dict[str, Any]:
    """The last ``bench-figures`` block of ``bench/<name>/RESULTS.md``."""
    text = ((root or BENCH) / name / "RESULTS.md").read_text()
    blocks = FENCE.findall(text)
    if not blocks:
        raise SystemExit(f"bench/{name}/RESULTS.md has no ```json bench-figures block to compare with")
    figures: dict[str, Any] = json.loads(blocks[-1])
    return figures


def scheduler_ratios(figures: dict[str, Any]) -> dict[str, float]:
    return {
        f"scheduler {size} nodes: crane/kube pods/s": float(row["ratio_to_kube"])
        for size, row in figures["sizes"].items()
        if row.get("ratio_to_kube")
    }


def extender_ratios(figures: dict[str, Any]) -> dict[str, float]:
    out = {}
    for row in figures["results"]:
        if row["mode"] == "nodeCacheCapable" and row["filter+prioritize"]["p50_ms"] > 0:
            ratio = row["reference_json_only"]["p50_ms"] / row["filter+prioritize"]["p50_ms"]
            out[f"extender {row['nodes']} nodes (node cache): JSON-only p50 / ours p50"] = ratio
    return out


def annotator_ratios(figures: dict[str, Any]) -> dict[str, float]:
    median = float(figures["round_over_watched_bare_median"])
    return {f"annotator {figures['nodes']} nodes: bare-patch ceiling / round": 1 / median} if median > 0 else {}


def annotator_run(figures: dict[str, Any]) -> list[str]:
    """The ``bench.annotator`` arguments that time the recorded round again: same fleet, rounds, concurrency and
    rate limit; no patch budget and only a token upstream-style round (neither is a ratio this check compares)."""
    settings = figures.get("settings", {})
    run = ["--nodes", str(figures["nodes"]), "--rounds", str(len(figures["ours"])), "--budget-periods", "0"]
    run += ["--upstream-seconds", "5"]
    if "concurrency" in settings:
        run += ["--patch-concurrency", str(settings["concurrency"])]
    if "qps" in settings:
        run += ["--kube-api-qps", str(settings["qps"])]
    return run


RATIOS = {"scheduler": scheduler_ratios, "extender": extender_ratios, "annotator": annotator_ratios}


def scheduler_runs(figures: dict[str, Any]) -> list[list[str]]:
    """The ``bench.scheduler`` arguments that measure the recorded sizes again, each size with the pods and bound
    pods it was recorded with (a size's own ``pods``/``bound_pods``, else the run's), and with the recorded
    placement (``scheduler_cpu``: each scheduler on that CPU alone), so like is compared with like."""
    groups: dict[tuple[int, int], list[str]] = {}
    for size, row in figures["sizes"].items():
        pods = int(row.get("pods", figures.get("pods", 10000)))
        bound = int(row.get("bound_pods", figures.get("bound_pods", 0)))
        groups.setdefault((pods, bound), []).append(size)
    cpu = figures.get("scheduler_cpu")
    placement = [] if cpu is None else ["--scheduler-cpu", str(cpu)]
    runs = []
    for (pods, bound), sizes in groups.items():
        run = ["--nodes", ",".join(sizes), "--plugins", figures["profile"], "--pods", str(pods)]
        runs.append([*run, "--bound-pods", str(bound), *placement])
    return runs


def compare(before: dict[str, float], after: dict[str, float], tolerance: float) -> list[str]:
    """The failures: a recorded ratio missing from the new run, or more than ``tolerance`` below it."""
    failures = []
    for key, old in before.items():
        new = after.get(key)
        if new is None:
            failures.append(f"{key}: recorded {old:.3g}, not measured now")
        elif new < old * (1 - tolerance):
            failures.append(f"{key}: {new:.3g} is {1 - new / old:.0%} below the recorded {old:.3g}")
    return failures


def _run(module: str, extra: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        subprocess.run([sys.executable, "-m", module, *extra, "--json", str(out)], check=True)
        figures: dict[str, Any] = json.loads(out.read_text())
        return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="allowed relative drop")
    parser.add_argument("--scheduler", type=Path, help="figures of a bench.scheduler --json run (else: run it)")
    parser.add_argument("--extender", type=Path, help="figures of a bench.extender --json run (else: run it)")
    parser.add_argument("--annotator", type=Path, help="figures of a bench.annotator --json run (else: run it)")
    parser.add_argument("--only", choices=sorted(RATIOS), help="check one benchmark")
    args = parser.parse_args(argv)
    failures: list[str] = []
    for name in RATIOS:
        if args.only and name != args.only:
            continue
        old = recorded(name)
        given: Path | None = getattr(args, name)
        if given is not None:
            new = json.loads(given.read_text())
        elif name == "scheduler":
            new = {"sizes": {}}
            for run in scheduler_runs(old):
                new["sizes"].update(_run("bench.scheduler", run)["sizes"])
        elif name == "extender":
            new = _run("bench.extender", ["--sizes", ",".join(str(r["nodes"]) for r in old["results"])])
        else:
            new = _run("bench.annotator", annotator_run(old))
        before, after = RATIOS[name](old), RATIOS[name](new)
        for key, value in after.items():
            print(f"{key}: {value:.3g} (recorded {before.get(key, float('nan')):.3g})")
        failures += compare(before, after, args.tolerance)
    for failure in failures:
        print(f"REGRESSION {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
