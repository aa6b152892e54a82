"""The prompt dataset loader (rlboost.tasks.dataset) on real files: JSONL, Parquet (several row groups), a
`datasets.save_to_disk` directory; the seeded order, epochs, cursors, the length filter and every bad input.

The encoder stands in for a tokenizer's chat template (one token per word of the rendered messages): the loader
only needs a function from messages to token ids, and the real template is covered by tests/trainer."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest

from rlboost.spec import JobSpec, JobSpecError, TaskSpec, parse_job_spec
from rlboost.tasks.base import Cursor, Example
from rlboost.tasks.dataset import (
    BLOCK_ROWS,
    DatasetError,
    DatasetPrompts,
    check_dataset,
    make_prompts,
    warmup_task,
)

N = 2500  # rows: three JSONL blocks, several Parquet row groups


def words(messages: list[dict[str, str]]) -> list[int]:
    return [len(w) for m in messages for w in f"{m['role']}: {m['content']}".split()]


def rows(n: int = N) -> list[dict]:
    out = []
    for i in range(n):
        prompt = f"question {i}" if i % 2 else [{"role": "user", "content": f"question {i}"}]
        out.append({"prompt": prompt, "answer": i, "source": f"s{i % 3}", "extra": "x"})
    return out


def write_jsonl(path: Path, data: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return path


def write_parquet(path: Path, data: list[dict], row_group: int = 300) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"q": [str(r["prompt"]) for r in data], "a": [str(r["answer"]) for r in data]})
    pq.write_table(table, path, row_group_size=row_group)
    return path


def task(train: str, **dataset: object) -> TaskSpec:
    return TaskSpec.model_validate({"seed": 7, "dataset": {"train": train, **dataset}})


def questions(prompts: DatasetPrompts, cursor: Cursor, n: int) -> tuple[list[str], Cursor]:
    batch = prompts.take(cursor, n)
    return [e.question for e in batch.examples], batch.cursor


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "train.jsonl", rows())


def test_jsonl_rows_become_examples_with_chat_messages_answer_text_and_metadata(jsonl: Path) -> None:
    prompts = DatasetPrompts(
        task(str(jsonl), shuffle=False, metadataFields=["source"], systemPrompt="Be brief."), words
    )
    batch = prompts.take(Cursor(), 2)
    chat, text = batch.examples
    assert chat == Example("question 0", "0", ({"role": "user", "content": "question 0"},), {"source": "s0"})
    assert text == Example("question 1", "1", None, {"source": "s1"})
    assert prompts.messages(text) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "question 1"},
    ]
    assert batch.prompt_ids[1] == words(prompts.messages(text)) and batch.cursor == Cursor(0, 2)
    assert Example(**json.loads(json.dumps(asdict(chat)))) == chat  # the reward sandbox's wire keeps it whole


def test_an_epoch_visits_every_row_once_in_a_seeded_order_and_the_next_epoch_reshuffles(jsonl: Path) -> None:
    prompts = DatasetPrompts(task(str(jsonl), shuffleWindowBlocks=2), words)
    first, cursor = questions(prompts, Cursor(), N)
    second, end = questions(prompts, cursor, N)
    every = sorted(f"question {i}" for i in range(N))
    assert sorted(first) == sorted(second) == every
    assert first != every and second != first and cursor == Cursor(1, 0) and end == Cursor(2, 0)
    again, _ = questions(DatasetPrompts(task(str(jsonl), shuffleWindowBlocks=2), words), Cursor(), N)
    assert again == first  # a pure function of the seed and the files
    other = TaskSpec.model_validate({"seed": 8, "dataset": {"train": str(jsonl), "shuffleWindowBlocks": 2}})
    assert questions(DatasetPrompts(other, words), Cursor(), N)[0] != first


def test_rows_mix_across_blocks_of_a_window(jsonl: Path) -> None:
    head, _ = questions(DatasetPrompts(task(str(jsonl), shuffleWindowBlocks=4), words), Cursor(), 100)
    blocks = {int(q.split()[1]) // BLOCK_ROWS for q in head}
    assert len(blocks) > 1


def test_resuming_from_any_cursor_gives_the_same_rows_as_going_on(jsonl: Path) -> None:
    spec = task(str(jsonl), shuffleWindowBlocks=2)
    going, cursor, cursors = DatasetPrompts(spec, words), Cursor(), []
    straight = []
    for _ in range(9):  # 9 x 700 rows: across windows and two epoch ends
        got, cursor = questions(going, cursor, 700)
        straight.append(got)
        cursors.append(cursor)
    for k in (0, 3, 6):
        fresh = DatasetPrompts(spec, words)  # a restarted trainer: nothing but the checkpointed cursor
        resumed, c = [], cursors[k]
        for _ in range(9 - k - 1):
            got, c = questions(fresh, c, 700)
            resumed.append(got)
        assert resumed == straight[k + 1 :]


def test_epochs_end_the_stream_with_a_short_batch(jsonl: Path) -> None:
    prompts = DatasetPrompts(task(str(jsonl), epochs=2), words)
    batch = prompts.take(Cursor(1, N - 10), 64)
    assert len(batch.examples) == 10 and batch.cursor == Cursor(2, 0)
    assert prompts.take(batch.cursor, 64).examples == []


def test_validation_split_is_read_once_in_file_order(tmp_path: Path, jsonl: Path) -> None:
    val = write_jsonl(tmp_path / "val.jsonl", rows(30))
    prompts = DatasetPrompts(task(str(jsonl), validation=str(val)), words, split="validation")
    batch = prompts.take(Cursor(), 100)
    assert [e.question for e in batch.examples] == [f"question {i}" for i in range(30)]
    with pytest.raises(DatasetError, match=r"task\.dataset\.validation is not set"):
        DatasetPrompts(task(str(jsonl)), words, split="validation")


def test_long_prompts_are_skipped_and_counted_never_truncated(tmp_path: Path) -> None:
    data = [{"prompt": "long " * (40 if i % 4 == 0 else 1) + str(i), "answer": i} for i in range(40)]
    path = write_jsonl(tmp_path / "t.jsonl", data)
    prompts = DatasetPrompts(task(str(path), shuffle=False, maxPromptTokens=10), words)
    batch = prompts.take(Cursor(), 6)
    assert [e.answer for e in batch.examples] == ["1", "2", "3", "5", "6", "7"]
    assert batch.skipped == 2 and batch.cursor == Cursor(0, 8) and all(len(p) <= 10 for p in batch.prompt_ids)
    assert prompts.skipped_total == 2


def test_parquet_row_groups_are_the_blocks(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "t.parquet", rows(), row_group=300)
    spec = task(str(path), promptField="q", answerField="a")
    prompts = DatasetPrompts(spec, words)
    assert [b.rows for b in prompts.split.blocks] == [300] * 8 + [100]
    first, cursor = questions(prompts, Cursor(), N)
    assert sorted(first) == sorted(str(r["prompt"]) for r in rows()) and cursor == Cursor(1, 0)
    resumed, _ = questions(DatasetPrompts(spec, words), Cursor(0, 1234), 50)
    assert resumed == first[1234:1284]


def test_a_directory_or_glob_of_files_is_one_split_in_name_order(tmp_path: Path) -> None:
    data = rows(40)
    write_jsonl(tmp_path / "part-1.jsonl", data[20:])
    write_jsonl(tmp_path / "part-0.jsonl", data[:20])
    (tmp_path / "README.md").write_text("not data")
    for location in (str(tmp_path), str(tmp_path / "part-*.jsonl")):
        got, _ = questions(DatasetPrompts(task(location, shuffle=False), words), Cursor(), 40)
        assert got == [f"question {i}" for i in range(40)]


def test_hf_datasets_save_to_disk_directory_and_its_splits(tmp_path: Path) -> None:
    import datasets

    data = {"problem": [f"p{i}" for i in range(50)], "solution": [str(i) for i in range(50)]}
    datasets.Dataset.from_dict(data).save_to_disk(str(tmp_path / "one"))
    both = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(data),
            "validation": datasets.Dataset.from_dict({k: v[:5] for k, v in data.items()}),
        }
    )
    both.save_to_disk(str(tmp_path / "dict"))
    fields = {"promptField": "problem", "answerField": "solution", "shuffle": False}
    got, _ = questions(DatasetPrompts(task(str(tmp_path / "one"), **fields), words), Cursor(), 50)
    assert got == data["problem"]
    spec = task(str(tmp_path / "dict"), validation=str(tmp_path / "dict"), **fields)
    assert questions(DatasetPrompts(spec, words, "validation"), Cursor(), 50)[0] == data["problem"][:5]
    with pytest.raises(DatasetError, match=r"splits \['train', 'validation'\], not 'test'.*task\.dataset\.split"):
        DatasetPrompts(task(str(tmp_path / "dict"), split="test", **fields), words)


def test_builtin_task_takes_the_same_batches_as_before() -> None:
    spec = TaskSpec(num_prompts=10)
    prompts, cursor = make_prompts(spec, words), Cursor()
    from rlboost.tasks import make_task

    reference = make_task(spec)
    for step in range(7):  # across epoch boundaries (10 rows, 4 per step)
        batch = prompts.take(cursor, 4)
        assert batch.examples == [ex for _, ex in reference.batch(step, 4)]
        cursor = batch.cursor
    assert warmup_task(spec).examples == reference.examples


def test_builtin_task_takes_any_count_from_any_cursor_in_one_order() -> None:
    """Partial rollout tops up a varying number of prompts per step: the order stays the epochs' one."""
    spec = TaskSpec(num_prompts=10)
    prompts, cursor = make_prompts(spec, words), Cursor()
    from rlboost.tasks import make_task

    flat = [ex for _, ex in make_task(spec).batch(0, 30)]
    taken = []
    for n in (3, 5, 1, 7, 4, 10):  # 30 rows in all, across 3 epochs, never at a multiple of n
        batch = prompts.take(cursor, n)
        taken += batch.examples
        cursor = batch.cursor
    assert taken == flat
    assert cursor == Cursor(3, 0)


