"""Throughput of the math_verify reward (HF math-verify): rewards/s per core in-process and in the reward sandbox,
and whether scoring stalls the trainer's consumption of the trajectory stream.

    .venv/bin/python bench/reward_bench.py                      # 512 responses, sandbox pools of 1 and 2
    .venv/bin/python bench/reward_bench.py --samples 2048 --processes 1 2 4

Responses are math-style solutions (~300-1,500 characters of reasoning ending in \\boxed{}, '####' or plain
text; fractions, decimals, polynomials, sets; a third wrong). For each: rewards/s in-process on one core (the
per-core figure), rewards/s through RewardSandbox with N processes (the trainer's path), latency percentiles per
sample, and the event-loop lag of an asyncio loop that scores those batches through asyncio.to_thread as the
trainer does (its stream reader's view: a large lag would mean scoring stalls stream consumption), against the
same loop scoring in one of its own threads without the sandbox.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

_FILLER = (
    "First we rewrite the expression and collect the terms. Then we substitute the known values "
    "and simplify step by step, checking each intermediate result: {a} + {b} = {s}, and {a} x {b} = {p}. "
)
_ANSWERS = [  # (how the response writes it, the reference answer)
    ("\\boxed{\\frac{3}{4}}", "0.75"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("#### 42", "42"),
    ("the answer is $x^2+2x+1$", "(x+1)^2"),
    ("\\boxed{\\{1, 2, 3\\}}", "\\{3, 2, 1\\}"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("\\boxed{-7}", "-7"),
    ("so we get $\\frac{10}{4}$", "2.5"),
]


def items(n: int, seed: int = 0) -> list:
    from rlboost.tasks.base import Example

    rng = random.Random(seed)
    out = []
    for i in range(n):
        said, reference = _ANSWERS[i % len(_ANSWERS)]
        if i % 3 == 2:  # a wrong answer: the reference of another row
            reference = _ANSWERS[(i + 1) % len(_ANSWERS)][1]
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        text = _FILLER.format(a=a, b=b, s=a + b, p=a * b) * rng.randint(2, 10)
        out.append((f"{text}Therefore {said}.", Example(f"problem {i}", reference)))
    return out


def in_process(samples: list) -> dict:
    """One core, the reward called directly (the warm-up first, as the sandbox does at load)."""
    from rlboost.tasks.verifiers import math_verify

    math_verify.warm_up()
    latencies, passed = [], 0
    start = time.perf_counter()
    for text, ex in samples:
        t = time.perf_counter()
        passed += math_verify(text, ex) == 1.0
        latencies.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    return {"rewards_per_s": round(len(samples) / wall, 1), "passed": passed, **_percentiles(latencies)}


def _percentiles(latencies: list[float]) -> dict:
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"p50_ms": round(q[49] * 1e3, 2), "p99_ms": round(q[98] * 1e3, 2), "max_ms": round(max(latencies) * 1e3, 2)}


async def _score_with_ticker(sandbox, samples: list, batch: int) -> tuple[float, float, int]:
    """Score `samples` in batches through asyncio.to_thread while a ticker measures the loop's lag."""
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append(time.perf_counter() - t - 0.005)

    tick = asyncio.create_task(ticker())
    start, failures = time.perf_counter(), 0
    for i in range(0, len(samples), batch):
        results = await asyncio.to_thread(sandbox.score, samples[i : i + batch])
        failures += sum(r.failure is not None for r in results)
    wall = time.perf_counter() - start
    done.set()
    await tick
    return wall, max(lags, default=0.0), failures


class _InThread:
    """The reward called in the trainer's own process, in a worker thread (no sandbox): the GIL is shared."""

    def score(self, batch: list) -> list:
        from math_verify import parse, verify

        from rlboost.tasks.sandbox import RewardResult

        out = []
        for text, ex in batch:
            gold, answer = parse(f"${ex.answer}$", parsing_timeout=None), parse(text, parsing_timeout=None)
            out.append(RewardResult(float(bool(gold and answer and verify(gold, answer, timeout_seconds=None)))))
        return out


def in_thread(samples: list, batch: int) -> dict:
    """For comparison: what the trainer's event loop would see if math-verify ran in one of its threads. Its
    signal-based timeouts work only in a main thread (it refuses threads otherwise), so they are off here."""
    wall, lag, _ = asyncio.run(_score_with_ticker(_InThread(), samples, batch))
    return {"batch": batch, "rewards_per_s": round(len(samples) / wall, 1), "loop_max_lag_ms": round(lag * 1e3, 2)}


def in_sandbox(samples: list, processes: int, batch: int) -> dict:
    from rlboost.tasks.sandbox import RewardSandbox, SandboxLimits

    t = time.perf_counter()
    with RewardSandbox("math_verify", SandboxLimits(processes=processes)) as sandbox:
        start_s = time.perf_counter() - t
        wall, lag, failures = asyncio.run(_score_with_ticker(sandbox, samples, batch))
    return {
        "processes": processes,
        "batch": batch,
        "rewards_per_s": round(len(samples) / wall, 1),
        "start_s": round(start_s, 2),
        "loop_max_lag_ms": round(lag * 1e3, 2),
        "failures": failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--processes", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--batch", type=int, default=64, help="samples per sandbox call (what arrived together)")
    args = parser.parse_args()
    samples = items(args.samples)
    result = {
        "bench": "reward_math_verify",
        "samples": args.samples,
        "in_process": in_process(samples),
        "in_thread": in_thread(samples, args.batch),
        "sandbox": [in_sandbox(samples, p, args.batch) for p in args.processes],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
