"""The batch Job example asks for what the annotator publishes, in the form the API server accepts."""

from __future__ import annotations

from pathlib import Path

import yaml

from crane_shared.batch import BATCH_RESOURCES, is_batch
from crane_shared.quantity import parse_quantity

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "examples" / "batch-job.yaml"


def test_the_example_job_requests_the_batch_resources_with_equal_integer_limits() -> None:
    job = yaml.safe_load(EXAMPLE.read_text())
    spec = job["spec"]["template"]["spec"]
    assert is_batch(spec)
    for container in spec["containers"]:
        resources = container["resources"]
        assert set(resources["requests"]) == set(BATCH_RESOURCES)
        assert resources["limits"] == resources["requests"]  # extended resources: limits equal to requests
        for value in resources["requests"].values():
            assert parse_quantity(value) == int(parse_quantity(value))  # no fractions
