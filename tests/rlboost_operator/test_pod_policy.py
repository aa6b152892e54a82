"""Each component's pod policy (rlboost.pod_policy, issue 29) on the children the operator builds: the overlay's merge
rules (children/overlay.py), the accounts, env, pull Secrets, priority and disruption protection (children/policy.py,
disruption.py), and the spec's list of what the operator owns kept in step with what the builders make."""

from __future__ import annotations

from typing import Any

import pytest

from rlboost import pod_policy
from rlboost.spec import JobSpec, parse_job_spec
from rlboost_operator import children
from rlboost_operator.checks import SpecProblemError, check_job
from rlboost_operator.config import OperatorSettings

TEAM = {"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}


def workloads(spec: JobSpec, settings: OperatorSettings | None = None) -> dict[str, dict[str, Any]]:
    objs = children.build_children("j", "ns", spec, settings or OperatorSettings(), 2)
    return {o["metadata"]["name"]: o["spec"]["template"] for o in objs if o["kind"] in ("Deployment", "StatefulSet")}


def container(template: dict[str, Any], name: str, kind: str = "containers") -> dict[str, Any]:
    return next(c for c in template["spec"][kind] if c["name"] == name)


def test_an_overlay_merges_by_name_and_key_over_the_operators_pod():
    base = workloads(JobSpec())["j-workers-reserved"]
    overlay = {
        "metadata": {"labels": {"team": "ml"}, "annotations": {"cost": "a"}},
        "spec": {
            "containers": [
                {
                    "name": "rollout-worker",
                    "image": "my.registry/worker:patched",
                    "imagePullPolicy": "Always",
                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "cache", "mountPath": "/tmp"}],
                    "resources": {"limits": {"memory": "8Gi"}},
                }
            ],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "model", "ephemeral": {}}],
            "tolerations": [TEAM, TEAM],
            "nodeSelector": {"team": "ml"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}],
                }
            },
            "runtimeClassName": "nvidia",
        },
    }
    out = children.merge_template(base, overlay, ["cache"])
    assert base == workloads(JobSpec())["j-workers-reserved"]  # not changed in place
    assert (
        out["metadata"]["labels"]["team"] == "ml"
        and out["metadata"]["labels"].items() >= base["metadata"]["labels"].items()
    )
    worker = container(out, "rollout-worker")
    assert worker["image"] == "my.registry/worker:patched" and worker["imagePullPolicy"] == "Always"
    assert worker["command"] == container(base, "rollout-worker")["command"]
    mounts = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
    assert mounts["/dev/shm"] == "dshm" and mounts["/tmp"] == "cache"  # a mountPath given twice: the overlay's
    assert len(worker["volumeMounts"]) == len(container(base, "rollout-worker")["volumeMounts"]) + 1
    assert worker["resources"]["limits"] == {"memory": "8Gi"} and worker["resources"]["requests"]["cpu"] == "500m"
    volumes = {v["name"]: v for v in out["spec"]["volumes"]}
    assert volumes["model"] == {"name": "model", "ephemeral": {}} and "dshm" in volumes and "config" in volumes
    assert out["spec"]["tolerations"].count(TEAM) == 1
    assert out["spec"]["nodeSelector"] == {"team": "ml"} and out["spec"]["runtimeClassName"] == "nvidia"
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    operator_terms = base["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert len(terms) == len(operator_terms["nodeSelectorTerms"])
    for term, operator_term in zip(terms, operator_terms["nodeSelectorTerms"], strict=True):  # both must hold
        assert term["matchExpressions"] == [
            *operator_term["matchExpressions"],
            {"key": "zone", "operator": "In", "values": ["a"]},
        ]
    assert out["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 1, "preference": {}}
    ]


def test_an_overlay_that_does_not_fit_its_pod_is_refused_naming_the_field():
    spec = {"rollout": {"reserved": {"podTemplate": {"spec": {"containers": [{"name": "sidecar", "image": "x"}]}}}}}
    with pytest.raises(SpecProblemError) as err:
        check_job(spec, OperatorSettings())
    assert err.value.field == "rollout.reserved.podTemplate.spec.containers.0.name"
    assert "no container 'sidecar'" in str(err.value) and "rollout-worker" in str(err.value)
    mount = {"name": "trainer", "volumeMounts": [{"name": "nowhere", "mountPath": "/x"}]}
    with pytest.raises(SpecProblemError) as err:
        check_job({"trainer": {"podTemplate": {"spec": {"containers": [mount]}}}}, OperatorSettings())
    assert err.value.field == "trainer.podTemplate.spec.containers.0.volumeMounts.0.name"
    # the trainer's checkpoint volume comes from its StatefulSet's claim template: mounting it is fine
    check_job(
        {
            "trainer": {
                "podTemplate": {
                    "spec": {"containers": [{**mount, "volumeMounts": [{"name": "data", "mountPath": "/y"}]}]}
                }
            }
        },
        OperatorSettings(),
    )


def test_each_component_runs_as_its_account_with_its_env_pull_secrets_and_priority():
    spec = parse_job_spec(
        {
            "trainer": {
                "serviceAccount": {"annotations": {"iam.gke.io/gcp-service-account": "t@p.iam.gserviceaccount.com"}},
                "env": [{"name": "WANDB_PROJECT", "value": "rl"}],
                "envFrom": [{"secretRef": {"name": "tracking"}}],
                "imagePullSecrets": [{"name": "team-registry"}],
                "priorityClassName": "training",
            },
            "services": {"manager": {"serviceAccount": {"name": "shared"}}},
            "rollout": {
                "spot": {
                    "variants": [
                        {"name": "l4", "pricePerGpuHour": 1.0, "podTemplate": {"spec": {"tolerations": [TEAM]}}}
                    ]
                }
            },
        }
    )
    settings = OperatorSettings(image_pull_secrets=["chart-registry"], service_account_annotations={"team": "ml"})
    objs = children.build_children("j", "ns", spec, settings, 2)
    accounts = {o["metadata"]["name"]: o["metadata"].get("annotations") for o in objs if o["kind"] == "ServiceAccount"}
    assert "j-manager" not in accounts  # it runs as the existing `shared`
    assert accounts["j-trainer"] == {"team": "ml", "iam.gke.io/gcp-service-account": "t@p.iam.gserviceaccount.com"}
    assert accounts["j-weight-server"] == accounts["j-reserved-worker"] == {"team": "ml"}
    pods = workloads(spec, settings)
    expected = {
        "j-trainer": "j-trainer",
        "j-manager": "shared",
        "j-weights": "j-weight-server",
        "j-nats": "j-nats",
        "j-workers-reserved": "j-reserved-worker",
        "j-workers-spot-l4": "j-spot-worker",
    }
    assert {n: p["spec"]["serviceAccountName"] for n, p in pods.items()} == expected
    trainer = pods["j-trainer"]["spec"]
    for c in (*trainer["containers"], *trainer["initContainers"]):  # the model fetcher too
        assert {"name": "WANDB_PROJECT", "value": "rl"} in c["env"] and c["envFrom"] == [
            {"secretRef": {"name": "tracking"}}
        ]
    assert trainer["imagePullSecrets"] == [{"name": "chart-registry"}, {"name": "team-registry"}]
    assert trainer["priorityClassName"] == "training" and "priorityClassName" not in pods["j-manager"]["spec"]
    assert pods["j-manager"]["spec"]["imagePullSecrets"] == [{"name": "chart-registry"}]
    assert TEAM in pods["j-workers-spot-l4"]["spec"]["tolerations"]  # the variant's overlay
    assert TEAM not in pods["j-workers-reserved"]["spec"].get("tolerations", [])


def test_the_single_replica_services_have_a_budget_and_do_not_disrupt():
    objs = children.build_children("j", "ns", JobSpec(), OperatorSettings(), 2)
    budgets = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "PodDisruptionBudget"}
    assert set(budgets) == {"j-trainer", "j-manager", "j-weights"}
    for name, template in workloads(JobSpec()).items():
        protected = name in budgets
        notes = template["metadata"].get("annotations", {})
        assert (notes.get("karpenter.sh/do-not-disrupt") == "true") is protected, name
        assert (notes.get("cluster-autoscaler.kubernetes.io/safe-to-evict") == "false") is protected, name
        if protected:
            selected = budgets[name]["selector"]["matchLabels"]
            assert selected.items() <= template["metadata"]["labels"].items() and budgets[name]["maxUnavailable"] == 0


