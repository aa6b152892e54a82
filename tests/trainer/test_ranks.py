"""Two trainer ranks (gloo, ZeRO-2) as two real `python -m trainer` processes learn on the stand-in's batches.

Peers as in test_loop: a real nats-server, a real weight-server process, and the stand-in rollout-manager
(tests/trainer/peers.py; no workers generate here). Rank 0 talks to them and broadcasts micro-batches;
rank 1 trains its share. Learning is checked on the published weights: the advantage-weighted
log-likelihood of the trajectories the stand-in sent (right answers +, wrong answers -) goes up. Under partial
rollout a step's micro-batches need not fill its last round: that round is padded with weightless rows
(trainer.ranks.complete_round), checked here pure, on the real engine, and as 2 ranks against 1.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from rlboost.models import load_tokenizer, stop_token_ids
from rlboost.nats_server import free_port
from rlboost.spec import dump_job_spec
from rlboost.weights.client import WeightClient
from rlboost.weights.safetensors_io import state_from_bytes
from rlboost.wire.rollout_io import Trajectory
from tests.trainer.conftest import tiny_spec
from tests.trainer.peers import TOKEN, StandInManager, WeightServerProcess, child_env, start_manager, wait_process
from tests.trainer.test_loop import _collect, _trainer_cmd
from trainer.grpo import LossStats, Sample, clipped_policy_loss, collate, token_logprobs
from trainer.ranks import complete_round

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]


def _micro_batches(count: int, rows: int = 2) -> list:
    """`count` collated micro-batches of `rows` samples each, of varied lengths, advantages and staleness."""
    g = torch.Generator().manual_seed(5)
    out = []
    for k in range(count):
        samples = []
        for r in range(rows):
            prompt = torch.randint(5, 60, (3 + r,), generator=g).tolist()
            resp = torch.randint(5, 60, (2 + k,), generator=g).tolist()
            t = Trajectory(f"s0-p{k}-g{r}", 0, k, r, prompt, resp, [-0.5] * len(resp), "stop", 0)
            samples.append(Sample(t, reward=float(r), advantage=1.0 - 2 * r, stale=r == 1))
        out.append(collate(samples, pad_id=0))
    return out


def test_a_short_round_is_completed_with_weightless_rows_that_add_nothing():
    real = _micro_batches(3)
    assert complete_round(real[:2], 2) == real[:2]  # a full round is left as it is
    last = complete_round(real[2:], 2)
    assert last[0] is real[2] and len(last) == 2  # the real one keeps its rank (micro-batch k on rank k mod world)
    assert [mb.input_ids.shape[0] for mb in complete_round(real[2:], 4)] == [2, 1, 1, 1]
    pad = last[1]
    assert pad.input_ids.shape == (1, real[2].input_ids.shape[1])
    assert pad.response_mask.sum() == 0 and pad.loss_weight.tolist() == [0.0] and pad.advantages.tolist() == [0.0]
    assert not pad.stale.any()  # the ratio is exactly 1: nothing to overflow in a zero-weighted product
    logits = torch.randn(1, pad.input_ids.shape[1], 64, requires_grad=True)
    logp = token_logprobs(logits, pad.input_ids, 1.0)
    for aggregation in ("sequence", "token"):
        mask = pad.response_mask * pad.loss_weight[:, None]
        loss, stats = clipped_policy_loss(
            logp, logp.detach(), pad.advantages, mask, 0.2, 6, aggregation=aggregation, max_tokens=8
        )
        (grad,) = torch.autograd.grad(loss, logits, retain_graph=True)
        assert loss.item() == 0.0 and stats == LossStats(0, 0, 0.0, 0.0) and not grad.any()
    for bad in ([], real):
        with pytest.raises(ValueError, match="a round has 1 to 2 micro-batches"):
            complete_round(bad, 2)


def test_a_weightless_row_trains_nothing_on_the_real_engine(tiny_model_dir):
    """One rank, real DeepSpeed: the pad's pass (with the KL and entropy terms on) leaves loss, stats and weights."""
    from trainer.engine import PolicyEngine

    engine = PolicyEngine(tiny_model_dir, tiny_spec(kl_coef=0.1, entropy_coef=0.01))
    before = engine.full_state()
    loss, stats = engine.forward_backward(_micro_batches(1)[0].weightless_row(), 6)
    assert loss == 0.0 and stats == LossStats(0, 0, 0.0, 0.0, 0.0, 0.0)
    engine.step()  # Adam on an all-zero gradient: a zero update
    after = engine.full_state()
    assert all(torch.equal(before[k], after[k]) for k in before)


