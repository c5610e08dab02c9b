"""``cranectl snapshot`` / ``simulate`` without a cluster: manifests expanded as their controllers would, pods
placed by the scheduler on a snapshot, what a snapshot keeps out, and the table, JSON, PNG and HTML rendered."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from cranectl import whatif
from cranectl.snapshot import KIND, policy_path_of, read, scrub_pod
from tests.support.cranectl import assert_plot_and_page, run_cli

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
METRICS = ["cpu_usage_avg_5m", "cpu_usage_max_avg_1h", "cpu_usage_max_avg_1d"]
METRICS += ["mem_usage_avg_5m", "mem_usage_max_avg_1h", "mem_usage_max_avg_1d"]


def node(name: str, usage: float, cpu: str = "8") -> dict[str, Any]:
    stamp = NOW.strftime("%Y-%m-%dT%H:%M:%S+00:00")
    resources = {"cpu": cpu, "memory": "32Gi", "pods": "110"}
    return {
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {m: f"{usage:.5f},{stamp}" for m in METRICS},
        },
        "spec": {},
        "status": {"allocatable": resources, "capacity": resources},
    }


def snapshot(*nodes: dict[str, Any], policy: dict[str, Any] | None = None) -> dict[str, Any]:
    bound = {
        "kind": "Pod",
        "metadata": {"name": "old", "namespace": "default", "uid": "u-old"},
        "spec": {
            "nodeName": nodes[0]["metadata"]["name"],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}],
        },
        "status": {"phase": "Running"},
    }
    return {
        "apiVersion": "crane.io/v1alpha1",
        "kind": KIND,
        "takenAt": NOW.isoformat(),
        "schedulerConfig": None,
        "policy": policy,
        "notServed": [],
        "objects": [*nodes, bound],
    }


def template(cpu: str, memory: str = "1Gi", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels or {"app": "web"}},
        "spec": {
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]
        },
    }


def deployment(name: str, replicas: int, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template(cpu)},
    }


# ------------------------------------------------------------------------------------------ expansion


def test_workloads_expand_as_their_controllers_would() -> None:
    job = {"kind": "Job", "metadata": {"name": "j", "namespace": "batch"}}
    job["spec"] = {"parallelism": 5, "completions": 2, "template": template("1")}
    sts = {"kind": "StatefulSet", "metadata": {"name": "db"}, "spec": {"replicas": 2, "template": template("1")}}
    pod = {"kind": "Pod", "metadata": {"name": "solo"}, "spec": template("1")["spec"]}
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "g"}}
    out = whatif.expand([deployment("web", 3, "1"), job, sts, pod, group])
    names = [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in out.pods]
    assert names == [
        "default/web-simulated-0",
        "default/web-simulated-1",
        "default/web-simulated-2",
        "batch/j-0",  # parallelism 5, but only 2 completions: 2 pods at once
        "batch/j-1",
        "default/db-0",
        "default/db-1",
        "default/solo",
    ]
    first = out.pods[0]
    assert first["metadata"]["labels"] == {"app": "web"}
    assert first["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"  # the default spread's owner
    assert out.pods[3]["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "j"
    assert out.pods[5]["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"] == "db-0"
    assert [o["kind"] for o in out.objects] == ["ReplicaSet", "StatefulSet", "PodGroup"]


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"kind": "Service", "metadata": {"name": "s"}}, "Service default/s: kind 'Service' is not simulated"),
        (deployment("web", -1, "1"), "Deployment default/web: spec.replicas must be a non-negative integer"),
        (
            {"kind": "StatefulSet", "metadata": {"name": "db"}, "spec": {"template": {}, "volumeClaimTemplates": [{}]}},
            "StatefulSet default/db: spec.volumeClaimTemplates is not simulated",
        ),
        ({"kind": "Deployment", "metadata": {"name": "d"}, "spec": {}}, "Deployment default/d: spec.template"),
    ],
)
def test_what_cannot_be_simulated_is_refused_naming_it(doc: dict[str, Any], words: str) -> None:
    with pytest.raises(whatif.ManifestError, match=words):
        whatif.expand([doc])


# ------------------------------------------------------------------------------------------ the run


def test_pods_go_where_the_scheduler_puts_them_and_a_hot_node_gets_none() -> None:
    snap = snapshot(node("n1", 0.2), node("n2", 0.5), node("hot", 0.7))
    workload = whatif.expand([deployment("web", 4, "1"), deployment("big", 1, "7")])
    outcome = whatif.run(snap, workload, whatif.base_setup(snap))
    placed = {p.pod: p.node for p in outcome.pods}
    assert set(placed.values()) - {None} <= {"n1", "n2"}  # 0.7 is above the default policy's 0.65
    assert placed["default/big-simulated-0"] is None
    big = next(p for p in outcome.pods if p.pod == "default/big-simulated-0")
    assert "1 node(s) had cpu_usage_avg_5m above 0.65" in big.reason
    assert "Insufficient cpu" in big.reason
    nodes = {n.node: n for n in outcome.nodes}
    assert nodes["n1"].cpu[0] == 2.0  # the snapshot's bound pod
    assert nodes["n1"].cpu[1] + nodes["n2"].cpu[1] == 2.0 + 4.0
    before, after = nodes["n2"].load["cpu_usage_avg_5m"]
    assert before == pytest.approx(0.5)
    assert before is not None
    assert after is not None
    assert after > before  # the placed pods' estimated usage
    assert list(nodes["hot"].load["cpu_usage_avg_5m"]) == [pytest.approx(0.7), pytest.approx(0.7)]


def test_a_gang_short_of_min_member_places_nobody() -> None:
    snap = snapshot(node("n1", 0.1, cpu="5"), node("n2", 0.1, cpu="5"))  # n1 holds 2 cores
    group = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "train"},
        "spec": {"minMember": 3},
    }
    job = {"kind": "Job", "metadata": {"name": "train"}}
    job["spec"] = {"parallelism": 3, "template": template("3", labels={"scheduling.x-k8s.io/pod-group": "train"})}
    snap["schedulerConfig"] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "plugins": {
                    "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
                    "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                },
            }
        ],
    }
    outcome = whatif.run(snap, whatif.expand([group, job]), whatif.base_setup(snap))
    assert [p.node for p in outcome.pods] == [None, None, None]  # two fit, the third does not: none kept
    assert all("gang default/train: 2 of minMember 3 members found a node" in p.reason for p in outcome.pods)
    # the member that found no place: the gang cycle's words (it never preempts for a gang's member)
    assert outcome.pods[2].reason.endswith(
        "2 Insufficient cpu. preemption: not attempted for a member of pod group default/train "
        "(gang preemption is not supported)"
    )
    assert {n.node: n.cpu[1] for n in outcome.nodes} == {"n1": 2.0, "n2": 0.0}  # reservations undone


def test_compare_runs_a_second_policy_on_the_same_input() -> None:
    snap = snapshot(node("n1", 0.2), node("warm", 0.7))
    policy = {
        "apiVersion": "scheduler.policy.crane.io/v1alpha1",
        "kind": "DynamicSchedulerPolicy",
        "spec": {
            "syncPolicy": [{"name": "cpu_usage_avg_5m", "period": "3m"}],
            "predicate": [{"name": "cpu_usage_avg_5m", "maxLimitPecent": 0.9}],
            "priority": [{"name": "cpu_usage_avg_5m", "weight": 1.0}],
        },
    }
    base = whatif.base_setup(snap)
    other = whatif.setup_of(policy, base, "loose")
    workload = whatif.expand([deployment("web", 6, "1")])
    strict, loose = (whatif.run(snap, workload, s) for s in (base, other))
    assert {p.node for p in strict.pods} == {"n1"}
    assert "warm" in {p.node for p in loose.pods}  # 0.7 passes a 0.9 threshold
    text = whatif.table([strict, loose])
    assert "as is: 6/6 pods placed" in text
    assert "loose: cpu_usage_avg_5m (0.9)" in text


# ------------------------------------------------------------------------------------------ the snapshot


def test_a_snapshot_never_keeps_env_commands_or_the_last_applied_manifest() -> None:
    pod: dict[str, Any] = {
        "metadata": {
            "name": "p",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...PASSWORD...}", "keep": "1"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "env": [{"name": "PASSWORD", "value": "hunter2"}],
                    "envFrom": [{"secretRef": {"name": "s"}}],
                    "command": ["run", "--token=abc"],
                    "args": ["--password=x"],
                    "resources": {"requests": {"cpu": "1"}},
                }
            ],
            "initContainers": [{"name": "i", "env": [{"name": "K", "value": "v"}]}],
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
                {"name": "creds", "secret": {"secretName": "s", "items": [{"key": "k", "path": "p"}]}},
            ],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1", "startTime": "2026-01-01T10:00:00Z"},
    }
    out = scrub_pod(pod)
    text = json.dumps(out)
    for secret in ("hunter2", "PASSWORD", "--token", "--password", "secretName", "managedFields", "podIP"):
        assert secret not in text, secret
    assert out["metadata"]["annotations"] == {"keep": "1"}
    assert out["spec"]["containers"][0]["resources"] == {"requests": {"cpu": "1"}}
    assert out["spec"]["volumes"] == [
        {"name": "data", "persistentVolumeClaim": {"claimName": "d"}},
        {"name": "creds", "secret": {}},
    ]
    assert pod["spec"]["containers"][0]["env"]  # the input is not changed
    assert out["status"] == {"phase": "Running", "startTime": "2026-01-01T10:00:00Z"}  # preemption orders by it


def test_a_file_that_is_not_a_snapshot_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump({"kind": "ConfigMap"}))
    with pytest.raises(ValueError, match="not a snapshot"):
        read(path)


# ------------------------------------------------------------------------------------------ the command


def test_simulate_prints_the_table_and_writes_a_png_and_a_self_contained_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snap, manifests = tmp_path / "snap.json", tmp_path / "app.yaml"
    snap.write_text(json.dumps(snapshot(node("n1", 0.2), node("n2", 0.5))))
    manifests.write_text(yaml.safe_dump_all([deployment("web", 3, "1")]))
    png, page = tmp_path / "out.png", tmp_path / "out.html"
    code = run_cli(monkeypatch, "simulate", "--snapshot", str(snap), "-f", str(manifests))
    code += run_cli(
        monkeypatch, "simulate", "--snapshot", str(snap), "-f", str(manifests), "--plot", str(png), "--html", str(page)
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "default/web-simulated-2" in out
    assert "as is: 3/3 pods placed, 0 pending" in out
    html = assert_plot_and_page(png, page)
    assert "default/web-simulated-2" in html


def test_simulate_json_and_a_bad_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snap, manifests = tmp_path / "snap.json", tmp_path / "app.yaml"
    snap.write_text(json.dumps(snapshot(node("n1", 0.2))))
    manifests.write_text(yaml.safe_dump_all([deployment("web", 2, "1")]))
    assert run_cli(monkeypatch, "simulate", "--snapshot", str(snap), "-f", str(manifests), "-o", "json") == 0
    body = json.loads(capsys.readouterr().out)
    assert [p["node"] for p in body["runs"][0]["pods"]] == ["n1", "n1"]
    assert body["runs"][0]["placed"] == 2
    assert body["runs"][0]["pods"][0]["feasible"] is None  # asked for only
    argv = ("simulate", "--snapshot", str(snap), "-f", str(manifests), "-o", "json", "--feasible")
    assert run_cli(monkeypatch, *argv) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["pods"][0]["feasible"] == ["n1"]
    manifests.write_text(yaml.safe_dump({"kind": "CronJob", "metadata": {"name": "c"}}))
    assert run_cli(monkeypatch, "simulate", "--snapshot", str(snap), "-f", str(manifests)) == 2
    assert "CronJob default/c: kind 'CronJob' is not simulated" in capsys.readouterr().err


class Response:
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.reason, self._body = status, "Status", body
        self.headers: dict[str, str] = {}

    async def read(self) -> bytes:
        return json.dumps(self._body).encode()


class FakeApi:
    """The list calls ``take`` makes, answered from ``pages`` (``(resource, continue token) -> (status, body)``);
    every call's keyword arguments are kept (each must carry a timeout)."""

    def __init__(self, pages: dict[tuple[str, str | None], tuple[int, dict[str, Any]]]) -> None:
        self.pages = pages
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, _api: Any) -> FakeApi:
        return self

    def _answer(self, resource: str, kw: dict[str, Any]) -> Any:
        self.calls.append((resource, kw))
        status, body = self.pages.get((resource, kw.get("_continue")), (200, {"items": []}))

        async def answer() -> Response:
            return Response(status, body)

        return answer()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("list_cluster_custom_object"):
            return lambda group, version, plural, **kw: self._answer(f"{plural}.{group}/{version}", kw)
        return lambda **kw: self._answer(name, kw)


