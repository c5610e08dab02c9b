"""Who takes the CPU from crane-scheduler's scheduling loop, and for how long: the kernel's ``sched_switch`` and
``sched_wakeup`` events while the bench's crane-scheduler runs.

The decision's wall-clock p99 (issue 16) is set by the OS preempting the loop thread, not by the decision's own
CPU time. This records the switches (tracefs: root, and a kernel with ``/sys/kernel/tracing``), then for each time
the loop thread was switched out while runnable says what ran first (``preempted by``: a wake-up of that task just
before, or the loop's slice ending), how long until the loop ran again, and which processes had the CPU meanwhile.

    python -m bench.scheduler.ostrace record OUT &   # waits for the bench's crane-scheduler, stops when it exits
    python -m bench.scheduler --nodes 1000 --pods 5000
    python -m bench.scheduler.ostrace report OUT
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

TRACING = Path("/sys/kernel/tracing")
WAKE_WINDOW = 0.0002
"""seconds: a switch this soon after the next task's wake-up counts as a wake-up preemption"""
SWITCH = re.compile(
    r"\[(\d+)\].*?\s([\d.]+): sched_switch: prev_comm=(.*?) prev_pid=(\d+) prev_prio=\d+ prev_state=(\S+) ==> "
    r"next_comm=(.*?) next_pid=(\d+)"
)
WAKEUP = re.compile(r"\s([\d.]+): sched_wakeup: comm=.*? pid=(\d+) ")
KNOWN = ("kube-apiserver", "etcd", "kube-controller", "kube-scheduler", "bench.scheduler", "kwok")


@dataclass
class Wait:
    """One stretch the loop thread spent runnable but off the CPU."""

    seconds: float
    preempted_by: str
    woken: bool  # the preempting task had just woken up (else: the loop's slice ended)
    cpu_by: dict[str, float] = field(default_factory=dict)  # who had that CPU meanwhile, seconds


def classify(tid: int, comm: str, loop: int, threads: dict[int, str]) -> str:
    """A thread's process, by name: the loop itself, crane's other threads and its API writer, the servers."""
    if tid == 0:
        return "idle"
    line = threads.get(tid)
    if line is None:
        return comm
    owner, cmd = line.split(" ", 1)
    if int(owner) == loop:
        return "crane:loop" if tid == loop else "crane:other thread"
    if "crane_scheduler" in cmd and "writer" in cmd:
        return "crane:API writer"
    return next((k for k in KNOWN if k in cmd), comm)


def waits(lines: Iterable[str], loop: int, threads: dict[int, str]) -> tuple[list[Wait], float]:
    """The loop thread's involuntary waits in a ``trace`` text, and the seconds it ran."""
    out: list[Wait] = []
    woke: dict[int, float] = {}
    running: dict[int, tuple[str, float]] = {}  # cpu -> (who, since)
    pending: tuple[float, Wait] | None = None  # (switched out at, the wait being filled)
    ran, since = 0.0, None
    for line in lines:
        m = SWITCH.search(line)
        if m is None:
            if (w := WAKEUP.search(line)) is not None:
                woke[int(w[2])] = float(w[1])
            continue
        cpu, t, prev, state, nxt = int(m[1]), float(m[2]), int(m[4]), m[5], int(m[7])
        if pending is not None and (current := running.get(cpu)) is not None and current[0] != "crane:loop":
            who, start = current
            pending[1].cpu_by[who] = pending[1].cpu_by.get(who, 0.0) + t - max(start, pending[0])
        if prev == loop:
            if since is not None:
                ran += t - since
                since = None
            if state.startswith("R"):
                woken = t - woke.get(nxt, float("-inf")) < WAKE_WINDOW
                pending = (t, Wait(0.0, classify(nxt, m[6], loop, threads), woken))
        running[cpu] = (classify(nxt, m[6], loop, threads), t)
        if nxt == loop:
            since = t
            if pending is not None:
                pending[1].seconds = t - pending[0]
                out.append(pending[1])
                pending = None
    return out, ran


