"""The wire formats: ``NodeResourceTopology`` objects (as crane-agent writes them) and the pod annotations.

Pure decoding and encoding over plain JSON dicts; every value is an integer in the scheduler's units (cpu in
millicores, everything else in its base unit), so the fit arithmetic never touches quantity strings.

The topology result is written exactly in upstream's form (a JSON array of zones with ``name``, ``type: Node``
and ``resources.capacity`` in canonical Kubernetes quantities), which is what crane-agent's CPU manager parses:
``[{"name":"node0","type":"Node","resources":{"capacity":{"cpu":"2"}}}]``. One deliberate difference: upstream
records memory with the CPU's number (``"memory":"2000"`` for 2 CPUs/4Gi); we record real bytes (``"4Gi"``).
The agent reads only ``cpu`` from the result, so the key set and the quantity syntax are unchanged for it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from crane_shared.quantity import parse_quantity

GROUP = "topology.crane.io"
VERSION = "v1alpha1"
PLURAL = "noderesourcetopologies"
KIND = "NodeResourceTopology"

ANNOTATION_AWARENESS = "topology.crane.io/topology-awareness"
ANNOTATION_CPU_POLICY = "topology.crane.io/cpu-policy"
ANNOTATION_RESULT = "topology.crane.io/topology-result"

CPU_POLICY_NONE = "None"  # the kubelet manages cpusets: the scheduler does not place pods on zones
CPU_POLICY_STATIC = "Static"  # crane-agent pins the pod's CPUs to the zones the scheduler chose
TOPOLOGY_POLICY_NONE = "None"
TOPOLOGY_POLICY_SINGLE_NUMA = "SingleNUMANodePodLevel"
CPU_POLICIES = (CPU_POLICY_NONE, CPU_POLICY_STATIC)
TOPOLOGY_POLICIES = (TOPOLOGY_POLICY_NONE, TOPOLOGY_POLICY_SINGLE_NUMA)
ZONE_TYPE_NODE = "Node"
ZONE_TYPES = ("Node", "Socket", "Core")

_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = {-3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


MAX_VALUE = 2**63 - 1
"""the largest quantity kube stores (an int64)"""


class TopologyError(ValueError):
    """A malformed NRT object or annotation; the message names the field."""


def scheduler_value(name: str, text: Any) -> int:
    """A quantity in the scheduler's units (millicores for cpu), rounded up like ``MilliValue()``/``Value()``."""
    try:
        value = parse_quantity(text)
        scaled = value * 1000 if name == "cpu" else value
        if abs(scaled) > MAX_VALUE:
            raise ValueError(f"{name} {text!r} is out of range")
        return int(scaled.to_integral_value(rounding="ROUND_CEILING"))
    except (ValueError, ArithmeticError) as err:  # decimal's Overflow for an exponent past its range
        raise TopologyError(f"{name}: {err}" if not str(err).startswith(name) else str(err)) from err


def _binary(name: str) -> bool:
    return name in ("memory", "ephemeral-storage") or name.startswith("hugepages-")


def format_quantity(name: str, value: int) -> str:
    """``value`` (scheduler units) as Go's ``Quantity.String()`` prints it: DecimalSI for cpu and counts,
    BinarySI for bytes (``2Gi``; a byte count that is no whole binary multiple stays a plain number)."""
    if _binary(name) and abs(value) >= 1024:
        exponent = 0
        while value % 1024 == 0 and exponent < len(_BINARY_SUFFIXES) - 1:
            value //= 1024
            exponent += 1
        return f"{value}{_BINARY_SUFFIXES[exponent]}"
    exponent = -3 if name == "cpu" else 0
    if value == 0:
        return "0"
    while value % 1000 == 0 and exponent < 18:
        value //= 1000
        exponent += 3
    return f"{value}{_DECIMAL_SUFFIXES[exponent]}"


# ---------------------------------------------------------------------------------------------- NRT objects


@dataclass(frozen=True, slots=True)
class Zone:
    name: str
    type: str
    allocatable: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """What the scheduler reads from a node's NRT (object name = node name)."""

    node: str
    cpu_manager_policy: str
    topology_manager_policy: str
    zones: tuple[Zone, ...]

    @property
    def static(self) -> bool:
        return self.cpu_manager_policy == CPU_POLICY_STATIC

    @property
    def aware_by_default(self) -> bool:
        return self.topology_manager_policy == TOPOLOGY_POLICY_SINGLE_NUMA

    @property
    def numa_zones(self) -> tuple[Zone, ...]:
        """The zones pods are placed on. Upstream also took Socket and Core zones and labelled them ``Node``,
        which crane-agent cannot parse (it slices ``node<N>``); only ``Node`` zones are candidates here."""
        return tuple(z for z in self.zones if z.type == ZONE_TYPE_NODE)


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TopologyError(f"{path}: must be an object")
    return value