def test_take_pages_scrubs_skips_what_is_not_served_and_names_what_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from cranectl import snapshot as snap_module

    pod_on = {"metadata": {"name": "a"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "env": [{}]}]}}
    pod_elsewhere = {"metadata": {"name": "b"}, "spec": {"nodeName": "other"}}
    pending = {"metadata": {"name": "c"}, "spec": {}, "status": {"phase": "Pending"}}
    done = {"metadata": {"name": "d"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Succeeded"}}
    fake = FakeApi(
        {
            ("list_node", None): (200, {"items": [{"metadata": {"name": "n1"}}]}),
            ("list_pod_for_all_namespaces", None): (
                200,
                {"items": [pod_on, pod_elsewhere], "metadata": {"continue": "t"}},
            ),
            ("list_pod_for_all_namespaces", "t"): (200, {"items": [pending, done]}),
            ("podgroups.scheduling.k8s.io/v1beta1", None): (404, {"message": "not found"}),
        }
    )
    monkeypatch.setattr("cranectl.snapshot.client.CoreV1Api", fake)
    monkeypatch.setattr("cranectl.snapshot.client.CustomObjectsApi", fake)
    doc = asyncio.run(snap_module.take(object(), node_selector="pool=a", timeout=7, now=NOW))
    assert [(o["kind"], o["metadata"]["name"]) for o in doc["objects"] if o["kind"] in ("Node", "Pod")] == [
        ("Node", "n1"),
        ("Pod", "a"),  # bound to a node of the snapshot
        ("Pod", "c"),  # pending (the second page)
    ]
    assert "env" not in json.dumps(doc["objects"])
    assert doc["notServed"] == ["podgroups.scheduling.k8s.io/v1beta1"]
    assert doc["takenAt"] == NOW.isoformat()
    assert all(kw.get("_request_timeout") == 7 for _, kw in fake.calls)  # every request has its timeout
    assert fake.calls[0] == (
        "list_node",
        {"limit": 500, "_preload_content": False, "_request_timeout": 7, "label_selector": "pool=a"},
    )
    fake.pages[("resourceslices.resource.k8s.io/v1", None)] = (403, {"message": "forbidden: cannot list"})
    with pytest.raises(
        snap_module.SnapshotError, match=r"listing resourceslices.resource.k8s.io/v1: HTTP 403 .*forbidden"
    ):
        asyncio.run(snap_module.take(object(), now=NOW))


def test_the_policy_a_scheduler_configuration_names_is_found() -> None:
    dynamic = {"name": "Dynamic", "args": {"policyConfigPath": "/etc/crane/policy.yaml"}}
    config = {"profiles": [{"schedulerName": "a"}, {"schedulerName": "b", "pluginConfig": [{"name": "X"}, dynamic]}]}
    assert policy_path_of(config) == "/etc/crane/policy.yaml"
    assert policy_path_of({"profiles": [{"schedulerName": "a"}]}) is None
    assert policy_path_of(None) is None


def test_priority_classes_order_the_pods_as_the_queue_would_and_an_unknown_one_is_refused() -> None:
    snap = snapshot(node("n1", 0.1, cpu="4"))  # 2 of its 4 cores taken: room for one 2-core pod
    high = {"kind": "PriorityClass", "metadata": {"name": "high"}, "value": 1000}
    low = {"kind": "PriorityClass", "metadata": {"name": "low"}, "value": 10, "globalDefault": True}
    snap["objects"] += [high, low]
    first = deployment("first", 1, "2")
    urgent = deployment("urgent", 1, "2")
    urgent["spec"]["template"]["spec"]["priorityClassName"] = "high"
    outcome = whatif.run(snap, whatif.expand([first, urgent]), whatif.base_setup(snap))
    assert [(p.pod, p.node) for p in outcome.pods] == [
        ("default/urgent-simulated-0", "n1"),  # 1000 before the global default's 10, though given second
        ("default/first-simulated-0", None),
    ]
    urgent["spec"]["template"]["spec"]["priorityClassName"] = "nope"
    with pytest.raises(whatif.ManifestError, match=r"urgent-simulated-0: spec\.priorityClassName 'nope'"):
        whatif.run(snap, whatif.expand([first, urgent]), whatif.base_setup(snap))


def test_a_pod_that_would_preempt_is_shown_with_its_node_and_victims_and_nothing_is_evicted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = snapshot(node("n1", 0.1, cpu="4"))  # the bound pod "old" (priority 0) holds 2 of its 4 cores
    base["objects"].append({"kind": "PriorityClass", "metadata": {"name": "high"}, "value": 1000})
    urgent, plain = deployment("urgent", 1, "3"), deployment("plain", 1, "3")
    urgent["spec"]["template"]["spec"]["priorityClassName"] = "high"
    snap, manifests = tmp_path / "snap.json", tmp_path / "app.yaml"
    snap.write_text(json.dumps(base))
    manifests.write_text(yaml.safe_dump_all([urgent, plain]))
    assert run_cli(monkeypatch, "simulate", "--snapshot", str(snap), "-f", str(manifests), "-o", "json") == 0
    pods = {p["pod"]: p for p in json.loads(capsys.readouterr().out)["runs"][0]["pods"]}
    would = pods["default/urgent-simulated-0"]
    assert would["node"] is None
    assert would["preemption"] == {"node": "n1", "victims": ["default/old"]}
    assert would["reason"] == "0/1 nodes are available: 1 Insufficient cpu."  # as the scheduler reports it then
    cannot = pods["default/plain-simulated-0"]  # old is not of lower priority, and stays: nothing was evicted
    assert cannot["preemption"] is None
    assert cannot["reason"] == (
        "0/1 nodes are available: 1 Insufficient cpu. "
        "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
    )
    assert run_cli(monkeypatch, "simulate", "--snapshot", str(snap), "-f", str(manifests)) == 0
    out = capsys.readouterr().out
    assert "  default/urgent-simulated-0: 0/1 nodes are available: 1 Insufficient cpu.\n" in out
    assert "    would preempt on n1: default/old\n" in out


def test_a_priority_class_gives_its_preemption_policy_as_admission_does() -> None:
    """A class with ``preemptionPolicy: Never``: its pod waits instead of being shown as preempting."""
    snap = snapshot(node("n1", 0.1, cpu="4"))  # 2 of its 4 cores taken by a pod of priority 0
    snap["objects"].append(
        {"kind": "PriorityClass", "metadata": {"name": "polite"}, "value": 1000, "preemptionPolicy": "Never"}
    )
    urgent = deployment("urgent", 1, "3")
    urgent["spec"]["template"]["spec"]["priorityClassName"] = "polite"
    [result] = whatif.run(snap, whatif.expand([urgent]), whatif.base_setup(snap)).pods
    assert result.node is None and result.preemption is None
    assert "not eligible due to preemptionPolicy=Never" in result.reason


def test_a_gated_pod_and_a_pod_bound_to_a_node_not_in_the_snapshot_stay_pending() -> None:
    snap = snapshot(node("n1", 0.2))
    spec = template("1")["spec"]
    gated = {"kind": "Pod", "metadata": {"name": "gated"}, "spec": {**spec, "schedulingGates": [{"name": "quota"}]}}
    ghost = {"kind": "Pod", "metadata": {"name": "ghost"}, "spec": {**spec, "nodeName": "gone"}}
    pods = whatif.run(snap, whatif.expand([gated, ghost]), whatif.base_setup(snap)).pods
    assert [(p.pod, p.node, p.reason) for p in pods] == [
        ("default/gated", None, "Scheduling is blocked due to non-empty scheduling gates (quota)"),
        ("default/ghost", None, "spec.nodeName: node 'gone' is not in the snapshot"),
    ]


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        (deployment("bad", 1, "2 cores"), r"pod default/bad-simulated-0: invalid quantity '2 cores'"),
        (
            {"kind": "Pod", "metadata": {"name": "t"}, "spec": {**template("1")["spec"], "tolerations": "x"}},
            r"pod default/t: ",
        ),
        (
            {"kind": "Pod", "metadata": {"name": "p"}, "spec": {**template("1")["spec"], "priority": "high"}},
            r"pod default/p: spec\.priority must be an integer",
        ),
        (
            {"kind": "Pod", "metadata": {"name": "n", "namespace": ["a"]}, "spec": template("1")["spec"]},
            r"metadata\.name and metadata\.namespace must be strings",
        ),
        (
            {
                "kind": "Deployment",
                "metadata": {"name": "d"},
                "spec": {"template": {"metadata": {"labels": ["a"]}, "spec": template("1")["spec"]}},
            },
            r"Deployment default/d: spec\.template\.metadata\.labels must be a mapping",
        ),
        (
            {"kind": "Pod", "metadata": {"name": "k"}, "spec": {**template("1")["spec"], "runtimeClassName": "kata"}},
            r"Pod default/k: spec\.runtimeClassName is not simulated .*give spec\.overhead",
        ),
    ],
)
def test_a_malformed_pod_is_refused_naming_it(doc: dict[str, Any], words: str) -> None:
    snap = snapshot(node("n1", 0.2))
    with pytest.raises(whatif.ManifestError, match=words):
        whatif.run(snap, whatif.expand([doc]), whatif.base_setup(snap))


