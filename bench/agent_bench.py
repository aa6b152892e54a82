"""Agentic episodes: turn-level scheduling against holding an engine slot for a whole episode (issue 33).

    python bench/agent_bench.py                          # the default scenario, both policies, a table
    python bench/agent_bench.py --tool-median 2 --tool-sigma 1.0 --turns 6 --json agent.json

The rollout-manager's real state machine (rollout_manager.state.ManagerState: episodes, turns as requests,
placement, its idle slot-second counter) is driven in virtual time by modelled workers and env-runners:

* workers: `--workers` x `--slots` engine slots; a turn of `--turn-tokens` tokens takes turn_tokens /
  `--tokens-per-s` seconds on a slot (no batching slowdown: the bound is slots, as with a saturated engine);
* env-runners: an episode's reset and each of its `--turns` tool steps take a latency drawn from a log-normal
  distribution (`--tool-median` seconds, `--tool-sigma`), seeded;
* **turn-level** (rlboost): the env-runners drive `--concurrency` x slots episodes at once; an episode holds a slot
  only while a turn generates, so other episodes' turns use it while its tool runs;
* **episode-held** (an agent loop that keeps its sequence slot, or a rollout with as many episodes in flight as
  slots): the env-runners drive exactly `slots` episodes at once, so every episode owns a slot, idle while its
  tools run.

Printed per policy: episodes per second (of virtual time), slot utilisation (generating slot-seconds / slot-seconds),
and the manager's `idle_slot_seconds_in_tools` (free slots while episodes were in their tools and no turn was
pending), per episode. Deterministic for a seed; it measures the policy, not this machine's speed (the wall time it
took is printed too).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import platform
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "services" / "rollout-manager")]

from rlboost.wire.episode_io import EpisodeResult, RunnerRegistration, TurnRequest  # noqa: E402
from rlboost.wire.rollout_io import (  # noqa: E402
    EpisodeSettings,
    Pool,
    PromptItem,
    RolloutRequest,
    SamplingParams,
    TokenChunk,
    WorkerRegistration,
)
from rollout_manager.state import ManagerState  # noqa: E402


@dataclass(frozen=True)
class Scenario:
    episodes: int = 512
    turns: int = 4
    turn_tokens: int = 256
    tokens_per_s: float = 64.0  # per slot
    workers: int = 4
    slots: int = 8  # per worker
    tool_median: float = 1.0
    tool_sigma: float = 0.8
    concurrency: float = 4.0  # turn-level: episodes in flight per slot
    seed: int = 0


class Run:
    """One policy's run of a scenario: the manager's state in virtual time."""

    def __init__(self, sc: Scenario, in_flight: int) -> None:
        self.sc = sc
        self.rng = random.Random(sc.seed)
        self.st = ManagerState(lease_timeout_s=1e9)
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = 0
        self.now = 0.0
        self.turns_left: dict[str, int] = {}
        self.lease: dict[str, int] = {}
        self.busy_slot_s = 0.0
        self.done = 0
        for w in range(sc.workers):
            self.st.register(WorkerRegistration(f"w{w}", Pool.SPOT, f"n{w}", sc.slots, 0), 0.0)
        self.st.register_runner(RunnerRegistration("env", "cpu", in_flight), 0.0)

    def push(self, delay: float, kind: str, data: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (self.now + delay, self.seq, kind, data))

    def tool_latency(self) -> float:
        return self.sc.tool_median * math.exp(self.rng.gauss(0.0, self.sc.tool_sigma))

    def run(self) -> dict[str, float]:
        sc = self.sc
        sampling = SamplingParams(temperature=0.0, max_new_tokens=sc.turn_tokens, seed=sc.seed)
        tasks = [PromptItem(i, [], "{}") for i in range(sc.episodes)]
        request = RolloutRequest(
            0, 0, tasks, 1, sampling, episodes=EpisodeSettings(sc.turns, (sc.turns + 1) * sc.turn_tokens)
        )
        self.st.add_step(request, 0.0)
        self.flush()
        while self.events:
            self.now, _, kind, data = heapq.heappop(self.events)
            getattr(self, f"on_{kind}")(data)
            self.st.tick(self.now)
            self.flush()
        status = self.st.status(self.now)
        slots = sc.workers * sc.slots
        return {
            "episodes_per_s": self.done / self.now,
            "slot_utilisation": self.busy_slot_s / (slots * self.now),
            "idle_slot_s_per_episode": status.episodes.idle_slot_seconds_in_tools / self.done,
            "makespan_s": self.now,
        }

    def flush(self) -> None:
        """The manager's commands: assignments to workers (a turn generates) and to the env-runner."""
        self.st.schedule(self.now)
        for wid, box in self.st.take_outbox().items():
            for a in box.assign:
                seconds = self.sc.turn_tokens / self.sc.tokens_per_s
                self.busy_slot_s += seconds
                self.push(seconds, "turn_end", (wid, a))
        box = self.st.take_runner_outboxes(self.now).get("env")
        if box is None:
            return
        for a in box.assign:
            self.turns_left[a.episode_id], self.lease[a.episode_id] = self.sc.turns, a.lease_epoch
            self.push(self.tool_latency(), "tool_end", (a.episode_id, 0))
        for t in box.turns:
            self.turns_left[t.episode_id] -= 1
            self.push(self.tool_latency(), "tool_end", (t.episode_id, t.turn + 1))

    def on_turn_end(self, data) -> None:
        wid, a = data
        ids = [1] * self.sc.turn_tokens
        chunk = TokenChunk(a.request_id, a.lease_epoch, 0, ids, [-0.1] * len(ids), True, "length")
        self.st.on_chunks(wid, [chunk], self.now)

    def on_tool_end(self, data) -> None:
        eid, turn = data
        lease = self.lease[eid]
        if self.turns_left[eid] == 0:
            result = EpisodeResult(eid, lease, [1], [], [], b"", "stop", self.sc.turns, reward=1.0)
            self.st.on_episode_result("env", result, self.now)
            self.done += 1
            return
        self.st.on_turn("env", TurnRequest(eid, lease, turn, [1] * (turn + 1), self.sc.turn_tokens), self.now)


def bench(sc: Scenario) -> dict:
    slots = sc.workers * sc.slots
    out = {}
    for name, in_flight in (("turn-level", int(slots * sc.concurrency)), ("episode-held", slots)):
        start = time.perf_counter()
        out[name] = Run(sc, in_flight).run()
        out[name]["wall_s"] = time.perf_counter() - start
    out["speedup"] = out["turn-level"]["episodes_per_s"] / out["episode-held"]["episodes_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field, value in Scenario().__dict__.items():
        p.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    p.add_argument("--json", type=Path, help="write the figures here too")
    args = p.parse_args(argv)
    sc = Scenario(**{k: getattr(args, k) for k in Scenario().__dict__})
    result = {"scenario": sc.__dict__, "results": bench(sc)}
    result["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(), "load1": os.getloadavg()[0]}
    print(f"scenario: {sc}")
    print(f"{'policy':<14}{'episodes/s':>12}{'slot util':>11}{'idle slot-s/episode':>21}{'makespan s':>12}")
    for name in ("turn-level", "episode-held"):
        r = result["results"][name]
        print(
            f"{name:<14}{r['episodes_per_s']:>12.3f}{r['slot_utilisation']:>11.2%}"
            f"{r['idle_slot_s_per_episode']:>21.2f}{r['makespan_s']:>12.1f}"
        )
    print(f"turn-level / episode-held episodes/s: {result['results']['speedup']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
