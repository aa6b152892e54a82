"""`rlboost local --trainer-ranks N --checkpoint-dir DIR --resume`: the plan's trainer processes (pure)."""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
from pathlib import Path

from rlboost.cli.local_cmd import resolve_spec
from rlboost.cpu_numerics import CPU_NUMERICS_ENV
from rlboost.local.plan import LocalOptions, available_cores, build_plan, trainer_threads
from rlboost.spec import JobSpec


def _args(**kw: object) -> argparse.Namespace:
    base = dict(
        config=None,
        steps=None,
        temperature=None,
        seed=None,
        workers_reserved=None,
        workers_spot=None,
        trainer_ranks=None,
        checkpoint_dir=None,
        resume=False,
    )
    base.update(kw)
    return argparse.Namespace(**base)


def test_two_ranks_are_two_processes_on_one_rendezvous(tmp_path: Path):
    spec = resolve_spec(_args(trainer_ranks=2))
    assert spec.trainer.ranks == 2
    ports = itertools.count(30000)
    opts = LocalOptions(run_dir=tmp_path, python="/py", checkpoint_dir=tmp_path / "ck", resume=True)
    plan = build_plan(spec, opts, lambda: next(ports), nats_binary="/bin/nats-server")
    trainers = [c for c in plan.children if c.role == "trainer"]
    assert [c.name for c in trainers] == ["trainer", "trainer-1"]
    assert [c.env["RANK"] for c in trainers] == ["0", "1"] and {c.env["WORLD_SIZE"] for c in trainers} == {"2"}
    assert len({c.env["MASTER_PORT"] for c in trainers}) == 1
    assert len({c.ready_port for c in trainers}) == 2  # each rank serves its own /metrics
    for c in trainers:
        argv = c.argv
        assert argv[argv.index("--checkpoint-dir") + 1] == str(tmp_path / "ck") and "--resume" in argv


def test_one_rank_keeps_the_plain_trainer(tmp_path: Path):
    plan = build_plan(JobSpec(), LocalOptions(run_dir=tmp_path, python="/py"), lambda: 1, nats_binary="/n")
    (trainer,) = [c for c in plan.children if c.role == "trainer"]
    # a local run checkpoints into its run directory by default (the runner restarts a killed trainer from there)
    assert trainer.argv[trainer.argv.index("--checkpoint-dir") + 1] == str(tmp_path / "checkpoints")
    assert "--resume" not in trainer.argv
    # a rendezvous of its own, never one inherited from the runner's environment (it may be in use)
    # (and the pinned CPU arithmetic: rlboost.cpu_numerics)
    assert trainer.env == {
        **CPU_NUMERICS_ENV,
        "WORLD_SIZE": "1",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
        "OMP_NUM_THREADS": str(trainer_threads(JobSpec(), available_cores())),  # the cores its workers leave
    }


def test_bad_ranks_and_resume_without_dir_are_exit_2_naming_the_flag():
    def run(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rlboost.cli.main", "local", *a], capture_output=True, text=True, timeout=60
        )

    res = run("--trainer-ranks", "3")  # 16 x 8 = 128 samples do not split over 3 ranks
    assert res.returncode == 2 and "must be divisible by trainer.ranks (3)" in res.stderr
    assert "Traceback" not in res.stderr and ": :" not in res.stderr
    res = run("--resume")
    assert res.returncode == 2 and "--resume needs --checkpoint-dir" in res.stderr
