"""The RLJob CRD's CEL rules (x-kubernetes-validations), evaluated with a real CEL implementation (cel-python).

This is CEL evaluated outside an API server: no API server can run here. The test walks the generated CRD's
schema as the API server does: each rule is evaluated on the node that carries it, a rule that reads
`oldSelf` (a transition rule) only on an update and only where the old object has that node. Each object is
checked twice, as written and with the schema's defaults applied (the API server defaults before it
validates), since the rules must hold either way. What it cannot show: the API server's CEL type checking and
cost estimation at CRD registration.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlboost.spec import JobSpecError, parse_job_spec
from rlboost_operator import cel_eval, cel_rules, crd

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("rljob*.yaml"))
SPEC_SCHEMA = crd.spec_schema()


def refusals(new: dict[str, Any], old: dict[str, Any] | None = None, defaulted: bool = False) -> list[str]:
    """The messages of the rules that refuse `new` (a create when `old` is None, else an update of `old`); a rule
    that does not evaluate to a bool fails the test."""
    found = cel_eval.refusals(SPEC_SCHEMA, new, old, defaulted=defaulted)
    assert not [r for r in found if r.error], found
    return [r.message for r in found]


def both_ways(new: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """refusals() as written and defaulted; they must agree."""
    raw = refusals(new, old)
    assert refusals(new, old, defaulted=True) == raw, (new, old)
    return raw


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_accepted_created_and_updated_unchanged(path):
    spec = yaml.safe_load(path.read_text())["spec"]
    assert both_ways(spec) == []
    assert both_ways(spec, old=copy.deepcopy(spec)) == []
    assert both_ways({}) == []  # every default


MUTABLE_EDITS = [
    {"algorithm": {"learningRate": 0.01}},
    {"algorithm": {"steps": 80}},
    {"prices": {"spotPerGpuHour": 1.5}},
    {"rollout": {"spot": {"maxReplicas": 8}}},
    {"trainer": {"backoffLimit": 5, "checkpointEvery": 5}},
    {"retention": {"pvcs": "Delete"}},
]


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        out[key] = _merge(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


@pytest.mark.parametrize("edit", MUTABLE_EDITS, ids=lambda e: ".".join([next(iter(e)), next(iter(e[next(iter(e))]))]))
def test_an_edit_of_a_mutable_field_is_accepted(edit):
    old = yaml.safe_load((ROOT / "examples" / "rljob.yaml").read_text())["spec"]
    assert both_ways(_merge(old, edit), old) == []


IMMUTABLE_EDITS = [
    ({"trainer": {"ranks": 2}}, "spec.trainer.ranks cannot change"),
    ({"trainer": {"zeroStage": 2}}, "spec.trainer.zeroStage cannot change"),
    ({"task": {"seed": 7}}, "spec.task.seed cannot change"),
    ({"algorithm": {"promptsPerStep": 32}}, "spec.algorithm.promptsPerStep cannot change"),
    ({"model": {"hiddenSize": 256}}, "spec.model cannot change"),
]


@pytest.mark.parametrize(("edit", "message"), IMMUTABLE_EDITS, ids=[m.split()[0] for _, m in IMMUTABLE_EDITS])
def test_an_edit_of_a_field_the_checkpoints_depend_on_is_refused(edit, message):
    old = yaml.safe_load((ROOT / "examples" / "rljob.yaml").read_text())["spec"]
    new = _merge(old, edit)
    found = both_ways(new, old)
    assert len(found) == 1 and found[0].startswith(message), found
    assert both_ways(new) == []  # the same spec is fine for a new job


def test_a_field_left_out_reads_as_its_default_in_transition_rules():
    assert both_ways({"trainer": {"ranks": 1}}, old={}) == []  # 1 is the default: no change
    assert both_ways({}, old={"trainer": {"ranks": 1}}) == []
    assert both_ways({"task": {}}, old={"task": {"seed": 1234}}) == []
    refused = both_ways({"trainer": {"ranks": 2}, "algorithm": {"microBatchSize": 8}}, old={})
    assert [m.split(" cannot")[0] for m in refused] == ["spec.trainer.ranks"]
    assert both_ways({"model": {"source": "tiny"}}, old={})[0].startswith("spec.model cannot be added or removed")


BAD_SPECS = [
    {"rollout": {"spot": {"minReplicas": 5, "maxReplicas": 2}}},
    {"rollout": {"reserved": {"minReplicas": 20}}},  # maxReplicas' default is 16
    {"trainer": {"ranks": 3}},
    {"algorithm": {"promptsPerStep": 4, "groupSize": 4, "microBatchSize": 3}},
    {"trainer": {"ranks": 2, "colocateReserved": True}},
    {"trainer": {"backend": "nccl"}},
    {"algorithm": {"partialRollout": True}},  # maxStaleness 0
    {"algorithm": {"partialRollout": True, "promptsPerStep": 4}, "trainer": {"ranks": 2}},  # maxStaleness 0
    {
        "algorithm": {"partialRollout": True, "maxStaleness": 1, "promptsPerStep": 3, "groupSize": 3},
        "trainer": {"ranks": 2},
    },
    {"rollout": {"spot": {"gpusPerWorker": 2, "tensorParallel": 2}}},  # engine torch (the default)
    {"task": {"environment": {"name": "calculator"}}, "algorithm": {"partialRollout": True}},  # maxStaleness 0
    {"task": {"dataset": {"train": "a.jsonl", "reasoningGym": {"name": "chain_sum"}}}},
    {"task": {"environment": {"verifiers": "my-taskset"}, "dataset": {"reasoningGym": {"name": "chain_sum"}}}},
    {"rollout": {"reserved": {"engine": "sglang", "gpusPerWorker": 1, "tensorParallel": 2}}},
    {"algorithm": {"dualClip": 0.5}},
    {"algorithm": {"dualClip": 1}},
    {"algorithm": {"klInReward": True}},  # klCoef 0
    {"algorithm": {"rolloutAhead": 1}},  # maxStaleness 0
    {"algorithm": {"rolloutAhead": 1, "maxStaleness": 1, "partialRollout": True}},
    {"algorithm": {"rolloutAhead": 1, "maxStaleness": 1}, "trainer": {"colocateReserved": True}},
    {"algorithm": {"maxStaleness": 2, "rolloutCorrection": {"oldLogprobs": "trainer"}}},
    {"algorithm": {"maxStaleness": 1, "rolloutCorrection": {"oldLogprobs": "trainer", "mode": "mask"}}},
    {"algorithm": {"maxStaleness": 1, "partialRollout": True, "rolloutCorrection": {"oldLogprobs": "trainer"}}},
    {"algorithm": {"maxStaleness": 1, "rolloutCorrection": {"oldLogprobs": "trainer"}}, "trainer": {"zeroStage": 3}},
    {"rollout": {"reserved": {"replicas": 0}, "spot": {"replicas": 0, "maxReplicas": 0}}},  # no worker (issue 31)
    {"trainer": {"gpusPerRank": 2}},
    {"rollout": {"spot": {"serviceAccount": {"name": "shared"}}}},
]


@pytest.mark.parametrize("spec", BAD_SPECS, ids=lambda s: str(s))
def test_cross_field_rules_refuse_what_the_spec_models_refuse_naming_the_same_field(spec):
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(spec)
    field = err.value.problems[0].path
    found = both_ways(spec)
    assert len(found) == 1, found
    assert found[0].startswith(f"spec.{field} "), (field, found)
    rule = next(r for r in cel_rules.cross_field_rules() if r.message == found[0])
    assert rule.field == field


def test_partial_rollout_with_several_trainer_ranks_is_accepted():
    """A step's short last round is padded with weightless rows (trainer.ranks.complete_round)."""
    spec = {"algorithm": {"partialRollout": True, "maxStaleness": 1, "promptsPerStep": 4}, "trainer": {"ranks": 2}}
    parse_job_spec(spec)
    assert both_ways(spec) == []


