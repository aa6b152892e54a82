"""Run a whole job under one policy: steps back to back until the step count or the time runs out."""

from __future__ import annotations

import numpy as np

from rlboost.policies.offload import OffloadConfig, OffloadWindow, StepMeasurements
from rlboost.policies.spot_scaling import SpotScaler
from rlboost.simulate.cluster import ClusterConfig, Instances, PolicyResult, SimStepResult, SpotPool, StepSim, Trainer
from rlboost.simulate.hardware import sync_seconds
from rlboost.simulate.trace import SpotTrace

POLICIES = ("reserved-only", "disaggregated", "hybrid")
LOCAL_RELOAD_S = 1.0  # colocated engines reload weights from the trainer's memory


class StepRunner:
    """Shared stepping: ticks until rollout and the streamed trainer are both done."""

    def __init__(self, cfg: ClusterConfig, policy: str, trace: SpotTrace | None, spot_cap: int | None = None) -> None:
        self.cfg, self.policy = cfg, policy
        self.inst = Instances(cfg)
        self.spot = SpotPool(cfg, self.inst, trace if policy == "hybrid" else None, spot_cap)
        self.result = PolicyResult(policy)
        self.window = OffloadWindow(OffloadConfig(initial_s=initial_window(cfg), min_s=5.0, max_s=3600.0))
        self.scaler = SpotScaler() if spot_cap is None else None
        self.rollout_gpus = cfg.reserved_gpus
        self.now = 0.0

    def build_reserved(self, gpus: int) -> list[int]:
        self.rollout_gpus = gpus
        return [self.inst.add(False, 0.0) for _ in range(gpus // self.cfg.model.tp)]

    def step(self, k: int, lengths: np.ndarray, reserved: list[int]) -> None:
        cfg, t0 = self.cfg, self.now
        if self.scaler is not None and self.spot.trace is not None:
            self.spot.cap = self.scaler.cap(self.spot.trace.count_at(t0))
        spot_paid0 = self.result.spot_gpu_s
        sim = StepSim(cfg, self.inst, lengths, t0)
        self.spot.follow(t0, sim)
        streamed = self.policy == "disaggregated"
        trainer = Trainer(cfg, cfg.reserved_gpus - (self.rollout_gpus if streamed else 0), sim)
        if streamed:
            trainer.start = t0
        window = None
        if self.policy == "hybrid":
            self.window.start_step(t0, self.spot.ready_instances(t0), len(reserved))
            window = self.window.window_s if self.window.active else None
        offloaded, spot_idle_s, spot_samples, dt = False, 0.0, [], cfg.tick_s
        while not sim.all_done:
            sim.now = self.now
            self.result.spot_gpu_s += self.spot.gpu_count() * dt
            ready_spot = self.spot.ready_instances(self.now)
            if window is not None and not offloaded and ready_spot and self.window.should_offload(self.now):
                offloaded = True  # the RLBoost move: reserved requests migrate, reserved GPUs train
                sim.blocked |= set(reserved)
                sim.release(reserved)
                trainer.start = self.now
            if offloaded:
                trainer.paused = ready_spot == 0 and not self.spot.vms
                sim.blocked = set() if trainer.paused else set(reserved)
            self.spot.follow(self.now, sim)
            sim.place()
            sim.decode(dt)
            trainer.advance(self.now, dt)
            if trainer.start is not None:
                spot_idle_s += sim.idle_spot() * dt / max(ready_spot, 1)
            spot_samples.append(len(self.spot.vms))
            self.now += dt
        rollout_end = float(np.max(sim.done_at))
        if trainer.start is None:  # colocated: training starts once rollout is over
            trainer.start = rollout_end
        end = max(trainer.finish_time_after_rollout(max(self.now, rollout_end)), self.now)
        tail = end - self.now
        self.result.spot_gpu_s += self.spot.gpu_count() * tail
        if self.spot.vms:
            spot_idle_s += tail
        self.now = end + self.sync_time()
        self._account(k, t0, sim, trainer, spot_samples, window, spot_idle_s)
        paid = self.result.spot_gpu_s - spot_paid0
        if self.scaler is not None and paid > 0:
            self.scaler.update(len(self.spot.vms), sim.busy_spot_gpu_s / paid, trainer.wait_s)

    def sync_time(self) -> float:
        cfg = self.cfg
        if self.policy == "disaggregated":
            return sync_seconds(cfg.model.weight_bytes, cfg.reserved_link_bytes_s)
        if self.policy == "hybrid" and self.spot.vms:
            per_param = cfg.delta_bytes_per_param if cfg.weight_sync == "delta" else 2.0
            return max(LOCAL_RELOAD_S, sync_seconds(cfg.model.params * per_param, cfg.spot_link_bytes_s))
        return LOCAL_RELOAD_S

    def _account(self, k, t0, sim, trainer, spot_samples, window, spot_idle_s) -> None:
        cfg, r = self.cfg, self.result
        wall = self.now - t0
        r.reserved_gpu_s += cfg.reserved_gpus * wall
        r.spot_gpu_s += self.spot.gpu_count() * (self.now - max(t0, self.now - self.sync_time()))
        train_busy = trainer.busy_s * trainer.gpus + (trainer.total - 0.0) * 0  # busy_s counts streamed work only
        train_busy = trainer.total / trainer.rate * trainer.gpus
        r.busy_gpu_s += sim.busy_reserved_gpu_s + sim.busy_spot_gpu_s + train_busy
        r.bubble_s += max(cfg.reserved_gpus * wall - sim.busy_reserved_gpu_s - train_busy, 0.0)
        mean_spot = float(np.mean(spot_samples)) if spot_samples else 0.0
        r.steps.append(SimStepResult(k, t0, self.now, len(sim.need), mean_spot, window, trainer.wait_s, spot_idle_s))
        r.timeline.append((self.now, len(self.spot.vms)))
        if window is not None:
            self.window.end_step(StepMeasurements(trainer_wait_s=trainer.wait_s, spot_idle_s=spot_idle_s))


def initial_window(cfg: ClusterConfig) -> float:
    """Start T at the time the reserved cluster needs to generate an average response (then it adapts)."""
    return 60.0 + cfg.workload.mean_response_start * 0.04


def run_policy(
    cfg: ClusterConfig, policy: str, trace: SpotTrace | None, steps: int, seed: int, duration_s: float | None = None
) -> PolicyResult:
    """Simulate `steps` steps (or until `duration_s` of simulated time) under `policy`."""
    if policy not in POLICIES:
        raise ValueError(f"policy: unknown {policy!r}; choose one of {', '.join(POLICIES)}")
    runner = StepRunner(cfg, policy, trace)
    gpus = balanced_split(cfg, seed) if policy == "disaggregated" else cfg.reserved_gpus
    reserved = runner.build_reserved(gpus)
    rng = np.random.default_rng(seed)
    for k in range(steps):
        runner.step(k, cfg.workload.response_lengths(k, steps, rng), reserved)
        if duration_s is not None and runner.now >= duration_s:
            break
    return runner.result


def balanced_split(cfg: ClusterConfig, seed: int) -> int:
    """StreamRL-style fixed split: the rollout GPU count that makes a first step shortest."""
    best, best_t = cfg.model.tp, float("inf")
    for gpus in range(cfg.model.tp, cfg.reserved_gpus, cfg.model.tp):
        runner = StepRunner(cfg, "disaggregated", None)
        reserved = runner.build_reserved(gpus)
        runner.step(0, cfg.workload.response_lengths(0, 1, np.random.default_rng(seed)), reserved)
        if runner.now < best_t:
            best, best_t = gpus, runner.now
    return best
