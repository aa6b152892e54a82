"""The trainer's step loop: rollouts stream in, micro-batches train as soon as their groups complete,
one optimizer step per RL step, then the new weights are published and the step reported on NATS.

Per step s (weight version s is on the weight-server): Rollout(step=s, version=s) -> trajectories are
received by a reader task while ready micro-batches train in a worker thread -> optimizer step ->
upload version s+1 (the weight-server announces it) -> StepReport on `rlboost.<ns>.<job>.steps`.
At the end JobDone on `...done`. Time split of a step: rollout = request to last trajectory,
train = last trajectory to optimizer step done (training overlapped with rollout is not counted twice),
sync = weight publication.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlboost.spec import JobSpec
from rlboost.wire.events import JobDone, StepReport, subject
from rlboost.wire.rollout_io import PromptItem, RolloutRequest, SamplingParams, Trajectory
from trainer import metrics
from trainer.batching import StepAssembler
from trainer.grpo import LossStats, Sample, collate
from trainer.publisher import WeightPublisher
from trainer.rollout_client import RolloutClient, RolloutError

log = logging.getLogger(__name__)


@dataclass
class TrainerOptions:
    """Where the trainer's peers are and where it writes; mirrors the CLI flags."""

    manager: str  # host:port of the rollout-manager
    weight_server: str  # base URL of the weight-server
    token: str  # bearer token for uploads
    model_dir: Path
    run_dir: Path
    nats_url: str
    namespace: str = "default"
    job: str = "local"
    steps: int | None = None  # overrides spec.algorithm.steps
    dump_rollouts: Path | None = None
    connect_timeout_s: float = 30.0


@dataclass
class StepRecord:
    """Everything known about one step; a line of run_dir/steps.jsonl."""

    step: int
    weight_version: int
    weights_checksum: str
    reward_mean: float
    reward_std: float
    loss: float
    grad_norm: float
    learning_rate: float
    tokens: int
    trajectories: int
    rollout_seconds: float
    train_seconds: float
    sync_seconds: float
    train_compute_seconds: float
    first_trajectory_seconds: float
    clip_fraction: float
    logprob_abs_diff: float
    off_policy: int
    finish_reasons: dict[str, int] = field(default_factory=dict)


class StepContext:
    """One step's prompts, examples and running sums."""

    def __init__(self, step: int, examples: list[Any], prompts: list[list[int]]) -> None:
        self.step, self.examples, self.prompts = step, examples, prompts
        self.loss = 0.0
        self.stats = LossStats(0, 0, 0.0, 0.0)
        self.compute_s = 0.0

    def add_stats(self, loss: float, s: LossStats, seconds: float) -> None:
        self.loss += loss
        self.compute_s += seconds
        self.stats = LossStats(
            self.stats.tokens + s.tokens,
            self.stats.clipped_tokens + s.clipped_tokens,
            self.stats.ratio_sum + s.ratio_sum,
            self.stats.abs_logp_diff_sum + s.abs_logp_diff_sum,
        )


