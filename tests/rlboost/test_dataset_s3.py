"""task.dataset.train on s3:// for real: fsspec's s3fs talks HTTP to moto's S3 server (a separate process on
loopback, as in test_model_fetch_s3.py: the stand-in begins at the S3 API). JSONL and Parquet files are uploaded,
then streamed in the same order as from local disk; a missing object is a clear error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlboost.spec import TaskSpec
from rlboost.tasks.base import Cursor
from rlboost.tasks.dataset import DatasetError, DatasetPrompts, check_dataset
from tests.rlboost.test_dataset import rows, words, write_jsonl, write_parquet
from tests.rlboost.test_model_fetch_s3 import _moto

pytest.importorskip("s3fs", reason="rlboost[models] is not installed")
pytest.importorskip("moto.server", reason="the dev extra (moto) is not installed")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _moto(tmp_path_factory.mktemp("moto"))


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch, s3: str, tmp_path: Path) -> str:
    """Static keys and moto's endpoint in the environment (as a pod's SDK reads them); a bucket with the files."""
    import s3fs

    for name, value in {
        "AWS_ENDPOINT_URL": s3,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    if not fs.exists("data"):
        fs.mkdir("data")
    fs.put(str(write_jsonl(tmp_path / "train.jsonl", rows(1500))), "data/math/train.jsonl")
    fs.put(str(write_parquet(tmp_path / "train.parquet", rows(1500))), "data/math/train.parquet")
    s3fs.S3FileSystem.clear_instance_cache()  # the loader's filesystem must not reuse this one's listings
    return "s3://data/math"


def test_s3_jsonl_and_parquet_stream_like_local_files(bucket: str, tmp_path: Path) -> None:
    for name, fields in (("train.jsonl", {}), ("train.parquet", {"promptField": "q", "answerField": "a"})):
        remote = TaskSpec.model_validate({"seed": 3, "dataset": {"train": f"{bucket}/{name}", **fields}})
        local = TaskSpec.model_validate({"seed": 3, "dataset": {"train": str(tmp_path / name), **fields}})
        got = DatasetPrompts(remote, words).take(Cursor(0, 700), 900)
        want = DatasetPrompts(local, words).take(Cursor(0, 700), 900)
        assert got.examples == want.examples and got.cursor == want.cursor == Cursor(1, 100)


def test_s3_missing_object_is_a_clear_error(bucket: str) -> None:
    spec = TaskSpec.model_validate({"dataset": {"train": f"{bucket}/nope.jsonl"}})
    with pytest.raises(DatasetError, match=r"task\.dataset\.train: 's3://data/math/nope\.jsonl' does not exist"):
        check_dataset(spec, 4, words)
