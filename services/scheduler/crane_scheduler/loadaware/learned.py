"""The workloads' measured usage, joined from the nodes' ``crane.io/pod-usage`` and the scheduler's pod informer.

Each node's annotation is decoded once per change (a table column hook); each pod the node table accounts is
filed under its workload (``crane_shared.loadaware.learned.workload_key``) once per add. A workload's learned
usage is computed when asked and kept until a member joins or leaves, a member's measured usage changes, or the
oldest sample used passes ``maxAge``: a burst of replicas of one Deployment computes it once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from crane_shared.batch import POD_USAGE_KEY, PodUsage, PodUsageError, decode_pod_usage
from crane_shared.loadaware.learned import LearnArgs, WorkloadKey, learned_usage, workload_key


class WorkloadUsage:
    """Measured usage per pod (by ``namespace/name``) and pods per workload; ``estimate`` answers per workload."""

    def __init__(self, args: LearnArgs) -> None:
        self.args = args
        self._usage: dict[str, tuple[PodUsage, float]] = {}
        """namespace/name -> (usage, unix time of the node's sample)"""
        self._texts: dict[str, str] = {}
        """node -> the annotation text last decoded (an unchanged text is not decoded again)"""
        self._on_node: dict[str, set[str]] = {}
        self._key_of: dict[str, WorkloadKey] = {}
        """pod uid -> its workload"""
        self._name_of: dict[str, str] = {}
        """pod uid -> namespace/name"""
        self._members: dict[WorkloadKey, dict[str, str]] = {}
        """workload -> {uid: namespace/name}"""
        self._workload_of_name: dict[str, WorkloadKey] = {}
        self._cache: dict[WorkloadKey, tuple[PodUsage | None, float]] = {}
        """workload -> (learned usage, valid until unix time)"""
        self.computed = 0
        """workloads whose usage was computed (a cost counter for tests and benches)"""

    # -- inputs ---------------------------------------------------------------------------------------------------

    def node_changed(self, node: str, annotations: Mapping[str, str] | None) -> str | None:
        """A node's annotations changed: refile its pods' usage. Returns the reason a malformed annotation was
        skipped (its pods then count as unmeasured), else None."""
        text = (annotations or {}).get(POD_USAGE_KEY)
        if text is not None and self._texts.get(node) == text:
            return None
        error = None
        pods: dict[str, tuple[PodUsage, float]] = {}
        if text is not None:
            try:
                decoded = decode_pod_usage(text)
                at = decoded.at.timestamp()
                pods = {name: (usage, at) for name, usage in decoded.pods.items()}
            except PodUsageError as err:
                error = str(err)
            self._texts[node] = text
        else:
            self._texts.pop(node, None)
        for name in self._on_node.pop(node, set()) - pods.keys():
            self._usage.pop(name, None)
            self._forget(name)
        for name, found in pods.items():
            if self._usage.get(name) != found:
                self._usage[name] = found
                self._forget(name)
        if pods:
            self._on_node[node] = set(pods)
        return error

    def pod_added(self, uid: str, namespace: str, name: str, metadata: Mapping[str, object] | None) -> None:
        """A pod the informer knows on a node (called again on every update: cheap when nothing moved)."""
        if uid in self._key_of:
            return
        key = workload_key(metadata)
        if key is None:
            return
        full = f"{namespace}/{name}"
        self._key_of[uid], self._name_of[uid] = key, full
        self._members.setdefault(key, {})[uid] = full
        self._workload_of_name[full] = key
        self._cache.pop(key, None)

    def pod_removed(self, uid: str) -> None:
        key = self._key_of.pop(uid, None)
        if key is None:
            return
        full = self._name_of.pop(uid)
        members = self._members.get(key)
        if members is not None:
            members.pop(uid, None)
            if not members:
                del self._members[key]
        if self._workload_of_name.get(full) == key:
            del self._workload_of_name[full]
        self._cache.pop(key, None)

    def _forget(self, name: str) -> None:
        key = self._workload_of_name.get(name)
        if key is not None:
            self._cache.pop(key, None)

    # -- per decision ---------------------------------------------------------------------------------------------

    def estimate(self, metadata: Mapping[str, object] | None, now: float) -> PodUsage | None:
        """The learned usage of a pod of this workload, or None (not enough measured pods: the factor applies)."""
        if not self.args.enabled or not self._usage:  # nothing measured anywhere: no workload has samples
            return None
        key = workload_key(metadata)
        if key is None:
            return None
        cached = self._cache.get(key)
        if cached is not None and now < cached[1]:
            return cached[0]
        self.computed += 1
        oldest = self.args.max_age.total_seconds()
        samples, until = [], math.inf
        for name in self._members.get(key, {}).values():
            found = self._usage.get(name)
            if found is not None and now - oldest <= found[1] <= now + oldest:
                samples.append(found[0])
                until = min(until, found[1] + oldest)
        learned = learned_usage(samples, self.args)
        self._cache[key] = (learned, until)
        return learned
