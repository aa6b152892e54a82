"""The plan of a local run (pure): paths, ports, and the command line of every child process.

`build_plan(spec, options, port_fn)` decides everything `rlboost local` starts, in start order:
nats-server, weight-server, rollout-manager, the reserved and spot rollout-workers, the env-runners (agentic
episodes: task.environment set), the trainer.
Every service's command line is rendered from its options model in `rlboost.options` (the contract with
the services), for a `Site` that binds every socket to loopback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from rlboost.cpu_numerics import CPU_NUMERICS_ENV
from rlboost.local.chaos import DEFAULT_TARGETS, parse_targets
from rlboost.options import (
    LOOPBACK,
    ServiceOptions,
    Site,
    env_runner_options,
    manager_options,
    trainer_options,
    weight_server_options,
    worker_options,
)
from rlboost.spec import JobSpec
from rlboost.wire.weight_routes import HEALTHZ

HOST = LOOPBACK


class LocalOptions(BaseModel):
    """What `rlboost local` was asked for beyond the job spec."""

    run_dir: Path = Field(description="Directory of this run: job.yaml, credentials/, logs/, model/, weights/, report.")
    namespace: str = Field("local", description="NATS subject namespace passed to every service.")
    job: str = Field("local", description="Job name passed to every service (NATS subjects, metrics labels).")
    dump_rollouts: Path | None = Field(None, description="Trainer writes every finished sample here as JSON lines.")
    spot_trace: Path | None = Field(None, description="Bamboo-format trace the spot pool's size follows.")
    trace_time_scale: float = Field(1.0, gt=0, description="Trace seconds per wall second (the wall clock).")
    trace_step_seconds: float | None = Field(
        None, gt=0, description="Replay the trace by the job's progress: trace seconds per step of finished samples."
    )
    chaos_kill_every: float | None = Field(
        None,
        gt=0,
        description="Preempt a spot worker caught streaming an unfinished response, at most once a period (s).",
    )
    chaos_step_seconds: float | None = Field(
        None,
        gt=0,
        description="Pace chaos by the job's progress: seconds of its period per step of finished samples.",
    )
    chaos_signal: Literal["KILL", "TERM", "STOP"] = Field(
        "KILL",
        description="Signal of chaos kills: KILL (no notice), TERM (the worker drains and flushes first) or STOP (a "
        "spot worker freezes with its connections open, as a vanished VM: found by lease expiry; spot only).",
    )
    chaos_targets: tuple[str, ...] = Field(
        DEFAULT_TARGETS,
        min_length=1,
        description="Roles chaos kills (spot, reserved, manager, weight-server, nats, trainer); all but spot restart.",
    )
    seed: int = Field(0, ge=0, description="Seed of chaos and trace victim choice.")
    python: str = Field(sys.executable, description="Interpreter that runs every service.")
    log_level: str = Field("INFO", description="Log level passed to every service.")
    checkpoint_dir: Path | None = Field(
        None, description="Trainer checkpoints go here (<run dir>/checkpoints when unset)."
    )
    resume: bool = Field(False, description="Trainer continues from the newest valid checkpoint in checkpoint_dir.")

    @field_validator("chaos_targets")
    @classmethod
    def _known_targets(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return parse_targets(",".join(value))

    @property
    def trainer_checkpoints(self) -> Path:
        """Where the trainer checkpoints: checkpoint_dir, else `<run dir>/checkpoints` (the runner restarts a trainer
        that dies, with --resume, as Kubernetes does from the trainer's volume; a fresh run clears it first)."""
        return self.checkpoint_dir if self.checkpoint_dir is not None else self.implied_checkpoints

    @property
    def implied_checkpoints(self) -> Path:
        """The run directory's own checkpoints, used without --checkpoint-dir."""
        return self.run_dir / "checkpoints"


@dataclass(frozen=True)
class ChildPlan:
    """One child process: its name, argv, and how to tell it is up."""

    name: str
    argv: list[str]
    role: str  # nats | weight-server | rollout-manager | rollout-worker | env-runner | trainer
    ready_port: int  # accepts TCP connections once started
    health_url: str = ""  # GET must answer 200 before the next child starts (empty: the port is enough)
    pool: str = ""  # workers only
    env: dict[str, str] = field(default_factory=dict)
    options: ServiceOptions | None = None  # what argv renders (an rlboost service; None for nats-server)
    cores: tuple[int, ...] = ()  # the CPUs it may run on (core_split); empty: those of `rlboost local`


@dataclass(frozen=True)
class CoreSplit:
    """The CPUs of a run whose rollout overlaps training: the trainer's ranks on some, every other child on the
    rest, so neither waits for the other's CPU (`core_split`)."""

    trainer: tuple[int, ...]
    services: tuple[int, ...]


@dataclass
class LocalPlan:
    """Everything decided before the first process starts."""

    spec: JobSpec
    options: LocalOptions
    job_file: Path
    credentials_dir: Path
    model_dir: Path
    log_dir: Path
    nats_port: int
    weight_server_port: int
    manager_port: int
    manager_metrics_port: int
    trainer_metrics_port: int
    children: list[ChildPlan]
    port_fn: Callable[[], int]
    # The plan each child was last started with (runner.start_child): a restart uses it, also for spot workers
    # started after the first plan (by the trace or chaos), which `children` does not list.
    started: dict[str, ChildPlan] = field(default_factory=dict)
    split: CoreSplit | None = None  # where the trainer and the other children run (core_split); None: anywhere

    def service_cores(self) -> tuple[int, ...]:
        """The CPUs of every child but the trainer's ranks (empty: the run's own)."""
        return self.split.services if self.split else ()

    @property
    def nats_url(self) -> str:
        return f"nats://{HOST}:{self.nats_port}"

    @property
    def nats_config_file(self) -> Path:
        return self.options.run_dir / "nats.conf"

    def nats_config_text(self) -> str:
        """The nats-server configuration (rlboost.auth.nats_config) from the job's credentials, which must exist."""
        from rlboost.auth.credentials import JobCredentials
        from rlboost.auth.nats_config import passwords_of, render_nats_config

        passwords = passwords_of(JobCredentials(self.credentials_dir))
        o = self.options
        listen, store = f"{HOST}:{self.nats_port}", str(o.run_dir / "nats")
        return render_nats_config(passwords, o.namespace, o.job, listen=listen, store_dir=store)

    @property
    def manager_address(self) -> str:
        return f"{HOST}:{self.manager_port}"

    @property
    def weight_server_url(self) -> str:
        return f"http://{HOST}:{self.weight_server_port}"

    @property
    def site(self) -> Site:
        """What every service is told: the job file, NATS, where the others are; all of it on loopback."""
        o = self.options
        return Site(
            config=str(self.job_file),
            nats_url=self.nats_url,
            namespace=o.namespace,
            job=o.job,
            bind_host=HOST,
            manager_address=self.manager_address,
            weight_server_url=self.weight_server_url,
            credentials_dir=str(self.credentials_dir),
            log_level=o.log_level,
        )

    @property
    def endpoints_file(self) -> Path:
        return self.options.run_dir / "endpoints.json"

    def endpoints(self) -> dict[str, object]:
        """Where the run's services listen (endpoints.json): clients need the credentials directory's tokens.
        Metrics (/metrics, /healthz; unauthenticated, for Prometheus) by child name; the weight-server serves
        them on its own port."""
        metrics = {
            "rollout-manager": self.manager_metrics_port,
            "trainer": self.trainer_metrics_port,
            "weight-server": self.weight_server_port,
        }
        metrics |= {c.name: c.ready_port for c in self.children if c.role == "rollout-worker"}
        return {
            "manager": self.manager_address,
            "weight_server": self.weight_server_url,
            "nats": self.nats_url,
            "credentials": str(self.credentials_dir),
            "metrics_ports": metrics,
        }

    def worker(self, worker_id: str, pool: str) -> ChildPlan:
        """A rollout-worker child (also used to start spot workers later, with a fresh metrics port)."""
        metrics_port = self.port_fn()
        gpus = getattr(self.spec.rollout, pool).gpus_per_worker
        options = worker_options(
            self.site,
            worker_id,
            pool,
            f"local-{worker_id}",
            self.model_dir,
            metrics_port,
            accelerated=gpus > 0,
            peer_port=0,  # peer fan-out: each worker serves the weights it holds on a free port it advertises
        ).model_copy(update={"identity_token_file": str(self.identity_file(worker_id))})
        # Several workers and the trainer share few cores: one thread each avoids oversubscription.
        env = {**CPU_NUMERICS_ENV, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        return ChildPlan(
            worker_id,
            options.command(self.options.python),
            "rollout-worker",
            metrics_port,
            pool=pool,
            env=env,
            options=options,
            cores=self.service_cores(),
        )

    def env_runner(self, runner_id: str) -> ChildPlan:
        """An env-runner child: the run's model directory gives it the tokenizer; one thread (few cores)."""
        metrics_port = self.port_fn()
        options = env_runner_options(self.site, runner_id, f"local-{runner_id}", self.model_dir, metrics_port)
        env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        argv = options.command(self.options.python)
        return ChildPlan(
            runner_id, argv, "env-runner", metrics_port, env=env, options=options, cores=self.service_cores()
        )

    def identity_file(self, worker_id: str) -> Path:
        """Where the runner writes worker `worker_id`'s identity proof (rlboost.auth.worker_identity.local_proof)."""
        return self.options.run_dir / "identities" / worker_id

    def restart_of(self, name: str) -> list[ChildPlan]:
        """The children to start again after `name` died: itself, with the command line it last had (so the same
        ports); for a trainer rank every rank, with --resume (they continue from the newest checkpoint) and a fresh
        rendezvous port (the killed one's may still be held), since the ranks left cannot go on without it."""
        old = self.started.get(name) or self.child(name)
        return _trainers(self, resume=True) if old.role == "trainer" else [old]

    def child(self, name: str) -> ChildPlan:
        for c in self.children:
            if c.name == name:
                return c
        raise KeyError(name)


def _nats(plan: LocalPlan, nats_binary: str) -> ChildPlan:
    # Listen address, JetStream store and one user per role with its job's subjects: the runner writes the file
    # from the job's credentials (nats_config_text) before starting it.
    argv = [nats_binary, "-c", str(plan.nats_config_file)]
    return ChildPlan("nats", argv, "nats", plan.nats_port, cores=plan.service_cores())


def _weight_server(plan: LocalPlan) -> ChildPlan:
    options = weight_server_options(plan.site, plan.weight_server_port, plan.options.run_dir / "weights")
    return ChildPlan(
        "weight-server",
        options.command(plan.options.python),
        "weight-server",
        plan.weight_server_port,
        health_url=plan.weight_server_url + HEALTHZ,
        options=options,
        cores=plan.service_cores(),
    )


def _manager(plan: LocalPlan) -> ChildPlan:
    options = manager_options(plan.site, plan.manager_port, plan.manager_metrics_port)
    health = f"http://{HOST}:{plan.manager_metrics_port}{HEALTHZ}"
    return ChildPlan(
        "rollout-manager",
        options.command(plan.options.python),
        "rollout-manager",
        plan.manager_port,
        health_url=health,
        options=options,
        cores=plan.service_cores(),
    )


def _trainers(plan: LocalPlan, resume: bool | None = None) -> list[ChildPlan]:
    """`trainer.ranks` trainer processes ("trainer" is rank 0) sharing one gloo/NCCL rendezvous on loopback.
    `resume`: override --resume (a trainer restarted after a chaos kill resumes from its checkpoint)."""
    o = plan.options
    resume = o.resume if resume is None else resume

    def child(name: str, metrics_port: int, env: dict[str, str] | None = None) -> ChildPlan:
        options = trainer_options(
            plan.site, plan.model_dir, o.run_dir, metrics_port, o.dump_rollouts, o.trainer_checkpoints, resume
        )
        env = {**CPU_NUMERICS_ENV, **(env or {})}  # the same weights on every x86 machine (rlboost.cpu_numerics)
        cores = plan.split.trainer if plan.split else ()
        return ChildPlan(
            name, options.command(o.python), "trainer", metrics_port, env=env, options=options, cores=cores
        )

    world = plan.spec.trainer.ranks
    rendezvous = {"WORLD_SIZE": str(world), "MASTER_ADDR": HOST, "MASTER_PORT": str(plan.port_fn())}
    if world == 1:  # a rendezvous of its own too: one inherited from this process's environment may be in use
        threads = str(len(plan.split.trainer) if plan.split else trainer_threads(plan.spec, available_cores()))
        env = {**rendezvous, "RANK": "0", "LOCAL_RANK": "0", "OMP_NUM_THREADS": threads}
        return [child("trainer", plan.trainer_metrics_port, env)]
    out = []
    for rank in range(world):
        port = plan.trainer_metrics_port if rank == 0 else plan.port_fn()
        env = {**rendezvous, "RANK": str(rank), "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1"}
        out.append(child("trainer" if rank == 0 else f"trainer-{rank}", port, env))
    return out


def trainer_threads(spec: JobSpec, cores: int) -> int:
    """Torch threads of a single-rank local trainer: the cores left after one per rollout worker, at least 1.

    The workers run one thread each beside it. On 2 cores with the default 3 workers the trainer's second thread
    mostly spun in OpenMP waits while the workers wanted the cores: the default job's trainer spent 0.35 CPU seconds
    per step with 2 threads and 0.26 with 1, and its step took 0.33-0.39 s instead of 0.40 s (docs/benchmarks.md,
    "Step time against TRL"). Same weights either way (rlboost.cpu_numerics)."""
    return max(1, cores - spec.rollout.reserved.replicas - spec.rollout.spot.replicas)


def core_split(spec: JobSpec, allowed: list[int]) -> CoreSplit | None:
    """Where a CPU run whose rollout overlaps training (algorithm.rolloutAhead) puts its children: the trainer's
    ranks on the first `max(ranks, trainer_threads)` CPUs (leaving at least one), every other child on the rest.

    With the rollout one step ahead the workers generate while the trainer trains; sharing every CPU, the trainer's
    threads waited for one ~60 ms a step behind the workers', and its training took 0.17-0.18 s instead of 0.14 s.
    Split, the default job with rolloutAhead took 0.185-0.194 s a step against 0.218-0.298 (2 vCPUs,
    docs/benchmarks.md, "Step time against TRL"). Otherwise None: an on-policy step's rollout and training take
    turns (the workers need every CPU while the trainer waits for the first groups), and split, the default job's
    step took 0.30-0.34 s against 0.25. GPU runs are left alone too: their compute is not on these CPUs, and so are
    runs with a rank per CPU or more: split, every rank would share the one CPU left them (2 ranks on 2 vCPUs, ahead:
    0.35-0.40 s a step split, 0.30-0.34 s not; docs/benchmarks.md, "2026-11-28, night")."""
    cores = sorted(allowed)
    pools = (spec.rollout.reserved, spec.rollout.spot, *spec.rollout.spot.variants)
    gpus = spec.trainer.gpus_per_rank + sum(pool.gpus_per_worker for pool in pools)
    if not spec.algorithm.rollout_ahead or len(cores) <= spec.trainer.ranks or gpus:
        return None
    n = min(len(cores) - 1, max(spec.trainer.ranks, trainer_threads(spec, len(cores))))
    return CoreSplit(tuple(cores[:n]), tuple(cores[n:]))


def allowed_cores() -> list[int]:
    """The CPUs this process may run on (its affinity, where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return sorted(affinity(0)) if affinity is not None else list(range(os.cpu_count() or 1))


def available_cores() -> int:
    """How many CPUs this process may run on."""
    return len(allowed_cores())


def model_dir_for(spec: JobSpec, run_dir: Path) -> Path:
    """Where the model lives: `model.path` if given, else `<run-dir>/model`."""
    return Path(spec.model.path) if spec.model.path else run_dir / "model"


def initial_spot_workers(spec: JobSpec, first_trace_count: int | None) -> int:
    """Spot workers at start: the trace's first count when replaying one, else `spot.replicas`, within min/max."""
    pool = spec.rollout.spot
    wanted = pool.replicas if first_trace_count is None else first_trace_count
    return max(pool.min_replicas, min(pool.max_replicas, wanted))


def _env_runners(spec: JobSpec) -> int:
    """Env-runners to start: rollout.envRunners.replicas for a job with an environment, else none."""
    return spec.rollout.env_runners.replicas if spec.task.episodes else 0


def build_plan(
    spec: JobSpec,
    options: LocalOptions,
    port_fn: Callable[[], int],
    nats_binary: str = "nats-server",
    spot_workers: int | None = None,
) -> LocalPlan:
    """Decide every child's command line. Pure: no process starts, no file is written."""
    run_dir = options.run_dir
    ports = {name: port_fn() for name in ("nats", "ws", "mgr", "mgr_metrics", "trainer_metrics")}
    plan = LocalPlan(
        spec=spec,
        options=options,
        job_file=run_dir / "job.yaml",
        credentials_dir=run_dir / "credentials",
        model_dir=model_dir_for(spec, run_dir),
        log_dir=run_dir / "logs",
        nats_port=ports["nats"],
        weight_server_port=ports["ws"],
        manager_port=ports["mgr"],
        manager_metrics_port=ports["mgr_metrics"],
        trainer_metrics_port=ports["trainer_metrics"],
        children=[],
        port_fn=port_fn,
        split=core_split(spec, allowed_cores()),
    )
    n_spot = spec.rollout.spot.replicas if spot_workers is None else spot_workers
    plan.children = [
        _nats(plan, nats_binary),
        _weight_server(plan),
        _manager(plan),
        *(plan.worker(f"reserved-{i}", "reserved") for i in range(spec.rollout.reserved.replicas)),
        *(plan.worker(f"spot-{i}", "spot") for i in range(n_spot)),
        *(plan.env_runner(f"env-runner-{i}") for i in range(_env_runners(spec))),
        *_trainers(plan),
    ]
    return plan
