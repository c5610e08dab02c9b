"""ImageLocality: favour nodes that already have the pod's images, weighted by how widely each image is spread
(kube-scheduler's ``imagelocality``): per container image (and, since 1.37, image volume) present on the node,
``size * nodes_with_it / nodes``, summed, clamped to [23 MiB, 1000 MiB x images] and scaled to 0..100 in integer
math.

Image states (name -> size, nodes) are rebuilt from ``status.images`` only for nodes whose image list changed
since the last decision; like kube's cache, an image's size is the one first seen for that name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from crane_scheduler import framework as fwk
from crane_scheduler.nodetable import IntArray, NodeTable
from crane_scheduler.podinfo import NodeInfo, PodInfo

NAME = "ImageLocality"
MB = 1024 * 1024
MIN_THRESHOLD = 23 * MB
MAX_CONTAINER_THRESHOLD = 1000 * MB

Images = tuple[tuple[tuple[str, ...], int], ...]


def node_images(node: NodeInfo) -> Images:
    return tuple(
        (tuple(str(n) for n in image.get("names") or ()), int(image.get("sizeBytes") or 0))
        for image in (node.raw.get("status") or {}).get("images") or ()
    )


def normalized_image_name(name: str) -> str:
    """``name:latest`` when the name has no tag (the last ':' is not after the last '/')."""
    return name + ":latest" if name.rfind(":") <= name.rfind("/") else name


def calculate_priority(sum_scores: int, num_containers: int) -> int:
    max_threshold = MAX_CONTAINER_THRESHOLD * num_containers
    sum_scores = min(max(sum_scores, MIN_THRESHOLD), max_threshold)
    return fwk.MAX_NODE_SCORE * (sum_scores - MIN_THRESHOLD) // (max_threshold - MIN_THRESHOLD)


class ImageLocality(fwk.ScorePlugin, fwk.EnqueueExtensions):
    name = NAME

    def __init__(self) -> None:
        self._row_images: dict[int, tuple[str, Images]] = {}  # row -> (node name, its images)
        self._row_raw: dict[int, tuple[str, Any] | None] = {}
        self._states: dict[str, tuple[int, set[int]]] = {}  # image name -> (size, rows having it)
        self._version = -1

    def _refresh(self, table: NodeTable) -> None:
        if self._version == table.nodes_version:
            return
        self._version = table.nodes_version
        for row in range(table.n_rows):
            node = table.nodes[row]
            raw = (node.raw.get("status") or {}).get("images") if node is not None else None
            seen = self._row_raw.get(row)
            if seen is not None and node is not None and seen[0] == node.name and seen[1] == raw:
                continue  # the common case: nothing image-related changed (compared in C, not parsed)
            self._row_raw[row] = (node.name, raw) if node is not None else None
            current = (node.name, node_images(node)) if node is not None else None
            old = self._row_images.pop(row, None)
            if old is not None:
                self._drop(row, old[1])
            if current is not None:
                self._row_images[row] = current
                for names, size in current[1]:
                    for name in names:
                        state = self._states.get(name)
                        if state is None:
                            self._states[name] = (size, {row})
                        else:
                            state[1].add(row)

    def _drop(self, row: int, images: Images) -> None:
        for names, _ in images:
            for name in names:
                state = self._states.get(name)
                if state is not None:
                    state[1].discard(row)
                    if not state[1]:
                        del self._states[name]

    def score(self, state: fwk.CycleState, pod: PodInfo, table: NodeTable, rows: fwk.Rows) -> IntArray:
        spec = pod.raw.get("spec") or {}
        containers = list(spec.get("initContainers") or ()) + list(spec.get("containers") or ())
        images = [str(c.get("image") or "") for c in containers]
        # kube 1.37: image volumes (``volumes[].image.reference``) count as images too
        images += [str(v["image"].get("reference") or "") for v in spec.get("volumes") or () if v.get("image")]
        if not images:
            return np.zeros(len(rows), dtype=np.int64)
        self._refresh(table)
        states = [found for image in images if (found := self._states.get(normalized_image_name(image))) is not None]
        if not states:  # no node has any of the images: every sum is 0, below the threshold, so every score 0
            return np.zeros(len(rows), dtype=np.int64)
        total_nodes = table.num_nodes
        sums = np.zeros(table.n_rows, dtype=np.int64)
        for size, having in states:
            idx = np.fromiter(having, dtype=np.intp, count=len(having))
            sums[idx] += int(float(size) * (float(len(having)) / float(total_nodes)))
        clamped = np.clip(sums[rows], MIN_THRESHOLD, MAX_CONTAINER_THRESHOLD * len(images))
        span = MAX_CONTAINER_THRESHOLD * len(images) - MIN_THRESHOLD
        out: IntArray = fwk.MAX_NODE_SCORE * (clamped - MIN_THRESHOLD) // span
        return out

    def events_to_register(self) -> fwk.ClusterEvent:
        return fwk.ClusterEvent.NODE_ADD | fwk.ClusterEvent.NODE_UPDATE


def new(args: Mapping[str, Any], handle: fwk.Handle) -> ImageLocality:
    fwk.no_args(NAME)(args)
    return ImageLocality()