def _objective(model_dir, state: dict[str, torch.Tensor], trajs) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    total = 0.0
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor([t.prompt_ids + t.response_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            p = len(t.prompt_ids)
            tok = logp[p - 1 :, :].gather(-1, ids[0, p:, None]).squeeze(-1)
            total += (1.0 if t.sample_index % 2 == 0 else -1.0) * float(tok.mean())
    return total


async def _train(tmp_path, spec, tiny_model_dir, nats_url: str, job: str, world: int, steps: int, dropped=frozenset()):
    """`world` real `python -m trainer` rank processes for `steps` against the stand-in manager, a real
    weight-server and NATS: (the job's NATS events, published states by version, the stand-in). `dropped`: the
    (prompt, sample)s the stand-in sends as dropped."""
    job_dir = tmp_path / job
    job_dir.mkdir()
    (job_dir / "model").symlink_to(tiny_model_dir)
    config = job_dir / "job.yaml"
    config.write_text(dump_job_spec(spec))
    tok = load_tokenizer(tiny_model_dir)
    stand_in = StandInManager(tok, stop_token_ids(tok)[0], dropped=set(dropped))
    server, target = await start_manager(stand_in)
    import nats

    nc = await nats.connect(nats_url)
    events = await _collect(nc, job)
    rendezvous = {"WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    try:
        with WeightServerProcess(tmp_path / f"ws-{job}", nats_url, job=job) as ws:
            procs = []
            for rank in range(world):
                cmd = _trainer_cmd(tmp_path / f"{job}-r{rank}", config, target, ws, nats_url, job, steps=steps)
                env = {**child_env(), **rendezvous, "RANK": str(rank), "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1"}
                procs.append(await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE, env=env))
            results = await asyncio.gather(*(wait_process(p, 300) for p in procs))
            for code, err in results:
                assert code == 0, err[-3000:]
            async with WeightClient(ws.url, token=TOKEN) as wc:
                versions = (await wc.versions()).versions
                states = {v: state_from_bytes(await wc.pull(v)) for v in versions}
        await nc.flush()
    finally:
        await nc.close()
        await server.stop(None)
    return events, states, stand_in


@pytest.mark.slow
async def test_two_ranks_zero2_train_and_learn(tmp_path, tiny_model_dir, nats_server):
    spec = tiny_spec(micro_batch_size=2, learning_rate=2e-2)
    spec.trainer.ranks, spec.trainer.zero_stage = 2, 2
    events, states, stand_in = await _train(tmp_path, spec, tiny_model_dir, nats_server.url, "r2", world=2, steps=3)
    assert sorted(states) == [0, 1, 2, 3]
    assert [(s.step, s.weight_version, s.ranks) for s in events["steps"]] == [(0, 1, 2), (1, 2, 2), (2, 3, 2)]
    # Both ranks' tokens are in the all-reduced statistics: 4 trajectories per step, every one counted.
    assert all(s.grad_norm > 0 and s.entropy > 0 for s in events["steps"])
    assert len(events["done"]) == 1 and events["done"][0].ok and events["done"][0].steps == 3
    # Only rank 0 published: the weight-server announced each version once.
    assert sorted(w.version for w in events["weights"]) == [0, 1, 2, 3]
    before = _objective(tiny_model_dir, states[0], stand_in.sent)
    after = _objective(tiny_model_dir, states[3], stand_in.sent)
    assert after > before + 1e-3, (before, after)


@pytest.mark.slow
async def test_partial_rollout_on_two_ranks_trains_an_odd_step_as_one_rank_does(tmp_path, tiny_model_dir, nats_server):
    """Partial rollout, 3 groups of 2 complete per step (over-provision 0.5), micro-batches of 2: 3 micro-batches,
    so each step's second round is micro-batch 2 and a weightless row. Same samples to 1 rank and to 2 (ZeRO-2):
    the same loss, gradient norm and statistics to fp32 rounding (the order of the gradient sums differs: rank 0
    accumulates micro-batches 0 and 2, the all-reduce adds rank 1's), and the same published bf16 weights."""
    spec = tiny_spec(
        micro_batch_size=2,
        learning_rate=2e-2,
        partial_rollout=True,
        max_staleness=1,
        partial_rollout_over_provision=0.5,
    )
    spec.trainer.zero_stage = 2
    one, one_states, _ = await _train(tmp_path, spec, tiny_model_dir, nats_server.url, "p1", world=1, steps=2)
    spec.trainer.ranks = 2
    two, two_states, _ = await _train(tmp_path, spec, tiny_model_dir, nats_server.url, "p2", world=2, steps=2)
    assert [(s.trajectories, s.carried_over, s.ranks) for s in two["steps"]] == [(6, 0, 2), (6, 0, 2)]
    assert [s.ranks for s in one["steps"]] == [1, 1]
    for a, b in zip(one["steps"], two["steps"], strict=True):
        assert a.tokens == b.tokens and a.reward_mean == b.reward_mean  # the same samples
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-5) and b.loss == pytest.approx(a.loss, rel=1e-5)
        assert b.entropy == pytest.approx(a.entropy, rel=1e-5)  # padded rows count no tokens
    assert sorted(one_states) == sorted(two_states) == [0, 1, 2]
    for name, want in one_states[2].items():
        torch.testing.assert_close(two_states[2][name].float(), want.float(), rtol=2**-7, atol=1e-6, msg=name)
