"""Real trainer updates for the delta codec benchmark: consecutive published bf16 states of real GRPO steps.

    python -m trainer.delta_updates --out DIR --steps N --lr 1e-6 [--spec job.yaml] [--hidden 512 --layers 4]

Builds the trainer's own engine (trainer.engine.PolicyEngine: DeepSpeed on gloo, one rank, fp32 master
weights, torch AdamW with no weight decay) on the job's model (the tiny Qwen3 created by
rlboost.models.ensure_model, here resized by --hidden/--layers/--heads), then runs N GRPO steps on the job's
task. Each step's rollouts are real: for every prompt, `group - 1` responses are SAMPLED from the current
policy (transformers generate at the job's temperature) and one is the task's reference answer,
teacher-forced, so that each group has reward variance and a non-zero advantage even when a small model
rarely succeeds; rewards come from the task's reward function, advantages from trainer.grpo, and the loss
and optimizer step are the engine's own (forward/backward per micro-batch, one step per RL step).

After step 0..N the weights are published exactly as the trainer's publisher does
(trainer.publisher.publish_state: floating tensors to bf16) and written as DIR/v0.safetensors .. vN.safetensors,
with DIR/updates.json describing the run. With --progress-json one JSON object per line goes to stdout
({"event": "model" | "step" | "done", ...}) for a progress display (`rlboost delta bench --source real`);
logs are JSON on stderr. Bad flags or spec print one `error: ...` line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlboost.spec import JobSpec
    from trainer.engine import PolicyEngine

SAMPLING = "sampled from the policy (group - 1 per prompt) + the teacher-forced reference answer (1 per prompt)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.delta_updates", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="directory for v0..vN.safetensors and updates.json")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps (N >= 1); N+1 states are written")
    p.add_argument("--lr", type=float, default=1e-6, help="Adam learning rate (algorithm.learningRate)")
    p.add_argument("--spec", type=Path, default=None, help="job spec YAML (model, task, algorithm); default: built-in")
    p.add_argument("--hidden", type=int, default=None, help="override model.hiddenSize")
    p.add_argument("--layers", type=int, default=None, help="override model.numLayers")
    p.add_argument("--heads", type=int, default=None, help="override model.numHeads")
    p.add_argument("--warmup-steps", type=int, default=None, help="override model.warmupSteps (model creation)")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (algorithm.promptsPerStep)")
    p.add_argument("--group", type=int, default=4, help="samples per prompt (algorithm.groupSize, >= 2)")
    p.add_argument(
        "--model-dir", type=Path, default=None, help="model directory (created if empty); default OUT/model-<shape>"
    )
    p.add_argument("--progress-json", action="store_true", help="one JSON progress object per line on stdout")
    return p


def job_spec(args: argparse.Namespace) -> JobSpec:
    """The job spec with this run's overrides; JobSpecError names a bad field."""
    from rlboost.spec import JobSpec, load_job_spec, parse_job_spec

    base = load_job_spec(args.spec) if args.spec else JobSpec()
    data = base.model_dump(by_alias=True, mode="json")
    model = {"hiddenSize": args.hidden, "numLayers": args.layers, "numHeads": args.heads}
    data["model"].update({k: v for k, v in model.items() if v is not None})
    if args.warmup_steps is not None:
        data["model"]["warmupSteps"] = args.warmup_steps
    batch = args.prompts * args.group
    data["algorithm"].update(
        {"learningRate": args.lr, "promptsPerStep": args.prompts, "groupSize": args.group, "microBatchSize": batch}
    )
    data["trainer"].update({"ranks": 1, "zeroStage": 1})
    return parse_job_spec(data, str(args.spec) if args.spec else "the built-in job spec + flags")


