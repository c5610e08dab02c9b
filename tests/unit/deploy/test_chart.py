"""The Helm chart: lint, render, and the properties every rendering keeps (least privilege, non-root, read-only,
PDBs, NetworkPolicies), plus the rule that deploy/kubernetes/ is the chart rendered, never edited by hand."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml

from crane_annotator.config import parse_config
from tests.support.deploy import ALERTS, CHART, REPO, by_kind, helm, prefetch, render

prefetch("tools", "helm")

FULL = [
    "--set",
    "extender.enabled=true,serviceMonitor.enabled=true,prometheusRule.enabled=true,dashboards.enabled=true",
]
EXTERNAL_REDIS = [
    "--set",
    "redis.enabled=false,redis.external.url=rediss://redis.example:6380/2,redis.auth.existingSecret=ext,"
    "redis.tls.caSecret=redis-ca,prometheus.url=https://prom.example,prometheus.tls.caSecret=prom-ca,"
    "prometheus.bearerTokenSecret=prom-token",
]
SERVICES = ("event-recorder", "annotator", "scheduler", "extender", "descheduler")


def test_helm_lint_passes_for_the_default_and_the_full_configuration() -> None:
    for args in ([], FULL, EXTERNAL_REDIS, ["--strict"]):
        result = helm("lint", str(CHART), *args)
        assert "0 chart(s) failed" in result.stdout, result.stdout


def test_lint_refuses_external_redis_without_a_url() -> None:
    result = helm("template", "crane", str(CHART), "--set", "redis.enabled=false", check=False)
    assert result.returncode != 0
    assert "redis.external.url is required" in result.stderr


def test_committed_plain_manifests_are_the_chart_rendered() -> None:
    result = subprocess.run(
        [str(REPO / "scripts" / "render-manifests"), "--check"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr


def test_every_pod_is_non_root_read_only_and_drops_all_capabilities() -> None:
    for d in by_kind(render(*FULL), "Deployment").values():
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, d["metadata"]["name"]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], c["name"]


# The one built-in role the chart binds: delegated /metrics access (TokenReview + SubjectAccessReview create).
AUTH_DELEGATOR = [
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
]


def _rules_of(objects: list[dict[str, Any]], subject: str) -> list[dict[str, Any]]:
    """Every RBAC rule bound to the ServiceAccount ``subject`` (cluster-wide and namespaced)."""
    roles = {(o["kind"], o["metadata"]["name"]): o["rules"] for o in objects if o["kind"] in ("ClusterRole", "Role")}
    roles[("ClusterRole", "system:auth-delegator")] = AUTH_DELEGATOR
    rules: list[dict[str, Any]] = []
    for b in objects:
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding") and any(s["name"] == subject for s in b["subjects"]):
            rules += roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
    return rules


def _granted(objects: list[dict[str, Any]], subject: str) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every rule bound to the ServiceAccount ``subject``."""
    return {
        (group, resource, verb)
        for rule in _rules_of(objects, subject)
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_annotator_watches_pods_and_patches_node_status_only_with_spec_reclaim() -> None:
    objects = render("--set", "policy.spec.reclaim.maxAge=5m")
    granted = _granted(objects, "crane-annotator")
    assert {("", "pods", "list"), ("", "pods", "watch"), ("", "nodes/status", "patch")} <= granted
    assert not {(g, r, v) for g, r, v in granted if r.startswith("pods") and v not in ("list", "watch")}
    assert ("", "nodes/status", "update") not in granted


def test_the_load_taint_adds_node_events_and_joins_the_uninstall_hook_with_its_least_privilege_account() -> None:
    plain = render()
    assert "crane-uninstall" not in json.dumps(plain), "no hook and no account without spec.loadTaint or reclaim"
    assert not [r for r in _rules_of(plain, "crane-annotator") if "events.k8s.io" in r["apiGroups"]]
    assert not [r for r in _rules_of(plain, "crane-annotator") if "nodes" in r["resources"] and "get" in r["verbs"]]
    objects = render("--set", "policy.spec.loadTaint.hotRounds=2")
    events = [r for r in _rules_of(objects, "crane-annotator") if "events.k8s.io" in r["apiGroups"]]
    assert events == [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}]
    assert {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]} in _rules_of(objects, "crane-annotator")
    assert by_kind(objects, "Role")["crane-annotator-node-events"]["metadata"]["namespace"] == "default"
    hooks = [o for o in objects if o["metadata"]["name"] == "crane-uninstall"]
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Job"}
    assert {o["kind"] for o in hooks} == kinds
    for o in hooks:  # created before the release's objects go, removed once it succeeded
        assert o["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete", o["kind"]
    weights = {o["kind"]: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for o in hooks}
    assert max(w for k, w in weights.items() if k != "Job") < weights["Job"], "the account exists before the Job"

    def steps(objects: list[dict[str, Any]]) -> list[list[str]]:
        pod = by_kind(objects, "Job")["crane-uninstall"]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "crane-uninstall"
        return [c["command"] for c in [*pod.get("initContainers", []), *pod["containers"]]]

    stop = [
        "cranectl",
        "stop-annotator",
        "--deployment=crane-system/crane-annotator",
        "--lease=crane-system/crane-annotator",
        "--timeout=120",
    ]
    clear, withdraw = ["cranectl", "load-taint", "clear"], ["cranectl", "withdraw-batch"]
    assert steps(objects) == [stop, clear]
    both = render("--set", "policy.spec.loadTaint.hotRounds=2,policy.spec.reclaim.maxAge=5m")
    assert steps(both) == [stop, clear, withdraw]
    assert steps(render("--set", "policy.spec.reclaim.maxAge=5m")) == [stop, withdraw]

    def granted(objects: list[dict[str, Any]]) -> set[tuple[str, str, str, tuple[str, ...]]]:
        return {
            (group, resource, verb, tuple(rule.get("resourceNames", ())))
            for rule in _rules_of(objects, "crane-uninstall")
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
        }

    stopping = {
        ("apps", "deployments/scale", "patch", ("crane-annotator",)),
        ("coordination.k8s.io", "leases", "get", ("crane-annotator",)),
    }
    assert granted(objects) == stopping | {("", "nodes", v, ()) for v in ("get", "list", "patch")}
    assert granted(both) == granted(objects) | {("", "nodes/status", "patch", ())}
    off = render("--set", "policy.spec.loadTaint.hotRounds=2,annotator.loadTaintCleanup.enabled=false")
    assert "Job" not in {o["kind"] for o in off}


DELETES = {("crane-scheduler", "pods", "delete"), ("crane-scheduler", "resourceclaims", "delete")}


def test_rbac_is_least_privilege_per_service() -> None:
    objects = render(*FULL)
    allowed = {
        "crane-event-recorder": {("", "events", "list"), ("", "events", "watch")},
        "crane-annotator": {("", "nodes", "list"), ("", "nodes", "watch"), ("", "nodes", "patch")},
        "crane-scheduler": {
            ("", "nodes", "list"),
            ("", "pods", "get"),
            ("", "pods/binding", "create"),
            ("", "persistentvolumes", "update"),  # VolumeBinding's PreBind
            ("", "persistentvolumeclaims", "update"),
            ("storage.k8s.io", "csinodes", "watch"),
            ("storage.k8s.io", "csistoragecapacities", "watch"),  # VolumeBinding's capacity check
            ("storage.k8s.io", "csidrivers", "list"),
            ("policy", "poddisruptionbudgets", "watch"),
            ("", "pods", "delete"),  # DefaultPreemption evicts its victims, as kube-scheduler does
            ("resource.k8s.io", "resourceclaims", "update"),  # DynamicResources' PreBind: the finalizer
            ("resource.k8s.io", "resourceclaims/status", "update"),  # ... the allocation and reservation
            ("resource.k8s.io", "resourceclaims/binding", "update"),  # ... authorized there too since 1.36
            ("resource.k8s.io", "resourceslices", "watch"),
            ("resource.k8s.io", "deviceclasses", "watch"),
        },
        "crane-extender": {("", "nodes", "list"), ("", "nodes", "watch")},
        "crane-descheduler": {
            ("", "nodes", "list"),
            ("", "pods", "watch"),
            ("", "pods/eviction", "create"),  # the Eviction API only: PDBs honoured, never a delete
            ("policy", "poddisruptionbudgets", "watch"),
            ("apps", "replicasets", "watch"),  # the workload budget counts a ReplicaSet's Deployment
            ("events.k8s.io", "events", "create"),  # the one Event format of every service
        },
        "crane-redis": set(),
    }
    for sa, must in allowed.items():
        if sa != "crane-redis":  # delegated /metrics: each service asks the API server about its scrapers
            must = must | {("authentication.k8s.io", "tokenreviews", "create")}
        granted = _granted(objects, sa)
        assert must <= granted, (sa, must - granted)
        for group, resource, verb in granted:
            assert "*" not in (group, resource, verb), (sa, group, resource, verb)
            assert resource not in ("secrets", "configmaps"), (sa, resource)
            # the scheduler deletes pods (preemption's victims) and, as kube-scheduler 1.37 does, the extended-
            # resource claim of a pod's earlier attempt (DRAExtendedResource)
            if (sa, resource, verb) not in {
                ("crane-scheduler", "pods", "delete"),
                ("crane-scheduler", "resourceclaims", "delete"),
            }:
                assert verb not in ("delete", "deletecollection", "escalate", "bind", "impersonate"), (
                    sa,
                    resource,
                    verb,
                )
    annotator = {
        (r, v) for rule in _rules_of(objects, "crane-annotator") for r in rule["resources"] for v in rule["verbs"]
    }
    assert ("pods", "list") not in annotator  # no spec.reclaim: no pod is read
    # ... but node status is patched: an annotator without spec.reclaim withdraws a loan an earlier one left
    assert ("nodes/status", "patch") in annotator
    descheduler = _granted(objects, "crane-descheduler")
    assert ("", "pods", "delete") not in descheduler and ("", "pods", "patch") not in descheduler
    assert ("", "events", "create") not in descheduler  # events.k8s.io only, as every other service
    # Lease access: create, then only their own Lease by name.
    for sa in ("crane-annotator", "crane-scheduler", "crane-descheduler"):
        lease_rules = [r for r in _rules_of(objects, sa) if r["resources"] == ["leases"]]
        named = [r for r in lease_rules if "update" in r["verbs"]]
        assert named and all(r.get("resourceNames") == [sa] for r in named), (sa, lease_rules)


def test_the_snapshot_account_is_opt_in_and_may_only_list_what_a_snapshot_reads() -> None:
    from cranectl.snapshot import CORE, GROUPED

    assert "crane-snapshot" not in json.dumps(render(*FULL)), "off by default"
    objects = render("--set", "snapshot.rbac.enabled=true")
    ours = [o for o in objects if o["metadata"]["name"] == "crane-snapshot"]
    assert {o["kind"] for o in ours} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    granted = _granted(objects, "crane-snapshot")
    # list, exactly the kinds cranectl snapshot lists: no get, no watch, no write, no Secret, no ConfigMap
    assert granted == {("", r, "list") for r in CORE} | {(g, p, "list") for _, g, _, p in GROUPED}
    assert not any(
        rule.get("resourceNames") or rule.get("nonResourceURLs") for rule in _rules_of(objects, "crane-snapshot")
    )


def test_each_service_has_its_account_pdb_network_policy_and_metrics_service() -> None:
    objects = render(*FULL)
    deployments = by_kind(objects, "Deployment")
    for svc in SERVICES:
        name = f"crane-{svc}"
        pod = deployments[name]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == name
        assert name in by_kind(objects, "ServiceAccount")
        assert by_kind(objects, "PodDisruptionBudget")[name]["spec"]["minAvailable"] == 1
        policy = by_kind(objects, "NetworkPolicy")[name]
        assert policy["spec"]["podSelector"]["matchLabels"] == deployments[name]["spec"]["selector"]["matchLabels"]
        assert by_kind(objects, "Service")[name]["spec"]["ports"][0]["name"] == "http"
    redis_policy = by_kind(objects, "NetworkPolicy")["crane-redis"]["spec"]["ingress"][0]["from"][0]["podSelector"]
    assert redis_policy["matchExpressions"][0]["values"] == ["event-recorder", "annotator", "extender"]


def test_single_replica_gets_no_pdb_that_would_block_every_drain() -> None:
    objects = render("--set", "annotator.replicas=1")
    assert "crane-annotator" not in by_kind(objects, "PodDisruptionBudget")
    assert "crane-scheduler" in by_kind(objects, "PodDisruptionBudget")


def test_redis_in_chart_gets_a_generated_password_kept_across_upgrades() -> None:
    secret = by_kind(render(), "Secret")["crane-redis-auth"]
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(secret["data"]["password"]) > 40
    env = {
        e["name"]: e.get("value")
        for e in by_kind(render(), "Deployment")["crane-event-recorder"]["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    assert env["CRANE_REDIS_URL"] == "redis://crane-redis.crane-system.svc:6379/0"
    assert env["CRANE_REDIS_PASSWORD_FILE"] == "/etc/crane/redis/password"


def test_external_redis_and_prometheus_with_tls() -> None:
    objects = render(*EXTERNAL_REDIS)
    assert "crane-redis" not in by_kind(objects, "Deployment")
    assert not by_kind(objects, "Secret")
    pod = by_kind(objects, "Deployment")["crane-annotator"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["CRANE_REDIS_URL"] == "rediss://redis.example:6380/2"
    assert env["CRANE_REDIS_CA_FILE"] == "/etc/crane/redis-ca/ca.crt"
    assert env["CRANE_PROMETHEUS_URL"] == "https://prom.example"
    assert env["CRANE_PROMETHEUS_CA_FILE"] == "/etc/crane/prometheus-ca/ca.crt"
    assert env["CRANE_PROMETHEUS_BEARER_TOKEN_FILE"] == "/etc/crane/prometheus-token/token"
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {
        "redis-auth": "ext",
        "redis-ca": "redis-ca",
        "prometheus-ca": "prom-ca",
        "prometheus-token": "prom-token",
    }


def test_every_prometheus_setting_is_wired_from_values_with_secrets_mounted_never_inlined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = render(
        "--set",
        "prometheus.url=https://mimir.example/prometheus,prometheus.tenant=team-a,prometheus.headers.X-Team=sched,"
        "prometheus.queryParams.dedup=true,prometheus.partialResponse=accept,prometheus.denyPartialResponse=true,"
        "prometheus.latencyOffset=30s,prometheus.proxyFromEnvironment=false,prometheus.tls.clientCertSecret=client,"
        "prometheus.basicAuth.username=crane,prometheus.basicAuth.passwordSecret=prom-pw,prometheus.headersSecret=hdr",
    )
    pod = by_kind(objects, "Deployment")["crane-annotator"]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert {k: v for k, v in env.items() if k.startswith("CRANE_PROMETHEUS_")} == {
        "CRANE_PROMETHEUS_URL": "https://mimir.example/prometheus",
        "CRANE_PROMETHEUS_TIMEOUT": "10s",
        "CRANE_PROMETHEUS_PARTIAL_RESPONSE": "accept",
        "CRANE_PROMETHEUS_LATENCY_OFFSET": "30s",
        "CRANE_PROMETHEUS_DENY_PARTIAL_RESPONSE": "true",
        "CRANE_PROMETHEUS_NO_PROXY_FROM_ENVIRONMENT": "true",
        "CRANE_PROMETHEUS_TENANT": "team-a",
        "CRANE_PROMETHEUS_HEADERS": "X-Team: sched",
        "CRANE_PROMETHEUS_QUERY_PARAMS": "dedup=true",
        "CRANE_PROMETHEUS_CLIENT_CERT_FILE": "/etc/crane/prometheus-client/tls.crt",
        "CRANE_PROMETHEUS_CLIENT_KEY_FILE": "/etc/crane/prometheus-client/tls.key",
        "CRANE_PROMETHEUS_USERNAME": "crane",
        "CRANE_PROMETHEUS_PASSWORD_FILE": "/etc/crane/prometheus-password/password",
        "CRANE_PROMETHEUS_HEADERS_FILE": "/etc/crane/prometheus-headers/headers",
    }
    mounted = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    for volume, secret in (
        ("prometheus-client", "client"),
        ("prometheus-password", "prom-pw"),
        ("prometheus-headers", "hdr"),
    ):
        assert secrets[volume] == secret and mounted[volume].startswith("/etc/crane/")
    # the annotator parses exactly what the chart renders
    for name, value in env.items():
        if name.startswith("CRANE_PROMETHEUS_"):
            monkeypatch.setenv(name, value)
    section = parse_config([]).prometheus
    assert (section.tenant, section.headers, section.query_params) == (
        "team-a",
        (("X-Team", "sched"),),
        (("dedup", "true"),),
    )
    assert (section.partial_response, section.deny_partial_response, section.proxy_from_environment) == (
        "accept",
        True,
        False,
    )
    assert section.latency_offset == 30.0 and section.client_key_file == "/etc/crane/prometheus-client/tls.key"


def test_basic_auth_without_its_password_secret_is_refused_by_the_chart() -> None:
    result = helm("template", "crane", str(CHART), "--set", "prometheus.basicAuth.username=crane", check=False)
    assert result.returncode != 0 and "prometheus.basicAuth.passwordSecret" in result.stderr


def test_scheduler_configuration_from_values() -> None:
    objects = render("--set", "scheduler.extraConfig.percentageOfNodesToScore=50", release="prod")
    config = yaml.safe_load(by_kind(objects, "ConfigMap")["prod-scheduler-config"]["data"]["config.yaml"])
    assert config["leaderElection"] == {"resourceNamespace": "crane-system", "resourceName": "prod-scheduler"}
    assert config["percentageOfNodesToScore"] == 50
    assert config["profiles"][0]["schedulerName"] == "crane-scheduler"


def test_the_event_recorder_records_the_bindings_of_every_profile_of_the_scheduler() -> None:
    """An event's reportingController is its profile's name: a profile added in values must count in the hot
    values, not be skipped as untrusted by the recorder's default list."""
    objects = render(
        "--set",
        "scheduler.profiles[0].schedulerName=crane-scheduler",
        "--set",
        "scheduler.profiles[1].schedulerName=crane-batch",
    )
    [recorder] = [o for name, o in by_kind(objects, "Deployment").items() if name.endswith("event-recorder")]
    env = {e["name"]: e.get("value") for e in recorder["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CRANE_REPORTING_CONTROLLERS"] == "default-scheduler,crane-scheduler,crane-batch"


def test_monitoring_objects_carry_the_shipped_rules_and_dashboards() -> None:
    objects = render(*FULL)
    rule = by_kind(objects, "PrometheusRule")["crane"]
    alerts = yaml.safe_load(ALERTS.read_text())["groups"]
    recording = yaml.safe_load((CHART / "files" / "recording-rules.yml").read_text())["groups"]
    assert rule["spec"]["groups"] == recording + alerts
    monitor = by_kind(objects, "ServiceMonitor")["crane"]
    assert set(monitor["spec"]["selector"]["matchExpressions"][0]["values"]) == set(SERVICES)
    dashboards = [o for o in objects if o["kind"] == "ConfigMap" and "-dashboard-" in o["metadata"]["name"]]
    assert {o["metadata"]["labels"]["grafana_dashboard"] for o in dashboards} == {"1"}
    shipped = {p.name: json.loads(p.read_text()) for p in (CHART / "files" / "dashboards").glob("*.json")}
    assert {k: json.loads(v) for o in dashboards for k, v in o["data"].items()} == shipped


def test_prometheus_operator_objects_and_dashboards_are_off_by_default() -> None:
    objects = render()
    assert not {o["kind"] for o in objects} & {"ServiceMonitor", "PrometheusRule"}
    assert not [o for o in objects if "-dashboard-" in o["metadata"]["name"]]
    assert "crane-extender" not in by_kind(objects, "Deployment")


def test_no_secret_is_expanded_onto_a_command_line() -> None:
    """Kubernetes expands ``$(VAR)`` in command/args into the process' argv, readable by every process on the node
    in /proc/<pid>/cmdline: no container may do that with a variable that comes from a Secret; Redis gets its
    password through a 0600 config file written by the shell's printf builtin."""
    for name, deployment in by_kind(render(), "Deployment").items():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            secret_vars = {
                e["name"] for e in container.get("env") or () if "secretKeyRef" in (e.get("valueFrom") or {})
            }
            argv = " ".join([*(container.get("command") or ()), *(container.get("args") or ())])
            leaked = [v for v in secret_vars if f"$({v})" in argv]
            assert not leaked, f"{name}/{container['name']} puts {leaked} on its command line"
    redis = by_kind(render(), "Deployment")["crane-redis"]["spec"]["template"]["spec"]["containers"][0]
    assert "printf 'requirepass %s\\n' \"$REDIS_PASSWORD\" > /data/.auth.conf" in redis["args"][0]
    assert "exec redis-server /data/.auth.conf" in redis["args"][0]


def test_the_nrt_crd_ships_in_the_chart_and_topology_awareness_grants_only_what_the_plugin_needs() -> None:
    crd = yaml.safe_load((CHART / "crds" / "topology.crane.io_noderesourcetopologies.yaml").read_text())
    assert (crd["kind"], crd["spec"]["group"]) == ("CustomResourceDefinition", "topology.crane.io")

    def nrt_verbs(*values: str) -> set[tuple[str, str, str]]:
        return {
            (group, resource, verb)
            for rule in _rules_of(render(*values), "crane-scheduler")
            for group in rule["apiGroups"]
            for resource in rule["resources"]
            for verb in rule["verbs"]
            if group == "topology.crane.io" or (verb == "patch" and resource == "pods")
        }

    assert nrt_verbs() == set()
    assert nrt_verbs("--set", "scheduler.topologyAware=true") == {
        ("topology.crane.io", "noderesourcetopologies", "list"),
        ("topology.crane.io", "noderesourcetopologies", "watch"),
        ("", "pods", "patch"),
    }


def test_the_podgroup_crd_ships_and_the_scheduler_may_only_read_gangs_and_write_podgroup_status() -> None:
    crd = yaml.safe_load((CHART / "crds" / "scheduling.x-k8s.io_podgroups.yaml").read_text())
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"], crd["spec"]["scope"]) == (
        "scheduling.x-k8s.io",
        "PodGroup",
        "Namespaced",
    )
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    verbs = {
        (resource, verb)
        for rule in _rules_of(render(), "crane-scheduler")
        if "scheduling.x-k8s.io" in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert verbs == {
        ("podgroups", "get"),
        ("podgroups", "list"),
        ("podgroups", "watch"),
        ("podgroups/status", "update"),
        ("podgroups/status", "patch"),
    }
    workloads = {
        (resource, verb)
        for rule in _rules_of(render(), "crane-scheduler")
        if "scheduling.k8s.io" in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # GangScheduling: the Workload API, 1.37's PodGroups or 1.35's Workloads; read only
    assert workloads == {("podgroups", "list"), ("podgroups", "watch"), ("workloads", "list"), ("workloads", "watch")}


def test_metrics_are_delegated_by_default_and_the_service_monitor_scrapes_with_the_reader_account() -> None:
    objects = render(*FULL)
    for name, d in by_kind(objects, "Deployment").items():
        if name == "crane-redis":
            continue
        container = d["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["CRANE_METRICS_ACCESS"] == "delegated", name
        assert d["spec"]["template"]["spec"].get("automountServiceAccountToken", True) is True, name
    delegator = by_kind(objects, "ClusterRoleBinding")["crane-auth-delegator"]
    assert {s["name"] for s in delegator["subjects"]} == {f"crane-{s}" for s in SERVICES}
    assert by_kind(objects, "ClusterRole")["crane-metrics-reader"]["rules"] == [
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}
    ]
    readers = by_kind(objects, "ClusterRoleBinding")["crane-metrics-reader"]["subjects"]
    assert readers == [{"kind": "ServiceAccount", "name": "crane-metrics-scraper", "namespace": "crane-system"}]
    assert _rules_of(objects, "crane-metrics-scraper") == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    endpoint = next(iter(by_kind(objects, "ServiceMonitor").values()))["spec"]["endpoints"][0]
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "crane-metrics-scraper", "key": "token"},
    }
    secret = by_kind(objects, "Secret")["crane-metrics-scraper"]
    assert secret["type"] == "kubernetes.io/service-account-token"
    # "any" is still there for clusters whose Prometheus cannot send a token (the NetworkPolicy then limits it)
    opened = render("--set", "metrics.access=any,serviceMonitor.enabled=true")
    assert "crane-auth-delegator" not in by_kind(opened, "ClusterRoleBinding")
    assert "authorization" not in next(iter(by_kind(opened, "ServiceMonitor").values()))["spec"]["endpoints"][0]


def test_the_sandbox_applies_the_charts_own_roles_per_namespace() -> None:
    """``crane_sandbox.rbac`` (what the tests and the sandbox run the services under) is the chart rendered: the
    same rules, only the release namespace and name prefix differ, and nothing but accounts, roles, bindings."""
    from crane_sandbox.rbac import chart_prefix, chart_rbac

    namespace = "t-42-a-test-name-that-is-longer-than-forty-characters"
    objects = chart_rbac(namespace)
    prefix = chart_prefix(namespace)
    assert len(prefix) <= 40 and not prefix.endswith("-")
    assert {o["kind"] for o in objects} <= {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    }
    assert "zz-placeholder" not in json.dumps(objects)
    shipped = render(
        "--set",
        "fullnameOverride=crane,extender.enabled=true,scheduler.topologyAware=true,serviceMonitor.enabled=true,"
        "policy.spec.reclaim.maxAge=5m,policy.spec.loadTaint.hotRounds=2,snapshot.rbac.enabled=true",
    )
    for kind in ("ClusterRole", "Role"):  # the same rules; Lease names carry the prefix
        ours = {
            n.removeprefix(prefix): json.dumps(o["rules"]).replace(f'"{prefix}-', '"P-')
            for n, o in by_kind(objects, kind).items()
        }
        theirs = {
            n.removeprefix("crane"): json.dumps(o["rules"]).replace('"crane-', '"P-')
            for n, o in by_kind(shipped, kind).items()
        }
        assert ours == theirs, kind
    for service in SERVICES:
        account = f"{prefix}-{service}"
        assert by_kind(objects, "ServiceAccount")[account]["metadata"]["namespace"] == namespace
        assert _rules_of(objects, account), account


def test_external_redis_behind_sentinel_gets_the_sentinels_password_from_a_secret() -> None:
    objects = render(
        "--set",
        "redis.enabled=false,redis.external.url=redis+sentinel://s0:26379\\,s1:26379/crane/0,"
        "redis.external.sentinelPasswordSecret=sentinel-pw",
    )
    for name in ("crane-annotator", "crane-event-recorder"):
        pod = by_kind(objects, "Deployment")[name]["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["CRANE_REDIS_URL"] == "redis+sentinel://s0:26379,s1:26379/crane/0"
        assert env["CRANE_REDIS_SENTINEL_PASSWORD_FILE"] == "/etc/crane/redis-sentinel/password"
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert secrets["redis-sentinel"] == "sentinel-pw"