def test_what_the_spec_protects_covers_every_volume_mount_and_env_the_builders_own():
    """rlboost.pod_policy's lists (the core cannot import the operator) against the operator's builders."""
    spec = parse_job_spec({"model": {"source": "huggingface", "repo": "o/m", "tokenSecret": "hf"}})
    for name, template in workloads(spec).items():
        pod = template["spec"]
        for c in (*pod["containers"], *pod.get("initContainers", [])):
            for env in c.get("env", []):
                owned = env["name"] in pod_policy.OWNED_ENV or env["name"].startswith(pod_policy.OWNED_ENV_PREFIX)
                assert owned or env["name"] == "HF_TOKEN", (name, env["name"])  # HF_TOKEN: the user may set it too
            for mount in c.get("volumeMounts", []):
                if mount["name"] in pod_policy.OWNED_VOLUMES:
                    assert mount["mountPath"].startswith(pod_policy.OWNED_PATH_PREFIXES), (name, mount)
        for volume in pod["volumes"]:
            sensitive = "secret" in volume or "projected" in volume or "configMap" in volume
            assert not sensitive or volume["name"] in pod_policy.OWNED_VOLUMES, (name, volume["name"])
        assert pod["automountServiceAccountToken"] is False


def test_env_runners_of_an_agentic_job_have_their_own_account_and_pod_policy():
    """The env-runner Deployment (a job with task.environment) follows spec.rollout.envRunners' pod policy like
    every other component; a job without episodes has neither the Deployment nor its account."""
    spec = parse_job_spec(
        {
            "task": {"environment": {"name": "calculator"}},
            "rollout": {
                "envRunners": {
                    "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/env"}},
                    "env": [{"name": "TOOL_API", "value": "http://tools"}],
                    "priorityClassName": "batch",
                    "podTemplate": {"spec": {"tolerations": [TEAM]}},
                }
            },
        }
    )
    objs = children.build_children("j", "ns", spec, OperatorSettings(), 2)
    accounts = {o["metadata"]["name"]: o["metadata"].get("annotations") for o in objs if o["kind"] == "ServiceAccount"}
    assert accounts["j-env-runner"] == {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/env"}
    pod = workloads(spec)["j-env-runners"]["spec"]
    assert pod["serviceAccountName"] == "j-env-runner" and pod["priorityClassName"] == "batch"
    assert {"name": "TOOL_API", "value": "http://tools"} in container({"spec": pod}, "env-runner")["env"]
    assert TEAM in pod["tolerations"]  # the overlay, besides the operator's spot tolerations
    plain = children.build_children("j", "ns", JobSpec(), OperatorSettings(), 2)
    assert not [o for o in plain if o["metadata"]["name"] in ("j-env-runner", "j-env-runners")]
