"""``python -m bench.loadaware``: the seed experiment side by side for requests-only, upstream-style crane and ours.

Prints, per service and strategy: replicas placed (of 20 requested; the rest stay Pending), how many were placed
before any node's real usage went over the 0.65 threshold, the peak and the spread (max - min) of real use of the
service's main resource across the three nodes at the end, and where the replicas went.
"""

from __future__ import annotations

import argparse

from bench.loadaware.sim import CPU_HEAVY, MEMORY_HEAVY, Outcome, run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loadaware", description=__doc__)
    parser.add_argument("--replicas", type=int, default=20, help="replicas to add per service")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between two replicas")
    args = parser.parse_args()
    print(f"three nodes of 48 CPU / 192Gi; one replica every {args.interval:g}s; threshold {0.65}")
    for svc in (MEMORY_HEAVY, CPU_HEAVY):
        print(
            f"\n{svc.name}: real {svc.real_cpu:g} CPU / {svc.real_mem_gi:g}Gi, "
            f"requests {svc.req_cpu:g} CPU / {svc.req_mem_gi:g}Gi per replica"
        )
        header = f"{'strategy':10} {'placed':>6} {'overload after':>14} {'peak use':>8} {'spread':>6}"
        print(f"  {header}  per node  final use")
        outcomes: list[Outcome] = [
            run(s, svc, replicas=args.replicas, interval=args.interval) for s in ("requests", "upstream", "ours")
        ]
        for o in outcomes:
            used = o.final_mem if svc is MEMORY_HEAVY else o.final_cpu
            over = "never" if o.before_overload is None else f"{o.before_overload} replicas"
            print(
                f"  {o.strategy:10} {o.placed:>6} {over:>14} {o.peak:>8.2f} {o.spread:>6.2f}  "
                f"{'/'.join(map(str, o.per_node)):8}  {' '.join(f'{u:.2f}' for u in used)}"
            )
        ref = outcomes[0]
        for o in outcomes[1:]:
            print(
                f"  {o.strategy} vs requests-only: spread {o.spread / ref.spread:.2f}x, "
                f"peak {o.peak / ref.peak:.2f}x, placed {o.placed / ref.placed:.2f}x"
            )


if __name__ == "__main__":
    main()
