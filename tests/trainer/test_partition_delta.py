"""ZeRO-3 partitioned state extraction (trainer.partition_delta) against the gathered path, on real DeepSpeed.

Two real rank processes (gloo on loopback, ZeRO-3, the tiny Qwen3 with tied embeddings) train a fixed batch
for three steps; after the initial load and after each step both extraction paths run on the same engine
and rank 0 records the published-state checksums and the bytes each moved to rank 0. The same file is the
rank program:

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P python -m tests.trainer.test_partition_delta \
        --model-dir DIR --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlboost.nats_server import free_port
from tests.trainer.peers import child_env

pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

_ROOT = Path(__file__).resolve().parents[2]
SPARSE_LR, DENSE_LR = 1e-6, 1e-2  # steps 1-2: few bf16 values move; step 3: most do


def _rank_main(model_dir: str, out: str) -> None:
    import torch

    from rlboost.weights.checksum import state_checksum
    from tests.trainer.conftest import tiny_spec
    from tests.trainer.test_engine import _batch, collate_rows
    from trainer.engine import PolicyEngine

    spec = tiny_spec(learning_rate=SPARSE_LR, micro_batch_size=2)
    spec.trainer.ranks, spec.trainer.zero_stage = 2, 3
    engine = PolicyEngine(model_dir, spec)
    rank = engine.rank
    batch, n = _batch(engine)
    mine = collate_rows(batch, slice(2 * rank, 2 * rank + 2))
    rows = []
    for step in range(4):
        if step == 3:
            for group in engine.optimizer.param_groups:
                group["lr"] = DENSE_LR
        if step:
            engine.forward_backward(mine, n)
            engine.step()
        part = engine.publish_state("partitioned")
        part_traffic = dict(engine.last_extraction)
        full = engine.publish_state("gathered")
        if rank == 0:
            assert {t.dtype for t in part.values()} == {torch.bfloat16}
            rows.append(
                {
                    "partitioned": state_checksum(part),
                    "gathered": state_checksum(full),
                    "model_bytes": sum(t.numel() * t.element_size() for t in full.values()),
                    "names": sorted(part) == sorted(full),
                    "traffic": part_traffic,
                    "gathered_bytes": engine.last_extraction["bytes_to_rank0"],
                }
            )
    if rank == 0:
        Path(out).write_text(json.dumps({"extraction": engine.extraction, "rows": rows}))
    from trainer import ranks

    ranks.shutdown()  # as the trainer ends: without it a rank could abort at exit (-6) after its work was done


@pytest.mark.slow
def test_two_rank_zero3_partitioned_extraction_is_bit_exact_and_sparse(tiny_model_dir, tmp_path):
    """Real processes, real DeepSpeed ZeRO-3 partitions, real gloo gather: nothing mocked."""
    out = tmp_path / "result.json"
    env = {
        **child_env(),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "tests.trainer.test_partition_delta",
        "--model-dir",
        str(tiny_model_dir),
        "--out",
        str(out),
    ]
    procs = [
        subprocess.Popen(
            cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stderr=subprocess.PIPE, text=True, cwd=_ROOT
        )
        for r in (0, 1)
    ]
    errs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        errs.append(err)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-3000:] for e in errs)
    result = json.loads(out.read_text())
    assert result["extraction"] == "partitioned"
    rows = result["rows"]
    assert len(rows) == 4
    for i, row in enumerate(rows):
        assert row["names"], f"extraction {i}: the paths publish different tensor names"
        assert row["partitioned"] == row["gathered"], f"extraction {i}: published states differ"
    assert len({r["gathered"] for r in rows}) == 4  # every step moved some bf16 value
    model = rows[0]["model_bytes"]
    first, sparse, dense = rows[0]["traffic"], rows[1:3], rows[3]["traffic"]
    # Initially every slice moves whole: rank 1's half of the model, in bf16 where gathering moves fp32.
    gathered = rows[0]["gathered_bytes"]
    assert first["sparse_slices"] == 0 and abs(first["bytes_to_rank0"] - gathered / 2) < 0.01 * gathered
    for row in sparse:  # a tiny learning rate: few bf16 bits change, and only those move
        t = row["traffic"]
        assert 0 < t["bytes_to_rank0"] < 0.1 * model and t["whole_slices"] == 0, t
        assert t["bytes_to_rank0"] < 0.1 * row["gathered_bytes"]  # vs. gathering rank 1's fp32 share
    assert dense["whole_slices"] > 0 and dense["changed"] > 0.3 * model / 2  # most values moved: slices go whole


def main() -> None:
    p = argparse.ArgumentParser(description="one rank of the partitioned-extraction test")
    p.add_argument("--model-dir", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.environ.setdefault("LOCAL_RANK", os.environ.get("RANK", "0"))
    _rank_main(args.model_dir, args.out)


if __name__ == "__main__":
    main()
