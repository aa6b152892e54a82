"""Two trainer ranks (gloo, ZeRO-2) as two real `python -m trainer` processes learn on the stand-in's batches.

Peers as in test_loop: a real nats-server, a real weight-server process, and the stand-in rollout-manager
(tests/trainer/peers.py; no workers generate here). Rank 0 talks to them and broadcasts micro-batches;
rank 1 trains its share. Learning is checked on the published weights: the advantage-weighted
log-likelihood of the trajectories the stand-in sent (right answers +, wrong answers -) goes up.
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
from tests.trainer.conftest import tiny_spec
from tests.trainer.peers import TOKEN, StandInManager, WeightServerProcess, child_env, start_manager, wait_process
from tests.trainer.test_loop import _collect, _trainer_cmd

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


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


@pytest.mark.slow
async def test_two_ranks_zero2_train_and_learn(tmp_path, tiny_model_dir, nats_server):
    spec = tiny_spec(micro_batch_size=2, learning_rate=2e-2)
    spec.trainer.ranks, spec.trainer.zero_stage = 2, 2
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "model").symlink_to(tiny_model_dir)
    config = job_dir / "job.yaml"
    config.write_text(dump_job_spec(spec))
    tok = load_tokenizer(tiny_model_dir)
    stand_in = StandInManager(tok, stop_token_ids(tok)[0])
    server, target = await start_manager(stand_in)
    import nats

    nc = await nats.connect(nats_server.url)
    events = await _collect(nc, "r2")
    rendezvous = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    try:
        with WeightServerProcess(tmp_path / "ws", nats_server.url, job="r2") as ws:
            procs = []
            for rank in (0, 1):
                cmd = _trainer_cmd(tmp_path / f"r{rank}", config, target, ws, nats_server.url, "r2", steps=3)
                env = {**child_env(), **rendezvous, "RANK": str(rank), "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1"}
                procs.append(await asyncio.create_subprocess_exec(*cmd, stderr=asyncio.subprocess.PIPE, env=env))
            results = await asyncio.gather(*(wait_process(p, 300) for p in procs))
            for code, err in results:
                assert code == 0, err[-3000:]
            async with WeightClient(ws.url, token=TOKEN) as wc:
                assert (await wc.versions()).versions == [0, 1, 2, 3]
                v0 = state_from_bytes(await wc.pull(0))
                v3 = state_from_bytes(await wc.pull(3))
        await nc.flush()
    finally:
        await nc.close()
        await server.stop(None)
    assert [(s.step, s.weight_version, s.ranks) for s in events["steps"]] == [(0, 1, 2), (1, 2, 2), (2, 3, 2)]
    # Both ranks' tokens are in the all-reduced statistics: 4 trajectories per step, every one counted.
    assert all(s.grad_norm > 0 and s.entropy > 0 for s in events["steps"])
    assert len(events["done"]) == 1 and events["done"][0].ok and events["done"][0].steps == 3
    # Only rank 0 published: the weight-server announced each version once.
    assert sorted(w.version for w in events["weights"]) == [0, 1, 2, 3]
    before, after = _objective(tiny_model_dir, v0, stand_in.sent), _objective(tiny_model_dir, v3, stand_in.sent)
    assert after > before + 1e-3, (before, after)
