"""A prompt dataset streamed from JSONL / Parquet files or a `datasets.save_to_disk` directory (task.dataset).

Reading: a split (task.dataset.train / .validation) is resolved through fsspec (a local or PVC path, a glob, s3://,
gs://, hf://datasets/...) into files, and each file into *blocks* whose row counts are known from metadata or one
cheap scan: a Parquet row group, 1024 lines of a JSONL file (their byte offset indexed once), 1024 rows of an Arrow
`save_to_disk` dataset (memory-mapped). Only the blocks of the current window and only the columns asked for
(prompt, answer, metadata) are ever held in memory, as Arrow tables or raw JSON lines.

Order (the shuffle): per epoch, the block order is a seeded permutation, and consecutive blocks of it form windows
of `shuffleWindowBlocks`; the rows of a window are permuted with a seed of (task.seed, epoch, window). This is a
bounded-memory shuffle like a shuffle buffer, but stateless: the row at any (epoch, position) is a pure function
of the seed and the files' metadata, so a cursor of two integers is the whole state (a checkpoint stores it, a
resumed run reads one window and continues bit-exactly) and every rank that computed it would get the same order.
A running shuffle buffer would instead need its contents checkpointed, or the epoch replayed up to the cursor.
Mixing is across a window's blocks: files with many small row groups shuffle better than one giant row group.

Prompts: a row's prompt is text (one user turn) or chat messages; task.dataset.systemPrompt goes first where the
prompt has no system turn. Every prompt goes through the caller's `encode` (the model's chat template); one longer
than task.dataset.maxPromptTokens is skipped and counted, never truncated. Torch-free.
"""

from __future__ import annotations

import bisect
import json
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rlboost.spec import DatasetSpec, TaskSpec
from rlboost.tasks.base import Cursor, Encoder, Example, PromptBatch, Task, make_task, prompt_messages

log = logging.getLogger(__name__)

BLOCK_ROWS = 1024  # rows per block of a JSONL file or an Arrow dataset (a Parquet block is its row group)
_HF_DISK_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}


class DatasetError(ValueError):
    """A dataset that cannot be used; the message names the task.dataset field and the fix."""


@dataclass(frozen=True)
class Block:
    """Rows `[start, start + rows)` of one file: a Parquet row group, JSONL lines from a byte offset, Arrow rows."""

    file: int  # index into the split's files
    part: int  # Parquet row group index; JSONL byte offset; Arrow first row
    rows: int


