"""Run a whole job under one policy: steps back to back until the step count or the time runs out.

Policies: `reserved-only`, `disaggregated`, `hybrid` (the paper's), and rlboost's hybrid with issue 17's
policies (`Features`): `rlboost` has every one on; `hybrid+length`, `hybrid+scaler`, `hybrid+staleness`,
`hybrid+tp2` switch one on alone. `reserved-only+staleness` runs rlboost's algorithm (partial rollout) on the
reserved GPUs alone: against it, the gain left is spot's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from rlboost.policies.offload import OffloadConfig, OffloadWindow, StepMeasurements
from rlboost.policies.partial_rollout import in_flight, may_carry, new_groups, stream_ended, stream_target
from rlboost.policies.spot_scaling import BusySpotScaler, SpotPrices, SpotScaler, SpotSignals
from rlboost.simulate.cluster import ClusterConfig, Instances, PolicyResult, SimStepResult, SpotPool, StepSim, Trainer
from rlboost.simulate.hardware import sync_seconds
from rlboost.simulate.trace import SpotTrace
from rlboost.simulate.weights import server_egress_bytes, wave_seconds


@dataclass(frozen=True)
class Features:
    """Which of issue 17's policies a hybrid run uses."""

    length_aware: bool = False  # offload the longest-running requests first (rlboost.policies.length_offload)
    busy_scaler: bool = False  # pay only for busy spot (rlboost.policies.spot_scaling.BusySpotScaler)
    staleness: int = 0  # partial rollout: responses continue across <= this many versions (0: synchronous)
    tail_tp2: bool = False  # a share of spot VMs run one TP-2 engine for the tail


TP2_SHARE = 0.25  # share of spot VMs with a TP-2 engine when tail_tp2 is on
HYBRIDS = {
    "hybrid": Features(),
    "rlboost": Features(length_aware=True, busy_scaler=True, staleness=1, tail_tp2=True),
    "hybrid+length": Features(length_aware=True),
    "hybrid+scaler": Features(busy_scaler=True),
    "hybrid+staleness": Features(staleness=1),
    "hybrid+tp2": Features(tail_tp2=True),
}
# reserved-only with rlboost's algorithm (partial rollout, staleness 1) and no spot: the baseline that tells
# spot's share of rlboost's gain from the algorithm's (with no spot at all, `rlboost` is this policy)
SAME_ALGORITHM_BASELINE = "reserved-only+staleness"
BASELINES = {SAME_ALGORITHM_BASELINE: Features(staleness=HYBRIDS["rlboost"].staleness)}
POLICIES = ("reserved-only", SAME_ALGORITHM_BASELINE, "disaggregated", "hybrid", "rlboost")  # the default comparison
ALL_POLICIES = ("reserved-only", "disaggregated", *BASELINES, *HYBRIDS)
LOCAL_RELOAD_S = 1.0  # colocated engines reload weights from the trainer's memory
MAX_STEP_S = 7 * 24 * 3600.0  # simulated time one step may take before the run stops as stalled


class SimulationStalledError(RuntimeError):
    """A step made no progress within its bound of simulated time; the message names the policy and the step."""


