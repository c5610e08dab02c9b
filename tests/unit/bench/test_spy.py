"""bench.scheduler.spy: py-spy's collapsed stacks grouped into the scheduler's pipeline parts."""

from __future__ import annotations

from pathlib import Path

from bench.scheduler.spy import breakdown


def test_samples_go_to_the_first_matching_part_and_imports_are_left_out(tmp_path: Path) -> None:
    raw = tmp_path / "spy.txt"
    raw.write_text(
        "run (a.py:1);SchedulingCycle.schedule_one (s.py:2);Algorithm.schedule (alg.py:3);domain_sums (p.py:4) 6\n"
        "run (a.py:1);SchedulingCycle._binding_cycle (s.py:9);SSLObject.do_handshake (ssl.py:1) 2\n"
        "run (a.py:1);Reporter._worker (r.py:1) 1\n"
        "run (a.py:1);BaseEventLoop._run_once (b.py:1) 1\n"
        "<module> (m.py:1);_find_and_load (<frozen importlib._bootstrap>:1176) 50\n"
    )
    shares = breakdown(raw)
    assert shares["decision (Algorithm.schedule)"] == 0.6
    assert shares["TLS handshake / connect"] == 0.2  # inside a binding cycle, but a handshake
    assert shares["event writer (Scheduled events)"] == 0.1
    assert shares["other (event loop, timers, ...)"] == 0.1
    assert shares["binding cycle (bind request)"] == 0.0
    assert breakdown(tmp_path / "missing.txt") == {}
