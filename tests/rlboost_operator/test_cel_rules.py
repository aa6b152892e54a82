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
import functools
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from rlboost.spec import JobSpecError, parse_job_spec
from rlboost_operator import cel_rules, crd

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("rljob*.yaml"))
SPEC_SCHEMA = crd.spec_schema()
CEL = celpy.Environment()


def with_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Structural defaulting: each property of a present object that is left out gets its schema default."""
    if not isinstance(obj, dict) or "properties" not in schema:
        return obj
    out = dict(obj)
    for key, sub in schema["properties"].items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if key in out:
            out[key] = with_defaults(sub, out[key])
    return out


def _rules(schema: dict[str, Any], path: tuple[str, ...] = ()):
    """(path of the node, rule) for every rule in the schema."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule
    for key, sub in (schema.get("properties") or {}).items():
        yield from _rules(sub, (*path, key))


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


@functools.cache
def program(rule: str) -> celpy.Runner:
    return CEL.program(CEL.compile(rule))


def refusals(new: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """The messages of the rules that refuse `new` (a create when `old` is None, else an update of `old`)."""
    out = []
    for path, rule in _rules(SPEC_SCHEMA):
        here, before = _at(new, path), (_at(old, path) if old is not None else None)
        transition = "oldSelf" in rule["rule"]
        if here is None or (transition and before is None):
            continue
        activation = {"self": celpy.json_to_cel(here)}
        if transition:
            activation["oldSelf"] = celpy.json_to_cel(before)
        result = program(rule["rule"]).evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), (rule["rule"], result)  # no evaluation error
        if not result:
            out.append(rule["message"])
    return out


def both_ways(new: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """refusals() as written and defaulted; they must agree."""
    raw = refusals(new, old)
    default = lambda o: with_defaults(SPEC_SCHEMA, o) if o is not None else None  # noqa: E731
    assert refusals(default(new), default(old)) == raw, (new, old)
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
    {"task": {"dataset": {"train": "a.jsonl", "reasoningGym": {"name": "chain_sum"}}}},
    {"task": {"environment": {"verifiers": "my-taskset"}, "dataset": {"reasoningGym": {"name": "chain_sum"}}}},
    {"rollout": {"reserved": {"engine": "sglang", "gpusPerWorker": 1, "tensorParallel": 2}}},
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


def test_the_generated_crd_carries_the_rules_with_the_fields_they_name():
    on_spec = SPEC_SCHEMA["x-kubernetes-validations"]
    assert {r.get("fieldPath") for r in on_spec} >= {".trainer.ranks", ".rollout.spot.minReplicas", ".model"}
    for rule in on_spec:
        assert rule["message"].startswith(f"spec{rule['fieldPath']} "), rule
    assert SPEC_SCHEMA["properties"]["model"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    assert "fieldPath" not in SPEC_SCHEMA["properties"]["model"]["x-kubernetes-validations"][0]
