"""The trainer's step loop: rollouts stream in, micro-batches train as soon as their groups complete,
one optimizer step per RL step, then the new weights are published and the step reported on NATS.

Per step s (weight version s is on the weight-server): Rollout(step=s, version=s) -> trajectories are
received by a reader task while ready micro-batches train in a worker thread -> optimizer step ->
upload version s+1 (the weight-server announces it) -> StepReport on `rlboost.<ns>.<job>.steps`.
At the end JobDone on `...done`. Time split of a step: rollout = request to last trajectory,
train = last trajectory to optimizer step done (training overlapped with rollout is not counted twice),
sync = weight publication. `trainer_idle_seconds` = the part of (request -> optimizer step done) in which
rank 0 computed nothing: streamed consumption shrinks it (compare `trainer.streamTraining: false`).

Several ranks: see `trainer.ranks` (rank 0 leads, the others follow its broadcasts). Checkpoints: see
`trainer.checkpoint`; written after the step's weights are published, every `trainer.checkpointEvery` steps
and after the last one.

Versions on resume (the weight-server only accepts versions newer than its latest): the checkpoint's
weights are checksummed; if the weight-server's latest version holds exactly them it is reused, otherwise
they are published as max(latest + 1, checkpointed version) and the run continues from there. So a
resumed run whose killed predecessor already published later versions skips their numbers, with the same
content as an uninterrupted run (versions need not equal steps).

Evaluation (`spec.evaluation`): after every K-th step (and the last), once its weights are published, the
validation prompts (rlboost.tasks.validation) are rolled out at that version, k samples each, scored in the reward
sandbox and summarised (rlboost.evaluation: mean reward, pass@1, pass@k, response length) into the step's report.

Colocation (`trainer.colocateReserved`, see trainer.colocation): the reserved workers share the trainer's
accelerators. After the step's whole batch is in (colocation turns streamed training off, since reserved
workers would otherwise still generate on the accelerator being trained on) the trainer asks them to release
their engine memory and waits for their acks, trains, publishes the new weights, then asks them to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlboost.auth.grpc_auth import ClientAuth
from rlboost.evaluation import ScoredResponse, summarize
from rlboost.observability import LoopWatchdog
from rlboost.policies.partial_rollout import lag, new_groups, trainable
from rlboost.reward_registry import describe_reward
from rlboost.spec import JobSpec, effective_micro_batch
from rlboost.tasks.base import Cursor, PromptBatch
from rlboost.tasks.dataset import DatasetError
from rlboost.tasks.sandbox import RewardResult, RewardSandbox, SandboxLimits
from rlboost.tasks.validation import validation_source
from rlboost.wire.events import TRAINER_INBOX, JobDone, StepReport, ValidationReport, subject
from rlboost.wire.rollout_io import PromptItem, RolloutRequest, SamplingParams, Trajectory
from trainer import metrics, ranks
from trainer.batching import StepAssembler
from trainer.grpo import LossStats, MicroBatch, Sample, collate, group_advantages
from trainer.partial import GroupCarry
from trainer.pool_metrics import PoolMeter, length_percentiles
from trainer.publisher import WeightPublisher, upload_model_assets, with_retries
from trainer.rollout_client import RolloutClient, RolloutError

log = logging.getLogger(__name__)

FAILED = "failed"  # finish_reason of a sample the rollout-manager dropped (rollout.onFailedRequest: drop)


class StepDeadlineError(RolloutError):
    """A step's rollout passed rollout.stepDeadlineS with its retries spent; the message names what is missing."""


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
    colocation_timeout_s: float = 120.0  # wait this long for the colocated workers' release / resume acks
    checkpoint_dir: Path | None = None  # None: no checkpoints
    resume: bool = False  # continue from the newest valid checkpoint in checkpoint_dir
    auth: ClientAuth = ClientAuth()  # the trainer token (the manager's Rollout) and the job CA (manager, weights)
    credentials_dir: Path | None = (
        None  # the job's credentials: versions signed with its key, NATS as user trainer; None = anonymous
    )


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
        self.stats = self.stats + s


