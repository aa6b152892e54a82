"""The trainer's step loop: rollouts stream in, micro-batches train as soon as their groups complete, one optimizer
step per RL step, then the new weights are published and the step reported on NATS.

Per step s (weight version s is on the weight-server): Rollout(step=s, version=s) -> trajectories are received while
ready micro-batches train -> optimizer step -> upload version s+1 (the weight-server announces it) -> StepReport on
`rlboost.<ns>.<job>.steps`. At the end JobDone on `...done`.

`Trainer` is the recipe; its collaborators own their state:
  prompts      trainer.prompt_cursor.PromptCursor  the prompt stream, its cursor, epochs, skipped prompts
  assembly     trainer.assembly / .partial_assembly  requests, arriving trajectories -> samples, micro-batches
  stream       trainer.rollout_stream.RolloutStream  a step's Rollout in batches, its deadline and retries
  ahead        trainer.rollout_ahead.RolloutAhead   the next step's Rollout under way while this one trains
  judge        trainer.judge.Judge                  rewards in the sandbox, failed reward calls
  training     trainer.training.StepTrainer         the engine: rounds, optimizer step, state to publish
  weights      trainer.versions.WeightVersions      the newest published version and checksum
  checkpoints  trainer.resume.Checkpoints           resume point, save cadence, the report sent again
  evaluator    trainer.evaluation.Evaluator         validation rollouts and their summary
  export       trainer.export.PolicyExport          Hugging Face exports of the published weights
  reporter     trainer.reporting.StepReporter       the StepReport, steps.jsonl, metrics, trackers
  colocation   trainer.colocation.Colocated         release / resume of the colocated reserved workers
  suspension   trainer.suspension.Suspension        the operator's suspend requests: checkpoint, then stop
Ranks other than 0 follow rank 0's broadcasts (trainer.followers, trainer.rank_messages).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlboost import gc_pauses
from rlboost.auth.grpc_auth import ClientAuth
from rlboost.environment_registry import check_environment
from rlboost.observability import LoopWatchdog
from rlboost.options.trainer import TrainerOptions
from rlboost.spec import JobSpec
from rlboost.wire.events import DONE, JobDone, StepReport
from trainer import advantages, ranks
from trainer.assembly import OpenedStep, StepAssembly, WholeGroups
from trainer.colocation import Colocated, with_colocation
from trainer.evaluation import Evaluator
from trainer.export import PolicyExport
from trainer.followers import follow
from trainer.job_events import JobEvents
from trainer.judge import Judge
from trainer.partial_assembly import PartialGroups
from trainer.prompt_cursor import PromptCursor
from trainer.publisher import WeightPublisher
from trainer.rank_messages import OptimizerStep, ResumeFrom, Stop
from trainer.reporting import StepReporter
from trainer.resume import Checkpoints
from trainer.rollout_ahead import Prefetched, RolloutAhead
from trainer.rollout_client import RolloutClient
from trainer.rollout_dump import RolloutDump
from trainer.rollout_stream import RolloutStream
from trainer.suspension import Suspension
from trainer.tally import StepCounts, StepTally
from trainer.training import StepTrainer, Trained
from trainer.versions import WeightVersions
from trainer.vocabulary import Vocabulary

if TYPE_CHECKING:
    from trainer.checkpoint import TrainerState

log = logging.getLogger(__name__)


class Trainer:
    """Runs the whole job; `await Trainer(spec, opts).run()` returns the JobDone it published."""

    def __init__(self, spec: JobSpec, opts: TrainerOptions, auth: ClientAuth | None = None, token: str = "") -> None:
        """`auth`: the trainer token (the manager's Rollout) and the job CA (None: anonymous, plaintext); `token`:
        the weight-server's upload token. trainer.__main__ derives both from `opts`."""
        self.spec, self.opts, self.token = spec, opts, token
        self.auth = auth if auth is not None else ClientAuth()
        credentials, model_dir, run_dir = optional_path(opts.credentials_dir), Path(opts.model_dir), Path(opts.run_dir)
        if credentials is not None:  # a missing or unusable key fails the start, not the first publish
            from rlboost.auth.credentials import JobCredentials

            JobCredentials(credentials).signing_key()
        self.colocation = Colocated(spec, opts.job, credentials, opts.colocation_timeout)  # likewise colocation.key
        self.steps = opts.steps if opts.steps is not None else spec.algorithm.steps
        self.vocab = Vocabulary.load(model_dir)
        self.prompts = PromptCursor(spec, self.vocab, run_dir)
        self.judge = Judge(spec.task, self.vocab.decode)
        self.dump = RolloutDump(optional_path(opts.dump_rollouts))
        kind = PartialGroups if spec.algorithm.partial_rollout else WholeGroups
        self.assembly: StepAssembly = kind(spec, self.prompts, self.judge, self.vocab, self.dump)
        self.stream = RolloutStream(spec.rollout, reattach_s=opts.connect_timeout)
        self.ahead = RolloutAhead(spec.algorithm.rollout_ahead)
        self.training = StepTrainer(model_dir, spec, self.vocab.pad_id)
        self.weights = WeightVersions()
        self.checkpoints = Checkpoints(spec, optional_path(opts.checkpoint_dir), opts.resume, self.steps)
        self.evaluator = Evaluator(spec, self.steps, self.prompts, self.judge, self.vocab)
        self.events = JobEvents(opts.nats_url, opts.namespace, opts.job, opts.credentials_dir, opts.connect_timeout)
        self.healthy = True  # False once the job failed
        self.terminating = False  # SIGTERM arrived (trainer.__main__): stop, neither failed nor done
        self.watchdog = LoopWatchdog(max_lag_s=60.0)  # its loop only awaits: heavy work runs in threads
        self.steps_done = 0  # a resumed run (checkpoints) will start from its saved step
        self.suspension = Suspension()
        run_dir.mkdir(parents=True, exist_ok=True)
        self.reporter = StepReporter(spec, run_dir, self.events)
        self.export = PolicyExport(spec, self.steps, run_dir, model_dir, self.vocab)
        if ranks.rank() == 0:  # last: a backend or export path that cannot work fails the start, not a step
            self.export.check()
            self.reporter.open_trackers(spec, opts.job)

    def is_healthy(self) -> bool:
        """For /healthz (any thread): the job has not failed and the loop makes progress."""
        return self.healthy and self.watchdog.healthy()

    async def run(self) -> JobDone:
        """Train every step; publish JobDone(ok) or, on failure, JobDone(ok=False) and re-raise.

        Ranks other than 0 follow rank 0 (no NATS, manager or weight-server) and return JobDone(ok=True)."""
        self.watchdog.start()
        if ranks.rank() != 0:
            await asyncio.to_thread(self.training.start)
            steps = await asyncio.to_thread(follow, self.training, self.checkpoints)
            return JobDone(ok=True, steps=steps)
        try:
            await self.events.connect()  # first: a reward that cannot start is reported in JobDone
            env = self.spec.task.environment  # an unknown environment is refused before the first step
            check_environment(env.name, env.verifiers)
            await self.suspension.listen(self.events.nc, self.opts.namespace, self.opts.job)
            await asyncio.to_thread(self.prompts.open)  # bad dataset: a clear error, no step
            await asyncio.to_thread(self.judge.start)
            await asyncio.to_thread(self.training.start)
            await self._train_all()
            await asyncio.to_thread(ranks.broadcast, Stop())
            done = JobDone(
                ok=True,
                steps=self.steps_done,
                final_weights_checksum=self.weights.checksum,
                export_path=self.export.path,
            )
            await self.events.publish(DONE, done)
            return done
        except BaseException as err:
            if self.terminating:  # the pod is going away (scale-down, node drain): the job is not over
                log.info(
                    "stopped by SIGTERM", extra={"steps_done": self.steps_done, "suspended": self.suspension.stopped}
                )
                raise
            self.healthy = False
            message = _one_line(err)
            log.error("trainer failed", extra={"error": message, "step": self.steps_done}, exc_info=err)
            with contextlib.suppress(Exception):  # best effort: NATS may be what failed
                await self.events.publish(DONE, JobDone(ok=False, steps=self.steps_done, error=message))
            raise
        finally:
            await self._close()

    async def _close(self) -> None:
        self.ahead.cancel()
        self.prompts.close()
        await asyncio.to_thread(self.judge.close)
        await asyncio.to_thread(self.reporter.close)
        await self.events.close()

    async def _train_all(self) -> None:
        """Resume (or not), publish the starting weights, then run the steps, each evaluated when due and reported."""
        from rlboost.weights.client import WeightClient

        ckpt = self._resume_point()
        if self.checkpoints.resume:  # the steps it redoes are dumped again: each sample once (issue 31)
            await asyncio.to_thread(self.dump.keep_before, self.steps_done)
        if self.spec.weight_sync.mode == "delta":  # the codec's JIT beside the first step, not in the first publish
            import rlboost.delta

            rlboost.delta.warm_up_in_background()
        await asyncio.to_thread(ranks.broadcast, ResumeFrom(str(ckpt) if ckpt else None))
        state = await asyncio.to_thread(self.training.restore, ckpt)
        gc_pauses.freeze_after_start()  # torch's, DeepSpeed's and the model's objects: out of every full collection
        streams, ca = self.spec.weight_sync.streams, self.auth.ca
        async with WeightClient(self.opts.weight_server, token=self.token, streams=streams, ca=ca) as wc:
            publisher = WeightPublisher.from_spec(  # weightSync.mode: delta | full; signed with the job's key
                wc, self.spec.weight_sync, credentials_dir=optional_path(self.opts.credentials_dir)
            )
            await self.weights.publish_start(publisher, state, Path(self.opts.model_dir))
            del state
            await self.checkpoints.resend_last_report(self.events)
            async with RolloutClient(self.opts.manager, self.auth) as rc:
                await rc.wait_ready(self.opts.connect_timeout)
                await self.colocation.start(self.events.nc, self.opts.namespace)
                for step in range(self.steps_done, self.steps):
                    if self.suspension.may_stop():
                        self.ahead.cancel()
                        await publisher.flush()  # the checkpointed version is on the weight-server
                        await self.suspension.stop()
                    record = await self._step(step, rc, publisher)
                    if record is None:
                        log.info(
                            "training data exhausted: task.dataset.epochs done",
                            extra={"step": step, "epochs": self.spec.task.dataset.epochs},
                        )
                        break
                    self.steps_done = step + 1
                    if self.evaluator.due(step):
                        record.validation = await self.evaluator.run(step, rc, self.weights.version)
                        self.checkpoints.keep_validation(step, record.validation)
                    await self.reporter.report(record)
                    self.checkpoints.mark_reported(step)
                    self.suspension.progress(self.steps_done, self.weights.checksum)
            await publisher.flush()  # an upload still in flight (overlap mode) finishes before JobDone

    def _resume_point(self) -> Path | None:
        """The checkpoint to continue from (None: start fresh), its state handed to the collaborators it concerns."""
        found = self.checkpoints.resume_point(self.prompts.dataset_rows())
        if found is None:
            return None
        path, st = found
        self.steps_done = st.steps_done
        self.suspension.saved(st.steps_done)
        self.suspension.progress(st.steps_done, st.weights_checksum)
        self.weights.resume_at(st.weight_version, st.weights_checksum)
        self.prompts.resume_at(st.data_cursor, st.steps_done)
        self.assembly.resume(st.carried_groups)
        log.info(
            "resuming",
            extra={"checkpoint": str(path), "steps_done": st.steps_done, "weight_version": st.weight_version},
        )
        return path

    async def _step(self, step: int, rc: RolloutClient, publisher: WeightPublisher) -> StepReport | None:
        """One RL step: take prompts, stream rollouts (judged and assembled as they arrive), train, publish, report,
        checkpoint and export. None: the training data is exhausted."""
        prefetched = self.ahead.take(step) or await self._open(step, rc)
        epoch = self.prompts.epoch  # the epoch of this step's prompts, before the next step takes its own
        opened = prefetched.opened
        if opened is None or prefetched.started is None:
            return None
        tally = StepTally(StepCounts(skipped=opened.skipped))
        await self._roll_out(opened, prefetched, tally)
        samples, rest = self.assembly.finish(tally.counts)
        save = self._checkpoint_state_if_due()  # before the next step (rolloutAhead) takes its prompts
        if self._runs_ahead(step):
            self.ahead.hold(await self._open(step + 1, rc, trains_at=self.weights.next_version))
        released = await self.colocation.release(step, self.weights.version)
        self.training.queue(rest)
        if self.spec.algorithm.kl_in_reward:  # the KL goes into the rewards, then the advantages (trainer.advantages)
            await self.training.penalise_kl(tally.sums)
            advantages.assign(advantages.regroup(samples), self.spec.algorithm.advantage_normalization)
        await self.training.train_rest(tally.sums, len(samples))
        trained, state = await self._optimizer_step(save, tally)
        published = await self.weights.publish_next(publisher, state)
        resumed = await self.colocation.resume(step, published.version)
        if self._opens_next_early(step):  # on-policy: the workers pull these weights meanwhile
            self.ahead.hold(await self._open(step + 1, rc))
        tally.clock.sync_end = time.monotonic()
        pools = self.reporter.pools(await rc.status())
        record = self.reporter.record(step, samples, tally, trained, published, pools, epoch)
        record = with_colocation(record, released, resumed)
        if save is not None:  # the report goes into the checkpoint: a trainer killed before publishing it resends it
            save.weights_checksum, save.last_report = published.checksum, record.model_dump(mode="json")
            await asyncio.to_thread(self.checkpoints.write, self.training.engine, save)
            self.suspension.saved(save.steps_done)
        if self.export.due(step + 1):
            await asyncio.to_thread(self.export.write, state, step + 1)
        del state
        return record

    async def _open(self, step: int, rc: RolloutClient, trains_at: int | None = None) -> Prefetched:
        """Take the step's prompts and make its Rollout call (at the version the workers hold; `trains_at`: the later
        one the step will train at, algorithm.rolloutAhead)."""
        opened = await asyncio.to_thread(self.assembly.open, step, self.weights.version, trains_at)  # reads, templates
        started = None if opened is None else self.stream.start(rc, opened.request, self.assembly.progress)
        return Prefetched(step, opened, started)

    def _runs_ahead(self, step: int) -> bool:
        """algorithm.rolloutAhead: whether the next step's rollout starts now, before this step trains."""
        return self.ahead.enabled and self._may_open_next(step)

    def _opens_next_early(self, step: int) -> bool:
        """On-policy: whether the next step's rollout starts as soon as this step's weights are published, before
        this step is reported. The same requests at the same version as after the report, ~10 ms sooner: the step
        report (the manager's pool status, NATS, steps.jsonl) runs while the workers pull. Not with partial rollout
        (its next rollout continues this step's unfinished responses once they are accounted for)."""
        on_policy = not self.ahead.enabled and not self.spec.algorithm.partial_rollout
        return on_policy and self._may_open_next(step)

    def _may_open_next(self, step: int) -> bool:
        """Whether the next step's rollout may start before this step is done (trainer.rollout_ahead says why not):
        not after the job's last step, nor before an evaluation (it has the workers to itself) or a suspension."""
        return step + 1 < self.steps and not self.evaluator.due(step) and not self.suspension.save_due()

    async def _roll_out(self, opened: OpenedStep, prefetched: Prefetched, tally: StepTally) -> None:
        """Stream the step's rollout: each batch of new trajectories is judged and assembled, and (streamed
        training) the micro-batches that fill a round train while the rest still streams. Run ahead, a step's
        rollout has mostly arrived when it starts, and the next step's rollout should start before it trains: it
        trains after its stream ended."""
        assert prefetched.started is not None
        streams = self.assembly.streams and not self.ahead.enabled
        async with contextlib.aclosing(self.stream.consume(prefetched.started)) as batches:
            async for arrived in batches:
                fresh = self.assembly.fresh(arrived)  # re-sent by a retried rollout: once
                if not fresh:
                    continue
                tally.clock.arrived()
                rewards = await self.assembly.judged(fresh)
                self.training.queue(self.assembly.add(fresh, rewards, tally.counts))
                if streams and opened.sequences is not None:
                    await self.training.train_full_rounds(tally.sums, opened.sequences)
        tally.clock.rollout_end = time.monotonic()

    async def _optimizer_step(self, save: TrainerState | None, tally: StepTally) -> tuple[Trained, dict[str, Any]]:
        """Every rank's optimizer step (rank 0 counts it as compute; the others save with it when `save`); the state
        to publish."""
        await asyncio.to_thread(ranks.broadcast, OptimizerStep(save))
        t_step = time.monotonic()
        trained, state = await asyncio.to_thread(self.training.finish_step, tally.sums.loss, tally.sums.stats)
        tally.clock.train_end = time.monotonic()
        tally.sums.compute_s += tally.clock.train_end - t_step
        return trained, state

    def _checkpoint_state_if_due(self) -> TrainerState | None:
        """The TrainerState of the checkpoint this step writes, its checksum and report filled in once published;
        None when none is due."""
        suspending = self.suspension.save_due() and self.checkpoints.directory is not None
        if not (self.checkpoints.save_due(self.steps_done, self.prompts.data_ends()) or suspending):
            return None
        return self.checkpoint_state(self.steps_done + 1, self.weights.next_version)

    def checkpoint_state(self, steps_done: int, version: int, checksum: str = "") -> TrainerState:
        """What a checkpoint after `steps_done` steps records."""
        return self.checkpoints.state(
            steps_done,
            version,
            checksum,
            data_cursor=self.prompts.checkpoint(),
            dataset_rows=self.prompts.dataset_rows(),
            carried_groups=self.assembly.carried_groups(),
        )


def optional_path(value: str) -> Path | None:
    """An option's path; None where it is '' (off)."""
    return Path(value) if value else None


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__
