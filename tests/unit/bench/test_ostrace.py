"""bench.scheduler.ostrace: the loop thread's involuntary waits, who preempted it, who had the CPU meanwhile."""

from __future__ import annotations

from bench.scheduler.ostrace import report, waits

THREADS = {
    100: "100 python -m crane_scheduler --config crane-scheduler.yaml",
    101: "101 python -m crane_scheduler.writer.process",
    200: "200 /bin/kube-apiserver --etcd-servers=http://127.0.0.1:2379",
    300: "300 /bin/etcd --data-dir x",
}


def switch(cpu: int, t: float, prev: tuple[str, int], state: str, nxt: tuple[str, int]) -> str:
    return (
        f"  {prev[0]}-{prev[1]} [{cpu:03d}] d..2. {t:.6f}: sched_switch: prev_comm={prev[0]} prev_pid={prev[1]} "
        f"prev_prio=120 prev_state={state} ==> next_comm={nxt[0]} next_pid={nxt[1]} next_prio=120"
    )


def test_a_wait_is_charged_to_whoever_had_the_cpu_and_a_sleep_is_no_preemption() -> None:
    loop, api, etcd, writer = ("python3", 100), ("kube-apiserver", 200), ("etcd", 300), ("python3", 101)
    lines = [
        switch(0, 1.000, ("swapper/0", 0), "R", loop),
        # slice end: the API server, then etcd, then the loop again 3 ms later
        switch(0, 1.002, loop, "R", api),
        switch(0, 1.004, api, "S", etcd),
        switch(0, 1.005, etcd, "S", loop),
        # etcd wakes and preempts for 10 us
        "  python3-100 [000] dNh3. 1.005990: sched_wakeup: comm=etcd pid=300 prio=120 target_cpu=000",
        switch(0, 1.006, loop, "R+", etcd),
        switch(0, 1.00601, etcd, "S", loop),
        # the loop sleeps (waits for I/O): not a preemption
        switch(0, 1.007, loop, "S", writer),
        switch(0, 1.009, writer, "S", loop),
    ]
    found, ran = waits(lines, 100, THREADS)
    assert [round(w.seconds * 1e3, 2) for w in found] == [3.0, 0.01]
    assert found[0].preempted_by == "kube-apiserver" and not found[0].woken
    assert {k: round(v * 1e3, 3) for k, v in found[0].cpu_by.items()} == {"kube-apiserver": 2.0, "etcd": 1.0}
    assert found[1].preempted_by == "etcd" and found[1].woken
    assert round(ran * 1e3, 2) == 2.0 + 1.0 + 0.99
    text = report(found, ran)
    assert "preempted 2 times" in text
    assert "preemptions longer than 2 ms: 1 (0 at a wake-up" in text
