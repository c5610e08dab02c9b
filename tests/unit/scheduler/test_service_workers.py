"""The scheduler command runs its plugins' loops under the service's worker contract, where a worker that returns
stops the service: a plugin with nothing to watch (PodTopologySpread with ``defaultingType: List`` and no default
constraints, kube's documented way to turn default spreading off) must not stop crane-scheduler at start."""

from __future__ import annotations

import asyncio

from crane_scheduler.framework import WorkerPlugin
from crane_scheduler.simulate import Simulator
from crane_shared.service import until_stopped

NO_DEFAULT_SPREADING = {
    "apiVersion": "kubescheduler.config.k8s.io/v1",
    "kind": "KubeSchedulerConfiguration",
    "profiles": [
        {
            "schedulerName": "crane-scheduler",
            "pluginConfig": [
                {"name": "PodTopologySpread", "args": {"defaultingType": "List", "defaultConstraints": []}}
            ],
        }
    ],
}


async def test_a_plugin_loop_with_nothing_to_watch_runs_until_the_service_stops() -> None:
    spread = Simulator(NO_DEFAULT_SPREADING).profiles["crane-scheduler"].plugins["PodTopologySpread"]
    assert isinstance(spread, WorkerPlugin)
    stopping = asyncio.Event()
    await asyncio.wait_for(spread.run(stopping), 1)  # the plugin itself returns at once: nothing to watch
    loop = asyncio.create_task(until_stopped(spread.run(stopping), stopping))
    done, _ = await asyncio.wait([loop], timeout=0.2)
    assert not done, "the plugin's loop ended before the service stopped: the runtime would stop the scheduler"
    stopping.set()
    await asyncio.wait_for(loop, 1)
