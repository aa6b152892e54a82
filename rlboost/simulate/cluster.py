"""A fluid, tick-based simulation of RL steps on reserved and spot rollout instances.

Per tick every instance decodes its batch at the roofline rate (`hardware.decode_step_seconds`),
pending requests are placed by the manager's real placement policy, preempted instances hand
their requests back with every generated token (token-level migration), and a streamed trainer
consumes finished samples. Three policies share this machinery:

- reserved-only: the reserved GPUs roll out, then train (colocated, like veRL);
- disaggregated: a fixed split of the reserved GPUs, rollout on k, training on the rest;
- hybrid: reserved + spot roll out; after the offload window T the reserved requests migrate to
  spot and the reserved GPUs train on the stream (RLBoost), T adapting every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlboost.policies.balancing import BalanceWorker, HeldRequest, plan_rebalance
from rlboost.policies.length_offload import OffloadCandidate, plan_offload
from rlboost.policies.placement import WorkerLoad, place
from rlboost.simulate.hardware import (
    H100,
    Accelerator,
    LlmShape,
    kv_capacity_tokens,
    prefill_seconds,
    sync_seconds,
    train_seconds,
)
from rlboost.simulate.trace import SpotTrace
from rlboost.simulate.weights import WeightNetwork, server_egress_bytes, wave_seconds
from rlboost.simulate.workload import Workload

PENDING, DONE = -1, -2


@dataclass(frozen=True)
class ClusterConfig:
    model: LlmShape
    workload: Workload
    accelerator: Accelerator = H100
    reserved_gpus: int = 8
    gpus_per_spot: int = 2
    reserved_price: float = 10.47  # USD per GPU-hour
    spot_price: float = 2.66
    provision_s: float = 90.0  # spot VM boot + container start before its weights pull
    spot_link_bytes_s: float = 50e9 / 8  # 50 Gbit/s per spot instance
    reserved_link_bytes_s: float = 4 * 200e9 / 8  # (4+1)x200 Gbit/s nodes
    delta_bytes_per_param: float = 0.01 * 1.5  # ~1% changed bf16 elements x 1.5 B each
    weight_sync: str = "delta"  # "delta" | "full" for spot pulls after each step
    tick_s: float = 2.0
    max_batch: int = 256
    spot_tp2_share: float = 0.0  # share of spot VMs running one engine over 2x the model's TP (tail engines)
    tp_scaling: float = 0.8  # a 2x wider engine decodes this x 2 as fast (all-reduce per layer costs the rest)
    partial_overprovision: float = 0.25  # staleness > 0: in flight per step = samples + ceil(samples x this)
    # weight distribution (rlboost.simulate.weights); None: every VM pulls at its own link rate, an unshared server
    weights: WeightNetwork | None = None
    weights_fanout: bool = True  # relays (peer fan-out, the product's default) rather than all from the server

    def __post_init__(self) -> None:
        if self.weights is not None and self.weights.node_link_bytes_s != self.spot_link_bytes_s:
            raise ValueError(
                "weights.node_link_bytes_s must equal spot_link_bytes_s (one spot VM's link): set both to the same rate"
            )


@dataclass
class SimStepResult:
    """One simulated RL step of one policy (the simulator's own result, unrelated to rlboost.wire's StepReport)."""

    step: int
    start: float
    end: float
    samples: int
    spot_instances: float  # mean spot instances alive over the step
    window_s: float | None  # hybrid's offload window this step
    trainer_wait_s: float
    spot_idle_s: float


@dataclass
class PolicyResult:
    policy: str
    steps: list[SimStepResult] = field(default_factory=list)
    reserved_gpu_s: float = 0.0  # paid
    spot_gpu_s: float = 0.0  # paid (alive, provisioning included)
    busy_gpu_s: float = 0.0  # generating or training
    bubble_s: float = 0.0  # reserved GPU-seconds idle (neither rollout nor training)
    cold_start_gpu_s: float = 0.0  # spot GPU-seconds paid while a new VM pulls its first snapshot
    server_egress_bytes: float = 0.0  # the weight-server's egress: snapshots of new VMs + per-version deltas
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (time, spot instances alive)

    @property
    def wall_s(self) -> float:
        return self.steps[-1].end - self.steps[0].start if self.steps else 0.0

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.steps)

    def summary(self, cfg: ClusterConfig) -> dict[str, float]:
        hours = self.wall_s / 3600
        cost = (self.reserved_gpu_s * cfg.reserved_price + self.spot_gpu_s * cfg.spot_price) / 3600
        paid = self.reserved_gpu_s + self.spot_gpu_s
        return {
            "samples_per_s": self.samples / self.wall_s if self.wall_s else 0.0,
            "cost_per_hour": cost / hours if hours else 0.0,
            "cost_efficiency": self.samples / cost if cost else 0.0,
            "gpu_utilisation": self.busy_gpu_s / paid if paid else 0.0,
            "bubble_fraction": self.bubble_s / self.reserved_gpu_s if self.reserved_gpu_s else 0.0,
            "steps": len(self.steps),
            "wall_hours": hours,
            "mean_spot_instances": float(np.mean([s.spot_instances for s in self.steps])) if self.steps else 0.0,
            "cold_start_gpu_hours": self.cold_start_gpu_s / 3600,
            "server_egress_bytes_per_version": self.server_egress_bytes / len(self.steps) if self.steps else 0.0,
        }


class Instances:
    """Rollout instances (reserved or spot) with the state placement and decode need."""

    def __init__(self, cfg: ClusterConfig) -> None:
        self.cfg = cfg
        self.spot: list[bool] = []
        self.alive: list[bool] = []
        self.ready_at: list[float] = []
        self.prefill_debt: list[float] = []
        self.width: list[int] = []  # engine width in units of the model's TP (2: a tail engine over 2x the GPUs)
        self.kv_cap = kv_capacity_tokens(cfg.model, cfg.accelerator)

    def add(self, spot: bool, ready_at: float, width: int = 1) -> int:
        for lst, v in (
            (self.spot, spot),
            (self.alive, True),
            (self.ready_at, ready_at),
            (self.prefill_debt, 0.0),
            (self.width, width),
        ):
            lst.append(v)
        return len(self.spot) - 1

    def speedup(self) -> np.ndarray:
        """Per instance, how much faster than a base engine it decodes and prefills (TP scaling measured by tp_scaling)."""
        w = np.asarray(self.width, dtype=np.float64)
        return np.where(w > 1, w * self.cfg.tp_scaling, 1.0)

    def kv_caps(self) -> np.ndarray:
        """KV tokens per instance: a wider engine holds its weights once over more memory."""
        m, a = self.cfg.model, self.cfg.accelerator
        w = np.asarray(self.width, dtype=np.float64)
        free = a.hbm_bytes * m.tp * w * 0.85 - m.weight_bytes
        return np.maximum(free, 0.0) / m.kv_bytes_per_token

    def live_spot(self) -> list[int]:
        return [i for i, (s, a) in enumerate(zip(self.spot, self.alive, strict=True)) if s and a]

    def slots(self, expected_ctx: float) -> int:
        """Concurrent requests one instance holds: its KV capacity over the expected context."""
        return int(max(1, min(self.cfg.max_batch, self.kv_cap / max(expected_ctx, 1.0))))


class StepSim:
    """One RL step: rollout of `lengths` on `instances`, a streamed trainer, measured bubbles.

    `generated`: tokens already generated per request (responses carried over from the previous step under a
    staleness bound; a request with nothing left is a finished sample waiting to be trained on).
    `length_aware`: pending requests are placed longest-running first (rlboost.policies.length_offload).
    """

    def __init__(
        self,
        cfg: ClusterConfig,
        inst: Instances,
        lengths: np.ndarray,
        now: float,
        generated: np.ndarray | None = None,
        length_aware: bool = False,
    ) -> None:
        self.cfg, self.inst, self.now = cfg, inst, now
        self.need = lengths.astype(np.float64)
        self.gen = np.zeros_like(self.need) if generated is None else np.minimum(generated, self.need)
        self.where = np.full(len(lengths), PENDING, dtype=np.int64)
        self.done_at = np.full(len(lengths), np.inf)
        finished = self.gen >= self.need
        self.where[finished], self.done_at[finished] = DONE, now
        self.blocked: set[int] = set()  # instances that take no new work (offloaded reserved)
        self.prompt = float(cfg.workload.prompt_tokens)
        self.expected_ctx = self.prompt + float(np.mean(lengths))
        self.slots = inst.slots(self.expected_ctx)
        self.length_aware = length_aware
        self.busy_reserved_gpu_s = 0.0
        self.busy_spot_gpu_s = 0.0

    # ---- placement and migration ----
    def place(self) -> None:
        pending = np.flatnonzero(self.where == PENDING)
        if not len(pending):
            return
        if self.length_aware:  # the longest-running first (stable: index order among equals)
            pending = pending[np.argsort(-self.gen[pending], kind="stable")]
        chosen = place(len(pending), self._loads())
        if chosen:
            self._assign(pending[: len(chosen)], [int(w) for w in chosen])

    def offload(self, reserved: list[int]) -> None:
        """The window elapsed: the reserved instances' requests migrate (length-aware: longest first, each to
        the least-loaded spot instance, by the manager's policy; else back to pending for least-loaded placement)."""
        on = np.flatnonzero(np.isin(self.where, reserved))
        self.where[on] = PENDING
        if not self.length_aware or not len(on):
            return
        candidates = [OffloadCandidate(str(r), int(self.gen[r])) for r in on]
        plan = [(int(r), int(w)) for r, w in plan_offload(candidates, self._loads()) if w is not None]
        if plan:
            reqs, iids = zip(*plan, strict=True)
            self._assign(np.asarray(reqs, dtype=np.int64), list(iids))

    def rebalance(self) -> None:
        """The manager's continuous balancing (rlboost.policies.balancing) in the tail: with nothing pending and an
        instance idle, the busiest instances' excess moves to it, so the last responses decode in small batches.
        The sim does not track assignment times, so generated tokens stand in for time running (same order)."""
        if np.any(self.where == PENDING) or len(self.blocked) == len(self.inst.alive):
            return
        loads = self._loads()
        if all(w.running for w in loads):
            return
        by_inst: dict[int, list[HeldRequest]] = {int(w.worker_id): [] for w in loads}
        for r in np.flatnonzero(self.where >= 0):
            i = int(self.where[r])
            if i in by_inst:
                by_inst[i].append(HeldRequest(str(r), int(self.gen[r]), float(self.gen[r])))
        workers = [BalanceWorker(w.worker_id, w.capacity, by_inst[int(w.worker_id)]) for w in loads]
        moved = [int(r) for ids in plan_rebalance(workers, pending=0, min_excess=1).values() for r in ids]
        if moved:
            self.where[np.asarray(moved, dtype=np.int64)] = PENDING

    def _assign(self, reqs: np.ndarray, iids_list: list[int]) -> None:
        iids = np.asarray(iids_list, dtype=np.int64)
        self.where[reqs] = iids
        # migrated requests re-prefill prompt + generated tokens; prefill is batched across the instance's slots
        cost = prefill_seconds(self.cfg.model, self.cfg.accelerator, 1.0) / self.slots / self.inst.speedup()[iids]
        debt = np.bincount(iids, weights=(self.prompt + self.gen[reqs]) * cost, minlength=len(self.inst.alive))
        self.inst.prefill_debt = list(np.asarray(self.inst.prefill_debt) + debt)

    def _loads(self) -> list[WorkerLoad]:
        """Instances that can take work now (alive, weights loaded, not offloaded), as placement sees them."""
        running = np.bincount(self.where[self.where >= 0], minlength=len(self.inst.alive))
        caps = np.clip(self.inst.kv_caps() / max(self.expected_ctx, 1.0), 1, self.cfg.max_batch).astype(np.int64)
        return [
            WorkerLoad(str(i), int(running[i]), int(caps[i]))
            for i, alive in enumerate(self.inst.alive)
            if alive and self.inst.ready_at[i] <= self.now and i not in self.blocked
        ]

    def release(self, iids: list[int]) -> None:
        """Requests on these instances go back to pending with every generated token."""
        if iids:
            self.where[np.isin(self.where, iids)] = PENDING

    # ---- decode ----
    def decode(self, dt: float) -> None:
        active = np.flatnonzero(self.where >= 0)
        if not len(active):
            return
        n = len(self.inst.alive)
        on = self.where[active]
        batch = np.bincount(on, minlength=n).astype(np.float64)
        kv = np.bincount(on, weights=self.prompt + self.gen[active], minlength=n)
        step = self._decode_step(batch, kv)
        debt = np.asarray(self.inst.prefill_debt)
        budget = np.clip(dt - debt, 0.0, dt)
        self.inst.prefill_debt = list(np.maximum(debt - dt, 0.0))
        rate = budget / step  # tokens per request this tick
        adv = rate[on]
        left = self.need[active] - self.gen[active]
        finished = adv >= left
        self.gen[active] = np.minimum(self.gen[active] + adv, self.need[active])
        frac = np.where(adv > 0, left / np.maximum(adv, 1e-9), 1.0)
        done = active[finished]
        self.done_at[done] = (
            self.now + dt * np.minimum(frac[finished], 1.0) * (budget[on[finished]] / dt) + (dt - budget[on[finished]])
        )
        self.where[done] = DONE
        working = batch > 0
        spot = np.asarray(self.inst.spot, dtype=bool)
        gpus = np.asarray(self.inst.width, dtype=np.float64) * self.cfg.model.tp * dt
        self.busy_reserved_gpu_s += float(np.sum(gpus[working & ~spot]))
        self.busy_spot_gpu_s += float(np.sum(gpus[working & spot]))

    def idle_spot(self) -> int:
        """Ready spot instances with nothing to generate right now."""
        busy = set(np.unique(self.where[self.where >= 0]).tolist())
        return sum(
            1
            for i, (s, a) in enumerate(zip(self.inst.spot, self.inst.alive, strict=True))
            if s and a and self.inst.ready_at[i] <= self.now and i not in busy
        )

    def _decode_step(self, batch: np.ndarray, kv: np.ndarray) -> np.ndarray:
        m, a = self.cfg.model, self.cfg.accelerator
        tp = m.tp * self.inst.speedup()
        memory = (m.weight_bytes + kv * m.kv_bytes_per_token) / (a.hbm_bw * a.bw_efficiency * tp)
        compute = 2.0 * m.params * batch / (a.bf16_flops * a.mfu_decode * tp)
        return np.maximum(memory, compute) + a.step_overhead_s

    @property
    def all_done(self) -> bool:
        return bool(np.all(self.where == DONE))

    def done_count(self) -> int:
        return int(np.count_nonzero(self.where == DONE))

    def tokens(self) -> float:
        return float(np.sum(self.need)) + self.prompt * len(self.need)


