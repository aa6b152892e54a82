"""Unit tests of the operator's pure parts: spot detection and sizing, preemption signals, status and
cost, spec checks, the CRD, and the children's manifests (validated strictly with kubernetes-validate)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jsonschema
import kubernetes_validate
import pytest

from rlboost.auth.credentials import ROLE_ITEMS, generate_items
from rlboost.spec import JobSpec, JobSpecError, PoolSpec, parse_job_spec
from rlboost.wire.events import JobDone, StepReport, ValidationReport
from rlboost_operator import children, crd, spot, status
from rlboost_operator.checks import SpecProblemError, check_job, check_reward
from rlboost_operator.config import OperatorSettings, load_settings

K8S_VERSION = "1.30.0"


def node(name: str, labels: dict[str, str], gpus: int = 1, ready: bool = True, taints=None, unschedulable=False):
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": str(ready)}],
        },
    }


@pytest.mark.parametrize(
    ("labels", "provider"),
    [
        ({"cloud.google.com/gke-spot": "true"}, "gke"),
        ({"eks.amazonaws.com/capacityType": "SPOT"}, "eks"),
        ({"karpenter.sh/capacity-type": "spot"}, "karpenter"),
        ({"kubernetes.azure.com/scalesetpriority": "spot"}, "aks"),
        ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, None),
        ({}, None),
    ],
)
def test_spot_provider_per_cloud(labels, provider):
    assert spot.spot_provider(node("n", labels)) == provider


def test_desired_spot_replicas_counts_accelerators_of_matching_usable_nodes_and_clamps():
    pool = PoolSpec(min_replicas=1, max_replicas=5, gpus_per_worker=2, node_selector={"pool": "h100"})
    gke = {"cloud.google.com/gke-spot": "true", "pool": "h100"}
    nodes = [
        node("a", gke, gpus=4),  # 2 workers
        node("b", gke, gpus=3),  # 1 worker (3 // 2)
        node("c", {"cloud.google.com/gke-spot": "true", "pool": "a100"}, gpus=8),  # other pool
        node("d", {"pool": "h100"}, gpus=8),  # not spot
        node("e", gke, gpus=8, ready=False),  # NotReady
        node("f", gke, gpus=8, taints=[{"key": "cloud.google.com/impending-node-termination"}]),  # going away
    ]
    assert spot.spot_capacity(nodes, pool) == 3
    assert spot.spot_accelerators(nodes, pool) == 7
    assert spot.desired_spot_replicas(nodes, pool) == 3
    assert spot.desired_spot_replicas([], pool) == 1  # the minimum
    assert spot.desired_spot_replicas(nodes * 3, pool) == 5  # the maximum
    cpu_pool = PoolSpec(min_replicas=0, max_replicas=10, node_selector={"pool": "h100"})
    assert spot.spot_capacity(nodes, cpu_pool) == 2  # one CPU worker per usable node


@pytest.mark.parametrize(
    ("taint", "reason", "deadline"),
    [
        ("cloud.google.com/impending-node-termination", "gke-termination", 30.0),
        ("aws-node-termination-handler/spot-itn", "aws-spot-interruption", 120.0),
        ("aws-node-termination-handler/rebalance-recommendation", "aws-rebalance-recommendation", 600.0),
        ("karpenter.sh/disrupted", "karpenter-disrupted", 30.0),
        ("ToBeDeletedByClusterAutoscaler", "cluster-autoscaler-scale-down", 30.0),
    ],
)
def test_preemption_taints(taint, reason, deadline):
    signal = spot.preemption(node("n", {}, taints=[{"key": taint, "effect": "NoSchedule"}]))
    assert signal == spot.Preemption("n", reason, deadline)


def test_preemption_from_state_changes_and_the_soonest_taint_wins():
    assert spot.preemption(node("n", {})) is None
    assert spot.preemption(node("n", {}), deleted=True).reason == "node-deleted"
    assert spot.preemption(node("n", {}, ready=False)).reason == "node-not-ready"
    assert spot.preemption(node("n", {}, unschedulable=True)).reason == "node-unschedulable"
    both = [
        {"key": "aws-node-termination-handler/rebalance-recommendation"},
        {"key": "aws-node-termination-handler/spot-itn"},
    ]
    assert spot.preemption(node("n", {}, taints=both)).reason == "aws-spot-interruption"


def test_spot_scheduling_targets_every_clouds_spot_label():
    sched = spot.spot_scheduling(PoolSpec(gpus_per_worker=1, node_selector={"x": "y"}))
    terms = sched["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {t["matchExpressions"][0]["key"] for t in terms}
    assert {"cloud.google.com/gke-spot", "eks.amazonaws.com/capacityType", "karpenter.sh/capacity-type"} <= keys
    assert sched["nodeSelector"] == {"x": "y"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in sched["tolerations"]
    reserved = spot.reserved_scheduling(PoolSpec())
    exprs = reserved["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][
        0
    ]["matchExpressions"]
    assert all(e["operator"] == "NotIn" for e in exprs)


def gpu_spec() -> JobSpec:
    return parse_job_spec(
        {
            "trainer": {"ranks": 2, "gpusPerRank": 1},
            "rollout": {"reserved": {"gpusPerWorker": 1}, "spot": {"gpusPerWorker": 2}},
            "prices": {"reservedPerGpuHour": 10.0, "spotPerGpuHour": 2.5},
        }
    )


def test_cost_per_hour_and_efficiency():
    spec = gpu_spec()
    assert status.accelerator_counts(spec, reserved_workers=1, spot_workers=3) == (3, 6)
    assert status.cost_per_hour(spec, 1, 3) == 3 * 10.0 + 6 * 2.5
    assert status.cost_efficiency(100.0, 45.0) == pytest.approx(8000.0)
    assert status.cost_efficiency(100.0, 0.0) == 0.0
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    assert status.accumulate_cost(1.0, 36.0, t0, t0 + timedelta(minutes=10)) == pytest.approx(7.0)
    assert status.accumulate_cost(1.0, 36.0, None, t0) == 1.0


def test_step_status_integrates_cost_at_the_previous_rate_and_keeps_terminal_phases():
    spec = gpu_spec()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    report = StepReport(
        step=5,
        reward_mean=0.5,
        tokens=600,
        rollout_seconds=2,
        train_seconds=0.5,
        sync_seconds=0.5,
        weight_version=5,
        weights_checksum="x",
    )
    prev = {"phase": "Pending", "costPerHour": 36.0, "costSoFar": 2.0, "updatedAt": status.now_iso(t0)}
    st = status.step_status(report, spec, {"reserved": 1, "spot": 3}, prev, t0 + timedelta(hours=0.5))
    assert st["phase"] == "Running"
    assert st["tokensPerSecond"] == 200.0
    assert st["costSoFar"] == pytest.approx(2.0 + 18.0)
    assert st["costPerHour"] == 45.0
    assert st["workers"] == {"reserved": 1, "spot": 3}
    assert status.step_status(report, spec, {}, {"phase": "Succeeded"})["phase"] == "Succeeded"
    assert status.done_status(JobDone(ok=False, steps=2, error="oom"), {})["phase"] == "Failed"
    # `done` names the last step even when late step reports were dropped behind it (two subscriptions)
    assert status.done_status(JobDone(ok=True, steps=40), {"step": 19})["step"] == 39


def test_a_step_with_an_evaluation_reports_it_in_the_status():
    validation = ValidationReport(
        step=9,
        weight_version=10,
        reward_mean=0.5,
        pass_at_1=0.25,
        pass_at_k=0.75,
        k=4,
        prompts=16,
        response_tokens_mean=5.5,
    )
    report = StepReport(
        step=9,
        reward_mean=0.5,
        tokens=6,
        rollout_seconds=1,
        train_seconds=1,
        sync_seconds=1,
        weight_version=10,
        weights_checksum="x",
        validation=validation,
    )
    st = status.step_status(report, gpu_spec(), {}, {})
    assert st["validation"] == {
        "step": 9,
        "weightVersion": 10,
        "k": 4,
        "prompts": 16,
        "rewardMean": 0.5,
        "passAt1": 0.25,
        "passAtK": 0.75,
        "responseTokensMean": 5.5,
    }
    jsonschema.Draft4Validator(crd.status_schema()).validate({"validation": st["validation"]})
    assert "validation" not in status.step_status(report.model_copy(update={"validation": None}), gpu_spec(), {}, {})


def test_set_condition_keeps_transition_time_when_status_unchanged():
    t0, t1 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    first = status.set_condition([], status.condition("Valid", True, "A", "a", t0))
    same = status.set_condition(first, status.condition("Valid", True, "B", "b", t1))
    assert same == [{**first[0], "reason": "B", "message": "b"}]
    flipped = status.set_condition(same, status.condition("Valid", False, "C", "c", t1))
    assert flipped[0]["lastTransitionTime"] == status.now_iso(t1)


def test_conditions_carry_the_generation_they_were_judged_on():
    assert "observedGeneration" not in status.condition("Valid", True, "A", "a")  # no generation from the API
    done = status.done_status(JobDone(ok=True, steps=2), {}, generation=4)
    assert [(c["type"], c["observedGeneration"]) for c in done["conditions"]] == [("Complete", 4)]
    validator = jsonschema.Draft4Validator(crd.status_schema())
    validator.validate({**done, "observedGeneration": 4})


def test_checks_name_the_field():
    settings = OperatorSettings(max_trainer_ranks=4, max_trainer_gpus=4)
    assert check_job({}, settings).trainer.ranks == 1
    cases = [
        ({"trainer": {"ranks": 8}}, "trainer.ranks"),
        ({"trainer": {"ranks": 4, "gpusPerRank": 2}}, "trainer.gpusPerRank"),
        ({"rollout": {"spot": {"minReplicas": 3, "maxReplicas": 1}}}, "rollout.spot.minReplicas"),
        ({"trainer": {"ranks": 3}}, "trainer.ranks"),  # a cross-field rule names the field it is about
        ({"task": {"reward": "rlboost.tasks.rewards:no_such_function"}}, "task.reward"),
        ({"task": {"reward": "not-a-registered-reward"}}, "task.reward"),
        ({"algorithm": {"groupSize": 1}}, "algorithm.groupSize"),
    ]
    for data, field in cases:
        with pytest.raises(SpecProblemError) as err:
            check_job(data, settings)
        assert err.value.field == field, (data, str(err.value))


def test_reward_check_imports_nothing():
    import sys

    sys.modules.pop("rlboost.tasks.rewards", None)
    check_reward("exact_match")
    assert "rlboost.tasks.rewards" not in sys.modules


def test_settings_from_env_and_bad_values_name_the_variable():
    assert load_settings({"RLBOOST_OPERATOR_MAX_TRAINER_RANKS": "3"}).max_trainer_ranks == 3
    with pytest.raises(SystemExit, match="RLBOOST_OPERATOR_MAX_TRAINER_RANKS"):
        load_settings({"RLBOOST_OPERATOR_MAX_TRAINER_RANKS": "zero"})


def test_crd_schema_is_structural_and_matches_the_spec():
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = str(schema)
    for banned in ("$ref", "'title'", "'const'", "additionalProperties': False"):
        assert banned not in text
    spec_schema = schema["properties"]["spec"]
    rollout = spec_schema["properties"]["rollout"]
    assert rollout["description"] and rollout["properties"]["spot"]["properties"]["maxReplicas"]["maximum"] == 10000
    lr = spec_schema["properties"]["algorithm"]["properties"]["learningRate"]
    assert lr["minimum"] == 0 and lr["exclusiveMinimum"] is True

    # Every leaf field carries a description (kubectl explain).
    def walk(node, path):
        assert "description" in node or path.endswith(("apiVersion", "kind", "metadata")), path
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{key}")

    walk(spec_schema, "spec")
    # A default spec validates; an out-of-bounds one does not.
    draft = jsonschema.Draft4Validator(spec_schema)
    draft.validate(JobSpec().model_dump(by_alias=True, mode="json", exclude_none=True))  # Draft 4 knows no nullable
    with pytest.raises(jsonschema.ValidationError):
        draft.validate({"trainer": {"ranks": 0}})
    assert kubernetes_validate.validate(crd.build_crd(), K8S_VERSION, strict=True) is not None


def test_children_are_valid_kubernetes_objects_with_the_services_flags():
    spec = gpu_spec()
    settings = OperatorSettings(nats_url="nats://nats:4222")
    objs = children.build_children("job1", "ns1", spec, settings, spot_replicas=3)
    items = generate_items(children.tls_hosts("job1", "ns1"))
    objs += [children.credentials_secret("job1", "ns1", items), children.nats_config_secret("job1", "ns1", items)]
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    by = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    assert by[("Deployment", "job1-workers-spot")]["spec"]["replicas"] == 3
    sts = by[("StatefulSet", "job1-trainer")]
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == "job1-trainer"
    assert by[("Service", "job1-trainer")]["spec"]["clusterIP"] == "None"
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"]["value"] == "job1-trainer-0.job1-trainer.ns1.svc"
    assert "pod-index" in env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    worker = by[("Deployment", "job1-workers-spot")]["spec"]["template"]["spec"]
    cmd = worker["containers"][0]["command"]
    assert cmd[:3] == ["python", "-m", "rollout_worker"]
    assert cmd[cmd.index("--pool") + 1] == "spot" and cmd[cmd.index("--worker-id") + 1] == "$(POD_NAME)"
    assert cmd[cmd.index("--nats-url") + 1] == "nats://job1-nats.ns1.svc:4222"  # the job's own NATS
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "affinity" in worker and worker["tolerations"]
    mgr = by[("Deployment", "job1-manager")]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert mgr[:3] == ["python", "-m", "rollout_manager"] and "--port" in mgr and "--metrics-port" in mgr
    ws = by[("Deployment", "job1-weights")]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert ws[:3] == ["python", "-m", "weight_server"] and "--token-file" not in ws  # its tokens: the credentials
    assert ws[ws.index("--credentials-dir") + 1] == children.CREDENTIALS_DIR
    assert "ranks: 2" in by[("ConfigMap", "job1-config")]["data"]["job.yaml"]


def test_colocated_reserved_workers_go_one_per_trainer_node():
    spec = parse_job_spec(
        {
            "trainer": {"ranks": 2, "gpusPerRank": 1, "colocateReserved": True},
            "rollout": {"reserved": {"replicas": 2, "gpusPerWorker": 1}},
        }
    )
    objs = children.build_children("job1", "ns1", spec, OperatorSettings(), spot_replicas=0)
    reserved = next(o for o in objs if o["metadata"]["name"] == "job1-workers-reserved")
    kubernetes_validate.validate(reserved, K8S_VERSION, strict=True)
    affinity = reserved["spec"]["template"]["spec"]["affinity"]
    [near] = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    [apart] = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert near["labelSelector"]["matchLabels"] == children.selector("job1", "trainer")
    assert apart["labelSelector"]["matchLabels"] == reserved["spec"]["selector"]["matchLabels"]
    assert near["topologyKey"] == apart["topologyKey"] == "kubernetes.io/hostname"
    assert reserved["spec"]["replicas"] == 2 and "nodeAffinity" in affinity  # still off spot nodes
    plain = children.build_children("job1", "ns1", gpu_spec(), OperatorSettings(), spot_replicas=0)
    assert (
        "podAffinity"
        not in next(o for o in plain if o["metadata"]["name"] == "job1-workers-reserved")["spec"]["template"]["spec"][
            "affinity"
        ]
    )


def test_colocation_needs_one_reserved_worker_per_rank():
    with pytest.raises(JobSpecError, match=r"rollout.reserved.replicas \(1\) must equal trainer.ranks \(2\)"):
        parse_job_spec({"trainer": {"ranks": 2, "colocateReserved": True}})


def test_entry_point_help_runs_without_heavy_imports():
    import subprocess
    import sys

    code = "import sys, rlboost_operator.handlers; bad = [m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules]; print(bad)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "rlboost_operator", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "--metrics-port" in proc.stdout


def test_only_spot_workers_may_land_on_spot_nodes():
    """The trainer, manager, weight-server and NATS carry the off-spot affinity (a preemption must not take the job's
    control plane down); spot workers require spot nodes; reserved workers avoid them."""
    spec = parse_job_spec({})
    kids = children.build_children("j", "ns", spec, OperatorSettings(), 1)
    affinity = {
        k["metadata"]["name"]: k["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        for k in kids
        if k["kind"] in ("Deployment", "StatefulSet")
    }
    operators = {
        name: {
            e["operator"]
            for t in a["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            for e in t["matchExpressions"]
        }
        for name, a in affinity.items()
    }
    assert operators == {
        "j-trainer": {"NotIn"},
        "j-manager": {"NotIn"},
        "j-weights": {"NotIn"},
        "j-nats": {"NotIn"},
        "j-workers-reserved": {"NotIn"},
        "j-workers-spot": {"In"},
    }


def _pods(objs):
    """(name, pod spec) of every workload."""
    return [
        (o["metadata"]["name"], o["spec"]["template"]["spec"])
        for o in objs
        if o["kind"] in ("Deployment", "StatefulSet")
    ]


def test_job_pods_are_locked_down_and_ask_for_cpu_and_memory():
    spec = parse_job_spec({"rollout": {"spot": {"resources": {"cpu": "3", "memory": "6Gi"}}}})
    objs = children.build_children("job1", "ns1", spec, OperatorSettings(), spot_replicas=1)
    pods = _pods(objs)
    assert {name for name, _ in pods} >= {"job1-nats", "job1-manager", "job1-weights", "job1-trainer"}
    for name, pod in pods:
        assert pod["automountServiceAccountToken"] is False, name
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert set(c["resources"]["requests"]) == {"cpu", "memory"}, (name, c["name"])
            writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
            assert writable <= {"/tmp", "/data", children.MODEL_ROOT}, (name, writable)
    spot = dict(pods)["job1-workers-spot"]["containers"][0]
    assert spot["resources"]["requests"] == {"cpu": "3", "memory": "6Gi"}
    assert {"name": "HOME", "value": "/tmp"} in spot["env"]


@pytest.mark.parametrize(
    ("workload", "role"),
    [
        ("job1-trainer", "trainer"),
        ("job1-workers-spot", "worker"),
        ("job1-workers-reserved", "worker"),
        ("job1-manager", "manager"),
        ("job1-weights", "weight-server"),
        ("job1-nats", "nats"),
    ],
)
def test_each_role_mounts_only_its_credentials(workload, role):
    objs = children.build_children("job1", "ns1", JobSpec(), OperatorSettings(), spot_replicas=1)
    pod = dict(_pods(objs))[workload]
    secret = next(v["secret"] for v in pod["volumes"] if v["name"] == "credentials")
    assert secret["secretName"] == "job1-credentials"
    assert [i["key"] for i in secret["items"]] == list(ROLE_ITEMS[role])
    if role != "nats":
        cmd = pod["containers"][0]["command"]
        assert cmd[cmd.index("--credentials-dir") + 1] == children.CREDENTIALS_DIR


def test_the_jobs_nats_configuration_gives_each_role_its_users_over_tls():
    import json

    items = generate_items(children.tls_hosts("job1", "ns1"))
    conf = json.loads(children.secret_items(children.nats_config_secret("job1", "ns1", items))["nats.conf"])
    assert conf["tls"]["cert_file"] == f"{children.CREDENTIALS_DIR}/tls-nats.crt"
    users = {u["user"]: u for u in conf["authorization"]["users"]}
    assert users["operator"]["password"] == items["nats-operator.pass"].decode()
    assert users["operator"]["permissions"]["publish"]["allow"][0] == "rlboost.ns1.job1.nodes"
    assert "rlboost.ns1.job1.steps" in users["trainer"]["permissions"]["publish"]["allow"]


def test_tls_certificates_name_the_jobs_services():
    from cryptography import x509

    items = generate_items(children.tls_hosts("job1", "ns1"))
    for service, host in [
        ("nats", "job1-nats.ns1.svc"),
        ("manager", "job1-manager.ns1.svc"),
        ("weight-server", "job1-weights.ns1.svc"),
    ]:
        cert = x509.load_pem_x509_certificate(items[f"tls-{service}.crt"])
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert host in names.get_values_for_type(x509.DNSName), service


def test_network_policy_lets_in_only_the_jobs_pods_the_operator_to_nats_and_metrics_scrapes():
    settings = OperatorSettings(operator_namespace="rlboost-system")
    policy = next(
        o for o in children.build_children("job1", "ns1", JobSpec(), settings, 1) if o["kind"] == "NetworkPolicy"
    )
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"rlboost.io/job": "job1"}} and spec["policyTypes"] == ["Ingress"]
    own, operator, metrics = spec["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"rlboost.io/job": "job1"}}}]}
    assert operator["from"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "rlboost-system"}
    }
    assert operator["ports"] == [{"port": children.NATS_PORT, "protocol": "TCP"}]
    assert metrics["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    env = {"RLBOOST_OPERATOR_NETWORK_POLICY": "false", "RLBOOST_OPERATOR_METRICS_NAMESPACE_LABELS": "{}"}
    off = load_settings(env)
    assert off.metrics_namespace_labels == {}
    assert not any(o["kind"] == "NetworkPolicy" for o in children.build_children("job1", "ns1", JobSpec(), off, 1))
    assert len(children.network_policy("job1", "ns1", off)["spec"]["ingress"]) == 2  # no metrics rule


def test_a_relative_dataset_path_is_refused_on_kubernetes_naming_the_field() -> None:
    with pytest.raises(SpecProblemError) as info:
        check_job(
            {"task": {"dataset": {"train": "s3://b/train.jsonl", "validation": "data/val.jsonl"}}}, OperatorSettings()
        )
    assert info.value.field == "task.dataset.validation" and "absolute path" in str(info.value)
    assert check_job({"task": {"dataset": {"train": "/data/train.parquet"}}}, OperatorSettings())
