"""Run a whole job locally: start every service as a child process, follow its progress, stop everything.

`run_local(spec, options, console, json_report)` is what `rlboost local` calls; it returns the exit code
(0 done, 1 a child or the job failed, 130/143 interrupted by SIGINT/SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.live import Live

from rlboost.auth.credentials import write_private
from rlboost.local.chaos import ChaosMonkey
from rlboost.local.plan import ChildPlan, LocalOptions, LocalPlan, build_plan, initial_spot_workers
from rlboost.local.progress import ProgressState, render, step_line, summary_table, validation_line
from rlboost.local.report import (
    FaultRecord,
    LocalReport,
    RestartRecord,
    counters_from_status,
    plot_rewards,
    workers_from_status,
    write_report,
)
from rlboost.local.restarts import Restarts
from rlboost.local.spot_trace import TraceSchedule, load_trace, reconcile
from rlboost.local.status_stream import StreamCursor
from rlboost.local.supervisor import ChildFailedError, Supervisor
from rlboost.nats_server import free_port, nats_server_binary
from rlboost.spec import JobSpec, dump_job_spec
from rlboost.wire.events import DONE, STEPS, JobDone
from rlboost.wire.rollout_io import ManagerStatus

log = logging.getLogger(__name__)

# Start-up deadlines per role (seconds): model loading and DeepSpeed's first import are slow on CPU.
READY_TIMEOUT_S = {
    "nats": 15.0,
    "weight-server": 60.0,
    "rollout-manager": 60.0,
    "rollout-worker": 180.0,
    "env-runner": 120.0,
    "trainer": 240.0,
}
SETTLE_TIMEOUT_S = 60.0  # after JobDone: how long workers get to report the final weight version
TRAINER_DONE_GRACE_S = 10.0  # a trainer that exits 0 may have published `done` a moment before
SHUTDOWN_GRACE_S = 10.0
STATUS_READ_EVERY_S = 0.2  # how often the status stream is read for new step reports and `done`
FINAL_READ_S = 5.0  # on the way out: how long the last read of the status stream may take
EXIT_SIGNAL = {"SIGINT": 130, "SIGTERM": 143}


class LocalRunError(RuntimeError):
    """A run that cannot go on; the message is what the user sees."""


def prepare_run_dir(spec: JobSpec, plan: LocalPlan) -> None:
    """Write job.yaml (what every child reads) and the job's credentials (made once, kept by later runs). A fresh
    run (no --resume) clears the run directory's own checkpoints: a trainer restarted with --resume must continue
    this run, not an earlier one."""
    o = plan.options
    o.run_dir.mkdir(parents=True, exist_ok=True)
    if not o.resume and o.checkpoint_dir is None:
        shutil.rmtree(o.implied_checkpoints, ignore_errors=True)
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    plan.job_file.write_text(dump_job_spec(spec))
    ensure_credentials(plan.credentials_dir)
    write_private(plan.nats_config_file, plan.nats_config_text().encode())  # it holds passwords


def write_endpoints(plan: LocalPlan) -> None:
    """`<run dir>/endpoints.json` while the run lasts: where each service listens, for an operator or a test."""
    tmp = plan.endpoints_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan.endpoints(), indent=2) + "\n")
    tmp.replace(plan.endpoints_file)


def ensure_credentials(directory: Path) -> None:
    """The job's credentials, made on the first run and kept by later ones (a resumed job keeps its keys)."""
    from rlboost.auth.credentials import (
        NATS_USERS,
        TOKEN_ROLES,
        add_missing,
        generate,
        nats_password_file,
        token_file,
    )

    wanted = [token_file(r) for r in TOKEN_ROLES] + [nats_password_file(u) for u in NATS_USERS]
    if not all((directory / name).is_file() for name in wanted):
        generate(directory)
    add_missing(directory)  # an older job's credentials get the items added since (its other keys kept)


