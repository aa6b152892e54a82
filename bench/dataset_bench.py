"""Loading throughput and memory of the prompt dataset loader (rlboost.tasks.dataset) on a 1M-row Parquet file.

    .venv/bin/python bench/dataset_bench.py                     # 1,000,000 rows, row groups of 10,000
    .venv/bin/python bench/dataset_bench.py --rows 200000 --row-group 5000 --window 8

Writes the file into a temporary directory (arithmetic word problems, ~90-character prompts, an answer and a
metadata column), then in a fresh process each (so peak RSS is the loader's, not the generator's): opening the
split (metadata only), streaming a whole shuffled epoch through `DatasetPrompts.take` in batches of 256 with a
trivial encoder (the loader's own cost: reading, permuting, building examples), and the same with the tiny
model's tokenizer applying its chat template (what the trainer pays per prompt). Also a resume: the time to
read one batch from a cursor in the middle of the epoch. Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def generate(path: Path, rows: int, row_group: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    for start in range(0, rows, row_group):
        ids = range(start, min(rows, start + row_group))
        table = pa.table(
            {
                "prompt": [
                    f"Problem {i}: a shop sells {i % 97} pens and then {i % 89} more. How many pens were sold?"
                    for i in ids
                ],
                "answer": [str(i % 97 + i % 89) for i in ids],
                "level": [i % 5 for i in ids],
            }
        )
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table, row_group_size=row_group)
    assert writer is not None
    writer.close()


def _rss_mib() -> float:
    """This process's peak RSS (VmHWM: per address space, unlike ru_maxrss, which keeps the forking parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(path: str, mode: str, window: int, model_dir: str) -> dict:
    """One measurement in this process: 'open', 'epoch', 'epoch-template', 'resume' or 'full-load' (for scale:
    the whole file read into Python rows at once, as a non-streaming loader would)."""
    if mode == "full-load":
        import pyarrow.parquet as pq

        base, t = _rss_mib(), time.perf_counter()
        rows = pq.read_table(path).to_pylist()
        return {
            "mode": mode,
            "rows": len(rows),
            "seconds": round(time.perf_counter() - t, 2),
            "peak_rss_mib": round(_rss_mib(), 1),
            "rss_before_open_mib": round(base, 1),
        }
    from rlboost.spec import TaskSpec
    from rlboost.tasks.base import Cursor
    from rlboost.tasks.dataset import DatasetPrompts

    def cheap(messages: list[dict[str, str]]) -> list[int]:
        return [len(messages[-1]["content"])]

    encode = cheap
    if mode == "epoch-template":
        from rlboost.models import encode_prompt, load_tokenizer

        tok = load_tokenizer(model_dir)

        def encode(messages: list[dict[str, str]]) -> list[int]:
            return encode_prompt(tok, messages)

    base_rss = _rss_mib()
    spec = TaskSpec.model_validate(
        {"dataset": {"train": path, "metadataFields": ["level"], "shuffleWindowBlocks": window}}
    )
    t0 = time.perf_counter()
    prompts = DatasetPrompts(spec, encode)
    opened = time.perf_counter() - t0
    rows = prompts.num_rows
    out: dict = {
        "mode": mode,
        "rows": rows,
        "blocks": len(prompts.split.blocks),
        "window_blocks": window,
        "open_seconds": round(opened, 3),
    }
    if mode == "open":
        pass
    elif mode == "resume":
        t = time.perf_counter()
        prompts.take(Cursor(0, rows // 2 + 123), 256)
        out["resume_batch_seconds"] = round(time.perf_counter() - t, 3)
    else:
        limit = rows if mode == "epoch" else min(rows, 50_000)
        cursor, seen, t = Cursor(), 0, time.perf_counter()
        while seen < limit:
            batch = prompts.take(cursor, 256)
            cursor, seen = batch.cursor, seen + len(batch.examples)
        elapsed = time.perf_counter() - t
        out.update(rows_read=seen, seconds=round(elapsed, 2), rows_per_second=round(seen / elapsed))
    out.update(peak_rss_mib=round(_rss_mib(), 1), rss_before_open_mib=round(base_rss, 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--row-group", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=16, help="task.dataset.shuffleWindowBlocks")
    parser.add_argument("--measure", nargs=3, metavar=("PATH", "MODE", "MODEL_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        path, mode, model_dir = args.measure
        print(json.dumps(measure(path, mode, args.window, model_dir)))
        return
    with tempfile.TemporaryDirectory(prefix="dataset-bench-") as tmp:
        path = Path(tmp) / "train.parquet"
        t = time.perf_counter()
        generate(path, args.rows, args.row_group)
        print(
            json.dumps(
                {
                    "generated_rows": args.rows,
                    "row_group": args.row_group,
                    "file_mib": round(path.stat().st_size / 2**20, 1),
                    "seconds": round(time.perf_counter() - t, 1),
                }
            )
        )
        model_dir = _tiny_model(Path(tmp))
        for mode in ("open", "resume", "epoch", "epoch-template", "full-load"):
            cmd = [sys.executable, __file__, "--window", str(args.window), "--measure", str(path), mode, model_dir]
            print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip(), flush=True)


def _tiny_model(tmp: Path) -> str:
    """The default tiny model (its tokenizer and chat template), from the cache when there."""
    from rlboost.models import ensure_model
    from rlboost.spec import JobSpec

    spec = JobSpec()
    return str(ensure_model(spec.model, spec.task, tmp / "model"))


if __name__ == "__main__":
    main()