class Split:
    """One split's files and blocks; `read(block)` returns its rows (only the needed columns)."""

    def __init__(self, spec: DatasetSpec, field: str) -> None:
        self.field = f"task.dataset.{field}"
        self.location: str = getattr(spec, field)
        self.columns = [spec.prompt_field, spec.answer_field, *spec.metadata_fields]
        self.format, self.fs, self.files = _resolve(spec, self.field, self.location)
        self._handles: dict[int, Any] = {}
        self.blocks: list[Block] = []
        try:
            for i in range(len(self.files)):
                self.blocks += self._file_blocks(i)
        except (OSError, ValueError) as err:
            if isinstance(err, DatasetError):
                raise
            raise DatasetError(
                f"{self.field}: cannot read {self.location!r} ({type(err).__name__}: {err}); check the path, the "
                f"file's format (task.dataset.format) and the credentials"
            ) from None
        self.num_rows = sum(b.rows for b in self.blocks)
        if self.num_rows == 0:
            raise DatasetError(f"{self.field}: {self.location!r} holds no rows; point it at a non-empty split")

    # ---- blocks of each format ----

    def _file_blocks(self, i: int) -> list[Block]:
        if self.format == "parquet":
            return self._parquet_blocks(i)
        if self.format == "hf-disk":
            return [
                Block(i, s, min(BLOCK_ROWS, len(self.files[i]) - s)) for s in range(0, len(self.files[i]), BLOCK_ROWS)
            ]
        return self._jsonl_blocks(i)

    def _parquet_blocks(self, i: int) -> list[Block]:
        meta = self._parquet(i).metadata
        self._check_columns(meta.schema.to_arrow_schema().names, self.files[i])
        return [Block(i, g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)]

    def _jsonl_blocks(self, i: int) -> list[Block]:
        """One pass over the file: the byte offset of every BLOCK_ROWS-th non-blank line (bounded memory)."""
        blocks, offset, start, rows = [], 0, 0, 0
        with self.fs.open(self.files[i], "rb") as f:
            for line in f:
                if line.strip():
                    if rows == 0:
                        start = offset
                        if not blocks:
                            self._check_columns(list(_json_row(line, self.field, self.files[i], offset)), self.files[i])
                    rows += 1
                    if rows == BLOCK_ROWS:
                        blocks.append(Block(i, start, rows))
                        rows = 0
                offset += len(line)
        if rows:
            blocks.append(Block(i, start, rows))
        return blocks

    def _check_columns(self, names: Sequence[str], where: Any) -> None:
        missing = [c for c in self.columns if c not in names]
        if missing:
            field = {self.columns[0]: "promptField", self.columns[1]: "answerField"}.get(missing[0], "metadataFields")
            raise DatasetError(
                f"{self.field}: {where} has no column {missing[0]!r} (task.dataset.{field}); its columns are "
                f"{sorted(names)}: set task.dataset.{field} to one of them"
            )

    def _parquet(self, i: int) -> Any:
        import pyarrow.parquet as pq

        if i not in self._handles:
            if len(self._handles) >= 8:  # a few open files at a time: a window touches at most its blocks' files
                _close(self._handles.pop(next(iter(self._handles))))
            source = self.fs.open(self.files[i], "rb")
            self._handles[i] = (source, pq.ParquetFile(source))
        return self._handles[i][1]

    # ---- reading ----

    def read(self, block: Block) -> Any:
        """The block's rows: an Arrow table (Parquet, Arrow) or a list of raw JSON lines."""
        if self.format == "parquet":
            return self._parquet(block.file).read_row_group(block.part, columns=self.columns)
        if self.format == "hf-disk":
            return self.files[block.file].with_format("arrow")[block.part : block.part + block.rows]
        lines: list[bytes] = []
        with self.fs.open(self.files[block.file], "rb") as f:
            f.seek(block.part)
            for line in f:
                if line.strip():
                    lines.append(line)
                    if len(lines) == block.rows:
                        break
        return lines

    def rows(self, data: Any, indices: Sequence[int]) -> list[dict[str, Any]]:
        """Rows `indices` of what `read` returned (several blocks concatenated), as dicts of the needed columns."""
        if isinstance(data, list):  # a row lacking a column is caught by row_example, naming the field
            return [_json_row(data[i], self.field, self.location, i) for i in indices]
        import pyarrow as pa

        return data.take(pa.array(indices, type=pa.int64())).to_pylist()

    def concat(self, parts: list[Any]) -> Any:
        if self.format == "jsonl":
            return [line for part in parts for line in part]
        import pyarrow as pa

        # One chunk: Arrow's take over a chunked table costs the whole window per call, over one chunk the rows taken
        return pa.concat_tables([p.select(self.columns) for p in parts]).combine_chunks()

    def close(self) -> None:
        for handle in self._handles.values():
            _close(handle)
        self._handles.clear()


def _close(handle: tuple[Any, Any]) -> None:
    """Close a Parquet reader and the file it reads (ParquetFile leaves a file object it was given open)."""
    source, reader = handle
    reader.close()
    source.close()


def _json_row(line: bytes, field: str, where: Any, at: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except ValueError as err:
        raise DatasetError(f"{field}: {where} (near byte/row {at}) is not JSON Lines ({err}); fix the file") from None
    if not isinstance(row, dict):
        raise DatasetError(f"{field}: {where} (near byte/row {at}): each line must be a JSON object")
    return row


def _resolve(spec: DatasetSpec, field: str, location: str) -> tuple[str, Any, list[Any]]:
    """(format, filesystem, files) of a location; hf-disk 'files' are the opened (memory-mapped) datasets."""
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(location)
        if any(c in path for c in "*?["):
            files = sorted(fs.glob(path))
        elif fs.isdir(path):
            names = {p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)}
            if spec.format == "hf-disk" or (spec.format == "auto" and names & set(_HF_DISK_MARKERS)):
                return "hf-disk", fs, [_load_from_disk(spec, field, location)]
            files = sorted(p for p in fs.find(path) if _format_of(p) is not None)
        elif fs.isfile(path):
            files = [path]
        else:
            files = []
    except (OSError, ValueError, ImportError) as err:
        raise DatasetError(
            f"{field}: cannot open {location!r} ({type(err).__name__}: {err}); check the path or URI and its credentials"
        ) from None
    if not files:
        raise DatasetError(f"{field}: {location!r} does not exist or holds no .jsonl / .parquet files; fix the path")
    fmt = spec.format if spec.format != "auto" else _format_of(files[0])
    if fmt is None or fmt == "hf-disk":
        raise DatasetError(
            f"{field}: cannot tell the format of {files[0]!r} from its name; set task.dataset.format "
            "('jsonl' or 'parquet')"
        )
    return fmt, fs, files


