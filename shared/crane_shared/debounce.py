"""Consecutive-rounds debounce (koordinator's anomaly detector; crane's avoidance/restore thresholds): a node
becomes *confirmed* hot after ``hot_rounds`` consecutive hot readings and cools after ``cool_rounds`` consecutive
readings that are not hot; a reading without usable data (``None``) resets it (a node must be seen hot K times on
good data in a row). Shared by the descheduler's node classes and the annotator's load taint. Pure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Detector:
    """The debounce state of one node: ``hot`` once confirmed, ``streak`` readings that contradicted it so far."""

    hot: bool = False
    streak: int = 0


def step(detector: Detector, hot: bool | None, hot_rounds: int, cool_rounds: int) -> Detector:
    """The state after one reading: ``hot`` True/False, or None (no usable data: back to the start)."""
    if hot is None:
        return Detector()
    if hot == detector.hot:
        return Detector(detector.hot, 0)
    streak = detector.streak + 1
    if streak >= (cool_rounds if detector.hot else hot_rounds):
        return Detector(not detector.hot, 0)
    return Detector(detector.hot, streak)
