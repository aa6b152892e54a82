"""The trainer's evaluation (spec.evaluation) as a real process: after every K-th step and the last, the
validation prompts are asked for at the just-published version (step id -(step + 1)) with the evaluation's
sampling, and pass@1 / pass@k land in the step report (NATS and steps.jsonl).

Peers as in test_loop.py: real NATS and weight-server, the stand-in rollout-manager (tests/trainer/peers.py), which
answers even samples right and odd ones off by one: with k = 2 every prompt has exactly one passing response, so
pass@1 = 0.5 and pass@2 = 1.0 exactly.
"""

from __future__ import annotations

import json

import pytest

from rlboost.models import stop_token_ids
from rlboost.spec import dump_job_spec
from rlboost.tasks.validation import validation_source
from rlboost.wire.events import StepReport
from tests.trainer.conftest import tiny_spec
from tests.trainer.peers import StandInManager
from tests.trainer.test_loop import _setup, run_trainer


@pytest.mark.slow
async def test_the_trainer_evaluates_every_k_steps_and_at_the_end(tmp_path, tiny_model_dir, nats_server):
    config, tok = _setup(tmp_path, tiny_model_dir)
    spec = tiny_spec()
    spec.evaluation = spec.evaluation.model_validate(
        {"everySteps": 2, "samples": 2, "prompts": 3, "temperature": 0.5, "maxNewTokens": 3, "seed": 9}
    )
    config.write_text(dump_job_spec(spec))
    stand_in = StandInManager(tok, stop_token_ids(tok)[0])
    code, err, events = await run_trainer(tmp_path, config, stand_in, nats_server.url, "tev", steps=3)
    assert code == 0, err[-3000:]

    asked = [(r.step, r.weight_version, len(r.prompts), r.group_size) for r in stand_in.requests]
    assert asked == [(0, 0, 2, 2), (1, 1, 2, 2), (-2, 2, 3, 2), (2, 2, 2, 2), (-3, 3, 3, 2)]
    evaluation = [r for r in stand_in.requests if r.step < 0]
    assert {(r.sampling.temperature, r.sampling.max_new_tokens, r.sampling.seed) for r in evaluation} == {(0.5, 3, 9)}
    questions = [tok.decode(p.token_ids) for p in evaluation[0].prompts]
    expected = validation_source(spec).validation_examples(3)
    assert all(e.question in q for q, e in zip(questions, expected, strict=True))

    steps = events["steps"]
    assert [s.validation is not None for s in steps] == [False, True, True]
    for report, version in zip(steps[1:], (2, 3), strict=True):
        v = report.validation
        assert (v.step, v.weight_version, v.k, v.prompts) == (report.step, version, 2, 3)
        assert (v.reward_mean, v.pass_at_1, v.pass_at_k, v.reward_failures) == (0.5, 0.5, 1.0, 0)
        assert v.response_tokens_mean > 0
    lines = (tmp_path / "run" / "steps.jsonl").read_text().splitlines()
    assert [StepReport.model_validate_json(x) for x in lines] == steps
    # Evaluation responses are not trained on: the trainer's rollout dump holds the training steps' only.
    dumped = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert sorted({d["step"] for d in dumped}) == [0, 1, 2] and len(dumped) == 3 * 2 * 2
