"""The load-aware Dynamic policy served over the Kubernetes scheduler-extender HTTP API.

For clusters that keep the stock kube-scheduler: an ``extenders:`` entry in its KubeSchedulerConfiguration
sends each pod's candidate nodes here (README.md in this folder). ``protocol`` is the pure request-to-response
translation, ``server`` the aiohttp handlers, ``recent`` the binding-stream follower, ``__main__`` the process.
"""

from crane_extender.protocol import (
    Decide,
    ExtenderArgs,
    MalformedRequest,
    filter_nodes,
    parse_args,
    prioritize_nodes,
)
from crane_extender.recent import RecentBindings, follow_bindings
from crane_extender.server import Extender, ExtenderMetrics, make_app

__all__ = [
    "Decide",
    "Extender",
    "ExtenderArgs",
    "ExtenderMetrics",
    "MalformedRequest",
    "RecentBindings",
    "filter_nodes",
    "follow_bindings",
    "make_app",
    "parse_args",
    "prioritize_nodes",
]
