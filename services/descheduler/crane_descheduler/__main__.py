"""``crane-descheduler``: evicts pods from nodes that stay hot, so the load-aware scheduler can place them again.

Reading order: ``config`` (flags) -> ``app`` (process) -> ``descheduler`` (assembly and the leader's rounds) ->
the pure pieces: ``rounds`` (a round from API objects), ``classify`` (node classes, debounce), ``pods``
(eligibility), ``plan`` (victims, budgets, targets), ``policy`` (the policy file); adapters at the edges:
``usage`` (Prometheus), ``evictor`` (Eviction API, Events); ``metrics``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from crane_descheduler import policy as dpolicy
from crane_descheduler.app import run
from crane_descheduler.config import parse_config
from crane_scheduler.simulate import ConfigError, Simulator
from crane_shared.loadaware.dynamic import DynamicArgs
from crane_shared.logs import configure_logging
from crane_shared.policy import default_policy, load_policy
from crane_shared.policyyaml import PolicyError


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    configure_logging(config.common.log_level, config.common.log_format)
    try:  # a bad policy refuses to start, every problem on its own line
        scheduler = load_policy(config.scheduler_policy) if config.scheduler_policy else default_policy()
        if config.policy:
            dpolicy.load_policy(config.policy, scheduler)
        else:
            dpolicy.default_policy(scheduler)
    except PolicyError as err:
        print(f"crane-descheduler: refusing to start, bad policy:\n{err}", file=sys.stderr)
        return 2
    try:  # the scheduler's own configuration, when given: refused as crane-scheduler refuses it
        if config.scheduler_config:  # read, and its plugins' args checked as the profiles are built
            Simulator(Path(config.scheduler_config), dynamic=DynamicArgs(scheduler))
    except ConfigError as err:
        print(f"crane-descheduler: refusing to start, bad --scheduler-config:\n{err}", file=sys.stderr)
        return 2
    return asyncio.run(run(config))


if __name__ == "__main__":
    sys.exit(main())