def test_node_selector_with_a_snapshot_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snap, manifests = tmp_path / "snap.json", tmp_path / "app.yaml"
    snap.write_text(json.dumps(snapshot(node("n1", 0.2))))
    manifests.write_text(yaml.safe_dump(deployment("web", 1, "1")))
    argv = ("simulate", "--snapshot", str(snap), "-f", str(manifests), "--node-selector", "pool=none")
    assert run_cli(monkeypatch, *argv) == 2
    assert "--node-selector reads the live cluster's nodes" in capsys.readouterr().err


def test_a_snapshot_lists_every_kind_the_scheduler_reads_and_only_the_selector_of_owners() -> None:
    from crane_scheduler.simulate import Simulator
    from cranectl.snapshot import CORE, GROUPED, scrub

    core_kinds = {
        "nodes": "Node",
        "pods": "Pod",
        "namespaces": "Namespace",
        "persistentvolumeclaims": "PersistentVolumeClaim",
        "persistentvolumes": "PersistentVolume",
        "services": "Service",
        "replicationcontrollers": "ReplicationController",
    }
    assert set(CORE) == set(core_kinds)
    listed = set(core_kinds.values()) | {kind for kind, *_ in GROUPED}
    assert set(Simulator().kinds) <= listed
    rs = {
        "metadata": {"name": "web-1", "ownerReferences": [{"kind": "Deployment", "name": "web"}]},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"spec": {"containers": [{"name": "c", "env": [{"name": "TOKEN", "value": "s3cret"}]}]}},
        },
        "status": {"replicas": 3},
    }
    out = scrub(rs, "ReplicaSet")
    assert out == {
        "kind": "ReplicaSet",
        "metadata": rs["metadata"],
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
    }