class Trainer:
    """A streamed trainer: consumes finished samples' tokens at its roofline rate from `start`."""

    def __init__(self, cfg: ClusterConfig, gpus: int, sim: StepSim) -> None:
        per_token = train_seconds(cfg.model, cfg.accelerator, 1.0, gpus)
        self.rate = 1.0 / per_token  # tokens per second
        self.gpus, self.sim = gpus, sim
        self.start: float | None = None
        self.paused = False  # colocated GPUs went back to rollout (no spot left to take the tail)
        self.processed = 0.0
        self.wait_s = 0.0
        self.busy_s = 0.0
        self.total = sim.tokens()  # partial rollout: unknown (inf) until the step's samples are in
        self.cap = np.inf  # partial rollout: tokens of the samples this step trains on, once known

    def available(self, t: float) -> float:
        arrived = self.sim.done_at <= t
        return min(float(np.sum(self.sim.need[arrived])) + self.sim.prompt * float(np.count_nonzero(arrived)), self.cap)

    def advance(self, t0: float, dt: float) -> None:
        if self.start is None or self.paused or self.finished:
            return
        can = self.rate * dt
        got = min(can, self.available(t0 + dt) - self.processed)
        self.processed += max(got, 0.0)
        used = max(got, 0.0) / self.rate
        self.busy_s += used
        self.wait_s += dt - used

    @property
    def finished(self) -> bool:
        return self.processed >= self.total - 1e-6

    def finish_time_after_rollout(self, t: float) -> float:
        """Once every sample is in, the rest takes a known time."""
        return t + (self.total - self.processed) / self.rate


