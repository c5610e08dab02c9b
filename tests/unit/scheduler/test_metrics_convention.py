"""Scheduler metrics follow the project's convention: per-instance, in the registry they are given, nothing
registered at import time (so two schedulers, or a test and a scheduler, never share or clash)."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client import CollectorRegistry

from crane_scheduler.metrics import SchedulerMetrics
from crane_scheduler.reporting import Reporter


def test_importing_every_scheduler_module_registers_no_metric() -> None:
    code = (
        "import importlib, pkgutil, crane_scheduler\n"
        "from prometheus_client import REGISTRY\n"
        "for m in pkgutil.walk_packages(crane_scheduler.__path__, 'crane_scheduler.'):\n"
        "    importlib.import_module(m.name)\n"
        "names = sorted(n for c in list(REGISTRY._collector_to_names) for n in REGISTRY._collector_to_names[c]\n"
        "               if n.startswith(('crane_', 'scheduler_')))\n"
        "print(names)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_two_schedulers_keep_separate_metrics() -> None:
    a, b = SchedulerMetrics(CollectorRegistry()), SchedulerMetrics(CollectorRegistry())
    Reporter(None, None, "a", metrics=a)
    a.schedule_attempts.labels("scheduled", "p").inc()
    assert (
        a.registry.get_sample_value("scheduler_schedule_attempts_total", {"result": "scheduled", "profile": "p"}) == 1
    )
    assert (
        b.registry.get_sample_value("scheduler_schedule_attempts_total", {"result": "scheduled", "profile": "p"})
        is None
    )