class Trainer:
    """Runs the whole job; `await Trainer(spec, opts).run()` returns the JobDone it published."""

    def __init__(self, spec: JobSpec, opts: TrainerOptions) -> None:
        from rlboost.models import decode_response, load_tokenizer, stop_token_ids

        self.spec, self.opts = spec, opts
        if opts.credentials_dir is not None:  # a missing or unusable key fails the start, not the first publish
            from rlboost.auth.credentials import JobCredentials

            JobCredentials(opts.credentials_dir).signing_key()
        self._ack_verifier = self._colocation_ack_verifier()  # likewise a missing colocation.key
        self.steps = opts.steps if opts.steps is not None else spec.algorithm.steps
        self.tokenizer = load_tokenizer(opts.model_dir)
        self.vocab_size = _vocab_size(opts.model_dir)
        self._decode = decode_response
        self.stop_ids = tuple(stop_token_ids(self.tokenizer))
        self.prompts: Any = None  # the prompt stream (rlboost.tasks.dataset.make_prompts), opened in run()
        self.cursor = Cursor()  # where the next step's prompts start (checkpointed)
        # algorithm.partialRollout: the groups in flight across steps (trainer.partial); None: off
        self.carry = GroupCarry(spec.algorithm.group_size) if spec.algorithm.partial_rollout else None
        self._next_batch: PromptBatch | None = None  # the following step's prompts (known: is this step the last?)
        self.rewards: RewardSandbox | None = None  # rank 0 scores samples in the reward sandbox (see _step)
        self._validation: tuple[list[Any], list[PromptItem]] | None = None  # encoded once, at the first evaluation
        self._encode: Any = None  # rank 0: chat messages -> prompt ids (the chat template), set with the prompts
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else (self.stop_ids[0] if self.stop_ids else 0)
        self.engine: Any = None
        self.healthy = True  # False once the job failed
        self.watchdog = LoopWatchdog(max_lag_s=60.0)  # its loop only awaits: heavy work runs in threads
        self.checksum = ""
        self.version = 0
        self.steps_done = 0  # a resumed run (checkpoints) will start from its saved step
        self._last_report: dict | None = None  # the resumed checkpoint's step report, published again
        self._nc: Any = None
        self._events: Any = None  # rlboost.durable.AcknowledgedPublisher on _nc
        self._colocation: Any = None  # trainer.colocation.Colocation when trainer.colocateReserved
        opts.run_dir.mkdir(parents=True, exist_ok=True)
        self.pool_meter = PoolMeter(spec, time.monotonic())
        self.export_path = ""  # where the last export went (JobDone.export_path)
        self.trackers: Any = None  # rank 0: rlboost.tracking.Trackers of spec.logging
        if ranks.rank() == 0:  # last: a backend that cannot work (a TrackingError) fails the start, not a step
            from rlboost.export import check_export_path
            from rlboost.tracking import open_trackers

            if spec.export.path:
                check_export_path(self._export_dest(self.steps))
            self.trackers = open_trackers(spec.logging, opts.run_dir, opts.job)

    def is_healthy(self) -> bool:
        """For /healthz (any thread): the job has not failed and the loop makes progress."""
        return self.healthy and self.watchdog.healthy()

    # ---- setup ----

    async def _connect_nats(self) -> None:
        import nats

        from rlboost.auth.nats import connect_options
        from rlboost.durable import AcknowledgedPublisher, reconnect_quietly

        try:
            self._nc = await asyncio.wait_for(
                nats.connect(
                    self.opts.nats_url,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    inbox_prefix=TRAINER_INBOX,  # the status stream's acknowledgements (rlboost.durable)
                    **reconnect_quietly(log),
                    **connect_options(self.opts.credentials_dir or "", "trainer"),
                ),
                self.opts.connect_timeout_s,
            )
        except (TimeoutError, OSError, nats.errors.NoServersError) as err:
            raise RuntimeError(f"cannot reach NATS at {self.opts.nats_url}: {err or type(err).__name__}") from None
        self._events = AcknowledgedPublisher(self._nc)

    async def _publish_event(self, topic: str, event: StepReport | JobDone) -> None:
        """Step reports and `done` must arrive: sent again until the job's status stream acknowledges them."""
        if self._events is None:
            return
        await self._events.publish(subject(self.opts.namespace, self.opts.job, topic), event.model_dump_json().encode())

    def _make_engine(self) -> Any:
        from trainer.engine import PolicyEngine

        return PolicyEngine(self.opts.model_dir, self.spec)

    # ---- the run ----

    async def run(self) -> JobDone:
        """Train every step; publish JobDone(ok) or, on failure, JobDone(ok=False) and re-raise.

        Ranks other than 0 follow rank 0 (no NATS, manager or weight-server) and return JobDone(ok=True)."""
        self.watchdog.start()
        if ranks.rank() != 0:
            self.engine = await asyncio.to_thread(self._make_engine)
            await asyncio.to_thread(self._follow)
            return JobDone(ok=True, steps=self.steps_done)
        try:
            await self._connect_nats()  # first: a reward that cannot start is reported in JobDone
            self.prompts = await asyncio.to_thread(self._open_prompts)  # bad dataset: a clear error, no step
            self.rewards = RewardSandbox(self.spec.task.reward, SandboxLimits.from_task(self.spec.task))
            await asyncio.to_thread(self.rewards.start)
            self.engine = await asyncio.to_thread(self._make_engine)
            await self._train_all()
            await asyncio.to_thread(ranks.broadcast, {"op": "stop"})
            done = JobDone(
                ok=True, steps=self.steps_done, final_weights_checksum=self.checksum, export_path=self.export_path
            )
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
            if self.prompts is not None:
                self.prompts.close()
            if self.rewards is not None:
                await asyncio.to_thread(self.rewards.close)
            if self.trackers is not None:
                await asyncio.to_thread(self.trackers.close)
            if self._nc is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._nc.drain(), 5)

    def _resume_point(self) -> Path | None:
        """Rank 0: the checkpoint to continue from (None: start fresh); checks it fits this job."""
        from trainer.checkpoint import CheckpointError, latest_valid, reported_marker

        if not (self.opts.resume and self.opts.checkpoint_dir):
            return None
        found = latest_valid(self.opts.checkpoint_dir)
        if found is None:
            log.warning("no valid checkpoint: starting from scratch", extra={"dir": str(self.opts.checkpoint_dir)})
            return None
        path, st = found
        want = {
            "world_size": ranks.world_size(),
            "zero_stage": self.spec.trainer.zero_stage,
            "task_seed": self.spec.task.seed,
            "prompts_per_step": self.spec.algorithm.prompts_per_step,
        }
        for key, value in want.items():
            if getattr(st, key) != value:
                raise CheckpointError(
                    f"checkpoint {path} was written with {key}={getattr(st, key)}, this job has {value}; "
                    "resume with the same trainer.ranks, trainer.zeroStage, task.seed and algorithm.promptsPerStep"
                )
        if st.dataset_rows != self._dataset_rows():
            raise CheckpointError(
                f"checkpoint {path} was written for a task.dataset.train of {st.dataset_rows} rows, this job's has "
                f"{self._dataset_rows()}: the order would differ; resume with the same dataset or start fresh"
            )
        self.steps_done, self.version, self.checksum = st.steps_done, st.weight_version, st.weights_checksum
        self._last_report = None if reported_marker(path).exists() else _with_validation(st.last_report, path)
        n = self.spec.algorithm.prompts_per_step
        if st.data_cursor is not None:
            self.cursor = Cursor(**st.data_cursor)
        else:  # written before cursors: the built-in task's order is a function of the step
            self.cursor = Cursor(*divmod(st.steps_done * n, self.prompts.num_rows))
        if self.carry is not None and st.carried_groups:  # rolled out afresh: see trainer.partial
            self.carry.restore(st.carried_groups, self.prompts)
            log.info("groups in flight at the checkpoint are rolled out again", extra={"groups": len(self.carry)})
        log.info(
            "resuming",
            extra={"checkpoint": str(path), "steps_done": st.steps_done, "weight_version": st.weight_version},
        )
        return path

    def _mark_reported(self, step: int) -> None:
        """The step's report is out (acknowledged by the status stream, when there is one): its checkpoint, if the
        step wrote one, need not send it again on resume."""
        from trainer.checkpoint import reported_marker, tag_of

        if self.opts.checkpoint_dir is not None and (ckpt := self.opts.checkpoint_dir / tag_of(step + 1)).is_dir():
            reported_marker(ckpt).touch()

    def _keep_validation(self, step: int, validation: Any) -> None:
        """Beside the step's checkpoint (if it wrote one): a report sent again on resume carries its evaluation."""
        from rlboost.fsio import write_text_atomic
        from trainer.checkpoint import tag_of, validation_file

        if validation is None or self.opts.checkpoint_dir is None:
            return
        if (ckpt := self.opts.checkpoint_dir / tag_of(step + 1)).is_dir():
            write_text_atomic(validation_file(ckpt), validation.model_dump_json())

    async def _resend_last_report(self) -> None:
        """The report of the step the checkpoint ended, published again when no mark says it went out: the trainer
        may have been killed between the checkpoint and the report's publication. Readers keep one report per step
        (a redelivery counts once)."""
        if self._last_report is None:
            return
        record = StepReport.model_validate(self._last_report)
        await self._publish_event("steps", record)
        log.info("step report sent again after resuming", extra={"step": record.step})

    def _restore(self, ckpt: Path | None) -> dict[str, Any]:
        """Every rank (in a thread): load the chosen checkpoint, then gather the state to publish."""
        from trainer import checkpoint

        if ckpt is not None:
            checkpoint.load(self.engine, ckpt)
        return self.engine.publish_state()  # bf16; ZeRO-3: per-rank partition deltas (trainer.partition_delta)

    async def _publish_initial(self, publisher: WeightPublisher, state: dict[str, Any]) -> None:
        """Publish the starting weights at a version the weight-server accepts (see the module docstring)."""
        from rlboost.weights.checksum import state_checksum
        from rlboost.weights.safetensors_io import to_publish_dtype

        bf16 = await asyncio.to_thread(to_publish_dtype, state)
        ours = await asyncio.to_thread(state_checksum, bf16)
        if self.checksum and ours != self.checksum:
            raise await asyncio.to_thread(_checksum_mismatch, bf16, ours, self.checksum)
        await upload_model_assets(publisher.client, self.opts.model_dir, publisher.signer)  # before any version
        held = await publisher.held_versions()
        version = self.version
        if held:
            latest = max(held)
            same = (await with_retries("manifest", lambda: publisher.client.manifest(latest))).checksum == ours
            version = latest if same else max(latest + 1, self.version)
        published = await publisher.publish(version, state, skip_if_present=True)
        self.checksum, self.version = published.checksum, published.version
        metrics.WEIGHT_VERSION.set(self.version)

    async def _train_all(self) -> None:
        """Resume (or not), publish the starting weights, then run the steps."""
        from rlboost.weights.client import WeightClient

        ckpt = self._resume_point()
        if self.spec.weight_sync.mode == "delta":  # the codec's JIT beside the first step, not in the first publish
            import rlboost.delta

            rlboost.delta.warm_up_in_background()
        await asyncio.to_thread(ranks.broadcast, {"op": "resume", "ckpt": str(ckpt) if ckpt else None})
        state = await asyncio.to_thread(self._restore, ckpt)
        streams = self.spec.weight_sync.streams
        ca = self.opts.auth.ca
        async with WeightClient(self.opts.weight_server, token=self.opts.token, streams=streams, ca=ca) as wc:
            publisher = WeightPublisher.from_spec(  # weightSync.mode: delta | full; signed with the job's key
                wc, self.spec.weight_sync, credentials_dir=self.opts.credentials_dir
            )
            await self._publish_initial(publisher, state)
            del state
            await self._resend_last_report()
            async with RolloutClient(self.opts.manager, self.opts.auth) as rc:
                await rc.wait_ready(self.opts.connect_timeout_s)
                await self._start_colocation()
                take_step = self._step if self.carry is None else self._step_partial
                for step in range(self.steps_done, self.steps):
                    record = await take_step(step, rc, publisher)
                    if record is None:
                        log.info(
                            "training data exhausted: task.dataset.epochs done",
                            extra={"step": step, "epochs": self.spec.task.dataset.epochs},
                        )
                        break
                    self.steps_done = step + 1
                    if self._evaluation_due(step):
                        record.validation = await self._evaluate_within_deadline(step, rc)
                        self._keep_validation(step, record.validation)
                    await self._report(record)
                    self._mark_reported(step)
            await publisher.flush()  # an upload still in flight (overlap mode) finishes before JobDone

    def _save_due(self) -> bool:
        every = self.spec.trainer.checkpoint_every
        n = self.spec.algorithm.prompts_per_step
        data_ends = self._next_batch is not None and len(self._next_batch.examples) < n
        last = self.steps_done + 1 == self.steps or data_ends
        return self.opts.checkpoint_dir is not None and ((self.steps_done + 1) % every == 0 or last)

    def _trainer_state(self, steps_done: int, version: int, checksum: str) -> Any:
        from trainer.checkpoint import TrainerState

        return TrainerState(
            steps_done=steps_done,
            weight_version=version,
            weights_checksum=checksum,
            world_size=ranks.world_size(),
            zero_stage=self.spec.trainer.zero_stage,
            task_seed=self.spec.task.seed,
            prompts_per_step=self.spec.algorithm.prompts_per_step,
            data_cursor=asdict(self.cursor),
            dataset_rows=self._dataset_rows(),
            carried_groups=self.carry.checkpoint() if self.carry is not None else None,
        )

    def _dataset_rows(self) -> int:
        return self.prompts.num_rows if self.spec.task.active_dataset is not None else 0

    def _open_prompts(self) -> Any:
        """Rank 0, before the first step: the prompt stream, checked (columns, rows, a first batch that fits
        task.dataset.maxPromptTokens), and the chat template recorded in the run directory and the log."""
        from rlboost.models.tokenizer import chat_template_record, encode_prompt
        from rlboost.tasks.dataset import check_dataset, make_prompts

        data = self.spec.task.active_dataset
        thinking, system = (data.thinking, data.system_prompt) if data else (None, "")
        if data is not None and not isinstance(self.tokenizer.chat_template, str):
            raise DatasetError(
                "task.dataset: the model's tokenizer has no chat template (tokenizer_config.json chat_template); "
                "use a chat model or add a template to its tokenizer"
            )

        def encode(messages: list[dict[str, str]]) -> list[int]:
            return encode_prompt(self.tokenizer, messages, enable_thinking=thinking)

        self._encode = encode  # evaluation encodes the validation prompts the same way
        prompts = make_prompts(self.spec.task, encode)
        try:
            check_dataset(self.spec.task, self.spec.algorithm.prompts_per_step, encode, train=prompts if data else None)
        except BaseException:
            prompts.close()
            raise
        record = chat_template_record(self.tokenizer, thinking, system)
        (self.opts.run_dir / "chat_template.json").write_text(json.dumps(record, indent=1) + "\n")
        log.info("chat template", extra={k: v for k, v in record.items() if k != "template"})
        if thinking is not None and not record["reads_enable_thinking"]:
            log.warning("task.dataset.enableThinking is set but the chat template does not read enable_thinking")
        return prompts

    # ---- export (spec.export) ----

    def _export_due(self, steps_done: int) -> bool:
        """At the end of training, and every export.everyCheckpoints x trainer.checkpointEvery steps (whether or
        not the trainer writes checkpoints: a run without a checkpoint directory exports on the same steps)."""
        exp = self.spec.export
        if not exp.path:
            return False
        period = exp.every_checkpoints * self.spec.trainer.checkpoint_every
        return steps_done == self.steps or (period > 0 and steps_done % period == 0)

    def _export_dest(self, steps_done: int) -> str:
        """export.path at the end; beside it, suffixed -step-<steps done>, for a periodic export."""
        from rlboost.export import resolve_export_path

        dest = resolve_export_path(self.spec.export.path, self.opts.run_dir).rstrip("/")
        return dest if steps_done == self.steps else f"{dest}-step-{steps_done:08d}"

    def _export(self, state: dict[str, Any], steps_done: int) -> None:
        """Rank 0 (in a thread): write the published bf16 state as a Hugging Face model directory."""
        from rlboost.export import export_model

        start = time.monotonic()
        self.export_path = export_model(
            state, self.opts.model_dir, self._export_dest(steps_done), stop_ids=self.stop_ids, pad_id=self.pad_id
        )
        log.info(
            "export done",
            extra={
                "export_path": self.export_path,
                "steps_done": steps_done,
                "seconds": round(time.monotonic() - start, 3),
            },
        )

    # ---- followers (ranks > 0) ----

    def _follow(self) -> None:
        """Ranks > 0: do what rank 0's broadcasts say until it says stop."""
        msg = ranks.broadcast()
        self._restore(Path(msg["ckpt"]) if msg["ckpt"] else None)
        loss, stats = 0.0, LossStats(0, 0, 0.0, 0.0)
        while True:
            msg = ranks.broadcast()
            if msg["op"] == "round":
                part, st = self.engine.forward_backward(msg["mbs"][ranks.rank()], msg["n"])
                loss, stats = loss + part, stats + st
            elif msg["op"] == "step":
                self._finish_step(loss, stats, msg["save"])
                self.steps_done += 1
                loss, stats = 0.0, LossStats(0, 0, 0.0, 0.0)
            elif msg["op"] == "stop":
                return
            else:
                raise RuntimeError(f"rank {ranks.rank()}: unknown message {msg['op']!r} from rank 0")

    def _finish_step(self, loss: float, stats: LossStats, save: Any) -> tuple[Any, float, LossStats, dict]:
        """Every rank: optimizer step, statistics all-reduce, state gather. (Checkpoint: after publication.)"""
        result = self.engine.step()
        loss, stats = ranks.all_reduce_stats(loss, stats)
        state = self.engine.publish_state()
        if ranks.rank() != 0 and save is not None:
            self._checkpoint(save)
        return result, loss, stats, state

    def _checkpoint(self, state: Any) -> None:
        from trainer import checkpoint

        assert self.opts.checkpoint_dir is not None
        checkpoint.save(self.engine, self.opts.checkpoint_dir, state, self.spec.trainer.keep_checkpoints)

    def _take(self) -> PromptBatch:
        """The step's prompts from the cursor; the following step's are taken too (to know whether this is the
        last step of the data), so each batch is read once."""
        n = self.spec.algorithm.prompts_per_step
        batch = self._next_batch if self._next_batch is not None else self.prompts.take(self.cursor, n)
        self._next_batch = self.prompts.take(batch.cursor, n) if len(batch.examples) == n else None
        return batch

    def _request(self, step: int) -> tuple[RolloutRequest, list[Any], int] | None:
        """The step's Rollout request, examples and prompts skipped for length; None: the data is exhausted."""
        alg = self.spec.algorithm
        batch = self._take()
        if len(batch.examples) < alg.prompts_per_step:
            return None  # the last epoch ended (a partial batch is dropped)
        self.cursor = batch.cursor
        examples = batch.examples
        prompts = [PromptItem(i, ids) for i, ids in enumerate(batch.prompt_ids)]
        if batch.skipped:
            metrics.PROMPTS_SKIPPED.inc(batch.skipped)
            log.warning(
                "prompts longer than task.dataset.maxPromptTokens skipped",
                extra={"step": step, "skipped": batch.skipped, "skipped_total": self.prompts.skipped_total},
            )
        request = RolloutRequest(step, self.version, prompts, alg.group_size, self._sampling(), self.vocab_size)
        return request, examples, batch.skipped

    def _sampling(self) -> SamplingParams:
        alg = self.spec.algorithm
        return SamplingParams(
            temperature=alg.temperature,
            top_p=alg.top_p,
            top_k=0,
            max_new_tokens=alg.max_new_tokens,
            seed=alg.seed,
            stop_token_ids=self.stop_ids,
        )

    # ---- partial rollout (algorithm.partialRollout; trainer.partial) ----

    def _partial_request(self, step: int) -> tuple[RolloutRequest, int] | None:
        """The step's Rollout: new prompts up to the groups kept in flight, the earlier groups' samples still owed,
        and the target of complete groups. None: the data is exhausted and nothing is in flight."""
        assert self.carry is not None
        alg = self.spec.algorithm
        new = new_groups(self.spec.partial_rollout_groups(), len(self.carry))
        batch = self.prompts.take(self.cursor, new) if new else None
        examples, ids = (batch.examples, batch.prompt_ids) if batch else ([], [])
        if not examples and not len(self.carry):
            return None
        if batch is not None:
            metrics.PROMPTS_SKIPPED.inc(batch.skipped)
            self.carry.open(step, examples, ids, self.cursor)
            self.cursor = batch.cursor
        prompts = [PromptItem(i, p) for i, p in enumerate(ids)]
        request = RolloutRequest(
            step,
            self.version,
            prompts,
            alg.group_size,
            self._sampling(),
            self.vocab_size,
            target_groups=alg.prompts_per_step,
            carried=self.carry.carried(step),
        )
        self.carry.start_stream(step)
        return request, batch.skipped if batch else 0

    async def _step_partial(self, step: int, rc: RolloutClient, publisher: WeightPublisher) -> StepReport | None:
        """A step under partial rollout: the stream ends at its target; the groups complete by then are trained, the
        others stay in flight (see trainer.partial)."""
        carry = self.carry
        assert carry is not None
        taken = await asyncio.to_thread(self._partial_request, step)
        if taken is None:
            return None
        request, skipped = taken
        ctx = StepContext(step, [], [])
        t0, first_at, finish = time.monotonic(), None, {}
        queue: asyncio.Queue[Trajectory | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read(rc, request, queue, carry))
        ended = False
        try:
            while not ended and (first := await queue.get()) is not None:
                batch, ended = self._drain(queue, first)
                batch = [t for t in batch if carry.wants(t)]  # re-sent ones (a retried rollout) once
                if not batch:
                    continue
                first_at = first_at if first_at is not None else time.monotonic() - t0
                for traj, reward in zip(batch, await self._score_groups(batch), strict=True):
                    finish[traj.finish_reason or "?"] = finish.get(traj.finish_reason or "?", 0) + 1
                    metrics.FAILED.inc(traj.finish_reason == FAILED)
                    self._dump(traj)
                    carry.add(traj, reward)
            await reader
        finally:
            reader.cancel()
        rollout_end = time.monotonic()
        samples, counts = self._complete_groups(request, carry.take_complete())
        if not samples:
            raise RolloutError(f"rollout stream of step {step} ended with no complete group ({carry.owed()} owed)")
        counts.update(skipped=skipped, carried_over=carry.owed())
        mb = effective_micro_batch(self.spec)
        pending = [samples[i : i + mb] for i in range(0, len(samples), mb)]
        times = (t0, rollout_end, first_at)
        return await self._close_step(ctx, rc, publisher, pending, samples, times, counts, finish)

    async def _score_groups(self, trajs: list[Trajectory]) -> list[float]:
        """Rewards of trajectories of any groups in flight: judged per step, whose examples they index."""
        assert self.carry is not None
        rewards: dict[str, float] = {}
        for origin in sorted({t.step for t in trajs}):
            part = [t for t in trajs if t.step == origin]
            judged = await self._judge(origin, self.carry.examples_of(origin), part)  # type: ignore[arg-type]
            rewards.update((t.request_id, r.value) for t, r in zip(part, judged, strict=True))
        return [rewards[t.request_id] for t in trajs]

    def _complete_groups(self, request: RolloutRequest, groups: list[Any]) -> tuple[list[Sample], dict[str, int]]:
        """The complete groups' samples with their advantages and staleness (lag of their oldest token), in order."""
        samples: list[Sample] = []
        counts = {"off_policy": 0, "stale": 0, "stale_tokens": 0}
        for group in groups:
            members = [group.samples[g] for g in range(self.spec.algorithm.group_size)]
            advantages = group_advantages([reward for _, reward in members])
            for (traj, reward), advantage in zip(members, advantages, strict=True):
                is_stale, weight = self._classify(request, traj)
                counts["stale"] += is_stale
                counts["off_policy"] += weight == 0.0 and traj.finish_reason != FAILED
                counts["stale_tokens"] += _older_tokens(traj, request.weight_version) if weight else 0
                samples.append(Sample(traj, float(reward), advantage, stale=is_stale, weight=weight))
        return samples, counts

    async def _score(self, ctx: StepContext, trajs: list[Trajectory]) -> list[float]:
        """The rewards of a batch of the step's trajectories (see _judge)."""
        return [r.value for r in await self._judge(ctx.step, ctx.examples, trajs)]

    async def _judge(self, step: int, examples: list[Any], trajs: list[Trajectory]) -> list[RewardResult]:
        """The rewards of trajectories of `examples` from the reward sandbox (a failed call scores 0 and is counted
        by reason). The trajectories were validated (their prompt_index is one of `examples`)."""
        assert self.rewards is not None
        judged = [t for t in trajs if t.finish_reason != FAILED]  # dropped by the manager: nothing to judge, 0
        items = [(self._decode(self.tokenizer, t.response_ids), examples[t.prompt_index]) for t in judged]
        results = await asyncio.to_thread(self.rewards.score, items) if items else []
        failed: dict[str, int] = {}
        for r in results:
            if r.failure is not None:
                metrics.REWARD_FAILURES.labels(r.failure).inc()
                failed[r.failure] = failed.get(r.failure, 0) + 1
        if failed:
            detail = next(r.detail for r in results if r.failure is not None)
            log.warning(
                "reward calls failed: those samples score 0",
                extra={
                    "step": step,
                    "failures": failed,
                    "first": detail,
                    "reward": describe_reward(self.spec.task.reward),
                },
            )
        scored = iter(results)
        return [RewardResult(0.0) if t.finish_reason == FAILED else next(scored) for t in trajs]

    # ---- evaluation (spec.evaluation; rlboost.evaluation) ----

    def _evaluation_due(self, step: int) -> bool:
        every = self.spec.evaluation.every_steps
        return every > 0 and ((step + 1) % every == 0 or step + 1 == self.steps)

    def _validation_request(self, step: int) -> tuple[RolloutRequest, list[Any]]:
        """The validation prompts at the current version, k samples each, with the evaluation's sampling. Its
        step id is -(step + 1): the manager keeps it apart from training steps, and no trajectory is trained on."""
        ev = self.spec.evaluation
        if self._validation is None:
            examples, ids = self._validation_set(ev.prompts)
            self._validation = (examples, [PromptItem(i, p) for i, p in enumerate(ids)])
        examples, prompts = self._validation
        sampling = SamplingParams(
            temperature=ev.temperature,
            top_p=ev.top_p,
            top_k=0,
            max_new_tokens=ev.max_new_tokens or self.spec.algorithm.max_new_tokens,
            seed=ev.seed,
            stop_token_ids=self.stop_ids,
        )
        request = RolloutRequest(-(step + 1), self.version, prompts, ev.samples, sampling, vocab_size=self.vocab_size)
        return request, examples

    def _validation_set(self, limit: int) -> tuple[list[Any], list[list[int]]]:
        """The first `limit` validation prompts and their ids: task.dataset.validation (in file order, too-long
        prompts skipped as in training) where the job has one, else the built-in task's held-out set."""
        data = self.spec.task.active_dataset
        if data is not None and data.validation:
            from rlboost.tasks.dataset import DatasetPrompts

            split = DatasetPrompts(self.spec.task, self._encode, split="validation")
            try:
                batch = split.take(Cursor(), limit)
            finally:
                split.close()
            return batch.examples, batch.prompt_ids
        examples = validation_source(self.spec).validation_examples(limit)
        return examples, [self._encode(self.prompts.task.messages(e)) for e in examples]

    async def _evaluate_within_deadline(self, step: int, rc: RolloutClient) -> ValidationReport | None:
        """The evaluation, bounded by rollout.stepDeadlineS like a step's rollout; past it the step is reported
        without one (a slow evaluation does not fail the training)."""
        deadline = self.spec.rollout.step_deadline_s
        try:
            async with asyncio.timeout(deadline or None):
                return await self._evaluate(step, rc)
        except TimeoutError:
            log.warning(
                "evaluation skipped: rollout.stepDeadlineS passed", extra={"step": step, "deadline_s": deadline}
            )
            return None

    async def _evaluate(self, step: int, rc: RolloutClient) -> ValidationReport:
        """Roll the validation prompts out at the step's published weights, score them, summarise."""
        ev, start = self.spec.evaluation, time.monotonic()
        request, examples = self._validation_request(step)
        trajs = [t async for t in rc.rollout(request)]
        results = await self._judge(step, examples, trajs)
        groups: list[list[ScoredResponse]] = [[] for _ in examples]
        for traj, result in zip(trajs, results, strict=True):
            groups[traj.prompt_index].append(
                ScoredResponse(result.value, len(traj.response_ids), result.failure is not None)
            )
        report = summarize(step, self.version, groups, ev.samples, ev.pass_threshold, time.monotonic() - start)
        log.info(
            "validation done",
            extra={
                "step": step,
                "reward_mean": round(report.reward_mean, 4),
                "pass_at_1": round(report.pass_at_1, 4),
                f"pass_at_{ev.samples}": round(report.pass_at_k, 4),
                "seconds": round(report.seconds, 3),
            },
        )
        return report

    @staticmethod
    def _drain(queue: asyncio.Queue[Trajectory | None], first: Trajectory) -> tuple[list[Trajectory], bool]:
        """`first` and every trajectory already queued (one reward batch); True when the end marker was reached."""
        batch = [first]
        while not queue.empty():
            item = queue.get_nowait()
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    def _classify(self, request: RolloutRequest, traj: Trajectory) -> tuple[bool, float]:
        """(stale, loss weight) of a trajectory: on-policy, stale within maxStaleness, or skipped."""
        if traj.finish_reason == FAILED:
            return False, 0.0
        behind = lag(request.weight_version, traj.weight_version)  # its oldest token's (partial rollout)
        if not trainable(behind, self.spec.algorithm.max_staleness):
            return False, 0.0
        return behind > 0, 1.0

    async def _step(self, step: int, rc: RolloutClient, publisher: WeightPublisher) -> StepReport | None:
        alg = self.spec.algorithm
        taken = await asyncio.to_thread(self._request, step)  # reading and templating: off the event loop
        if taken is None:
            return None
        request, examples, skipped = taken
        ctx = StepContext(step, examples, [p.token_ids for p in request.prompts])
        assembler = StepAssembler(step, len(examples), alg.group_size, effective_micro_batch(self.spec))
        t0 = time.monotonic()
        queue: asyncio.Queue[Trajectory | None] = asyncio.Queue()
        reader = asyncio.create_task(self._read(rc, request, queue, assembler))
        first_at: float | None = None
        off_policy = stale = 0
        finish: dict[str, int] = {}
        pending: list[list[Sample]] = []  # ready micro-batches not yet sent in a round
        stream = self._streaming()
        ended = False
        try:
            while not ended and (first := await queue.get()) is not None:
                batch, ended = self._drain(queue, first)  # what arrived meanwhile is scored in one batch
                batch = [t for t in batch if not assembler.has(t)]  # re-sent by a retried rollout (stepRetries)
                if not batch:
                    continue
                first_at = first_at if first_at is not None else time.monotonic() - t0
                for traj in batch:
                    assembler.validate(traj)
                rewards = await self._score(ctx, batch)
                for traj, reward in zip(batch, rewards, strict=True):
                    is_stale, weight = self._classify(request, traj)
                    stale += is_stale
                    failed = traj.finish_reason == FAILED
                    metrics.FAILED.inc(failed)
                    off_policy += weight == 0.0 and not failed
                    finish[traj.finish_reason or "?"] = finish.get(traj.finish_reason or "?", 0) + 1
                    self._dump(traj)
                    pending += assembler.add(traj, reward, stale=is_stale, weight=weight)
                while stream and len(pending) >= ranks.world_size():
                    await self._train_round(ctx, pending[: ranks.world_size()], assembler.total)
                    pending = pending[ranks.world_size() :]
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
        counts = {"off_policy": off_policy, "stale": stale, "skipped": skipped}
        times = (t0, rollout_end, first_at)
        return await self._close_step(ctx, rc, publisher, pending, assembler.samples(), times, counts, finish)

    async def _close_step(
        self,
        ctx: StepContext,
        rc: RolloutClient,
        publisher: WeightPublisher,
        pending: list[list[Sample]],
        samples: list[Sample],
        times: tuple[float, float, float | None],
        counts: dict[str, int],
        finish: dict[str, int],
    ) -> StepReport:
        """After the step's rollout: train what is left of `samples` (`pending` micro-batches), step the optimizer,
        publish the new weights, checkpoint, and make the step's report. `times`: request, last trajectory, first."""
        step, (t0, rollout_end, first_at) = ctx.step, times
        released = await self._colocation_release(step)
        while pending:  # not streaming (or a remainder): train what is left now
            await self._train_round(ctx, pending[: ranks.world_size()], len(samples))
            pending = pending[ranks.world_size() :]
        version = self.version + 1
        save = self._trainer_state(step + 1, version, "") if self._save_due() else None
        await asyncio.to_thread(ranks.broadcast, {"op": "step", "save": save})
        t_step = time.monotonic()
        result, loss, stats, state = await asyncio.to_thread(self._finish_step, ctx.loss, ctx.stats, None)
        train_end = time.monotonic()
        ctx.compute_s += train_end - t_step
        published = await publisher.publish(version, state, skip_if_present=True)
        resumed = await self._colocation_resume(step, published.version)
        sync_end = time.monotonic()
        pools = self.pool_meter.update(await rc.status(), time.monotonic())
        self.version, self.checksum = published.version, published.checksum
        off_policy, stale, skipped = counts["off_policy"], counts["stale"], counts["skipped"]
        metrics.OFF_POLICY.inc(off_policy)
        metrics.STALE.inc(stale)
        metrics.PUBLISHED_BYTES.inc(published.nbytes)
        rewards = [s.reward for s in samples]
        n_tok = stats.tokens
        record = StepReport(
            step=step,
            weight_version=published.version,
            weights_checksum=published.checksum,
            reward_mean=statistics.fmean(rewards),
            reward_std=statistics.pstdev(rewards),
            loss=loss,
            grad_norm=result.grad_norm,
            learning_rate=result.learning_rate,
            tokens=sum(len(s.trajectory.response_ids) for s in samples),
            trajectories=len(samples),
            rollout_seconds=rollout_end - t0,
            train_seconds=train_end - rollout_end,
            sync_seconds=sync_end - train_end,
            train_compute_seconds=ctx.compute_s,
            first_trajectory_seconds=first_at or 0.0,
            clip_fraction=stats.clipped_tokens / n_tok if n_tok else 0.0,
            logprob_abs_diff=stats.abs_logp_diff_sum / n_tok if n_tok else 0.0,
            off_policy=off_policy,
            stale=stale,
            kl=stats.kl_sum / n_tok if n_tok else 0.0,
            entropy=stats.entropy_sum / n_tok if n_tok else 0.0,
            trainer_idle_seconds=max(0.0, (train_end - t0) - ctx.compute_s),
            ranks=ranks.world_size(),
            finish_reasons=finish,
            response_length=length_percentiles([len(s.trajectory.response_ids) for s in samples]),
            sync_bytes=published.nbytes,
            pool_tokens_per_second=pools.tokens_per_second,
            pool_workers=pools.workers,
            workers_lost=pools.workers_lost,
            migrations=pools.migrations,
            cost_so_far=pools.cost_so_far,
            spot_busy_fraction=pools.spot_busy_fraction,
            prompts_skipped=skipped,
            data_epoch=self.cursor.epoch,
            carried_over=counts.get("carried_over", 0),
            stale_tokens=counts.get("stale_tokens", 0),
        )
        record = _with_colocation(record, released, resumed)
        if save is not None:  # the report goes into the checkpoint: a trainer killed before publishing it resends it
            save.weights_checksum, save.last_report = published.checksum, record.model_dump(mode="json")
            await asyncio.to_thread(self._checkpoint, save)
        if self._export_due(step + 1):
            await asyncio.to_thread(self._export, state, step + 1)
        del state
        return record

    # ---- colocation (trainer.colocateReserved; see trainer.colocation) ----

    def _streaming(self) -> bool:
        """Streamed training, unless colocated: reserved workers must finish generating before training starts."""
        return self.spec.trainer.stream_training and not self.spec.trainer.colocate_reserved

    async def _start_colocation(self) -> None:
        workers = self.spec.rollout.reserved.replicas
        if not self.spec.trainer.colocate_reserved or self._nc is None or workers == 0:
            return
        from trainer.colocation import Colocation

        self._colocation = Colocation(
            self._nc, self.opts.namespace, self.opts.job, workers, self.opts.colocation_timeout_s, self._ack_verifier
        )
        await self._colocation.start()
        log.info(
            "colocated with the reserved rollout workers: they release memory while the trainer trains",
            extra={"workers": workers, "stream_training": False, "timeout_s": self.opts.colocation_timeout_s},
        )

    def _colocation_ack_verifier(self) -> Any:
        """Checks each colocation ack is its worker's (the job's colocation.key); None without credentials or
        when not colocated."""
        if self.opts.credentials_dir is None or not self.spec.trainer.colocate_reserved:
            return None
        from rlboost.auth.colocation_acks import AckVerifier
        from rlboost.auth.credentials import JobCredentials

        return AckVerifier(JobCredentials(self.opts.credentials_dir).colocation_key(), self.opts.job)

    async def _colocation_release(self, step: int) -> Any:
        """Before training: the colocated workers free their engine memory (None when not colocated)."""
        if self._colocation is None:
            return None
        result = await self._colocation.release(step, self.version)
        metrics.COLOCATION_RELEASE_WAIT.set(result.wait_seconds)
        return result

    async def _colocation_resume(self, step: int, version: int) -> Any:
        """After publishing `version`: the colocated workers take their memory back and sync to it."""
        if self._colocation is None:
            return None
        return await self._colocation.resume(step, version)

    async def _read(
        self, rc: RolloutClient, request: RolloutRequest, queue: asyncio.Queue, assembler: StepAssembler | GroupCarry
    ) -> None:
        """Receive the step's trajectories into the queue while training runs; None marks the end.

        Past rollout.stepDeadlineS the call is cancelled (the manager drops the step's requests) and made again,
        rollout.stepRetries times (what already arrived is kept); then StepDeadlineError names what is missing."""
        deadline, retries = self.spec.rollout.step_deadline_s, 0
        try:
            while True:
                try:
                    async with asyncio.timeout(deadline or None):
                        async for traj in self._rollout_call(rc, request, again=retries > 0):
                            metrics.TRAJECTORIES.inc()
                            queue.put_nowait(traj)
                    return
                except TimeoutError:
                    missing = assembler.missing()
                    progress = f"{assembler.received}/{assembler.total} trajectories"
                    if retries >= self.spec.rollout.step_retries:
                        metrics.STEP_DEADLINES.labels("failed").inc()
                        raise StepDeadlineError(
                            f"step {request.step}: rollout.stepDeadlineS ({deadline:g}s) passed with {progress} after "
                            f"{retries} retries (rollout.stepRetries); missing (prompt, sample): {_listed(missing)}"
                        ) from None
                    retries += 1
                    metrics.STEP_DEADLINES.labels("retried").inc()
                    log.warning(
                        "step deadline passed: asking for the step's rollout again",
                        extra={
                            "step": request.step,
                            "received": assembler.received,
                            "total": assembler.total,
                            "missing": _listed(missing),
                            "retry": retries,
                        },
                    )
        finally:
            queue.put_nowait(None)

    async def _rollout_call(self, rc: RolloutClient, request: RolloutRequest, again: bool):
        """One Rollout call; made `again` after a deadline, it waits (bounded) while the manager still drops the
        cancelled call's requests."""
        waits = 8 if again else 0
        for attempt in range(waits + 1):
            try:
                # a manager lost mid-step is waited for (connect_timeout) and re-attached to, within the deadline
                async for traj in rc.rollout(request, reattach_s=self.opts.connect_timeout_s):
                    yield traj
                return
            except RolloutError as err:
                if not err.step_in_progress or attempt == waits:
                    raise
                await asyncio.sleep(min(0.05 * 2**attempt, 2.0))  # back-off: the manager is ending the first call

    async def _train_round(self, ctx: StepContext, round_: list[list[Sample]], num_sequences: int) -> None:
        """Send one micro-batch to each rank (rank 0 keeps the first) and train rank 0's."""
        start = time.monotonic()
        mbs = [collate(mb, self.pad_id) for mb in round_]
        loss, stats = await asyncio.to_thread(self._round, mbs, num_sequences)
        ctx.add_stats(loss, stats, time.monotonic() - start)

    def _round(self, mbs: list[MicroBatch], num_sequences: int) -> tuple[float, LossStats]:
        mbs = ranks.complete_round(mbs, ranks.world_size())  # a step's last round may be short: see trainer.ranks
        ranks.broadcast({"op": "round", "mbs": mbs, "n": num_sequences})
        return self.engine.forward_backward(mbs[0], num_sequences)

    # ---- outputs ----

    def _dump(self, traj: Trajectory) -> None:
        if self.opts.dump_rollouts is None:
            return
        line = {
            "step": traj.step,
            "prompt_index": traj.prompt_index,
            "sample_index": traj.sample_index,
            "token_ids": traj.response_ids,
            "weight_version": traj.weight_version,
            "workers": traj.workers,
        }
        if traj.version_spans:  # partial rollout: the versions it was generated under
            line["version_spans"] = traj.version_spans
        with self.opts.dump_rollouts.open("a") as f:
            f.write(json.dumps(line) + "\n")

    async def _report(self, r: StepReport) -> None:
        """The step's one record: a line of steps.jsonl, the step gauges, the log, the `steps` event."""
        with (self.opts.run_dir / "steps.jsonl").open("a") as f:
            f.write(r.model_dump_json() + "\n")
        metrics.export_step(r)
        if self.trackers is not None:
            from rlboost.tracking import step_metrics

            await asyncio.to_thread(self.trackers.log, r.step, step_metrics(r))
        log.info(
            "step done",
            extra={
                "step": r.step,
                "reward_mean": round(r.reward_mean, 4),
                "loss": round(r.loss, 5),
                "weight_version": r.weight_version,
                "tokens": r.tokens,
                "rollout_s": round(r.rollout_seconds, 3),
                "train_s": round(r.train_seconds, 3),
                "sync_s": round(r.sync_seconds, 3),
            },
        )
        await self._publish_event("steps", r)


