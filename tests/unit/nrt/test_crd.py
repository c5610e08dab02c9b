"""The shipped CRD matches what the plugin reads and what crane-agent writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from crane_scheduler.plugins.noderesourcetopology.model import GROUP, KIND, PLURAL, VERSION
from tests.support.nrt import nrt

CRDS = Path(__file__).resolve().parents[3] / "deploy" / "crds"


def crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((CRDS / "topology.crane.io_noderesourcetopologies.yaml").read_text())
    return doc


def _follow(schema: dict[str, Any], path: str) -> dict[str, Any]:
    for part in path.strip(".").split("."):
        schema = schema["properties"][part]
    return schema


def test_names_scope_and_version() -> None:
    spec = crd()["spec"]
    assert crd()["metadata"]["name"] == f"{PLURAL}.{GROUP}"
    assert (spec["group"], spec["scope"], spec["names"]["kind"], spec["names"]["plural"]) == (
        GROUP,
        "Cluster",
        KIND,
        PLURAL,
    )
    assert spec["names"]["shortNames"] == ["nrt"]
    assert [v["name"] for v in spec["versions"]] == [VERSION]


def test_printer_columns_point_at_real_fields() -> None:
    version = crd()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    for column in version["additionalPrinterColumns"]:
        if column["jsonPath"].startswith(".metadata"):
            continue
        assert _follow(schema, column["jsonPath"])["type"] == "string"


def test_an_agent_written_object_has_every_required_field_and_no_unknown_one() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    obj = nrt("w1", [("node0", "7", "15Gi")])

    def check(value: Any, s: dict[str, Any], path: str) -> None:
        if s.get("type") == "object" and "properties" in s:
            assert isinstance(value, dict), path
            for key in s.get("required", []):
                assert key in value, f"{path}.{key} required"
            for key, sub in value.items():
                assert key in s["properties"], f"{path}.{key} not in the schema"
                check(sub, s["properties"][key], f"{path}.{key}")
        elif s.get("type") == "array":
            for i, item in enumerate(value):
                check(item, s["items"], f"{path}[{i}]")
        elif "enum" in s:
            assert value in s["enum"], path

    check(obj, schema, "")