def _format_of(path: str) -> str | None:
    dot = path.rfind(".")
    return _EXTENSIONS.get(path[dot:].lower()) if dot >= 0 else None


def _load_from_disk(spec: DatasetSpec, field: str, location: str) -> Any:
    """A `datasets.save_to_disk` directory, memory-mapped (a DatasetDict: the split task.dataset.split names)."""
    import datasets

    data = datasets.load_from_disk(location)
    if isinstance(data, datasets.DatasetDict):
        split = spec.split or ("validation" if field.endswith("validation") else "train")
        if split not in data:
            raise DatasetError(
                f"{field}: {location!r} has the splits {sorted(data)}, not {split!r}; set task.dataset.split"
            )
        data = data[split]
    missing = [c for c in (spec.prompt_field, spec.answer_field, *spec.metadata_fields) if c not in data.column_names]
    if missing:
        raise DatasetError(
            f"{field}: {location!r} has no column {missing[0]!r}; its columns are {data.column_names}: set "
            "task.dataset.promptField / answerField / metadataFields to them"
        )
    return data


class BlockOrder:
    """The row order of one epoch: permuted blocks grouped in windows, rows permuted within each window."""

    def __init__(self, blocks: Sequence[Block], seed: int, epoch: int, shuffle: bool, window: int) -> None:
        order = list(range(len(blocks)))
        if shuffle:  # a string seed: stable across processes and Python versions (no hash())
            random.Random(f"{seed}:{epoch}:blocks").shuffle(order)
        self.windows = [order[i : i + window] for i in range(0, len(order), window)]
        self.starts = [0]
        for w in self.windows:
            self.starts.append(self.starts[-1] + sum(blocks[b].rows for b in w))
        self.seed, self.epoch, self.shuffle = seed, epoch, shuffle

    def locate(self, position: int) -> tuple[int, int]:
        """(window, offset in the window) of an epoch position."""
        w = bisect.bisect_right(self.starts, position) - 1
        return w, position - self.starts[w]

    def permutation(self, w: int) -> list[int]:
        size = self.starts[w + 1] - self.starts[w]
        perm = list(range(size))
        if self.shuffle:
            random.Random(f"{self.seed}:{self.epoch}:window:{w}").shuffle(perm)
        return perm


class RowStream:
    """Rows of a split in the seeded order, from any cursor; holds one window in memory."""

    def __init__(self, split: Split, seed: int, shuffle: bool, window: int, epochs: int) -> None:
        self.split, self.seed, self.shuffle, self.window, self.epochs = split, seed, shuffle, window, epochs
        self._order: BlockOrder | None = None
        self._loaded: tuple[int, int] | None = None  # (epoch, window) in memory
        self._data: Any = None
        self._perm: list[int] = []

    def _order_of(self, epoch: int) -> BlockOrder:
        if self._order is None or self._order.epoch != epoch:
            self._order = BlockOrder(self.split.blocks, self.seed, epoch, self.shuffle, self.window)
        return self._order

    def _load(self, epoch: int, w: int) -> None:
        if self._loaded == (epoch, w):
            return
        order = self._order_of(epoch)
        self._data = None  # release the previous window before reading the next
        self._data = self.split.concat([self.split.read(self.split.blocks[b]) for b in order.windows[w]])
        self._perm = order.permutation(w)
        self._loaded = (epoch, w)

    def read(self, cursor: Cursor, n: int) -> Iterator[tuple[Cursor, dict[str, Any]]]:
        """Up to `n` rows from `cursor` on, each with the cursor after it; ends early after the last epoch."""
        epoch, position, left = cursor.epoch, cursor.position, n
        while left > 0 and not (self.epochs and epoch >= self.epochs):
            if position >= self.split.num_rows:
                epoch, position = epoch + 1, 0
                continue
            order = self._order_of(epoch)
            w, offset = order.locate(position)
            self._load(epoch, w)
            count = min(left, order.starts[w + 1] - position)
            rows = self.split.rows(self._data, self._perm[offset : offset + count])
            for row in rows:
                position += 1
                end = position == self.split.num_rows  # canonical: an epoch's end is the next one's start
                yield (Cursor(epoch + 1, 0) if end else Cursor(epoch, position)), row
            left -= count