def _with_colocation(record: StepReport, released: Any, resumed: Any) -> StepReport:
    """Fill the record's colocation fields from the step's release / resume results (None: not colocated)."""
    if released is not None:
        record.colocation_released, record.colocation_wait_seconds = released.acked, released.wait_seconds
    if resumed is not None:
        record.colocation_resumed = resumed.acked
    return record


def _older_tokens(traj: Trajectory, version: int) -> int:
    """Response tokens generated under a version older than `version` (its spans, or all at its version)."""
    spans = traj.version_spans or [(traj.weight_version, len(traj.response_ids))]
    return sum(n for v, n in spans if v < version)


def _listed(missing: list[tuple[int, int]], most: int = 10) -> str:
    """The first `most` missing (prompt, sample) pairs, and how many more."""
    more = f" and {len(missing) - most} more" if len(missing) > most else ""
    return ", ".join(map(str, missing[:most])) + more


def _vocab_size(model_dir: Path) -> int:
    """The model's vocabulary size (its config.json), sent with each Rollout so the manager refuses token ids
    outside it; 0 (unchecked) when the config does not say."""
    try:
        value = json.loads((model_dir / "config.json").read_text()).get("vocab_size", 0)
    except (OSError, ValueError):
        return 0
    return value if isinstance(value, int) and value > 0 else 0


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _checksum_mismatch(bf16: dict[str, Any], ours: str, recorded: str) -> Exception:
    """The resume error when the restored weights' checksum is not the checkpoint's: it says whether the
    checkpoint was written by an older rlboost (checksum of the former definition, which these weights match)."""
    from rlboost.weights.checksum import legacy_state_checksum
    from trainer.checkpoint import CheckpointError

    head = f"restored weights have checksum {ours[:16]}, the checkpoint recorded {recorded[:16]}"
    if legacy_state_checksum(bf16) == recorded:
        return CheckpointError(
            f"{head}: the checkpoint was written by an older rlboost, whose weights checksum had another definition "
            "(sha256 of every byte; now sha256 over per-tensor xxh3-64 digests, see rlboost.weights.checksum). "
            "Start fresh (without --resume, or with an empty --checkpoint-dir) or resume it with the rlboost version that wrote it"
        )
    return CheckpointError(
        f"{head}: the weights were not restored exactly, or the checkpoint comes from another rlboost version whose "
        "weights checksum had another definition. Start fresh (without --resume, or with an empty --checkpoint-dir) "
        "or resume it with the rlboost version that wrote it"
    )


def _with_validation(report: dict | None, checkpoint: Path) -> dict | None:
    """A checkpoint's step report with the evaluation written beside it, if there was one (validation_file)."""
    from trainer.checkpoint import validation_file

    path = validation_file(checkpoint)
    if report is None or not path.is_file():
        return report
    return report | {"validation": json.loads(path.read_text())}