def write_identity_proof(plan: LocalPlan, child: ChildPlan) -> None:
    """The worker's identity proof, which the manager admits it under (its id and pool, minted with the job's
    worker-identity.key): what a client holding only the worker token cannot make."""
    from rlboost.auth.credentials import JobCredentials
    from rlboost.auth.worker_identity import LOCAL_KEY, local_proof

    key = JobCredentials(plan.credentials_dir).read(LOCAL_KEY)
    path = plan.identity_file(child.name)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_private(path, local_proof(key, plan.options.job, child.pool, child.name).encode())


def start_child(sup: Supervisor, plan: LocalPlan, child: ChildPlan) -> None:
    """Start `child` (again); a worker gets its identity proof first."""
    if child.role == "rollout-worker":
        write_identity_proof(plan, child)
    sup.start(child.name, child.argv, child.env, role=child.role, pool=child.pool, cores=child.cores)
    plan.started[child.name] = child


def ensure_model(spec: JobSpec, plan: LocalPlan, console: Console) -> None:
    """Create the tiny model (or check the given one) in-process, before any child needs it."""
    try:
        from rlboost.models import ModelError
        from rlboost.models import ensure_model as _ensure  # heavy imports happen inside
    except ImportError as err:
        raise LocalRunError(f"the model factory is not available (rlboost.models): {err}") from None
    with console.status(f"preparing model in {plan.model_dir} ..."):
        try:
            _ensure(spec.model, spec.task, plan.model_dir)
        except ModelError as err:
            raise LocalRunError(f"cannot prepare the model: {err}") from None


def with_absolute_dataset_paths(spec: JobSpec) -> JobSpec:
    """task.dataset.train / .validation made absolute (against the current directory) where they are relative."""
    data = spec.task.active_dataset
    if data is None:
        return spec
    fixed = {}
    for name in ("train", "validation"):
        value = getattr(data, name)
        if value and "://" not in value and not Path(value).is_absolute():
            fixed[name] = str(Path(value).resolve())
    if not fixed:
        return spec
    return spec.model_copy(update={"task": spec.task.model_copy(update={"dataset": data.model_copy(update=fixed)})})


def check_local_dataset(spec: JobSpec, model_dir: Path | None) -> None:
    """The dataset's checks before the first step (rlboost.tasks.dataset.check_dataset), as a LocalRunError;
    with the model directory also through its tokenizer's chat template."""
    if spec.task.dataset.reasoning_gym.name:
        from rlboost.tasks.reasoning_gym import ReasoningGymError, check_name

        try:
            check_name(spec.task.dataset.reasoning_gym.name)
        except ReasoningGymError as err:
            raise LocalRunError(str(err)) from None
    if spec.task.active_dataset is None:
        return
    from rlboost.tasks.dataset import DatasetError, check_dataset

    encode = None
    if model_dir is not None:
        from rlboost.models import encode_prompt, load_tokenizer

        tokenizer, thinking = load_tokenizer(model_dir), spec.task.dataset.thinking

        def encode(messages: list[dict[str, str]]) -> list[int]:
            return encode_prompt(tokenizer, messages, enable_thinking=thinking)

    try:
        check_dataset(spec.task, spec.algorithm.prompts_per_step, encode)
    except DatasetError as err:
        raise LocalRunError(str(err)) from None


