"""The supported Kubernetes releases: each module pins the release it is named for, the API server of each gets
the Workload API version that release has, and ``CRANE_KUBE_RELEASE`` picks one or says which exist."""

from __future__ import annotations

import pytest

from crane_sandbox.cluster import minor_release, workload_api_version
from crane_sandbox.kubebin import NEWEST, OLDEST, RELEASE_ENV, RELEASES, pinned_version, selected_release


def test_each_release_module_pins_the_release_it_is_named_for() -> None:
    assert set(RELEASES) == {NEWEST, OLDEST}
    for release, module in RELEASES.items():
        assert pinned_version(module).startswith(f"v{release}."), module
    assert minor_release(pinned_version(RELEASES[OLDEST])) < minor_release(pinned_version(RELEASES[NEWEST]))


def test_the_api_server_is_asked_for_the_workload_api_version_its_release_has() -> None:
    assert workload_api_version("v1.35.4") == "v1alpha1"  # Workload, spec.workloadRef
    assert workload_api_version("v1.36.1") == "v1alpha2"
    assert workload_api_version("v1.37.2") == "v1beta1"  # Workload and PodGroup, spec.schedulingGroup
    with pytest.raises(ValueError, match=r"not a Kubernetes 1\.x release"):
        workload_api_version("0.37.2")


def test_the_release_env_selects_the_servers_or_names_the_supported_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RELEASE_ENV, raising=False)
    assert selected_release() == NEWEST
    monkeypatch.setenv(RELEASE_ENV, OLDEST)
    assert selected_release() == OLDEST
    monkeypatch.setenv(RELEASE_ENV, "1.30")
    with pytest.raises(RuntimeError, match=rf"{RELEASE_ENV}=.1\.30.: supported releases are 1\.35, 1\.37"):
        selected_release()
