"""The scheduling framework, shaped like kube-scheduler's ``pkg/scheduler/framework``.

- ``types``: statuses, cycle state, rejections, cluster events, the queued pod, the FitError diagnosis;
- ``interface``: one Protocol per extension point, the optional Explain interface, the ``Handle``;
- ``registry``: plugin name -> factory;
- ``runtime``: profiles (plugins per extension point, built once) and the per-pod extension-point runners.

Import direction: ``types`` <- ``interface`` <- ``registry`` <- ``runtime``; plugins import the first three
(this package's names below), never the scheduler, the queue or the cache.
"""

from crane_scheduler.framework.interface import (
    EXTENSION_POINTS,
    BindPlugin,
    EnqueueExtensions,
    ExplainPlugin,
    FilterPlugin,
    Handle,
    NormalizeScorePlugin,
    PermitPlugin,
    Plugin,
    PluginMetrics,
    PostBindPlugin,
    PostFilterPlugin,
    PreBindPlugin,
    PreFilterPlugin,
    PreScorePlugin,
    QueueSortPlugin,
    ReservePlugin,
    ScorePlugin,
)
from crane_scheduler.framework.registry import PluginFactory, Registry, no_args
from crane_scheduler.framework.types import (
    EXPLAIN_FILTERS,
    EXPLAIN_SCORES,
    MAX_NODE_SCORE,
    NO_NODES_MESSAGE,
    SKIP,
    SUCCESS,
    ArgsError,
    ClusterEvent,
    Code,
    CycleState,
    Diagnosis,
    PreFilterResult,
    QueuedPod,
    Rejection,
    Rows,
    Status,
    default_normalize,
    error,
    fit_error_message,
    unschedulable,
)

__all__ = [
    "EXPLAIN_FILTERS",
    "EXPLAIN_SCORES",
    "EXTENSION_POINTS",
    "MAX_NODE_SCORE",
    "NO_NODES_MESSAGE",
    "SKIP",
    "SUCCESS",
    "ArgsError",
    "BindPlugin",
    "ClusterEvent",
    "Code",
    "CycleState",
    "Diagnosis",
    "EnqueueExtensions",
    "ExplainPlugin",
    "FilterPlugin",
    "Handle",
    "NormalizeScorePlugin",
    "PermitPlugin",
    "Plugin",
    "PluginFactory",
    "PluginMetrics",
    "PostBindPlugin",
    "PostFilterPlugin",
    "PreBindPlugin",
    "PreFilterPlugin",
    "PreFilterResult",
    "PreScorePlugin",
    "QueueSortPlugin",
    "QueuedPod",
    "Registry",
    "Rejection",
    "ReservePlugin",
    "Rows",
    "ScorePlugin",
    "Status",
    "default_normalize",
    "error",
    "fit_error_message",
    "no_args",
    "unschedulable",
]
