"""model.source 'uri' with s3:// for real: s3fs and aiobotocore talk HTTP to moto's S3 server (a separate
`python -m moto.server` process on loopback: the stand-in begins at the S3 API, which moto emulates), with a
model the test uploads. Credentials come from the environment as in a pod: static keys, or IRSA's web identity
(AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE, exchanged at moto's STS). A second server enforces IAM, so unknown
keys are refused by the API itself."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlboost.models import ensure_model
from rlboost.models.errors import EXIT_UNREACHABLE, ModelFetchError
from rlboost.models.layout import model_dir_problem
from rlboost.models.sources import SOURCE_MARKER, fetch_model
from rlboost.nats_server import free_port, wait_for_port
from rlboost.spec import JobSpec, ModelSpec, TaskSpec

pytest.importorskip("s3fs", reason="rlboost[models] is not installed")
pytest.importorskip("moto.server", reason="the dev extra (moto) is not installed")

SMALL = {"hiddenSize": 32, "numLayers": 1, "numHeads": 2, "warmupSteps": 0}


def _moto(tmp: Path, **env: str) -> Iterator[str]:
    port = free_port()
    log = (tmp / f"moto-{port}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **env},
    )
    try:
        wait_for_port("127.0.0.1", port, 60, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _moto(tmp_path_factory.mktemp("moto"))


@pytest.fixture(scope="module")
def s3_with_iam(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _moto(tmp_path_factory.mktemp("moto-iam"), INITIAL_NO_AUTH_ACTION_COUNT="0")


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, s3: str) -> str:
    """The environment a pod's SDK reads: the endpoint (moto's) and static keys."""
    for name in ("AWS_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # an unreachable store fails at once, not after botocore's retries
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    return s3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_model(ModelSpec.model_validate(SMALL), TaskSpec(), tmp_path_factory.mktemp("s3") / "model")


def _upload(model_dir: Path, uri: str, skip: str = "") -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    bucket = uri.removeprefix("s3://").split("/", 1)[0]
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    for path in model_dir.iterdir():
        if path.name != skip:
            fs.put_file(str(path), f"{uri.removeprefix('s3://')}/{path.name}")
    fs.pipe(f"{uri.removeprefix('s3://')}/README.md", b"not a model file: left behind")


def _spec(uri: str) -> JobSpec:
    return JobSpec.model_validate({"model": {**SMALL, "source": "uri", "uri": uri}})


def test_a_model_in_s3_is_fetched_checked_and_reused(aws: str, model_dir: Path, tmp_path: Path) -> None:
    _upload(model_dir, "s3://models/qwen-tiny")
    dest = fetch_model(_spec("s3://models/qwen-tiny"), tmp_path / "models" / "policy")
    assert model_dir_problem(dest) == ""
    for path in model_dir.iterdir():
        assert (dest / path.name).read_bytes() == path.read_bytes(), path.name
    assert not (dest / "README.md").exists() and (dest / SOURCE_MARKER).is_file()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["policy"]  # no temporary sibling left
    before = (dest / "model.safetensors").stat().st_mtime_ns
    assert fetch_model(_spec("s3://models/qwen-tiny/"), dest) == dest  # the same source: reused
    assert (dest / "model.safetensors").stat().st_mtime_ns == before


def test_irsa_web_identity_credentials_are_used(aws: str, model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    _upload(model_dir, "s3://models/irsa")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.e30.sig")  # what EKS projects into the pod; STS (moto's) exchanges it
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/rlboost-models")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    assert model_dir_problem(fetch_model(_spec("s3://models/irsa"), tmp_path / "m")) == ""


@pytest.mark.parametrize(
    ("uri", "words"),
    [("s3://no-such-bucket/m", "does not exist"), ("s3://models/nothing-here", "does not exist")],
)
def test_a_missing_bucket_or_prefix_is_not_found(aws: str, tmp_path: Path, uri: str, words: str) -> None:
    with pytest.raises(ModelFetchError) as info:
        fetch_model(_spec(uri), tmp_path / "m")
    assert (info.value.field, info.value.reason) == ("uri", "NotFound") and words in info.value.detail
    assert not (tmp_path / "m").exists()


def test_a_prefix_without_model_files_or_with_a_broken_one_is_refused(aws: str, model_dir: Path, tmp_path: Path):
    _upload(model_dir, "s3://models/no-tokenizer", skip="tokenizer.json")
    with pytest.raises(ModelFetchError) as info:
        fetch_model(_spec("s3://models/no-tokenizer"), tmp_path / "a")
    assert info.value.reason == "InvalidModel" and "holds no tokenizer" in info.value.detail
    assert sorted(os.listdir(tmp_path)) == []  # nothing half-fetched stays


def test_unknown_credentials_are_refused_by_the_store(aws: str, s3_with_iam: str, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_with_iam)
    with pytest.raises(ModelFetchError) as info:
        fetch_model(_spec("s3://models/qwen-tiny"), tmp_path / "m")
    assert (info.value.field, info.value.reason) == ("uri", "Unauthorized")
    assert "Access Key Id you provided does not exist" in info.value.detail and "IRSA" in info.value.detail


def test_an_unreachable_store_exits_4_with_one_line(aws: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    job, log = tmp_path / "job.yaml", tmp_path / "termination-log"
    job.write_text("model: {source: uri, uri: 's3://models/qwen-tiny'}\n")
    argv = [
        sys.executable,
        "-m",
        "rlboost.models.fetch",
        "--config",
        str(job),
        "--dest",
        str(tmp_path / "m"),
        "--termination-log",
        str(log),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert done.returncode == EXIT_UNREACHABLE, done.stderr
    assert log.read_text().startswith("spec.model.uri: Unreachable: cannot reach the object store for s3://models/")
    assert "Traceback" not in done.stderr