def _resources(value: Any, path: str) -> dict[str, int]:
    out = {}
    for name, text in _mapping(value, path).items():
        try:
            out[str(name)] = scheduler_value(str(name), text)
        except TopologyError as err:
            raise TopologyError(f"{path}.{name}: {err}") from err
    return out


def decode_topology(obj: Mapping[str, Any]) -> NodeTopology:
    """An NRT object as crane-agent writes it (all fields top level, no spec/status); ``TopologyError`` names
    the first bad field."""
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise TopologyError("metadata.name: missing")
    policy = _mapping(obj.get("craneManagerPolicy"), "craneManagerPolicy")
    cpu = policy.get("cpuManagerPolicy")
    if cpu not in CPU_POLICIES:
        raise TopologyError(f"craneManagerPolicy.cpuManagerPolicy: must be one of {CPU_POLICIES}, got {cpu!r}")
    topo = policy.get("topologyManagerPolicy", TOPOLOGY_POLICY_SINGLE_NUMA)  # the CRD's default
    if topo not in TOPOLOGY_POLICIES:
        raise TopologyError(
            f"craneManagerPolicy.topologyManagerPolicy: must be one of {TOPOLOGY_POLICIES}, got {topo!r}"
        )
    raw_zones = obj.get("zones") or []
    if not isinstance(raw_zones, Sequence) or isinstance(raw_zones, str):
        raise TopologyError("zones: must be a list")
    zones = []
    for i, z in enumerate(raw_zones):
        path = f"zones[{i}]"
        z = _mapping(z, path)
        zname, ztype = z.get("name"), z.get("type")
        if not isinstance(zname, str) or not zname:
            raise TopologyError(f"{path}.name: missing")
        if ztype not in ZONE_TYPES:
            raise TopologyError(f"{path}.type: must be one of {ZONE_TYPES}, got {ztype!r}")
        res = _mapping(z.get("resources"), f"{path}.resources")
        zones.append(Zone(zname, ztype, _resources(res.get("allocatable"), f"{path}.resources.allocatable")))
    return NodeTopology(name, cpu, topo, tuple(zones))


# ---------------------------------------------------------------------------------------------- the result


@dataclass(frozen=True, slots=True)
class ZoneResult:
    """One entry of a pod's topology result: what the pod takes from one zone (scheduler units)."""

    zone: str
    capacity: Mapping[str, int]


Result = tuple[ZoneResult, ...]


def encode_result(result: Result) -> str:
    """Upstream's JSON (Go's field order, map keys sorted, zero amounts left out, compact)."""
    return json.dumps(
        [
            {
                "name": e.zone,
                "type": ZONE_TYPE_NODE,
                "resources": {"capacity": {k: format_quantity(k, v) for k, v in sorted(e.capacity.items()) if v != 0}},
            }
            for e in result
        ],
        separators=(",", ":"),
    )


def decode_result(text: str) -> Result:
    """A topology-result annotation; only ``Node`` entries count (as upstream). ``TopologyError`` when the text
    is not such a list; an empty tuple when it holds no ``Node`` entry."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise TopologyError(f"{ANNOTATION_RESULT}: not JSON ({err})") from err
    if not isinstance(raw, list):
        raise TopologyError(f"{ANNOTATION_RESULT}: must be a JSON list")
    out = []
    for i, entry in enumerate(raw):
        path = f"{ANNOTATION_RESULT}[{i}]"
        entry = _mapping(entry, path)
        if entry.get("type") != ZONE_TYPE_NODE:
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise TopologyError(f"{path}.name: missing")
        capacity = _resources(_mapping(entry.get("resources"), f"{path}.resources").get("capacity"), path)
        out.append(ZoneResult(name, capacity))
    return tuple(out)


# ---------------------------------------------------------------------------------------------- pod annotations

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
CPU_POLICY_VALUES = ("none", "exclusive", "numa", "immovable")


def parse_go_bool(text: str) -> bool | None:
    """Go's ``strconv.ParseBool``; None when the text is none of its spellings."""
    if text in _GO_TRUE:
        return True
    if text in _GO_FALSE:
        return False
    return None


def whole_cores(text: Any) -> int | None:
    """A CPU quantity that is a whole number of cores > 0, in millicores; else None."""
    try:
        value = parse_quantity(text)
    except ValueError:
        return None
    if value <= 0 or value != value.to_integral_value():
        return None
    return int(value * Decimal(1000))