@dataclass
class SpotController:
    """Keeps the spot pool at its target size: the trace's count (or the initial count), minus chaos kills."""

    sup: Supervisor
    plan: LocalPlan
    restarts: Restarts
    desired: int
    schedule: TraceSchedule | None = None
    chaos: ChaosMonkey | None = None
    next_index: int = 0
    started_at: float | None = None
    preemptions: int = 0
    events: list[str] = field(default_factory=list)
    chaos_signal: int = signal.SIGKILL  # SIGTERM: with notice (the worker drains); SIGSTOP: frozen, lease expiry
    chaos_step_seconds: float | None = None  # chaos paced by progress: its seconds per step of finished samples
    samples_per_step: int = 1
    samples_finished: int = 0  # samples the manager(s) finished so far: the progress clock of the trace and chaos
    _manager_finished: int = 0  # the count of the manager's last status (a restarted manager counts from 0 again)
    faults: list[FaultRecord] = field(default_factory=list)  # every chaos kill, in order
    restarting: dict[str, FaultRecord] = field(default_factory=dict)  # killed, not yet back: name -> its fault
    _restart_records: dict[str, RestartRecord | None] = field(default_factory=dict)  # None: not restarted yet

    @property
    def active(self) -> bool:
        return self.schedule is not None or self.chaos is not None

    def hunting(self, now: float) -> bool:
        """Chaos is armed: it waits for a process caught at work, so it needs a fresh status every short tick."""
        return self.chaos is not None and self.chaos.armed(self.chaos_clock(now)) and not self.restarting

    def chaos_clock(self, now: float) -> float:
        """What chaos's period is measured on: the wall clock, or (`--chaos-step-seconds`) the job's progress, so
        that a fast machine cannot finish the job before the kills it is meant to survive."""
        if self.chaos_step_seconds is None:
            return now
        return self.samples_finished / max(self.samples_per_step, 1) * self.chaos_step_seconds

    def wants_status(self, now: float) -> bool:
        """A fresh manager status is needed this tick: chaos hunts, or the trace or chaos goes by the job's progress."""
        by_progress = self.schedule is not None and self.schedule.by_progress
        return self.hunting(now) or by_progress or (self.chaos is not None and self.chaos_step_seconds is not None)

    def _count_finished(self, manager_finished: int) -> None:
        """Add what the manager finished since its last status; a restarted manager counts from 0 again, and the
        progress clock must not go back (chaos would wait for progress the job already made)."""
        before = self._manager_finished if manager_finished >= self._manager_finished else 0
        self.samples_finished += manager_finished - before
        self._manager_finished = manager_finished

    def tick(self, now: float, status: ManagerStatus | None = None) -> None:
        """Chaos (a victim streaming an unfinished response, from `status`) and the trace's target size."""
        if not self.active:
            return
        if self.started_at is None:
            self.started_at = now
        if status is not None:
            self._count_finished(status.finished)
        self._bring_back(now)
        if self.hunting(now):
            self._chaos_kill(now, status)
        target = self.desired
        if self.schedule is not None:
            target = self.schedule.target(self.schedule.trace_seconds(now - self.started_at, self.samples_finished))
        names = [c.name for c in self.sup.running(pool="spot")]
        to_kill, to_start = reconcile(names, target, self.next_index)
        for name in to_kill:
            self._preempt(name, "trace", signal.SIGKILL)
        for name in to_start:
            self.next_index += 1
            start_child(self.sup, self.plan, self.plan.worker(name, "spot"))
            self.events.append(f"started {name}")

    def _live_targets(self) -> dict[str, list[str]]:
        """Per chaos target, the names of its live processes (the trainer: rank 0, the one that talks to peers)."""
        running = self.sup.running()
        by_role = {"manager": "rollout-manager", "weight-server": "weight-server", "nats": "nats"}
        live = {pool: [c.name for c in running if c.pool == pool] for pool in ("spot", "reserved")}
        live |= {t: [c.name for c in running if c.role == role] for t, role in by_role.items()}
        live["trainer"] = [c.name for c in running if c.name == "trainer"]
        return live

    def _chaos_kill(self, now: float, status: ManagerStatus | None) -> None:
        assert self.chaos is not None
        victim = self.chaos.pick(self._live_targets(), status)
        if victim is None:
            return
        self.chaos.fire(self.chaos_clock(now))
        at = now - (self.started_at if self.started_at is not None else now)
        fault = FaultRecord(
            role=victim.target,
            process=victim.name,
            signal=signal.Signals(self.chaos_signal).name,
            at_seconds=round(at, 3),
            doing=victim.doing,
        )
        self.faults.append(fault)
        if victim.target == "spot":
            self._preempt(victim.name, "chaos", self.chaos_signal, victim.doing)
            return
        self.sup.kill(victim.name, self.chaos_signal)
        self.restarting[victim.name] = fault
        self._restart_records[victim.name] = None
        self.events.append(f"{fault.signal} {victim.name} (chaos, {victim.doing})")
        log.info("chaos kill", extra={"process": victim.name, "signal": fault.signal, "doing": victim.doing})

    def _bring_back(self, now: float) -> None:
        """Restart each killed non-spot process once it has exited (the supervision's restart, without back-off);
        it is back when it answers its readiness probe again. Should it die while coming back, the supervision
        restarts it again."""
        for name, fault in list(self.restarting.items()):
            child = self.sup.children[name]
            if self._restart_records[name] is None:
                if child.alive:
                    continue  # a TERM still being handled (a worker drains first)
                record = self._restart_records[name] = self.restarts.killed_by_chaos(child, now)
                self.restarts.start(name, now, record)
                self.events.append(f"restarted {name}")
                continue
            if self.restarts.back(name):
                fault.back_after_seconds = round(now - (self.started_at or now) - fault.at_seconds, 3)
                del self.restarting[name], self._restart_records[name]

    def _preempt(self, name: str, why: str, sig: int, held: str = "") -> None:
        self.sup.kill(name, sig)
        self.preemptions += 1
        self.events.append(f"{signal.Signals(sig).name} {name} ({why}{', ' + held if held else ''})")
        log.info(
            "spot worker preempted",
            extra={"worker": name, "reason": why, "signal": signal.Signals(sig).name, "held": held},
        )


