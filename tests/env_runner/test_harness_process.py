"""The policy endpoint through real processes: a harness environment drives its episodes with the real `openai` client
over the env-runner's OpenAI-compatible endpoint; every completion is a model turn the `python -m rollout_manager`
schedules on torch `python -m rollout_worker`s (a tiny model, greedy); the trainer's own RolloutClient receives the
whole episodes on its step's stream.

* Token in, token out: each episode's trained tokens (loss_mask 1) are exactly the token ids the endpoint reported to
  the harness (the harness returns a fingerprint of them as its reward), the harness's own messages are masked (0),
  and the log-probs are the model's: recomputed here by a forward pass over the whole episode, they match.
* A worker SIGKILLed while it streams a turn: the turn continues on the other worker from the tokens it streamed,
  and every episode of the step is token for token (and mask for mask) the uninterrupted step's.

The harness is a real package registered under `rlboost.environments` (tests/env_runner/sites.py).
"""

from __future__ import annotations

import asyncio
import signal
import textwrap
from pathlib import Path

import pytest

from rlboost.wire.rollout_io import Trajectory
from tests.env_runner import procs, sites
from tests.env_runner.procs import Job, Shape, collect, same_episodes, whole_step
from trainer.rollout_client import RolloutClient

SHAPE = Shape("chatter", turns=3, max_new_tokens=48)
CHATTER = textwrap.dedent(
    '''
    from rlboost.environments.harness import Outcome

    def fingerprint(ids):
        return sum((i + 1) * t for i, t in enumerate(ids)) % 1_000_003

    class Chatter:
        """Three model turns with the openai client, a user message after each reply. The reward is a fingerprint
        of the token ids the endpoint reported (its `rlboost` field), which the trained tokens must match."""
        def run(self, task, policy):
            client = policy.openai()
            messages = [{"role": "user", "content": task.question}]
            seen = []
            for turn in range(3):
                reply = client.chat.completions.create(model=policy.model, messages=messages)
                extra = reply.model_extra["rlboost"]
                assert extra["episode_id"] == policy.episode_id and extra["turn"] == turn
                seen += extra["token_ids"]
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                messages.append({"role": "user", "content": f"and then? ({turn})"})
            return Outcome(reward=float(fingerprint(seen)), tool_calls=2)
    '''
)


def fingerprint(ids: list[int]) -> int:
    return sum((i + 1) * t for i, t in enumerate(ids)) % 1_000_003


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = sites.install(tmp_path_factory.mktemp("chatter-site"), "chatter_env", CHATTER, {"chatter": "Chatter"})
    with pytest.MonkeyPatch.context() as mp:
        sites.on_path(site, mp)  # this process validates the job spec, which looks the name up too
        yield site


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return procs.tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


def model_logprobs(model_dir: Path, t: Trajectory) -> list[float]:
    """The log-prob the model gives each response token after everything before it (one forward pass)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    ids = torch.tensor([t.prompt_ids + t.response_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    start = len(t.prompt_ids)
    return [logp[start + i - 1, tok].item() for i, tok in enumerate(t.response_ids)]


def model_tokens(t: Trajectory) -> list[int]:
    return [tok for tok, m in zip(t.response_ids, t.loss_mask, strict=True) if m]


async def test_a_harness_drives_episodes_through_the_endpoint_and_a_killed_worker_changes_nothing(
    model_dir, site, tmp_path
):
    job = Job(tmp_path, model_dir, site, SHAPE)
    try:
        await job.start(workers=2, worker_capacity=2)
        await job.ready(workers=2)
        async with RolloutClient(job.target) as rc:
            first = await whole_step(rc, SHAPE.request(0), 300)
            assert len(first) == SHAPE.prompts * SHAPE.group
            for t in first:
                assert (t.turns, t.finish_reason, t.episode.runner, t.episode.tool_calls) == (3, "stop", "env-0", 2)
                assert len(t.loss_mask) == len(t.response_ids) == len(t.logprobs) and 0 in t.loss_mask
                assert t.reward == fingerprint(model_tokens(t))  # what the harness was told is what is trained
                assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m == 0)
                expected = model_logprobs(model_dir, t)
                for lp, want, m in zip(t.logprobs, expected, t.loss_mask, strict=True):
                    assert not m or lp == pytest.approx(want, abs=2e-3)

            second: list[Trajectory] = []
            collecting = asyncio.create_task(collect(rc, SHAPE.request(1), second))

            async def streaming():
                s = await job.status()
                busy = [w for w in s.workers if w.inflight_tokens > 0] if s is not None else []
                return max(busy, key=lambda w: w.inflight_tokens).worker_id if busy else None

            victim = await job.until(streaming, "a worker streaming a turn")
            job.procs[victim].send_signal(signal.SIGKILL)
            await asyncio.wait_for(collecting, 300)
        same_episodes(first, second)  # greedy: the same episodes, however their turns were placed
        assert sorted(t.reward for t in first) == sorted(t.reward for t in second)
        continued = [t for t in second if victim in t.workers and len(set(t.workers)) >= 2]
        assert continued, f"no turn continued from {victim}'s tokens: {[t.workers for t in second]}"
        final = await job.status()
        assert final is not None and final.episodes.failed == 0 and final.migrations > 0
    finally:
        job.stop()
