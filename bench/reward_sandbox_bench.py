"""Cost of scoring rewards in the sandbox (rlboost.tasks.sandbox) against calling the reward in-process.

    .venv/bin/python bench/reward_sandbox_bench.py                  # exact_match and math_answer, best of 5
    .venv/bin/python bench/reward_sandbox_bench.py --repeat 9 --processes 1 2

For each reward, batch size (1 = a trajectory arriving alone, up to a whole step's batch) and pool size: the
wall time per sample in-process and in the sandbox, and their difference (the overhead per sample). Also the
time to start the pool and to replace a process after a failed call. Responses are ~40-character answers
like the default task's. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def _items(n: int) -> list:
    from rlboost.tasks.base import Example

    texts = ["The answer is \\boxed{42}.", "42", "I think 41", "x = 3/4 so 0.75"]
    return [(texts[i % 4] * 2, Example(f"What is {i}+{i}?", str(2 * i))) for i in range(n)]


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench(reward: str, batches: list[int], processes: int, repeat: int) -> dict:
    from rlboost.reward_registry import load_registered
    from rlboost.tasks.sandbox import RewardSandbox, SandboxLimits

    fn = load_registered(reward)
    t = time.perf_counter()
    sandbox = RewardSandbox(reward, SandboxLimits(processes=processes))
    sandbox.start()
    start_s = time.perf_counter() - t
    rows = []
    try:
        for n in batches:
            items = _items(n)
            inproc = _best(lambda items=items: [fn(text, ex) for text, ex in items], repeat) / n
            boxed = _best(lambda items=items: sandbox.score(items), repeat) / n
            rows.append(
                {
                    "batch": n,
                    "in_process_us": round(inproc * 1e6, 2),
                    "sandbox_us": round(boxed * 1e6, 2),
                    "overhead_us": round((boxed - inproc) * 1e6, 2),
                }
            )
        t = time.perf_counter()
        sandbox._replacement().kill()  # what a failed call costs beyond the call: a fresh process
        replace_s = time.perf_counter() - t
    finally:
        sandbox.close()
    return {
        "reward": reward,
        "processes": processes,
        "start_s": round(start_s, 3),
        "replace_s": round(replace_s, 3),
        "network_isolated": sandbox.network_isolated,
        "per_sample": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rewards", nargs="+", default=["exact_match", "math_answer"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64, 256])
    parser.add_argument("--processes", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    results = [bench(r, args.batches, p, args.repeat) for r in args.rewards for p in args.processes]
    print(json.dumps({"bench": "reward_sandbox", "results": results}))


if __name__ == "__main__":
    main()