@dataclass
class RunState:
    progress: ProgressState
    done: JobDone | None = None
    interrupted: str = ""
    wake: asyncio.Event = field(default_factory=asyncio.Event)


async def _get_status(stub: object, timeout: float = 2.0) -> ManagerStatus | None:
    from rlboost.rollout.v1 import rollout_pb2 as pb
    from rlboost.wire.rollout_proto import status_from_pb

    try:
        reply = await stub.GetStatus(pb.StatusRequest(), timeout=timeout)
    except Exception as err:  # (the manager may be busy or gone; the watchdog reports deaths)
        log.debug("GetStatus failed", extra={"error": str(err)})
        return None
    return status_from_pb(reply)


class Run:
    """One local run's asynchronous part: children, NATS, manager status, spot control, display."""

    def __init__(self, spec: JobSpec, plan: LocalPlan, console: Console, spot: SpotController) -> None:
        self.spec, self.plan, self.console, self.spot = spec, plan, console, spot
        self.sup, self.restarts = spot.sup, spot.restarts
        self.restarts.on_restart = self._show_restart
        self.state = RunState(ProgressState(total_steps=spec.algorithm.steps))
        self.live: Live | None = None
        self.nc = None
        self.status_reader = StreamCursor()
        self.channel = None
        self.stub = None
        self.status_read: asyncio.Task | None = None  # the status stream's read in progress
        self.ready: set[str] | None = set()  # while starting: the children that were ready (None: all started)
        self._supervising = asyncio.Lock()
        self._said_stalled = False

    # ---- start-up ----

    async def _await_ready(self, child: ChildPlan) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S[child.role]
        while time.monotonic() < deadline:
            self._check_interrupt()
            if await asyncio.to_thread(self.sup.check_ready, child.name, child.ready_port, child.health_url):
                if self.ready is not None:
                    self.ready.add(child.name)  # from now on supervised: restarted if it dies
                return
            async with self._supervising:  # the waits of the workers and the trainer run side by side
                self._check_children()
                await self._restart_due(time.monotonic())
            await asyncio.sleep(0.1)
        what = child.health_url or f"port {child.ready_port}"
        raise ChildFailedError(
            child.name,
            None,
            f"was not ready after {READY_TIMEOUT_S[child.role]:.0f}s (waiting for {what})",
            self.sup.tail(child.name),
        )

    def _start(self, child: ChildPlan) -> None:
        start_child(self.sup, self.plan, child)

    async def start_all(self) -> None:
        """nats, weight-server, manager: each ready before the next. Then every worker and the trainer,
        waited for together: a worker may wait for the trainer's first weights before it listens. Meanwhile the
        children already ready are supervised (a death at start-up fails the run at once, naming the child; one
        after it was ready is restarted, as while the job runs)."""
        children = self.plan.children
        for child in children:
            if child.role in ("nats", "weight-server", "rollout-manager"):
                self.state.progress.phase = f"starting {child.name}"
                self._start(child)
                await self._await_ready(child)
                if child.role == "nats":
                    await self._connect_nats()
                if child.role == "rollout-manager":
                    self._connect_manager()
        rest = [c for c in children if c.role in ("rollout-worker", "env-runner", "trainer")]
        for child in rest:
            self._start(child)
        self.state.progress.phase = "starting workers and trainer"
        await asyncio.gather(*(self._await_ready(c) for c in rest))
        self.ready = None  # every child started: all of them supervised

    async def _connect_nats(self) -> None:
        """Connect as the job's operator (this run plays it) and keep the status stream: every step report and
        `done` the trainer publishes is stored on disk and read back in order (`_read_status`), so a NATS restart
        or a reconnect loses none of them."""
        import nats

        from rlboost.auth.nats import connect_options
        from rlboost.durable import reconnect_quietly
        from rlboost.local.status_stream import ensure_status_stream

        auth = connect_options(self.plan.credentials_dir, "operator")
        self.nc = await nats.connect(
            self.plan.nats_url,
            connect_timeout=5,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            **reconnect_quietly(log, logging.DEBUG),
            **auth,
        )
        o = self.plan.options
        self.status_reader = await ensure_status_stream(self.nc, o.namespace, o.job)

    def _connect_manager(self) -> None:
        from rlboost.auth.grpc_auth import ClientAuth
        from rlboost.rollout.v1 import rollout_pb2_grpc

        # Short reconnect backoff: the status poll should see a restarted manager within a second.
        options = [("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 1000)]
        auth = ClientAuth.for_role(self.plan.credentials_dir, "observer")  # status reads: the observer token
        self.channel = auth.aio_channel(self.plan.manager_address, options=options)
        self.stub = rollout_pb2_grpc.RolloutManagerStub(self.channel)

    # ---- events ----

    async def _read_status(self) -> None:
        """Every stored step report and `done` not read yet (none while NATS is away: read on a later tick)."""
        from rlboost.local.status_stream import read_from

        if self.nc is None:
            return
        for subj, data in await read_from(self.nc, self.status_reader):
            await (self._on_done(data) if DONE.carries(subj) else self._on_step(data))

    async def _on_step(self, data: bytes) -> None:
        try:
            rec = STEPS.decode(data)
        except ValueError as err:
            log.warning("ignoring a malformed step report", extra={"error": str(err)})
            return
        steps = self.state.progress.steps
        resent = self.plan.options.resume and rec.step == self.status_reader.last_step_before  # shown by that run
        if resent or any(s.step == rec.step for s in steps):
            return  # sent again by a resumed trainer (its checkpoint's report): shown and counted once
        steps.append(rec)
        if self.live is None:
            self.console.print(step_line(rec, self.state.progress.total_steps), soft_wrap=True, highlight=False)

    async def _on_done(self, data: bytes) -> None:
        try:
            self.state.done = DONE.decode(data)
        except ValueError as err:
            self.state.done = JobDone(ok=False, steps=0, error=f"malformed done event: {err}")
        self.state.wake.set()

    def interrupt(self, signame: str) -> None:
        self.state.interrupted = signame
        self.state.wake.set()

    def _check_interrupt(self) -> None:
        if self.state.interrupted:
            raise KeyboardInterrupt(self.state.interrupted)

    # ---- the run ----

    def _check_children(self) -> None:
        """Every child that died unasked is restarted (rlboost.local.restarts), but a trainer that exited 0 (the job
        is done) and a spot worker the trace or chaos replaces; a crash loop fails the run."""
        now = time.monotonic()
        for child in self.sup.unexpected_exits(among=self.ready):
            if child.role == "trainer" and child.proc.returncode == 0:
                self._trainer_exited_at = now
            elif child.pool == "spot" and self.spot.active:
                self.restarts.replaced(child, now)  # the controller starts a new spot worker on its tick
            elif child.role == "trainer" and not self.restarts.back_all(self._trainer_ranks()):
                continue  # another rank died first: its restart starts every rank
            else:
                self.restarts.died(child, now)
        exited = getattr(self, "_trainer_exited_at", None)
        if exited is not None and self.state.done is None and now - exited > TRAINER_DONE_GRACE_S:
            raise ChildFailedError(
                "trainer", 0, "exited without announcing that the job is done", self.sup.tail("trainer")
            )

    def _trainer_ranks(self) -> list[str]:
        return [c.name for c in self.plan.children if c.role == "trainer"]

    async def _restart_due(self, now: float) -> None:
        """Start the children whose back-off has passed. A trainer is not, once the status stream holds `done`:
        it exited because the job ended (a failed job's trainer exits non-zero after saying why)."""
        for name in self.restarts.due(now):
            if self.sup.children[name].role == "trainer":
                await self.read_what_is_left()
                if self.state.done is not None:
                    self.restarts.cancel(name)
                    continue
            self.restarts.start(name, now)
            self.spot.events.append(f"restarted {name}")
        self.restarts.poll(now)
        self.state.progress.restarts = self.restarts.count

    def _say_stalled(self) -> None:
        """Without a live display, a line once the job makes no progress for want of workers (it has a header)."""
        stalled = self.state.progress.stalled()
        if self.live is None and stalled and not self._said_stalled:
            self.console.print(f"waiting: {stalled}", soft_wrap=True, highlight=False)
        self._said_stalled = bool(stalled)

    def _show_restart(self, record: RestartRecord) -> None:
        """A line per restart when there is no live display (the live one counts them in its header)."""
        if self.live is None:
            line = f"restarted {record.process} ({record.cause}: {record.ended} after {record.uptime_seconds:.0f}s"
            line += f", back-off {record.backoff_seconds:.1f}s)" if record.backoff_seconds else ")"
            self.console.print(line, soft_wrap=True, highlight=False)

    async def follow(self) -> None:
        """Until JobDone: watch children, poll the manager, drive the spot pool, refresh the display."""
        self.state.progress.phase = "training"
        last_poll = last_read = 0.0
        while self.state.done is None:
            self._check_interrupt()
            self._check_children()
            now = time.monotonic()
            status = None
            # Once a second for the display; every tick while chaos waits for a worker caught mid-response
            # (ticks are short then, so a response is seen streaming however fast the machine runs it).
            hunting = self.spot.hunting(now)
            if self.stub is not None and (now - last_poll >= 1.0 or self.spot.wants_status(now)):
                last_poll = now
                status = await _get_status(self.stub)
                if status is not None:
                    self.state.progress.on_status(status)
            self.spot.tick(now, status)
            await self._restart_due(now)
            if now - last_read >= STATUS_READ_EVERY_S and self._status_read_idle():
                last_read = now
                self.status_read = asyncio.create_task(self._read_status())
            self.state.progress.preemptions = self.spot.preemptions
            self._say_stalled()
            self._refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.state.wake.wait(), timeout=0.02 if hunting else 0.25)
            self.state.wake.clear()
        if self.status_read is not None:
            await self.status_read  # bounded by the read's timeout

    async def read_what_is_left(self) -> None:
        """On the way out, a failure's too: the step reports stored but not read yet, so this run's report shows
        every step it got (a resumed run takes the last one stored as shown: status_stream.StreamCursor). Bounded;
        nothing while NATS is gone."""
        with contextlib.suppress(Exception):
            if self.status_read is not None and not self.status_read.done():
                await asyncio.wait_for(self.status_read, FINAL_READ_S)
            await asyncio.wait_for(self._read_status(), FINAL_READ_S)

    def _status_read_idle(self) -> bool:
        """No status-stream read in progress (re-raising what a finished one raised). The read runs beside the
        loop, not in it: while NATS is away it waits for its timeout, and the loop must meanwhile restart NATS,
        watch the other children and keep chaos hunting."""
        if self.status_read is None:
            return True
        if not self.status_read.done():
            return False
        self.status_read.result()
        return True

    async def settle(self) -> ManagerStatus | None:
        """After JobDone: wait until every worker reports the final weight version (bounded), return the status."""
        self.state.progress.phase = "syncing final weights"
        steps = self.state.progress.steps
        final = max((s.weight_version for s in steps), default=None)
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        status = None
        while time.monotonic() < deadline:
            self._check_interrupt()
            status = await _get_status(self.stub) if self.stub is not None else None
            if status is not None:
                self.state.progress.on_status(status)
                live = {c.name for c in self.sup.running()}  # not one preempted (a frozen one stays registered)
                if final is None or all(w.weight_version == final for w in status.workers if w.worker_id in live):
                    break
            self._refresh()
            await asyncio.sleep(0.25)
        return status

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(render(self.state.progress))

    async def close(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(Exception):  # nats may be gone already
                await self.nc.close()
        if self.channel is not None:
            await self.channel.close()


async def _phases(run: Run) -> ManagerStatus | None:
    await run.start_all()
    await run.follow()
    if not (run.state.done and run.state.done.ok):
        return None
    return await run.settle()


async def _run_async(run: Run) -> ManagerStatus | None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, run.interrupt, sig.name)
    try:
        if run.console.is_terminal:
            with Live(render(run.state.progress), console=run.console, refresh_per_second=4) as live:
                run.live = live
                return await _phases(run)
        return await _phases(run)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        run.live = None
        await run.read_what_is_left()
        await run.close()


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _make_spot_controller(
    spec: JobSpec, options: LocalOptions, sup: Supervisor, plan: LocalPlan, n: int
) -> SpotController:
    def restart(name: str) -> None:
        for child in plan.restart_of(name):  # a trainer rank: every rank
            if child.name != name and sup.children[child.name].alive:
                sup.kill(child.name)  # a rank left alone cannot finish a collective
            start_child(sup, plan, child)

    def ready(name: str) -> bool:
        started = plan.started[name]  # the plan it was started again with
        return sup.probe_ready(name, started.ready_port, started.health_url)

    schedule = None
    if options.spot_trace is not None:
        pool = spec.rollout.spot
        schedule = TraceSchedule(
            load_trace(options.spot_trace),
            options.trace_time_scale,
            pool.min_replicas,
            pool.max_replicas,
            step_seconds=options.trace_step_seconds,
            samples_per_step=spec.algorithm.prompts_per_step * spec.algorithm.group_size,
        )
    chaos = None
    if options.chaos_kill_every:
        chaos = ChaosMonkey(options.chaos_kill_every, seed=options.seed, targets=options.chaos_targets)
    sig = {"TERM": signal.SIGTERM, "STOP": signal.SIGSTOP}.get(options.chaos_signal, signal.SIGKILL)
    return SpotController(
        sup,
        plan,
        Restarts(
            sup,
            started_at=time.monotonic(),
            start_child=restart,
            ready=ready,
            limits={"trainer": spec.trainer.backoff_limit + 1},  # as on Kubernetes
        ),
        desired=n,
        schedule=schedule,
        chaos=chaos,
        next_index=n,
        chaos_signal=sig,
        chaos_step_seconds=options.chaos_step_seconds,
        samples_per_step=spec.algorithm.prompts_per_step * spec.algorithm.group_size,
    )


def build_report(run: Run, status: ManagerStatus | None, wall_s: float) -> LocalReport:
    """The run's report: the trainer's step records and the manager's final status (counters 0 without one)."""
    by_step = {s.step: s for s in run.state.progress.steps}  # a redelivered event counts once
    steps = [by_step[k] for k in sorted(by_step)]
    done = run.state.done
    return LocalReport(
        ok=bool(done and done.ok),
        steps=steps,
        validation=[s.validation for s in steps if s.validation],
        final_weights_checksum=done.final_weights_checksum if done else "",
        export_path=done.export_path if done else "",
        preemptions=run.spot.preemptions,
        **counters_from_status(status),
        spot_events=list(run.spot.events),
        faults=list(run.spot.faults),
        restarts=list(run.restarts.records),
        workers=workers_from_status(status),
        wall_seconds=round(wall_s, 3),
    )


def _print_summary(console: Console, report: LocalReport, plot: Path | None, json_report: Path | None) -> None:
    console.print(summary_table(report.steps))
    first, last = (
        report.steps[0].reward_mean if report.steps else 0.0,
        report.steps[-1].reward_mean if report.steps else 0.0,
    )
    console.print(
        f"done: {len(report.steps)} steps in {report.wall_seconds:.0f}s, reward {first:.3f} -> {last:.3f}, "
        f"preemptions {report.preemptions}, restarts {len(report.restarts)}, migrations {report.migrations}, "
        f"tokens lost {report.tokens_lost}, "
        f"tokens regenerated {report.tokens_regenerated}"
    )
    for v in report.validation:
        console.print(validation_line(v))
    console.print(f"final weights checksum: {report.final_weights_checksum or '(none)'}")
    if report.export_path:
        console.print(f"exported model: {report.export_path}")
    for what, path in (("reward plot", plot), ("json report", json_report)):
        if path is not None:
            console.print(f"{what}: {path}")


def _cpus(cores: tuple[int, ...]) -> str:
    return ",".join(map(str, cores))


def run_local(spec: JobSpec, options: LocalOptions, console: Console, json_report: Path | None = None) -> int:
    """Run the job; return the exit code. Bad input (a trace file) raises TraceError before anything starts."""
    first_count = None
    if options.spot_trace is not None:
        first_count = load_trace(options.spot_trace).count_at(0)
    spec = with_absolute_dataset_paths(spec)  # the children run elsewhere: a relative path means here
    n_spot = initial_spot_workers(spec, first_count)
    plan = build_plan(spec, options, free_port, nats_server_binary(), spot_workers=n_spot)
    prepare_run_dir(spec, plan)
    write_endpoints(plan)
    console.print(f"run directory: {options.run_dir}  (logs in {plan.log_dir})")
    if plan.split:  # the rollout overlaps training: each side on CPUs of its own (rlboost.local.plan.core_split)
        console.print(f"CPUs: trainer {_cpus(plan.split.trainer)}, every other service {_cpus(plan.split.services)}")
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    sup = Supervisor(plan.log_dir)
    run = Run(spec, plan, console, _make_spot_controller(spec, options, sup, plan, n_spot))
    started = time.monotonic()
    status, code, error = None, 0, ""
    try:
        check_local_dataset(spec, None)  # columns, rows, readable: before a tiny model is made from it
        ensure_model(spec, plan, console)
        check_local_dataset(spec, plan.model_dir)  # ...and a first batch fits maxPromptTokens
        status = asyncio.run(_run_async(run))
        done = run.state.done
        if done is None or not done.ok:
            code, error = 1, f"the trainer reported a failure: {done.error if done else 'no result'}"
    except ChildFailedError as err:
        code, error = 1, str(err)
    except LocalRunError as err:
        code, error = 1, str(err)
    except KeyboardInterrupt as err:
        signame = run.state.interrupted or (str(err.args[0]) if err.args else "SIGINT")
        code, error = EXIT_SIGNAL.get(signame, 130), f"interrupted by {signame}"
    finally:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)  # the shutdown below is bounded; let it finish
        if code:
            console.print(f"[bold red]rlboost local: {error}[/]; stopping every child", highlight=False, soft_wrap=True)
        sup.shutdown(SHUTDOWN_GRACE_S)
        plan.endpoints_file.unlink(missing_ok=True)  # it says where a running job listens
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    report = build_report(run, status, time.monotonic() - started)
    report.error = error
    if json_report is not None:
        write_report(report, json_report)
    if code == 0:
        plot = plot_rewards(report.steps, options.run_dir / "reward.png")
        _print_summary(console, report, plot, json_report)
    return code