def report(found: list[Wait], ran: float, longer_than: float = 0.002) -> str:
    if not found:
        return "the loop thread was never preempted"
    ordered = sorted(w.seconds for w in found)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1e3

    lines = [
        f"loop thread: ran {ran:.2f} s, preempted {len(found)} times; off the CPU per preemption: "
        f"p50 {q(0.5):.2f} ms, p90 {q(0.9):.2f} ms, p99 {q(0.99):.2f} ms, max {ordered[-1] * 1e3:.2f} ms"
    ]
    for label, chosen in (
        ("all preemptions", found),
        (f"preemptions longer than {longer_than * 1e3:g} ms", [w for w in found if w.seconds > longer_than]),
    ):
        by = Counter(w.preempted_by for w in chosen)
        cpu: defaultdict[str, float] = defaultdict(float)
        for w in chosen:
            for who, seconds in w.cpu_by.items():
                cpu[who] += seconds
        woken = sum(w.woken for w in chosen)
        lines.append(f"{label}: {len(chosen)} ({woken} at a wake-up of the preempting task, the rest at a slice's end)")
        lines.append("  preempted by: " + ", ".join(f"{k} {v}" for k, v in by.most_common(6)))
        top = sorted(cpu.items(), key=lambda kv: -kv[1])[:8]
        lines.append("  the CPU meanwhile: " + ", ".join(f"{k} {v:.3f} s" for k, v in top))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- recording


def _write(name: str, value: str) -> None:
    (TRACING / name).write_text(value)


def _crane_pid() -> int | None:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(b"crane_scheduler" in a for a in argv) and any(b"crane-scheduler.yaml" in a for a in argv):
                return int(proc.name)
    return None


def _threads() -> dict[int, str]:
    """tid -> "<pid> <command line>" for every thread now."""
    out: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
                out.update({int(t.name): f"{proc.name} {cmd}" for t in (proc / "task").iterdir()})
            except OSError:
                continue
    return out


def record(out: Path) -> None:
    """Trace from the bench's crane-scheduler's start to its exit (its first run: the burst)."""
    out.mkdir(parents=True, exist_ok=True)
    _write("tracing_on", "0")
    _write("trace", "")
    _write("trace_clock", "mono")
    _write("buffer_size_kb", "262144")
    _write("options/overwrite", "0")
    _write("events/enable", "0")
    for event in ("sched_switch", "sched_wakeup"):
        _write(f"events/sched/{event}/enable", "1")
    try:
        while (pid := _crane_pid()) is None:
            time.sleep(0.02)
        _write("tracing_on", "1")
        threads: dict[int, str] = {}
        while Path(f"/proc/{pid}").exists():
            threads.update(_threads())
            time.sleep(0.5)
        _write("tracing_on", "0")
        (out / "threads.txt").write_text("".join(f"{k} {v}\n" for k, v in sorted(threads.items())))
        (out / "loop").write_text(str(pid))
        with open(out / "trace.txt", "wb") as dst, open(TRACING / "trace", "rb") as src:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    finally:
        _write("tracing_on", "0")
        _write("events/enable", "0")
        _write("trace", "")
        _write("buffer_size_kb", "1408")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler.ostrace", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("record", "report"))
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.action == "record":
        if not (TRACING / "trace").exists():
            sys.exit(f"no tracefs at {TRACING} (mount -t tracefs nodev {TRACING}, as root)")
        record(args.out)
        return
    threads = {}
    for line in (args.out / "threads.txt").read_text().splitlines():
        tid, rest = line.split(" ", 1)
        threads[int(tid)] = rest
    with open(args.out / "trace.txt") as lines:
        found, ran = waits(lines, int((args.out / "loop").read_text()), threads)
    print(report(found, ran))


if __name__ == "__main__":
    main()
