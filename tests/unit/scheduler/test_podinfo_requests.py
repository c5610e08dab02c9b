"""parse_pod's scoring requests (the 100m / 200Mi defaults for what a container leaves out) are kube's
``PodRequests`` with ``NonMissingContainerRequests`` whatever the containers state: both defaults and no pod-level
request for the pod being scheduled (NodeResourcesFit's Score: kube's Fit does not pass its scorer the
PodLevelResources option), and for a pod counted on a node kube's ``getNonMissingContainerRequests`` (with
pod-level requests, only for a resource the pod's requests do not name)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from crane_scheduler.podinfo import CPU, DEFAULT_MEMORY_REQUEST, DEFAULT_MILLI_CPU_REQUEST, MEMORY, parse_pod
from crane_shared.podresources import NON_MISSING, non_missing_for, pod_requests, pod_requests_of

requests = st.fixed_dictionaries(
    {}, optional={"cpu": st.sampled_from(["0", "100m", "2"]), "memory": st.sampled_from(["0", "1Mi", "3Gi"])}
)
containers = st.lists(st.builds(lambda r: {"name": "c", "resources": {"requests": r}}, requests), max_size=3)
init = st.lists(
    st.builds(
        lambda r, always: {
            "name": "i",
            "resources": {"requests": r},
            **({"restartPolicy": "Always"} if always else {}),
        },
        requests,
        st.booleans(),
    ),
    max_size=2,
)


@settings(max_examples=200, deadline=None)
@given(containers=containers, init=init, pod_level=st.one_of(st.none(), requests), overhead=st.booleans())
def test_scoring_requests_fill_in_only_what_containers_leave_out(
    containers: list[dict[str, Any]], init: list[dict[str, Any]], pod_level: dict[str, str] | None, overhead: bool
) -> None:
    spec: dict[str, Any] = {"containers": containers, "initContainers": init}
    if pod_level is not None:
        spec["resources"] = {"requests": pod_level}
    if overhead:
        spec["overhead"] = {"cpu": "10m", "memory": "1Mi"}
    info = parse_pod({"metadata": {"name": "p", "uid": "u"}, "spec": spec})
    incoming = pod_requests_of({"spec": spec}, use_status=False, non_missing=NON_MISSING, skip_pod_level=True)
    assert (info.score_nonzero_cpu, info.score_nonzero_memory) == (incoming.get(CPU, 0), incoming.get(MEMORY, 0))
    assert NON_MISSING == {CPU: DEFAULT_MILLI_CPU_REQUEST, MEMORY: DEFAULT_MEMORY_REQUEST}
    stated = pod_requests(spec)
    missing = non_missing_for(stated, spec)
    placed = pod_requests(spec, missing) if missing else stated
    assert (info.nonzero_cpu, info.nonzero_memory) == (placed.get(CPU, 0), placed.get(MEMORY, 0))
    assert info.requests == info.fit_requests == {k: v for k, v in stated.items() if v}
