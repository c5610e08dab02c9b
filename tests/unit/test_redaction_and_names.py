"""Secrets never reach logs; event names stay valid for any pod name."""

from __future__ import annotations

import re

from crane_shared.events import event_name
from crane_shared.redisconn import redacted

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def test_passwords_are_redacted_from_urls() -> None:
    assert redacted("redis://:s3cret@redis:6379/0") == "redis://:***@redis:6379/0"
    assert redacted("https://user:s3cret@prom:9090") == "https://user:***@prom:9090"
    assert "s3cret" not in redacted("redis://redis:6379/0?password=s3cret&db=1")
    assert redacted("http://prom:9090") == "http://prom:9090"


def test_event_names_are_valid_for_the_longest_pod_names() -> None:
    for pod in ("web-0", "a" * 253, "a" * 230 + "-" * 22 + "b"):
        name = event_name(pod, "0123456789abcdef")
        assert len(name) <= 253 and DNS_SUBDOMAIN.match(name), name
