"""rlboost.fsio on a real small file system (tests/small_fs.py, a tmpfs with size=): a full disk is one line
naming the path and the field, and an appended line is whole or not there (issue 31 item 2)."""

from __future__ import annotations

import logging

import pytest

from rlboost.fsio import WriteFailed, append_line, is_disk_full, write_text_atomic
from rlboost.spec import LoggingSpec
from rlboost.tracking import open_trackers
from tests.small_fs import fill, mounted_tmpfs


def test_a_line_appended_to_a_full_disk_is_cut_off_and_named() -> None:
    with mounted_tmpfs("64k") as root:
        path = root / "steps.jsonl"
        append_line(path, '{"step": 0}', "step report", "the trainer's --run-dir")
        filler = fill(root, leave=100)
        with pytest.raises(WriteFailed) as info:
            append_line(path, '{"step": 1, "pad": "' + "x" * 8000 + '"}', "step report", "the trainer's --run-dir")
        assert str(info.value) == (
            f"step report could not be written to {path}: no space left on device; free space there or change "
            "the trainer's --run-dir (nothing partial was left)"
        )
        assert info.value.full and path.read_text() == '{"step": 0}\n'  # the half-written line was cut off
        filler.unlink()
        append_line(path, '{"step": 1}', "step report", "the trainer's --run-dir")
        assert path.read_text().splitlines() == ['{"step": 0}', '{"step": 1}']


def test_an_atomic_write_to_a_full_disk_leaves_no_temporary_file() -> None:
    with mounted_tmpfs("64k") as root:
        path = root / "step-1.validation.json"
        fill(root, leave=100)
        with pytest.raises(WriteFailed, match="no space left on device; free space there or change --x"):
            write_text_atomic(path, "y" * 8000, "step evaluation", "--x")
        assert sorted(p.name for p in root.iterdir() if not p.name.startswith("filler")) == []


def test_a_library_error_that_lost_the_errno_counts_as_full_only_on_a_full_disk(tmp_path) -> None:
    """torch's zip writer says 'file write failed' without an errno: the file system's free space decides."""
    err = RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")
    assert not is_disk_full(err, tmp_path)
    with mounted_tmpfs("256k") as root:
        fill(root)
        assert is_disk_full(err, root / "step-1" / "x.pt")
    assert is_disk_full(OSError(28, "No space left on device"))


def test_the_jsonl_tracker_on_a_full_disk_warns_once_naming_logging_dir_and_writes_no_half_line(caplog) -> None:
    with mounted_tmpfs("64k") as root:
        trackers = open_trackers(LoggingSpec(backends=["jsonl"], dir=str(root / "tracking")), root)
        trackers.log(0, {"loss": 1.0})
        fill(root, leave=100)
        with caplog.at_level(logging.WARNING, logger="rlboost.tracking"):
            for step in (1, 2):  # training goes on; the failure is said once
                trackers.log(step, {f"m{i}": float(i) for i in range(400)})
        (record,) = [r for r in caplog.records if r.getMessage() == "tracking backend failed to log"]
        assert "no space left on device" in record.error and "logging.dir" in record.error
        assert str(root / "tracking" / "metrics.jsonl") in record.error
        lines = (root / "tracking" / "metrics.jsonl").read_text().splitlines()
        assert len(lines) == 1 and lines[0].startswith('{"step": 0')
        trackers.close()


def test_a_full_disk_is_named_even_when_the_undo_frees_the_space() -> None:
    """torch's zip writer fails with 'unexpected pos ...' (no errno) while the disk is full; removing the partial
    checkpoint (the undo) frees the space before the message is made: it still says what happened."""
    from rlboost.fsio import writing

    with mounted_tmpfs("256k") as root:
        partial = root / "step-2"
        partial.mkdir()
        fill(root).rename(partial / "model.pt")

        with (
            pytest.raises(WriteFailed) as info,
            writing("checkpoint step-2", root, "--checkpoint-dir", undo=lambda: (partial / "model.pt").unlink()),
        ):
            raise RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 406016 vs 405904")
        assert "no space left on device; free space there or change --checkpoint-dir" in str(info.value)
        assert not (partial / "model.pt").exists()