# ---- bad input: a clear error naming the field and the fix, before the first step ----


def _raises(spec: TaskSpec, pattern: str, encode: Callable | None = words, batch: int = 4) -> None:
    with pytest.raises(DatasetError, match=pattern):
        check_dataset(spec, batch, encode)


def test_missing_column_names_the_field_and_the_columns(tmp_path: Path, jsonl: Path) -> None:
    _raises(
        task(str(jsonl), promptField="question"),
        r"no column 'question' \(task\.dataset\.promptField\).*'answer', 'extra', 'prompt', 'source'",
    )
    parquet = write_parquet(tmp_path / "t.parquet", rows(10))
    _raises(
        task(str(parquet), promptField="q", answerField="label"), r"no column 'label' \(task\.dataset\.answerField\)"
    )
    _raises(task(str(jsonl), metadataFields=["level"]), r"no column 'level' \(task\.dataset\.metadataFields\)")


def test_empty_split_and_missing_path(tmp_path: Path, jsonl: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    _raises(task(str(tmp_path / "empty.jsonl")), r"task\.dataset\.train: .*empty\.jsonl' holds no rows")
    _raises(task(str(jsonl), validation=str(tmp_path / "nope.jsonl")), r"task\.dataset\.validation: .*does not exist")
    (tmp_path / "d").mkdir()
    _raises(task(str(tmp_path / "d")), r"holds no \.jsonl / \.parquet files")


def test_unreadable_files(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "answer": 1}\nnot json\n')
    _raises(task(str(tmp_path / "bad.jsonl")), r"bad\.jsonl.*is not JSON Lines")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    _raises(task(str(tmp_path / "bad.parquet")), r"task\.dataset\.train: cannot read .*bad\.parquet")
    (tmp_path / "data.txt").write_text("x")
    _raises(task(str(tmp_path / "data.txt")), r"set task\.dataset\.format")
    (tmp_path / "chat.jsonl").write_text(json.dumps({"prompt": [{"who": "me"}], "answer": 1}) + "\n")
    _raises(task(str(tmp_path / "chat.jsonl")), r"task\.dataset\.promptField\) must hold text or .*\{role, content\}")


def test_all_prompts_too_long_or_too_few_that_fit(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "a b c d e f", "answer": i} for i in range(20)])
    _raises(
        task(str(path), maxPromptTokens=3),
        r"every prompt of .* is longer than task\.dataset\.maxPromptTokens \(3; e\.g\. 7 tokens",
    )
    _raises(
        task(str(path), epochs=1),
        r"only 20 prompts fit .* fewer than one step's algorithm\.promptsPerStep \(32\)",
        batch=32,
    )
    check_dataset(task(str(path)), 32, words)  # epochs 0: the rows repeat


