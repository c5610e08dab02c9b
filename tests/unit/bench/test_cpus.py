"""``--scheduler-cpu``: the scheduler's whole process tree goes to its CPU, the servers to the others, and both
are put back when the run ends."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from bench.scheduler.cpus import descendants, scheduler_core, split

CPUS = os.sched_getaffinity(0)
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="needs two usable CPUs")

# a parent that starts a child (as crane's loop starts its API writer), prints the child's pid, then waits
TREE = (
    "import subprocess, sys, time; "
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print(c.pid, flush=True); time.sleep(60)"
)


def test_split_gives_the_scheduler_its_cpu_and_the_rest_the_others() -> None:
    assert split(1, {0, 1, 2, 3}) == ({1}, {0, 2, 3})
    with pytest.raises(SystemExit, match="--scheduler-cpu 5"):
        split(5, {0, 1})
    with pytest.raises(SystemExit, match="two usable CPUs"):
        split(0, {0})


@needs_two
async def test_the_scheduler_tree_and_the_servers_are_placed_apart_then_put_back() -> None:
    sched = await asyncio.create_subprocess_exec(sys.executable, "-c", TREE, stdout=asyncio.subprocess.PIPE)
    server = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    assert sched.stdout is not None
    child = int(await sched.stdout.readline())
    try:
        assert descendants(sched.pid) == {sched.pid, child}
        cpu = max(CPUS)
        async with scheduler_core(cpu, lambda: sched.pid, [server.pid, None]):
            assert os.sched_getaffinity(child) == {cpu}  # crane's API writer goes with its loop
            assert os.sched_getaffinity(sched.pid) == {cpu}
            assert os.sched_getaffinity(server.pid) == CPUS - {cpu}
            assert os.sched_getaffinity(0) == CPUS - {cpu}  # the bench itself stays off the scheduler's CPU
        for pid in (sched.pid, child, server.pid, 0):
            assert os.sched_getaffinity(pid) == CPUS
    finally:
        os.kill(child, signal.SIGKILL)  # it holds the parent's stdout open
        for p in (sched, server):
            p.kill()
            await p.wait()
        os.sched_setaffinity(0, CPUS)


async def test_without_a_cpu_nothing_is_placed() -> None:
    async with scheduler_core(None, lambda: os.getpid(), [os.getpid()]):
        assert os.sched_getaffinity(0) == CPUS
