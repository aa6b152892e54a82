"""Step time with heterogeneous worker speeds: least-loaded vs speed-aware placement vs speed-aware placement with
the speed-aware rebalance (the longest-running responses off slow workers to fast idle ones at a step's end; issue
16 item 3).

The real rollout-manager state machine (`rollout_manager.state.ManagerState`, its scheduling pass, balancing and
the policies in rlboost.policies) drives simulated workers on a simulated clock: each worker decodes every request
it holds at its own per-request rate (decode is memory-bound: the rate does not depend on the batch here), streams
a chunk per request per tick, flushes on revoke and reports a new weight version `sync` seconds after the manager
asks for it. Response lengths are long-tailed and correlated within a prompt group (lognormal per prompt, lognormal
per sample around it), drawn once per step and the same for both placements. The manager learns the speeds during
the first step (it starts least-loaded), so the figure is the mean step time of the steps after it.

python bench/placement_bench.py [--workers 32] [--capacity 8] [--slow-share 0.5] [--slow-factor 4] [--steps 5]
                                [--prompts 64] [--group 8] [--slow-sync-s 1] [--migration-cost-s 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
from dataclasses import dataclass, field

TICK_S = 0.25  # simulated seconds per tick: each worker streams one chunk per request per tick
BALANCE_S = 1.0  # the manager's balancing interval (RolloutManagerServer's default)


@dataclass
class SimWorker:
    """A simulated rollout worker: requests it decodes, with the tokens owed to each, and its pending sync."""

    worker_id: str
    rate: float  # tokens per second per request
    sync_s: float  # seconds from SetWeightVersion to holding the version
    version: int = 0
    sync_done_at: float | None = None
    sync_target: int = 0
    held: dict[str, list] = field(default_factory=dict)  # request id -> [epoch, offset, tokens owed, fraction]


def _lengths(rng: random.Random, prompts: int, group: int, max_new: int) -> dict[tuple[int, int], int]:
    """Response lengths: a lognormal median per prompt (long-tailed across prompts), lognormal spread per sample."""
    out = {}
    for p in range(prompts):
        median = rng.lognormvariate(math.log(300), 0.9)
        for g in range(group):
            out[(p, g)] = max(1, min(max_new, int(median * rng.lognormvariate(0, 0.4))))
    return out


MODES = {  # name -> (speed-aware placement, speed-aware rebalance)
    "least-loaded": (False, False),
    "speed-aware": (True, False),
    "speed-aware+rebalance": (True, True),
}


def run(args: argparse.Namespace, mode: str) -> tuple[list[float], dict]:
    """Step times (simulated seconds) of `args.steps` steps under one mode, and what the slow workers did."""
    from rlboost.wire.rollout_io import (
        Pool,
        PromptItem,
        RolloutRequest,
        SamplingParams,
        TokenChunk,
        WorkerRegistration,
        request_id,
    )
    from rollout_manager.state import ManagerState

    speed_aware, rebalance = MODES[mode]
    state = ManagerState(lease_timeout_s=30.0, speed_aware=speed_aware)
    state.speed.migration_cost_s = args.migration_cost_s
    state.speed.rebalance_moves = state.speed.rebalance_moves if rebalance else 0
    slow_n = round(args.workers * args.slow_share)
    workers = {}
    now = 0.0
    for i in range(args.workers):
        slow = i < slow_n
        w = SimWorker(f"w{i:04d}", args.rate / (args.slow_factor if slow else 1), args.slow_sync_s if slow else 1.0)
        workers[w.worker_id] = w
        state.register(WorkerRegistration(w.worker_id, Pool.SPOT, f"node-{i}", args.capacity, 0), now)
    rng = random.Random(args.seed)
    times = []
    next_balance = 0.0
    for step in range(args.steps):
        lengths = _lengths(rng, args.prompts, args.group, args.max_new_tokens)
        owed = {request_id(step, p, g): n for (p, g), n in lengths.items()}
        prompts = [PromptItem(p, [1, 2, 3]) for p in range(args.prompts)]
        sampling = SamplingParams(max_new_tokens=args.max_new_tokens, seed=1)
        total = state.add_step(RolloutRequest(step, step, prompts, args.group, sampling), now)
        start, delivered = now, 0
        while delivered < total:
            if state.dirty:
                state.schedule(now)
            _apply_outbox(state.take_outbox(), workers, owed, now)
            now += TICK_S
            for w in workers.values():
                _decode(state, w, now, TokenChunk)
            if now >= next_balance:
                next_balance = now + BALANCE_S
                state.balance(now)
                for w in workers.values():
                    state.on_heartbeat(w.worker_id, w.version, now)
                state.tick(now)
            delivered += len(state.take_delivered())
        times.append(now - start)
    return times, _slow_report(state, slow_n)


def _slow_report(state, slow_n: int) -> dict:
    """What the slow (or far) workers did: tokens generated, versions held, measured sync; migrations by reason."""
    slow = [w for w in state.workers.values() if int(w.id[1:]) < slow_n]
    return {
        "slow_tokens": sum(w.tokens_generated for w in slow),
        "all_tokens": sum(w.tokens_generated for w in state.workers.values()),
        "slow_versions": sorted({w.version for w in slow}),
        "slow_sync_s_measured": max((w.sync_s for w in slow), default=0.0),
        "migrations_by_reason": dict(state.tally.migrations_by_reason),
    }


def _apply_outbox(boxes: dict, workers: dict[str, SimWorker], owed: dict[str, int], now: float) -> None:
    for wid, box in boxes.items():
        w = workers[wid]
        for a in box.assign:
            w.held[a.request_id] = [a.lease_epoch, a.generated, owed[a.request_id] - a.generated, 0.0]
        for ids in box.revoke.values():
            for rid in ids:  # flushed on the next decode: an abort chunk with nothing new
                if rid in w.held:
                    w.held[rid][2] = -1
        if box.set_version is not None:
            w.sync_target, w.sync_done_at = box.set_version, now + w.sync_s


def _decode(state, w: SimWorker, now: float, chunk_type) -> None:
    """One tick of `w`: its requests advance at its rate; one chunk batch to the manager; a sync that completed."""
    if w.sync_done_at is not None and now >= w.sync_done_at:
        w.version, w.sync_done_at = w.sync_target, None
        state.on_weight_version(w.worker_id, w.version, now)
    chunks = []
    for rid, h in list(w.held.items()):
        epoch, offset, left, frac = h
        if left < 0:
            chunks.append(chunk_type(rid, epoch, offset, [], [], finish_reason="abort"))
            del w.held[rid]
            continue
        frac += w.rate * TICK_S
        n = min(int(frac), left)
        h[3] = frac - int(frac)
        if n == 0:
            continue
        done = n == left
        chunks.append(chunk_type(rid, epoch, offset, [1] * n, [-0.5] * n, finished=done, finish_reason="stop"))
        h[1], h[2] = offset + n, left - n
        if done:
            del w.held[rid]
    if chunks:
        state.on_chunks(w.worker_id, chunks, now)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=32, help="simulated workers")
    parser.add_argument("--capacity", type=int, default=8, help="concurrent requests per worker")
    parser.add_argument("--slow-share", type=float, default=0.5, help="share of the workers that are slow")
    parser.add_argument("--slow-factor", type=float, default=4.0, help="how many times slower the slow ones decode")
    parser.add_argument(
        "--slow-sync-s", type=float, default=1.0, help="weight-sync seconds of the slow ones (1 s: near)"
    )
    parser.add_argument("--rate", type=float, default=40.0, help="fast workers' tokens per second per request")
    parser.add_argument("--steps", type=int, default=5, help="steps (the first, before any measurement, not counted)")
    parser.add_argument("--prompts", type=int, default=64, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=4096, help="response budget")
    parser.add_argument("--seed", type=int, default=0, help="length draws (the same for both placements)")
    parser.add_argument(
        "--migration-cost-s", type=float, default=2.0, help="the rebalance's expected seconds per move (re-prefill)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    runs = {name: run(args, name) for name in MODES}
    results = {name: times for name, (times, _) in runs.items()}
    after_first = {name: sum(t[1:]) / max(1, len(t) - 1) for name, t in results.items()}
    report = {
        "machine": platform.node(),
        "config": vars(args),
        "step_s": results,
        "mean_step_s_after_first": after_first,
        "vs_least_loaded": {name: t / after_first["least-loaded"] for name, t in after_first.items()},
        "slow_workers": {name: report for name, (_, report) in runs.items()},
    }
    if args.json:
        print(json.dumps(report))
        return 0
    for name, t in results.items():
        steps = " ".join(f"{x:7.1f}" for x in t)
        ratio = report["vs_least_loaded"][name]
        print(
            f"{name:>21}: steps {steps} s; mean after the first {after_first[name]:7.1f} s ({ratio:.3f} x least-loaded)"
        )
        print(f"{'':>21}  slow workers: {report['slow_workers'][name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