class Trainer:
    """Runs the whole job; `await Trainer(spec, opts).run()` returns the JobDone it published."""

    def __init__(self, spec: JobSpec, opts: TrainerOptions) -> None:
        from rlboost.models import decode_response, load_tokenizer, stop_token_ids
        from rlboost.tasks import load_reward, make_task

        self.spec, self.opts = spec, opts
        self.steps = opts.steps if opts.steps is not None else spec.algorithm.steps
        self.tokenizer = load_tokenizer(opts.model_dir)
        self._decode = decode_response
        self.stop_ids = tuple(stop_token_ids(self.tokenizer))
        self.task = make_task(spec.task)
        self.reward_fn = load_reward(spec.task.reward)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else (self.stop_ids[0] if self.stop_ids else 0)
        self.engine: Any = None
        self.healthy = True
        self.checksum = ""
        self.version = 0
        self.steps_done = 0  # a resumed run (checkpoints) will start from its saved step
        self._nc: Any = None
        opts.run_dir.mkdir(parents=True, exist_ok=True)

    # ---- setup ----

    async def _connect_nats(self) -> None:
        import nats

        try:
            self._nc = await asyncio.wait_for(
                nats.connect(self.opts.nats_url, allow_reconnect=True, max_reconnect_attempts=-1),
                self.opts.connect_timeout_s,
            )
        except (TimeoutError, OSError, nats.errors.NoServersError) as err:
            raise RuntimeError(f"cannot reach NATS at {self.opts.nats_url}: {err or type(err).__name__}") from None

    async def _publish_event(self, topic: str, event: StepReport | JobDone) -> None:
        if self._nc is None:
            return
        await self._nc.publish(subject(self.opts.namespace, self.opts.job, topic), event.model_dump_json().encode())
        await self._nc.flush(timeout=10)

    def _make_engine(self) -> Any:
        from trainer.engine import PolicyEngine

        return PolicyEngine(self.opts.model_dir, self.spec)

    # ---- the run ----

    async def run(self) -> JobDone:
        """Train every step; publish JobDone(ok) or, on failure, JobDone(ok=False) and re-raise."""
        try:
            await self._connect_nats()
            self.engine = await asyncio.to_thread(self._make_engine)
            await self._train_all()
            done = JobDone(ok=True, steps=self.steps_done, final_weights_checksum=self.checksum)
            await self._publish_event("done", done)
            return done
        except BaseException as err:
            self.healthy = False
            message = _one_line(err)
            log.error("trainer failed", extra={"error": message, "step": self.steps_done}, exc_info=err)
            with contextlib.suppress(Exception):  # best effort: NATS may be what failed
                await self._publish_event("done", JobDone(ok=False, steps=self.steps_done, error=message))
            raise
        finally:
            if self._nc is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._nc.drain(), 5)

    async def _train_all(self) -> None:
        """Publish version 0 (unless the weight-server has it), then run the steps."""
        from rlboost.weights.client import WeightClient

        streams = self.spec.weight_sync.streams
        async with WeightClient(self.opts.weight_server, token=self.opts.token, streams=streams) as wc:
            publisher = WeightPublisher(wc)
            state = await asyncio.to_thread(self.engine.full_state)
            first = await publisher.publish(0, state, skip_if_present=True)
            self.checksum, self.version = first.checksum, 0
            metrics.WEIGHT_VERSION.set(0)
            async with RolloutClient(self.opts.manager) as rc:
                await rc.wait_ready(self.opts.connect_timeout_s)
                for step in range(self.steps_done, self.steps):
                    record = await self._step(step, rc, publisher)
                    self.steps_done = step + 1
                    await self._report(record)

    def _request(self, step: int) -> tuple[RolloutRequest, list[Any]]:
        from rlboost.models import encode_prompt

        alg = self.spec.algorithm
        batch = self.task.batch(step, alg.prompts_per_step)
        examples = [ex for _, ex in batch]
        prompts = [
            PromptItem(i, encode_prompt(self.tokenizer, self.task.messages(ex))) for i, ex in enumerate(examples)
        ]
        sampling = SamplingParams(
            temperature=alg.temperature, top_p=alg.top_p, top_k=0, max_new_tokens=alg.max_new_tokens,
            seed=alg.seed, stop_token_ids=self.stop_ids,
        )  # fmt: skip
        return RolloutRequest(step, self.version, prompts, alg.group_size, sampling), examples

    def _reward(self, ctx: StepContext, traj: Trajectory) -> float:
        text = self._decode(self.tokenizer, traj.response_ids)
        return float(self.reward_fn(text, ctx.examples[traj.prompt_index]))

    async def _step(self, step: int, rc: RolloutClient, publisher: WeightPublisher) -> StepRecord:
        alg = self.spec.algorithm
        request, examples = self._request(step)
        ctx = StepContext(step, examples, [p.token_ids for p in request.prompts])
        assembler = StepAssembler(
            step, len(examples), alg.group_size, alg.micro_batch_size, lambda t: self._reward(ctx, t)
        )
        t0 = time.monotonic()
        queue: asyncio.Queue[Trajectory | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read(rc, request, queue))
        first_at: float | None = None
        off_policy = 0
        finish: dict[str, int] = {}
        try:
            while (traj := await queue.get()) is not None:
                first_at = first_at if first_at is not None else time.monotonic() - t0
                off_policy += traj.weight_version != request.weight_version
                finish[traj.finish_reason or "?"] = finish.get(traj.finish_reason or "?", 0) + 1
                self._dump(traj)
                for mb in assembler.add(traj):
                    await self._train(ctx, mb, assembler.total)
            await reader  # re-raises a stream failure
        finally:
            reader.cancel()
        rollout_end = time.monotonic()
        if not assembler.complete:
            missing = assembler.missing()
            raise RolloutError(
                f"rollout stream of step {step} ended with {assembler.received}/{assembler.total} trajectories "
                f"(first missing (prompt, sample): {missing[:3]})"
            )
        result = await asyncio.to_thread(self.engine.step)
        train_end = time.monotonic()
        state = await asyncio.to_thread(self.engine.full_state)
        published = await publisher.publish(step + 1, state)
        sync_end = time.monotonic()
        self.version, self.checksum = published.version, published.checksum
        metrics.OFF_POLICY.inc(off_policy)
        metrics.PUBLISHED_BYTES.inc(published.nbytes)
        samples = assembler.samples()
        rewards = [s.reward for s in samples]
        n_tok = ctx.stats.tokens
        return StepRecord(
            step=step, weight_version=published.version, weights_checksum=published.checksum,
            reward_mean=statistics.fmean(rewards), reward_std=statistics.pstdev(rewards),
            loss=ctx.loss, grad_norm=result.grad_norm, learning_rate=result.learning_rate,
            tokens=sum(len(s.trajectory.response_ids) for s in samples), trajectories=len(samples),
            rollout_seconds=rollout_end - t0, train_seconds=train_end - rollout_end, sync_seconds=sync_end - train_end,
            train_compute_seconds=ctx.compute_s, first_trajectory_seconds=first_at or 0.0,
            clip_fraction=ctx.stats.clipped_tokens / n_tok if n_tok else 0.0,
            logprob_abs_diff=ctx.stats.abs_logp_diff_sum / n_tok if n_tok else 0.0,
            off_policy=off_policy, finish_reasons=finish,
        )  # fmt: skip

    async def _read(self, rc: RolloutClient, request: RolloutRequest, queue: asyncio.Queue) -> None:
        """Receive the step's trajectories into the queue while training runs; None marks the end."""
        try:
            async for traj in rc.rollout(request):
                metrics.TRAJECTORIES.inc()
                queue.put_nowait(traj)
        finally:
            queue.put_nowait(None)

    async def _train(self, ctx: StepContext, mb: list[Sample], num_sequences: int) -> None:
        start = time.monotonic()
        batch = collate(mb, self.pad_id)
        loss, stats = await asyncio.to_thread(self.engine.forward_backward, batch, num_sequences)
        ctx.add_stats(loss, stats, time.monotonic() - start)

    # ---- outputs ----

    def _dump(self, traj: Trajectory) -> None:
        if self.opts.dump_rollouts is None:
            return
        line = {
            "step": traj.step, "prompt_index": traj.prompt_index, "sample_index": traj.sample_index,
            "token_ids": traj.response_ids, "weight_version": traj.weight_version, "workers": traj.workers,
        }  # fmt: skip
        with self.opts.dump_rollouts.open("a") as f:
            f.write(json.dumps(line) + "\n")

    async def _report(self, r: StepRecord) -> None:
        with (self.opts.run_dir / "steps.jsonl").open("a") as f:
            f.write(json.dumps(asdict(r)) + "\n")
        _set_metrics(r)
        log.info(
            "step done",
            extra={"step": r.step, "reward_mean": round(r.reward_mean, 4), "loss": round(r.loss, 5),
                   "weight_version": r.weight_version, "tokens": r.tokens,
                   "rollout_s": round(r.rollout_seconds, 3), "train_s": round(r.train_seconds, 3),
                   "sync_s": round(r.sync_seconds, 3)},
        )  # fmt: skip
        report = StepReport(
            step=r.step, reward_mean=r.reward_mean, reward_std=r.reward_std, tokens=r.tokens,
            rollout_seconds=r.rollout_seconds, train_seconds=r.train_seconds, sync_seconds=r.sync_seconds,
            weight_version=r.weight_version, weights_checksum=r.weights_checksum, loss=r.loss,
        )  # fmt: skip
        await self._publish_event("steps", report)


def _set_metrics(r: StepRecord) -> None:
    metrics.STEP.set(r.step + 1)
    metrics.WEIGHT_VERSION.set(r.weight_version)
    metrics.REWARD_MEAN.set(r.reward_mean)
    metrics.REWARD_STD.set(r.reward_std)
    metrics.LOSS.set(r.loss)
    metrics.GRAD_NORM.set(r.grad_norm)
    metrics.LEARNING_RATE.set(r.learning_rate)
    metrics.CLIP_FRACTION.set(r.clip_fraction)
    metrics.LOGP_DIFF.set(r.logprob_abs_diff)
    metrics.TOKENS.inc(r.tokens)
    wall = r.rollout_seconds + r.train_seconds + r.sync_seconds
    metrics.TOKENS_PER_SECOND.set(r.tokens / wall if wall > 0 else 0.0)
    for phase, s in (("rollout", r.rollout_seconds), ("train", r.train_seconds), ("sync", r.sync_seconds)):
        metrics.STEP_SECONDS.labels(phase).set(s)


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