def test_spec_checks_that_need_no_data() -> None:
    with pytest.raises(JobSpecError, match=r"task\.dataset\.train: .*unsupported scheme"):
        parse_job_spec({"task": {"dataset": {"train": "ftp://host/x.jsonl"}}})
    with pytest.raises(JobSpecError, match=r"task\.dataset\.answerField: .*must differ"):
        parse_job_spec({"task": {"dataset": {"train": "x.jsonl", "answerField": "prompt"}}})
    with pytest.raises(JobSpecError, match=r"task\.dataset\.maxPromptTokens.*exceeds rollout\.maxPromptTokens"):
        parse_job_spec({"task": {"dataset": {"train": "x.jsonl", "maxPromptTokens": 9000}}})
    with pytest.raises(JobSpecError, match=r"task\.dataset\.train: .*set both"):
        parse_job_spec({"task": {"dataset": {"validation": "v.jsonl"}}})
    assert JobSpec().task.active_dataset is None  # the built-in task stays the default


def test_the_math_example_loads_and_its_dataset_is_what_the_script_writes(tmp_path, monkeypatch) -> None:
    import subprocess
    import sys

    from rlboost.local.runner import with_absolute_dataset_paths
    from rlboost.spec import load_job_spec

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)  # the example's paths are relative to the repository root
    spec = with_absolute_dataset_paths(load_job_spec(root / "examples" / "local-math.yaml"))
    check_dataset(spec.task, spec.algorithm.prompts_per_step, words)
    assert spec.task.reward == "math_verify" and spec.task.dataset.metadata_fields == ["kind"]
    subprocess.run([sys.executable, str(root / "scripts" / "make_math_dataset.py"), "--out", str(tmp_path)], check=True)
    for name in ("math-train.jsonl", "math-validation.jsonl"):
        assert (tmp_path / name).read_bytes() == (root / "examples" / "data" / name).read_bytes()
