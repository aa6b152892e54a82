"""spec.model: every source's fields, and inconsistent combinations refused naming the field (pure)."""

from __future__ import annotations

import pytest

from rlboost.spec import JobSpecError, parse_job_spec


def _problem(model: dict) -> tuple[str, str]:
    with pytest.raises(JobSpecError) as info:
        parse_job_spec({"model": model})
    return info.value.problems[0]


def test_each_source_with_its_fields_is_accepted() -> None:
    hf = parse_job_spec(
        {"model": {"source": "huggingface", "repo": "Qwen/Qwen3-0.6B", "revision": "abc123", "tokenSecret": "hf-token"}}
    ).model
    assert (hf.repo, hf.revision, hf.token_secret) == ("Qwen/Qwen3-0.6B", "abc123", "hf-token")
    uri = parse_job_spec({"model": {"source": "uri", "uri": "gs://bucket/models/qwen3"}}).model
    assert uri.uri == "gs://bucket/models/qwen3"
    pvc = parse_job_spec({"model": {"source": "pvc", "claimName": "models", "path": "qwen3/8b"}}).model
    assert (pvc.claim_name, pvc.path) == ("models", "qwen3/8b")
    assert parse_job_spec({"model": {"source": "tiny", "hiddenSize": 64}}).model.hidden_size == 64


@pytest.mark.parametrize(
    ("model", "field", "words"),
    [
        ({"source": "huggingface"}, "model.repo", "needs model.repo"),
        ({"source": "huggingface", "repo": "no-owner"}, "model.repo", "pattern"),
        ({"source": "uri"}, "model.uri", "needs model.uri"),
        ({"source": "uri", "uri": "https://example.com/m"}, "model.uri", "must start with s3:// or gs://"),
        ({"source": "uri", "uri": "s3://"}, "model.uri", "names no bucket"),
        ({"source": "pvc"}, "model.claimName", "needs model.claimName"),
        ({"source": "pvc", "claimName": "Models"}, "model.claimName", "pattern"),
        ({"source": "pvc", "claimName": "m", "path": "/abs"}, "model.path", "relative to the claim's root"),
        ({"source": "pvc", "claimName": "m", "path": "a/../../b"}, "model.path", "without '..'"),
        ({"source": "path"}, "model.path", "needs model.path"),
        ({"source": "tiny", "repo": "a/b"}, "model.repo", "set model.source to 'huggingface'"),
        ({"source": "huggingface", "repo": "a/b", "uri": "s3://b/m"}, "model.uri", "set model.source to 'uri'"),
        ({"source": "uri", "uri": "s3://b/m", "tokenSecret": "t"}, "model.tokenSecret", "not read by"),
        ({"source": "huggingface", "repo": "a/b", "claimName": "c"}, "model.claimName", "'pvc'"),
    ],
)
def test_inconsistent_sources_name_the_field(model: dict, field: str, words: str) -> None:
    path, message = _problem(model)
    assert path == field and words in message
