"""``cranectl plan``: the descheduler's last round as a person reads it."""

from __future__ import annotations

from cranectl.__main__ import render_plan


def test_the_plan_shows_classes_evictions_and_pods_passed_over():
    body = {
        "at": "2026-01-01T12:00:00+00:00",
        "classes": {"n1": "hot", "n2": "idle", "n3": "unknown", "n4": "idle"},
        "unknown": {"n3": "cpu_usage_avg_5m is stale"},
        "evictions": [
            {
                "pod": "shop/web-1",
                "node": "n1",
                "target": "n2",
                "metric": "cpu_usage_avg_5m",
                "value": 0.9123,
                "threshold": 0.65,
                "result": "pdb",
            }
        ],
        "skipped": {"no-target": 1, "daemonset": 2},
        "dry_run": False,
    }
    assert render_plan(body).splitlines() == [
        "round at 2026-01-01T12:00:00+00:00",
        "  hot:     n1",
        "  idle:    n2, n4",
        "  unknown: n3 (cpu_usage_avg_5m is stale)",
        "evictions:",
        "  shop/web-1                               from n1: cpu_usage_avg_5m 0.912 > 0.65  (target e.g. n2)  pdb",
        "passed over: daemonset 2, no-target 1",
    ]
    assert render_plan({"leading": False, "rounds": 0}) == "no round yet (leading: false)"
    assert render_plan(body | {"evictions": [], "dry_run": True}).splitlines()[0].endswith("(dry run: nothing evicted)")
