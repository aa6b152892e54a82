"""Fuzzing RLJob specs into the operator: rlboost.spec.parse_job_spec (the schema and cross-field rules every
service shares) and rlboost_operator.checks.check_job (the operator's own limits, the reward's registration),
then building the job's children from what was accepted.

A spec parses or raises JobSpecError (with at least one problem naming a field); the operator's check passes or
raises SpecProblemError naming a field - never another exception. What is accepted is valid: it survives a dump
and re-parse unchanged (the CRD round trip), and the operator can build its Kubernetes objects.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlboost.spec import JobSpec, JobSpecError, parse_job_spec
from rlboost_operator import children
from rlboost_operator.checks import SpecProblemError, check_job
from rlboost_operator.config import OperatorSettings

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SETTINGS = OperatorSettings(max_trainer_ranks=4, max_trainer_gpus=8, nats_url="nats://nats:4222")
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["exact_match", "cProfile:run", "tiny", "huggingface", "s3://b/m", "../x", "", "0", "-1"])
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=12,
)
DEFAULT = JobSpec().model_dump(by_alias=True, mode="json")


def _paths(doc: dict, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in doc.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out += _paths(value, (*prefix, key))
    return out


PATHS = _paths(DEFAULT)


@st.composite
def mutated_spec(draw: st.DrawFn) -> dict:
    """The default spec with one to three fields (at any depth) replaced by arbitrary JSON."""
    doc = json.loads(json.dumps(DEFAULT))
    for path in draw(st.lists(st.sampled_from(PATHS), min_size=1, max_size=3)):
        node = doc
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[path[-1]] = draw(JSON)
    return doc


def _accepted(data: object) -> JobSpec | None:
    try:
        spec = parse_job_spec(data, "RLJob.spec")
    except JobSpecError as err:
        assert err.problems or "expected a mapping" in str(err)
        return None
    assert parse_job_spec(spec.model_dump(by_alias=True, mode="json")) == spec  # what is accepted round-trips
    return spec


@FUZZ
@given(JSON)
def test_arbitrary_documents_parse_or_raise_job_spec_error(data: object) -> None:
    _accepted(data)


@FUZZ
@given(mutated_spec())
def test_a_mutated_spec_is_refused_with_a_field_or_runs(data: dict) -> None:
    if _accepted(data) is None:
        return
    try:
        spec = check_job(data, SETTINGS)
    except SpecProblemError as err:
        assert err.field and str(err)
        return
    objs = children.build_children("job1", "ns1", spec, SETTINGS, spot_replicas=spec.rollout.spot.min_replicas)
    assert all(o["kind"] and o["metadata"]["name"] for o in objs)
