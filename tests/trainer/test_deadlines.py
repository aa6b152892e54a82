"""The trainer against a rollout that misses its deadline or drops a sample: `python -m trainer` as a real
process, with a real nats-server and weight-server, and the stand-in rollout-manager of tests/trainer/peers.py
(the generated servicer over real gRPC: it can hold a step back or send a sample as dropped on demand).
"""

from __future__ import annotations

import asyncio

import pytest

from rlboost.models import load_tokenizer, stop_token_ids
from rlboost.spec import dump_job_spec
from tests.trainer.conftest import tiny_spec
from tests.trainer.peers import StandInManager
from tests.trainer.test_loop import _setup, run_trainer
from trainer.rollout_stream import listed_missing as _listed
from trainer.vocabulary import vocab_size as _vocab_size


def _stand_in(tiny_model_dir, **kw) -> StandInManager:
    tok = load_tokenizer(tiny_model_dir)
    return StandInManager(tok, stop_token_ids(tok)[0], **kw)


async def _run(tmp_path, tiny_model_dir, nats_server, stand_in: StandInManager, job: str, **rollout):
    """One trainer step against the stand-in, with these rollout spec fields; (exit code, stderr, events)."""
    config, _ = _setup(tmp_path, tiny_model_dir)
    spec = tiny_spec()
    for name, value in rollout.items():
        setattr(spec.rollout, name, value)
    config.write_text(dump_job_spec(spec))
    return await run_trainer(tmp_path, config, stand_in, nats_server.url, job, steps=1)


@pytest.mark.slow
async def test_step_deadline_retries_then_fails_naming_the_missing_samples(tmp_path, tiny_model_dir, nats_server):
    stand_in = _stand_in(tiny_model_dir, gates={0: asyncio.Event()})  # step 0 never comes back
    code, err, events = await _run(
        tmp_path, tiny_model_dir, nats_server, stand_in, "dl", step_deadline_s=2.0, step_retries=1
    )
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert "StepDeadlineError" in last and "rollout.stepDeadlineS (2s)" in last and "0/4 trajectories" in last
    assert "(0, 0), (0, 1), (1, 0), (1, 1)" in events["done"][0].error
    assert [r.step for r in stand_in.requests] == [0, 0]  # asked once more after the first deadline
    assert stand_in.requests[0].vocab_size == _vocab_size(tiny_model_dir) > 0


@pytest.mark.slow
async def test_dropped_sample_trains_with_zero_weight_and_is_counted(tmp_path, tiny_model_dir, nats_server):
    stand_in = _stand_in(tiny_model_dir, dropped={(1, 1)})
    code, err, events = await _run(tmp_path, tiny_model_dir, nats_server, stand_in, "dr")
    assert code == 0, err[-3000:]
    (report,) = events["steps"]
    assert report.finish_reasons == {"stop": 3, "failed": 1} and report.off_policy == 0
    assert report.baseline_excluded == 1  # and out of its group's baseline (trainer.advantages)
    assert report.trajectories == 4 and events["done"][0].ok


def test_missing_samples_are_listed_with_a_count_of_the_rest():
    assert _listed([(0, 1), (2, 3)]) == "(0, 1), (2, 3)"
    assert _listed([(i, 0) for i in range(12)], most=2) == "(0, 0), (1, 0) and 10 more"


def test_vocab_size_comes_from_the_model_config(tmp_path):
    (tmp_path / "config.json").write_text('{"vocab_size": 321}')
    assert _vocab_size(tmp_path) == 321
    (tmp_path / "config.json").write_text("{}")
    assert _vocab_size(tmp_path) == 0
    assert _vocab_size(tmp_path / "absent") == 0
