"""Bad config files: one line naming the file, the place and the fix; never a traceback (issue 31 item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlboost.config_file import MAX_FILE_BYTES, ConfigFileError, load_yaml_file
from rlboost.spec import JobSpecError, load_job_spec
from tests.rlboost.test_cli import rlboost

LAUGHS = "a: &a [1,2,3,4,5,6,7,8,9,10]\n" + "".join(
    f"{n}: &{n} [{','.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcde", "bcdef", strict=True)
)
BAD_FILES = {
    "not UTF-8": (b"model:\n  name: \xff\xfe\n", r"byte 15 \(line 2\) is not UTF-8; save the file as UTF-8"),
    "nested 5,000 deep": (b"a: " + b"[" * 5000 + b"]" * 5000, "line 1: nested more than 64 levels deep"),
    "a 5,000-digit integer": (
        b"algorithm:\n  steps: " + b"9" * 5000,
        "line 2: an integer of 5000 characters; write a number of at most 4300 digits",
    ),
    "aliases that expand a billion-fold": (LAUGHS.encode(), r"expands to more than 100,000 values \(YAML aliases\?\)"),
    "a syntax error": (b"algorithm:\n  steps: [1\n", "is not valid YAML: line 3, column 1: while parsing a flow"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_a_bad_file_is_one_line_naming_it(case: str, tmp_path: Path) -> None:
    content, message = BAD_FILES[case]
    path = tmp_path / "job.yaml"
    path.write_bytes(content)
    with pytest.raises(JobSpecError, match=message) as err:
        load_job_spec(path)
    assert str(err.value).startswith(f"config file {path}") and "\n" not in str(err.value)


def test_a_directory_an_oversized_file_and_a_missing_one_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match="is a directory; pass the YAML file in it"):
        load_yaml_file(tmp_path)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(ConfigFileError, match=f"is {MAX_FILE_BYTES + 1:,} bytes; a job spec is at most"):
        load_yaml_file(big)
    with pytest.raises(ConfigFileError, match="config file not found"):
        load_yaml_file(tmp_path / "missing.yaml")


def test_anchors_and_aliases_a_person_writes_still_load(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("pools: &pool {replicas: 2}\nother: *pool\n")
    assert load_yaml_file(path) == {"pools": {"replicas": 2}, "other": {"replicas": 2}}


def test_rlboost_local_says_it_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(BAD_FILES["not UTF-8"][0])
    res = rlboost("local", "--config", str(path))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        f"rlboost local: error: config file {path}: byte 15 (line 2) is not UTF-8; save the file as UTF-8"
    ]