class DatasetPrompts:
    """A split's prompts in the seeded order, encoded by the chat template, too-long ones skipped and counted."""

    def __init__(self, task: TaskSpec, encode: Encoder, split: str = "train") -> None:
        if task.active_dataset is None:
            raise DatasetError("task.dataset.train is not set")
        self.spec = task.dataset
        if split == "validation" and not self.spec.validation:
            raise DatasetError("task.dataset.validation is not set; point it at the validation split")
        self.split = Split(self.spec, split)
        train = split == "train"
        self.stream = RowStream(
            self.split,
            task.seed,
            self.spec.shuffle and train,
            self.spec.shuffle_window_blocks,
            self.spec.epochs if train else 1,
        )
        self.encode = encode
        self.skipped_total = 0

    @property
    def num_rows(self) -> int:
        return self.split.num_rows

    def example(self, row: dict[str, Any]) -> Example:
        return row_example(row, self.spec, self.split.field)

    def messages(self, example: Example) -> list[dict[str, str]]:
        return prompt_messages(example, self.spec.system_prompt)

    def take(self, cursor: Cursor, n: int) -> PromptBatch:
        """The next `n` prompts that fit task.dataset.maxPromptTokens from `cursor` (fewer: the epochs ended).

        A whole epoch's worth of rows skipped in a row means no prompt fits: DatasetError names the field."""
        examples: list[Example] = []
        ids: list[list[int]] = []
        skipped, streak = 0, 0
        while len(examples) < n:
            got = 0
            for after, row in self.stream.read(cursor, n - len(examples)):
                got, cursor = got + 1, after
                example = self.example(row)
                tokens = self.encode(self.messages(example))
                if len(tokens) > self.spec.max_prompt_tokens:
                    skipped, streak = skipped + 1, streak + 1
                    if streak >= self.num_rows:
                        raise self._all_too_long(len(tokens))
                    continue
                streak = 0
                examples.append(example)
                ids.append(tokens)
            if got == 0:
                break  # the last epoch ended
        self.skipped_total += skipped
        return PromptBatch(examples, ids, skipped, cursor)

    def _all_too_long(self, length: int) -> DatasetError:
        return DatasetError(
            f"{self.split.field}: every prompt of {self.split.location!r} is longer than task.dataset.maxPromptTokens "
            f"({self.spec.max_prompt_tokens}; e.g. {length} tokens after the chat template); raise "
            "task.dataset.maxPromptTokens or shorten the prompts"
        )

    def close(self) -> None:
        self.split.close()


def row_example(row: dict[str, Any], spec: DatasetSpec, field: str = "task.dataset.train") -> Example:
    """The Example of a dataset row: prompt text or chat messages, the answer as text, the metadata fields."""
    prompt, answer = row.get(spec.prompt_field), row.get(spec.answer_field)
    if prompt is None or answer is None:
        missing = spec.prompt_field if prompt is None else spec.answer_field
        kind = "promptField" if prompt is None else "answerField"
        raise DatasetError(f"{field}: a row has no value in {missing!r} (task.dataset.{kind}); fill or drop such rows")
    metadata = {k: _json_value(row.get(k)) for k in spec.metadata_fields}
    if isinstance(prompt, str):
        return Example(question=prompt, answer=_answer_text(answer), metadata=metadata)
    messages = _chat_messages(prompt, spec, field)
    users = [m["content"] for m in messages if m["role"] == "user"]
    return Example(
        question=users[-1] if users else messages[-1]["content"],
        answer=_answer_text(answer),
        messages=tuple(messages),
        metadata=metadata,
    )