class StepRunner:
    """Shared stepping: ticks until rollout and the streamed trainer are both done."""

    def __init__(
        self,
        cfg: ClusterConfig,
        policy: str,
        trace: SpotTrace | None,
        spot_cap: int | None = None,
        max_step_s: float = MAX_STEP_S,
    ) -> None:
        self.max_step_s = max_step_s
        self.features = HYBRIDS.get(policy) or BASELINES.get(policy, Features())
        if self.features.tail_tp2:
            cfg = replace(cfg, spot_tp2_share=TP2_SHARE)
        self.cfg, self.policy, self.hybrid = cfg, policy, policy in HYBRIDS
        self.inst = Instances(cfg)
        self.spot = SpotPool(cfg, self.inst, trace if self.hybrid else None, spot_cap)
        self.result = PolicyResult(policy)
        self.window = OffloadWindow(OffloadConfig(initial_s=initial_window(cfg), min_s=5.0, max_s=3600.0))
        self.scaler = SpotScaler() if spot_cap is None and not self.features.busy_scaler else None
        self.busy_scaler = busy_scaler(cfg) if spot_cap is None and self.features.busy_scaler else None
        self.rollout_gpus = cfg.reserved_gpus
        self.now = 0.0
        self.carry_need = np.zeros(0)  # partial rollout: responses carried into the next step
        self.carry_gen = np.zeros(0)
        self.carry_version = np.zeros(0, dtype=np.int64)  # the step (weight version) each was issued under

    def build_reserved(self, gpus: int) -> list[int]:
        self.rollout_gpus = gpus
        return [self.inst.add(False, 0.0) for _ in range(gpus // self.cfg.model.tp)]

    def fresh_count(self) -> int:
        """New responses this step: the step's samples, plus the over-provision that partial rollout keeps in flight."""
        partial = self.features.staleness > 0
        kept = in_flight(self.cfg.workload.samples_per_step, self.cfg.partial_overprovision, partial)
        return new_groups(kept, len(self.carry_need))

    def step(self, k: int, fresh: np.ndarray, reserved: list[int]) -> None:
        cfg, t0 = self.cfg, self.now
        if self.spot.trace is not None:
            available = self.spot.trace.count_at(t0)
            if self.scaler is not None:
                self.spot.cap = self.scaler.cap(available)
            elif self.busy_scaler is not None:
                self.spot.cap = self.busy_scaler.cap(available)
        spot_paid0 = self.result.spot_gpu_s
        partial = self.features.staleness > 0
        carried = len(self.carry_need)
        lengths = np.concatenate([self.carry_need, fresh]).astype(np.int64)
        versions = np.concatenate([self.carry_version, np.full(len(fresh), k, dtype=np.int64)])
        # a response issued under a version the next step could not train (the staleness bound) must finish now;
        # counted from the version it was issued under (its oldest token's, or earlier when it had not started)
        must_finish = np.array([not may_carry(int(v), k + 1, self.features.staleness) for v in versions], dtype=bool)
        generated = np.concatenate([self.carry_gen, np.zeros(len(fresh))])
        sim = StepSim(cfg, self.inst, lengths, t0, generated, self.features.length_aware)
        self.spot.follow(t0, sim)
        streamed = self.policy == "disaggregated"
        trainer = Trainer(cfg, cfg.reserved_gpus - (self.rollout_gpus if streamed else 0), sim)
        target = stream_target(cfg.workload.samples_per_step if partial else 0, len(lengths))
        if partial:
            trainer.total = np.inf  # known once the step's samples are in
        if streamed:
            trainer.start = t0
        window = None
        if self.hybrid:
            self.window.start_step(t0, self.spot.ready_instances(t0), len(reserved))
            window = self.window.window_s if self.window.active else None
        offloaded, complete, spot_idle_s, spot_samples, dt = False, False, 0.0, [], cfg.tick_s
        ready_spot_gpu_s = 0.0  # the busy scaler's denominator: registered spot, not VMs still booting
        while not (complete and (not partial or trainer.finished)):
            sim.now = self.now
            self.result.spot_gpu_s += self.spot.gpu_count() * dt
            ready_spot = self.spot.ready_instances(self.now)
            ready_spot_gpu_s += self.spot.ready_gpus(self.now) * dt
            self.result.cold_start_gpu_s += self.spot.pulling_gpus(self.now) * dt
            if window is not None and not offloaded and ready_spot and self.window.should_offload(self.now):
                offloaded = True  # the RLBoost move: reserved requests migrate, reserved GPUs train
                sim.blocked |= set(reserved)
                sim.offload(reserved)
                trainer.start = self.now
            if offloaded and not complete:
                trainer.paused = ready_spot == 0 and not self.spot.vms
                sim.blocked = set() if trainer.paused else set(reserved)
            self.spot.follow(self.now, sim)
            # the tail on spot spreads into small batches; not under partial rollout, where no step waits for its
            # tail and the moves only cost re-prefill (measured: 2.84x/1.73x with, 3.25x/1.99x without, p2 1e)
            if self.features.length_aware and offloaded and not partial:
                sim.rebalance()
            sim.place()
            sim.decode(dt)
            trainer.advance(self.now, dt)
            if trainer.start is not None:
                spot_idle_s += sim.idle_spot() * dt / max(ready_spot, 1)
            spot_samples.append(len(self.spot.vms))
            self.now += dt
            if not complete:
                complete = self._rollout_complete(sim, trainer, target, carried, must_finish if partial else None)
            if complete and partial and (not offloaded or trainer.paused):
                # the reserved GPUs stop generating and train: colocated, or offloaded but called back to rollout
                # because spot ran out (a trainer left paused here never finished: the loop never ended)
                offloaded = True
                sim.blocked |= set(reserved)
                sim.offload(reserved)
                if trainer.start is None:
                    trainer.start = self.now
                trainer.paused = False
            self._check_progress(k, t0)
        if partial:
            end = self.now
            self._carry(sim, target, carried, versions)
        else:
            rollout_end = float(np.max(sim.done_at))
            if trainer.start is None:  # colocated: training starts once rollout is over
                trainer.start = rollout_end
            end = max(trainer.finish_time_after_rollout(max(self.now, rollout_end)), self.now)
        tail = end - self.now
        self.result.spot_gpu_s += self.spot.gpu_count() * tail
        if self.spot.vms:
            spot_idle_s += tail
        self.now = end + self.sync_time()
        self.result.server_egress_bytes += self.delta_egress_bytes()
        self._account(k, t0, sim, trainer, spot_samples, window, spot_idle_s, target)
        paid = self.result.spot_gpu_s - spot_paid0
        ready = ready_spot_gpu_s + self.spot.ready_gpus(self.now) * (self.now - t0 - len(spot_samples) * dt)
        self._scale(sim, trainer, paid, ready, self.now - t0)

    def _check_progress(self, k: int, t0: float) -> None:
        """A step that runs past `max_step_s` of simulated time is a stall, not a slow step: stop, saying where."""
        if self.now - t0 > self.max_step_s:
            raise SimulationStalledError(
                f"policy {self.policy!r}: step {k} ran past {self.max_step_s:.0f} s of simulated time "
                f"(started at {t0:.0f} s; spot VMs now {len(self.spot.vms)}); the simulation stopped"
            )

    def _rollout_complete(
        self, sim: StepSim, trainer: Trainer, target: int, carried: int, must_finish: np.ndarray | None
    ) -> bool:
        """Synchronous (`must_finish` None): every response is in. Partial: `target` samples are in, and every
        response the staleness bound does not let cross into the next version (`must_finish`)."""
        if must_finish is None:
            return sim.all_done
        if not stream_ended(sim.done_count(), target) or not np.all(sim.done_at[must_finish] < np.inf):
            return False
        order = self._consumed(sim, target, carried)
        trainer.cap = trainer.total = float(np.sum(sim.need[order])) + sim.prompt * len(order)
        return True

    @staticmethod
    def _consumed(sim: StepSim, target: int, carried: int) -> np.ndarray:
        """The samples the step trains on: carried ones first, then the earliest finished."""
        done = np.flatnonzero(sim.done_at < np.inf)
        rank = np.lexsort((sim.done_at[done], done >= carried))
        return done[rank[:target]]

    def _carry(self, sim: StepSim, target: int, carried: int, versions: np.ndarray) -> None:
        """What the step did not train on continues under the next version (the KV is rebuilt: re-prefill)."""
        keep = np.ones(len(sim.need), dtype=bool)
        keep[self._consumed(sim, target, carried)] = False
        self.carry_need, self.carry_gen, self.carry_version = sim.need[keep], sim.gen[keep], versions[keep]

    def _scale(self, sim: StepSim, trainer: Trainer, paid: float, ready: float, step_s: float) -> None:
        """The paper's scaler measures busy over paid spot time; rlboost's over ready (registered) spot time, as
        the manager can: a VM still booting is the market's delay, not evidence of too much spot."""
        if self.scaler is not None and paid > 0:
            self.scaler.update(len(self.spot.vms), sim.busy_spot_gpu_s / paid, trainer.wait_s)
        elif self.busy_scaler is not None and ready > 0:
            busy = min(sim.busy_spot_gpu_s / ready, 1.0)
            self.busy_scaler.update(SpotSignals(len(self.spot.vms), busy, trainer.wait_s, step_s))

    def sync_time(self) -> float:
        cfg = self.cfg
        if self.policy == "disaggregated":
            return sync_seconds(cfg.model.weight_bytes, cfg.reserved_link_bytes_s)
        if self.hybrid and self.spot.vms:
            payload = self.version_bytes()
            if cfg.weights is None:
                return max(LOCAL_RELOAD_S, sync_seconds(payload, cfg.spot_link_bytes_s))
            return max(LOCAL_RELOAD_S, wave_seconds(payload, len(self.spot.vms), cfg.weights, cfg.weights_fanout))
        return LOCAL_RELOAD_S

    def version_bytes(self) -> float:
        """What a running spot VM pulls per version: the delta (or the whole snapshot under --weight-sync full)."""
        per_param = self.cfg.delta_bytes_per_param if self.cfg.weight_sync == "delta" else 2.0
        return self.cfg.model.params * per_param

    def delta_egress_bytes(self) -> float:
        """The weight-server's egress for this version's sync to the running spot VMs."""
        cfg = self.cfg
        if not (self.hybrid and self.spot.vms) or cfg.weights is None:
            return 0.0
        return server_egress_bytes(self.version_bytes(), len(self.spot.vms), cfg.weights, cfg.weights_fanout)

    def _account(self, k, t0, sim, trainer, spot_samples, window, spot_idle_s, samples) -> None:
        cfg, r = self.cfg, self.result
        wall = self.now - t0
        r.reserved_gpu_s += cfg.reserved_gpus * wall
        r.spot_gpu_s += self.spot.gpu_count() * (self.now - max(t0, self.now - self.sync_time()))
        train_busy = trainer.total / trainer.rate * trainer.gpus
        r.busy_gpu_s += sim.busy_reserved_gpu_s + sim.busy_spot_gpu_s + train_busy
        r.bubble_s += max(cfg.reserved_gpus * wall - sim.busy_reserved_gpu_s - train_busy, 0.0)
        mean_spot = float(np.mean(spot_samples)) if spot_samples else 0.0
        r.steps.append(SimStepResult(k, t0, self.now, samples, mean_spot, window, trainer.wait_s, spot_idle_s))
        r.timeline.append((self.now, len(self.spot.vms)))
        if window is not None:
            self.window.end_step(StepMeasurements(trainer_wait_s=trainer.wait_s, spot_idle_s=spot_idle_s))


def busy_scaler(cfg: ClusterConfig) -> BusySpotScaler:
    """rlboost's scaler with the prices of the run: the reserved pool and one spot VM."""
    prices = SpotPrices(
        cfg.reserved_gpus * cfg.reserved_price, cfg.gpus_per_spot * cfg.spot_price, cfg.reserved_gpus, cfg.gpus_per_spot
    )
    return BusySpotScaler(prices=prices)


def initial_window(cfg: ClusterConfig) -> float:
    """Start T at the time the reserved cluster needs to generate an average response (then it adapts)."""
    return 60.0 + cfg.workload.mean_response_start * 0.04


def run_policy(
    cfg: ClusterConfig, policy: str, trace: SpotTrace | None, steps: int, seed: int, duration_s: float | None = None
) -> PolicyResult:
    """Simulate `steps` steps (or until `duration_s` of simulated time) under `policy`."""
    if policy not in ALL_POLICIES:
        raise ValueError(f"policy: unknown {policy!r}; choose one of {', '.join(ALL_POLICIES)}")
    runner = StepRunner(cfg, policy, trace)
    gpus = balanced_split(cfg, seed) if policy == "disaggregated" else cfg.reserved_gpus
    reserved = runner.build_reserved(gpus)
    rng = np.random.default_rng(seed)
    for k in range(steps):
        runner.step(k, cfg.workload.response_lengths(k, steps, rng, runner.fresh_count()), reserved)
        if duration_s is not None and runner.now >= duration_s:
            break
    runner.result.server_egress_bytes += runner.spot.egress_bytes  # the new VMs' snapshots
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
