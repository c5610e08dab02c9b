"""What every policy file of the project shares: strict YAML, one ``PolicyError`` listing every problem (each
naming its field path), and the field readers that produce those problems.

The scheduler's ``DynamicSchedulerPolicy`` (``crane_shared.policy``) and the descheduler's policy are both read
with these, so a typo, a wrong type or a duplicate key reads the same in either file. Pure: no I/O.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import yaml

from crane_shared.durations import DurationError, parse_duration

__all__ = ["PolicyError", "check_keys", "describe", "duration", "number", "read_yaml"]


class PolicyError(ValueError):
    """A policy cannot be used; ``problems`` lists every issue found, each starting with its field path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__("\n".join(f"{source}: {problem}" for problem in problems))


def read_yaml(text: str, source: str) -> object:
    """The document in ``text``; invalid YAML and duplicate keys raise ``PolicyError`` naming line and column."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        raise PolicyError(source, [_yaml_problem(exc)]) from None


# --- YAML -----------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys, which PyYAML would otherwise silently overwrite."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            duplicate = key in seen
        except TypeError:  # unhashable key: construct_mapping reports it below
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return f"invalid YAML: {problem}"
    return f"line {mark.line + 1}, column {mark.column + 1}: invalid YAML: {problem}"


def check_keys(
    mapping: Mapping[Any, Any],
    path: str,
    allowed: tuple[str, ...],
    problems: list[str],
    shown: tuple[str, ...] | None = None,
) -> None:
    """Unknown keys are errors: a typo such as ``maxLimitPercnt`` must not silently drop a threshold."""
    shown = shown or allowed
    for key in mapping:
        if key in allowed:
            continue
        where = f"{path}.{key}" if path else str(key)
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f'did you mean "{close[0]}"?' if close else f"expected one of: {', '.join(shown)}"
        problems.append(f"{where}: unknown field ({hint})")


def duration(
    item: Mapping[Any, Any], path: str, key: str, problems: list[str], *, allow_zero: bool = False
) -> timedelta | None:
    """A required Go duration field, > 0 (``allow_zero``: >= 0); None when absent or wrong (the problem noted)."""
    if key not in item:
        problems.append(f"{path}.{key}: required")
        return None
    raw = item[key]
    if not isinstance(raw, str):
        problems.append(f'{path}.{key}: must be a Go duration string like "3m", got {describe(raw)}')
        return None
    try:
        value = parse_duration(raw)
    except DurationError as exc:
        problems.append(f"{path}.{key}: {exc}")
        return None
    if value < timedelta(0) or (value == timedelta(0) and not allow_zero):
        problems.append(f"{path}.{key}: must be > 0, got {raw!r}")
        return None
    return value


def number(item: Mapping[Any, Any], path: str, key: str, problems: list[str]) -> float | None:
    if key not in item:
        problems.append(f"{path}.{key}: required")
        return None
    raw = item[key]
    if not isinstance(raw, int | float) or isinstance(raw, bool):
        problems.append(f"{path}.{key}: must be a number, got {describe(raw)}")
        return None
    value = float(raw)
    if not math.isfinite(value):
        problems.append(f"{path}.{key}: must be a finite number, got {raw!r}")
        return None
    return value


def count(item: Mapping[Any, Any], path: str, key: str, default: int, minimum: int, problems: list[str]) -> int:
    """An optional integer field of at least ``minimum``; ``default`` when absent or wrong (the problem noted)."""
    if key not in item:
        return default
    raw = item[key]
    if not isinstance(raw, int) or isinstance(raw, bool):
        problems.append(f"{path}.{key}: must be an integer, got {describe(raw)}")
        return default
    if raw < minimum:
        problems.append(f"{path}.{key}: must be >= {minimum}, got {raw}")
        return default
    return raw


def describe(value: object) -> str:
    """A value as the YAML author wrote it, so the error can be matched to the file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return repr(value)