def _chat_messages(prompt: Any, spec: DatasetSpec, field: str) -> list[dict[str, str]]:
    ok = (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt
        )
    )
    if not ok:
        raise DatasetError(
            f"{field}: column {spec.prompt_field!r} (task.dataset.promptField) must hold text or a non-empty list of "
            f"{{role, content}} messages, got {str(prompt)[:80]!r}; point promptField at such a column"
        )
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def _answer_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(_json_value(value))


def _json_value(value: Any) -> Any:
    """A JSON-safe copy (dates, decimals and bytes from Parquet become text) for the reward sandbox's wire."""
    if value is None or isinstance(value, str | int | float | bool):  # the common case, without a round trip
        return value
    return json.loads(json.dumps(value, default=str))


class BuiltinPrompts:
    """The built-in task behind the same interface as DatasetPrompts (never skips, never ends)."""

    def __init__(self, task: Task, encode: Encoder) -> None:
        self.task, self.encode = task, encode
        self.skipped_total = 0
        self.num_rows = len(task.examples)

    def take(self, cursor: Cursor, n: int) -> PromptBatch:
        return self.task.take(cursor, n, self.encode)

    def close(self) -> None:
        pass


def generated_task(task: TaskSpec) -> Task:
    """The prompts that are not read from files: a verifiers environment's own tasks (task.environment.verifiers),
    reasoning-gym's generated tasks (task.dataset.reasoningGym), or the built-in task."""
    if task.environment.verifiers:
        from rlboost.tasks.verifiers_taskset import verifiers_examples

        env = task.environment
        return Task(f"verifiers:{env.verifiers}", verifiers_examples(env.verifiers, dict(env.args)), task.seed)
    if task.dataset.reasoning_gym.name:
        from rlboost.tasks.reasoning_gym import reasoning_gym_examples

        rg = task.dataset.reasoning_gym
        return Task(f"reasoning_gym:{rg.name}", reasoning_gym_examples(rg), task.seed, task.dataset.system_prompt)
    return make_task(task)


def make_prompts(task: TaskSpec, encode: Encoder) -> BuiltinPrompts | DatasetPrompts:
    """The training prompts of a job: its dataset (task.dataset), generated tasks or the built-in task. How the
    trainer asks for a step's prompts: `batch = prompts.take(cursor, algorithm.promptsPerStep)`, then
    `cursor = batch.cursor`."""
    if task.active_dataset is None:
        return BuiltinPrompts(generated_task(task), encode)
    return DatasetPrompts(task, encode)


def warmup_task(task: TaskSpec, limit: int = 512) -> Task:
    """The task the tiny model learns its tokenizer and answer format from: the built-in one, or the first
    `limit` rows of the dataset's training split."""
    if task.active_dataset is None:
        return generated_task(task)
    return Task("dataset", examples_head(task, limit), task.seed, task.dataset.system_prompt)


def examples_head(task: TaskSpec, limit: int) -> list[Example]:
    """The first `limit` rows of the training split in file order (the tiny model's tokenizer and warm-up)."""
    split = Split(task.dataset, "train")
    try:
        stream = RowStream(split, task.seed, shuffle=False, window=1, epochs=1)
        return [row_example(row, task.dataset) for _, row in stream.read(Cursor(), min(limit, split.num_rows))]
    finally:
        split.close()


def check_dataset(
    task: TaskSpec, batch: int, encode: Encoder | None = None, train: DatasetPrompts | None = None
) -> None:
    """Before the first step: each split opens, has its columns and rows; with `encode`, the first training batch
    (`batch` prompts) fits task.dataset.maxPromptTokens and a validation prompt does. DatasetError otherwise.
    `train`: the training split already open (it is not opened again, nor closed)."""
    if task.active_dataset is None:
        return
    for which in ("train", "validation") if task.dataset.validation else ("train",):
        opened = train if which == "train" and train is not None else None
        prompts = opened or DatasetPrompts(task, encode or (lambda m: []), which)
        try:
            want = batch if which == "train" else 1
            got = len(prompts.take(Cursor(), want).examples) if encode is not None else want
        finally:
            if opened is None:
                prompts.close()
        if got < want:
            raise DatasetError(
                f"task.dataset.train: only {got} prompts fit task.dataset.maxPromptTokens "
                f"({task.dataset.max_prompt_tokens}) in task.dataset.epochs ({task.dataset.epochs}), fewer than one "
                f"step's algorithm.promptsPerStep ({batch}); add rows, raise the epochs or lower promptsPerStep"
            )