class SpotPool:
    """Spot instances following the trace: provisioning delay, full weight pull, preemption."""

    def __init__(self, cfg: ClusterConfig, inst: Instances, trace: SpotTrace | None, cap: int | None) -> None:
        self.cfg, self.inst, self.trace, self.cap = cfg, inst, trace, cap
        self.per_vm = max(cfg.gpus_per_spot // cfg.model.tp, 1)
        self.vms: list[list[int]] = []  # instance ids per spot VM
        self.pull_start: dict[int, float] = {}  # first instance of a VM -> when its snapshot pull starts
        self.egress_bytes = 0.0  # the weight-server's egress for snapshots

    def target(self, t: float) -> int:
        if self.trace is None:
            return 0
        n = self.trace.count_at(t)
        return n if self.cap is None else min(n, self.cap)

    def follow(self, t: float, sim: StepSim | None) -> list[int]:
        """Add or preempt VMs to match the trace at t; returns the instances preempted."""
        want, gone = self.target(t), []
        full = self.cold_start_seconds(max(want - len(self.vms), 0))
        while len(self.vms) < want:
            ready = t + self.cfg.provision_s + full
            self.pull_start[len(self.inst.spot)] = t + self.cfg.provision_s
            if self._tail_vm(len(self.vms)):  # one engine over the VM's GPUs
                self.vms.append([self.inst.add(True, ready, width=self.per_vm)])
            else:
                self.vms.append([self.inst.add(True, ready) for _ in range(self.per_vm)])
        while len(self.vms) > want:
            for iid in self.vms.pop():
                self.inst.alive[iid] = False
                gone.append(iid)
        if sim is not None:
            sim.release(gone)
        return gone

    def cold_start_seconds(self, k: int) -> float:
        """A wave of k new VMs pulling the first snapshot (booted together); counts the server's egress."""
        cfg, payload = self.cfg, self.cfg.model.weight_bytes
        if cfg.weights is None:
            return sync_seconds(payload, cfg.spot_link_bytes_s)
        self.egress_bytes += server_egress_bytes(payload, k, cfg.weights, cfg.weights_fanout)
        return wave_seconds(payload, k, cfg.weights, cfg.weights_fanout)

    def pulling_gpus(self, t: float) -> int:
        """GPUs of VMs booted but still pulling their first snapshot at t (paid, not generating)."""
        return sum(self.cfg.gpus_per_spot for vm in self.vms if self.pull_start[vm[0]] <= t < self.inst.ready_at[vm[0]])

    def _tail_vm(self, j: int) -> bool:
        """The j-th VM runs one wide (TP x 2) engine: spot_tp2_share of them, spread evenly (VM 0 first)."""
        share = self.cfg.spot_tp2_share
        return self.per_vm >= 2 and share > 0 and int((j + 1) * share) > int(j * share) - (j == 0)

    def gpu_count(self) -> int:
        return len(self.vms) * self.cfg.gpus_per_spot

    def ready_gpus(self, t: float) -> int:
        """GPUs of spot instances with weights loaded (what the manager sees: registered workers)."""
        return sum(self.inst.width[i] * self.cfg.model.tp for vm in self.vms for i in vm if self.inst.ready_at[i] <= t)

    def ready_instances(self, t: float) -> int:
        return sum(1 for vm in self.vms for i in vm if self.inst.ready_at[i] <= t)
