"""DefaultPreemption: ``plugin`` (the PostFilter, its API calls) and ``evaluator`` (dry run, candidate choice)."""

from crane_scheduler.plugins.defaultpreemption.plugin import NAME, DefaultPreemption, new

__all__ = ["NAME", "DefaultPreemption", "new"]
