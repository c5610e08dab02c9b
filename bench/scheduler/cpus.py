"""``--scheduler-cpu``: the scheduler under test on a core of its own, the API server, etcd and the bench on the rest.

On a 2-core machine the scheduling loop shares its cores with the API server it is loading: a decision that
straddles the end of the loop's time slice waits while kube-apiserver's threads run (``ostrace``: most decisions
over 2 ms). A control plane with more cores does not make the scheduler wait like that. This places both
schedulers, one after the other, the same way: each one's whole process tree (crane's loop and API writer;
kube-scheduler's threads) on the given CPU, the cluster's servers and the bench process on the others. Other
processes on the machine are left where they are. Placement is re-applied every ``PERIOD`` seconds, so threads
and child processes started later follow, and undone when the run ends.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

PERIOD = 0.2


def proc_stats(proc: Path = Path("/proc")) -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of its ``stat`` after "pid (comm)": state, ppid, ...) of every live process."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        yield int(entry.name), stat[stat.rindex(")") + 2 :].split()


def descendants(root: int, proc: Path = Path("/proc")) -> set[int]:
    """``root`` and every process below it (from each process's ``stat`` parent field)."""
    children: dict[int, list[int]] = {}
    for pid, fields in proc_stats(proc):
        children.setdefault(int(fields[1]), []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def place(pids: Iterable[int], cpus: set[int], proc: Path = Path("/proc")) -> int:
    """Every thread of ``pids`` on ``cpus``; returns how many threads were placed (gone ones are skipped)."""
    placed = 0
    for pid in pids:
        try:
            tids = [int(t.name) for t in (proc / str(pid) / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
                placed += 1
            except OSError:
                continue
    return placed


def split(scheduler_cpu: int, available: set[int]) -> tuple[set[int], set[int]]:
    """(the scheduler's CPUs, everything else's): the given one, and the others."""
    if scheduler_cpu not in available or len(available) < 2:
        raise SystemExit(
            f"--scheduler-cpu {scheduler_cpu}: needs two usable CPUs including it, have {sorted(available)}"
        )
    return {scheduler_cpu}, available - {scheduler_cpu}


@asynccontextmanager
async def scheduler_core(
    scheduler_cpu: int | None, scheduler: Callable[[], int | None], others: Iterable[int | None]
) -> AsyncIterator[None]:
    """While the block runs, the process tree of ``scheduler()`` on ``scheduler_cpu`` and ``others`` (with this
    process) on the remaining CPUs; nothing when ``scheduler_cpu`` is None."""
    if scheduler_cpu is None:
        yield
        return
    available = os.sched_getaffinity(0)
    mine, rest = split(scheduler_cpu, available)
    servers = {p for p in others if p is not None} | {os.getpid()}

    def apply() -> None:
        pid = scheduler()
        if pid is not None:
            place(descendants(pid), mine)
        place(servers, rest)

    async def keep() -> None:
        while True:
            await asyncio.sleep(PERIOD)
            apply()

    apply()  # in effect from the block's first line; ``keep`` catches what starts later
    task = asyncio.create_task(keep())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        pid = scheduler()
        place(servers | (descendants(pid) if pid is not None else set()), available)