def test_a_pod_naming_a_claim_template_gets_its_claim_as_the_claim_controller_makes_it() -> None:
    """A Deployment of GPU pods, each claim made from a template (given in the manifests or in the snapshot): one
    pod per device, the rest pending on the devices; a template nowhere is refused naming the pod's field."""
    from tests.support.dra import DRIVER, device, device_class, exactly, resource_slice

    snap = snapshot(node("n1", 0.2), node("n2", 0.3))
    snap["objects"] += [
        device_class("gpu", f'device.driver == "{DRIVER}"'),
        resource_slice("s1", [device("g0")], node="n1"),
        resource_slice("s2", [device("g0")], node="n2"),
    ]
    train = deployment("train", 3, "1")
    train["spec"]["template"]["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu"},
        "spec": {"spec": {"devices": {"requests": [exactly("g", "gpu")]}}},
    }
    placed = whatif.run(snap, whatif.expand([template, train]), whatif.base_setup(snap)).pods
    assert sorted(p.node or "-" for p in placed) == ["-", "n1", "n2"]
    assert "cannot allocate all claims" in next(p.reason for p in placed if p.node is None)
    snap["objects"].append({**template, "metadata": {"name": "one-gpu", "namespace": "default"}})
    from_snapshot = whatif.run(snap, whatif.expand([train]), whatif.base_setup(snap)).pods
    assert sorted(p.node or "-" for p in from_snapshot) == ["-", "n1", "n2"]
    snap["objects"].pop()
    with pytest.raises(whatif.ManifestError, match=r"spec\.resourceClaims\[0\]\.resourceClaimTemplateName 'one-gpu'"):
        whatif.run(snap, whatif.expand([train]), whatif.base_setup(snap))


def test_pods_naming_a_scheduler_no_profile_serves_are_decided_with_the_first_and_said_so() -> None:
    snap = snapshot(node("n1", 0.2))
    other = {"kind": "Pod", "metadata": {"name": "v"}, "spec": {**template("1")["spec"], "schedulerName": "volcano"}}
    mine = {
        "kind": "Pod",
        "metadata": {"name": "c"},
        "spec": {**template("1")["spec"], "schedulerName": "crane-scheduler"},
    }
    outcome = whatif.run(snap, whatif.expand([other, mine]), whatif.base_setup(snap))
    assert [p.node for p in outcome.pods] == ["n1", "n1"]
    assert outcome.stand_in == {"volcano": ["default/v"]} and outcome.stand_in_profile == "crane-scheduler"
    assert (
        "as is: 1 pods name schedulerName 'volcano', which no profile serves: decided with profile "
        "'crane-scheduler' as if they named it"
    ) in whatif.table([outcome])