class Progress:
    """JSON progress lines on stdout (only with --progress-json)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, event: str, **fields: Any) -> None:
        if self.enabled:
            print(json.dumps({"event": event, **fields}), flush=True)


def _cut_at_stop(ids: list[int], stops: set[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in stops:
            return ids[: i + 1]
    return ids


def rollouts(
    engine: PolicyEngine, tokenizer: Any, task: Any, spec: JobSpec, step: int, sandbox: Any
) -> tuple[list, float]:
    """One step's samples with group advantages, and the mean reward of the sampled (not teacher-forced) ones.
    Rewards come from `sandbox` (rlboost.tasks.sandbox.RewardSandbox: the reward runs confined)."""
    import torch

    from rlboost.models import decode_response, encode_prompt, stop_token_ids
    from rlboost.wire.rollout_io import Trajectory
    from trainer.grpo import Sample, group_advantages

    alg = spec.algorithm
    stops = set(stop_token_ids(tokenizer))
    im_end = tokenizer.eos_token_id  # <|im_end|>: how the warm-up teaches answers to end
    model = engine.engine.module
    model.eval()
    samples, sampled_rewards = [], []
    torch.manual_seed(alg.seed * 100_003 + step)  # reproducible sampling per step
    for p, (_, ex) in enumerate(task.batch(step, alg.prompts_per_step)):
        prompt = encode_prompt(tokenizer, task.messages(ex))
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt], device=engine.device),
                do_sample=alg.temperature > 0,
                temperature=alg.temperature or None,
                max_new_tokens=alg.max_new_tokens,
                num_return_sequences=alg.group_size - 1,
                use_cache=True,
                pad_token_id=tokenizer.pad_token_id,
            )
        responses = [_cut_at_stop(row[len(prompt) :].tolist(), stops) for row in out]
        responses.append(tokenizer.encode(ex.answer, add_special_tokens=False) + [im_end])  # teacher-forced
        rewards = [r.value for r in sandbox.score([(decode_response(tokenizer, resp), ex) for resp in responses])]
        sampled_rewards += rewards[:-1]
        for s, (resp, adv) in enumerate(zip(responses, group_advantages(rewards), strict=True)):
            t = Trajectory(f"s{step}-p{p}-g{s}", step, p, s, prompt, resp, [], "stop", step)
            samples.append(Sample(t, reward=rewards[s], advantage=adv))
    model.train()
    return samples, sum(sampled_rewards) / max(len(sampled_rewards), 1)


def train_step(engine: PolicyEngine, samples: list, pad_id: int, micro: int) -> float:
    """Forward/backward every micro-batch, then one optimizer step; returns the step's loss."""
    from trainer.grpo import collate

    loss = 0.0
    for i in range(0, len(samples), micro):
        part, _ = engine.forward_backward(collate(samples[i : i + micro], pad_id), len(samples))
        loss += part
    engine.step()
    return loss


def write_state(engine: PolicyEngine, path: Path) -> int:
    """Publish the engine's weights as the trainer's publisher does (bf16) into a safetensors file; bytes."""
    from rlboost.weights.safetensors_io import state_to_bytes
    from trainer.publisher import publish_state

    data = state_to_bytes(publish_state(engine.full_state()))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)  # a reader never sees a half-written state
    return len(data)


def model_dir_for(spec: JobSpec, args: argparse.Namespace) -> Path:
    """--model-dir; else the spec's model.path for a 'path' model; else a directory per tiny-model shape under
    --out, so a reused --out never trains a model of another size."""
    m = spec.model
    if args.model_dir is not None:
        return args.model_dir
    if m.source == "path":
        return Path(m.path)
    return args.out / f"model-h{m.hidden_size}-l{m.num_layers}-n{m.num_heads}-w{m.warmup_steps}-s{m.seed}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    from rlboost.models import ensure_model, load_tokenizer
    from rlboost.tasks import make_task
    from rlboost.tasks.sandbox import RewardSandbox, SandboxLimits
    from trainer.engine import PolicyEngine

    spec = job_spec(args)
    progress = Progress(args.progress_json)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    model_dir = ensure_model(spec.model, spec.task, model_dir_for(spec, args))
    engine = PolicyEngine(model_dir, spec)
    tokenizer, task = load_tokenizer(model_dir), make_task(spec.task)
    params = sum(p.numel() for p in engine.engine.module.parameters())
    progress("model", params=params, steps=args.steps, seconds=round(time.monotonic() - t0, 2))
    nbytes = write_state(engine, args.out / "v0.safetensors")
    steps = []
    with RewardSandbox(spec.task.reward, SandboxLimits.from_task(spec.task)) as sandbox:
        for step in range(args.steps):
            s0 = time.monotonic()
            samples, reward = rollouts(engine, tokenizer, task, spec, step, sandbox)
            loss = train_step(engine, samples, tokenizer.pad_token_id, spec.algorithm.micro_batch_size)
            write_state(engine, args.out / f"v{step + 1}.safetensors")
            record = {
                "step": step + 1,
                "loss": round(loss, 6),
                "sampled_reward": round(reward, 4),
                "seconds": round(time.monotonic() - s0, 3),
            }
            steps.append(record)
            progress("step", steps=args.steps, **record)
    summary = {
        "source": "real",
        "params": params,
        "state_bytes": nbytes,
        "model": spec.model.model_dump(by_alias=True, mode="json"),
        "learning_rate": args.lr,
        "optimizer": "torch AdamW (weight decay 0) via DeepSpeed ZeRO-1, gloo, 1 rank; fp32 master weights",
        "rollouts": SAMPLING,
        "prompts_per_step": args.prompts,
        "group_size": args.group,
        "steps": steps,
        "files": [f"v{i}.safetensors" for i in range(args.steps + 1)],
    }
    (args.out / "updates.json").write_text(json.dumps(summary, indent=1))
    progress("done", seconds=round(time.monotonic() - t0, 2), out=str(args.out))
    return summary


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 1 or args.group < 2 or args.prompts < 1 or args.lr <= 0:
        print("error: --steps and --prompts must be >= 1, --group >= 2 and --lr > 0", file=sys.stderr)
        return 2
    from rlboost.models import ModelError
    from rlboost.observability import setup_logging
    from rlboost.spec import JobSpecError

    setup_logging("delta-updates", "WARNING")
    try:
        run(args)
    except (JobSpecError, ModelError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