def test_partial_rollout_of_agentic_episodes_is_accepted():
    """Episodes are carried across steps whole (rollout_manager.episode_carry), so partialRollout goes with
    task.environment under the same bound as single-turn samples (maxStaleness >= 1, refused above otherwise)."""
    spec = {"task": {"environment": {"name": "calculator"}}, "algorithm": {"partialRollout": True, "maxStaleness": 1}}
    assert parse_job_spec(spec).algorithm.partial_rollout
    assert both_ways(spec) == []


def test_the_generated_crd_carries_the_rules_with_the_fields_they_name():
    on_spec = SPEC_SCHEMA["x-kubernetes-validations"]
    assert {r.get("fieldPath") for r in on_spec} >= {".trainer.ranks", ".rollout.spot.minReplicas", ".model"}
    for rule in on_spec:
        assert rule["message"].startswith(f"spec{rule['fieldPath']} "), rule
    assert SPEC_SCHEMA["properties"]["model"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    assert "fieldPath" not in SPEC_SCHEMA["properties"]["model"]["x-kubernetes-validations"][0]


# --- pod policy (issue 29): what the operator owns in a pod, refused by the models and the CRD alike ---------------

_OVERLAY = {"spec": {"containers": [{"name": "trainer"}]}}
BAD_POLICIES = [
    {"trainer": {"podTemplate": {"spec": {"containers": [{"name": "trainer", "command": ["sh"]}]}}}},
    {"trainer": {"podTemplate": {"spec": {"initContainers": [{"name": "fetch-model", "args": ["--x"]}]}}}},
    {"trainer": {"podTemplate": {"spec": {"containers": [{"name": "trainer", "env": [{"name": "A", "value": "1"}]}]}}}},
    {"rollout": {"reserved": {"podTemplate": {"spec": {"volumes": [{"name": "identity", "emptyDir": {}}]}}}}},
    {
        "services": {
            "manager": {
                "podTemplate": {
                    "spec": {
                        "containers": [
                            {"name": "rollout-manager", "volumeMounts": [{"name": "x", "mountPath": "/etc/rlboost/c"}]}
                        ]
                    }
                }
            }
        }
    },
    {"services": {"weightServer": {"podTemplate": {"spec": {"automountServiceAccountToken": True}}}}},
    {"services": {"nats": {"podTemplate": {"spec": {"serviceAccountName": "default"}}}}},
    {"trainer": {"podTemplate": {"spec": {"priorityClassName": "high"}}}},
    {"trainer": {"podTemplate": {"metadata": {"labels": {"rlboost.io/job": "other"}}}}},
    {"trainer": {"podTemplate": {"metadata": {"labels": {"bad key!": "x"}}}}},
    {"rollout": {"reserved": {"podTemplate": {"metadata": {"labels": {"team": "not a value"}}}}}},
    {"services": {"nats": {"podTemplate": {"metadata": {"annotations": {"/x": "y"}}}}}},
    {
        "rollout": {
            "spot": {
                "podTemplate": {
                    "spec": {
                        "containers": [{"name": "rollout-worker", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]
                    }
                }
            }
        }
    },
    {
        "trainer": {
            "podTemplate": {"spec": {"containers": [{"name": "trainer", "resources": {"requests": {"cpu": "4"}}}]}}
        }
    },
    {"trainer": {"env": [{"name": "RANK", "value": "3"}]}},
    {"trainer": {"env": [{"name": "RLBOOST_X", "value": "3"}]}},
    {"trainer": {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}},
    {"trainer": {"env": [{"name": "A", "valueFrom": {}}]}},
    {"rollout": {"reserved": {"envFrom": [{"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}]}}},
    {"trainer": {"serviceAccount": {"name": "ml", "annotations": {"iam.gke.io/gcp-service-account": "x@y"}}}},
    {
        "rollout": {
            "spot": {
                "variants": [
                    {
                        "name": "l4",
                        "pricePerGpuHour": 1.0,
                        "podTemplate": {"spec": {"volumes": [{"name": "credentials", "emptyDir": {}}]}},
                    }
                ]
            }
        }
    },
]


@pytest.mark.parametrize("spec", BAD_POLICIES, ids=lambda s: str(s)[:90])
def test_pod_policy_rules_refuse_what_the_models_refuse_at_the_same_field(spec):
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(spec)
    field = err.value.problems[0].path
    found = cel_eval.refusals(SPEC_SCHEMA, spec)
    assert not [r for r in found if r.error], found
    assert [re.sub(r"\[(\d+)\]", r".\1", r.path) for r in found] == [f"spec.{field}"], (field, found)


def test_a_platform_teams_pod_policy_is_accepted_by_the_models_and_the_rules():
    job = yaml.safe_load((ROOT / "examples" / "rljob-platform.yaml").read_text())["spec"]
    parse_job_spec(job)
    assert both_ways(job) == []
    assert both_ways(job, old=copy.deepcopy(job)) == []
