"""The trainer's publish per step, on its own: the real WeightPublisher against a real weight-server process.

    .venv/bin/python bench/publish_bench.py                      # the default job's model, lr-2e-3-like updates
    .venv/bin/python bench/publish_bench.py --update sparse      # Adam-sized updates: deltas are sent
    .venv/bin/python bench/publish_bench.py --steps 60 --json publish.json

The state is the default job's tiny model (`rlboost local`'s, from the model cache: 369,920 bf16 elements, 739 KB)
as fp32 master weights. Each step moves them (`dense`: by 1e-2 x N(0,1), so nearly every bf16 element changes, as
the default job's lr 2e-3 does; `sparse`: by 3e-5 x N(0,1), a few percent change) and publishes the next version
as the trainer does (`WeightVersions.publish_next`: `publish(v, state, skip_if_present=True)`, delta mode, a
snapshot every `weightSync.fullEvery` = 10 versions, unsigned, no overlap) to `python -m weight_server --no-nats`
on loopback. Printed, medians over the steps after the first two: publish ms, wall and CPU of this process (cast,
checksum, delta or snapshot, upload), the publisher's own `encode_seconds`; and per piece, its calls and its ms per
step: the weight-server's version listings (after the start's), the delta encodes (`trainer.publisher.encode_delta`)
and the changed-element counts before them (`trainer.publisher.delta_exceeds`, where the publisher has it).

It imports the trainer from PYTHONPATH (falling back to this checkout), so the same file times another checkout's
publisher: `PYTHONPATH=<checkout paths> python bench/publish_bench.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "services" / "trainer", ROOT / "services" / "weight-server"):
    sys.path.append(str(extra))  # after PYTHONPATH: another checkout's code wins

TOKEN = "bench-token"
SCALES = {"dense": 1e-2, "sparse": 3e-5}


def model_state() -> dict[str, Any]:
    """The default job's model as fp32 master weights (the trainer's)."""
    import torch
    from safetensors.torch import load_file

    from rlboost.models import ensure_model
    from rlboost.spec import JobSpec

    spec = JobSpec()
    out = ensure_model(spec.model, spec.task, Path(tempfile.gettempdir()) / "rlboost-trl-compare" / "model")
    state: dict[str, torch.Tensor] = {}
    for path in sorted(Path(out).glob("*.safetensors")):
        state.update({k: v.float() for k, v in load_file(path).items()})
    return state


def spawn_server(data: Path) -> tuple[subprocess.Popen, str]:
    from rlboost.nats_server import free_port, wait_for_port

    port = free_port()
    path = os.environ.get("PYTHONPATH") or f"{ROOT}:{ROOT / 'services' / 'weight-server'}"
    env = {**os.environ, "RLBOOST_TOKEN": TOKEN, "PYTHONPATH": path}
    argv = [sys.executable, "-m", "weight_server", "--port", str(port), "--data-dir", str(data), "--no-nats"]
    proc = subprocess.Popen([*argv, "--log-level", "WARNING"], env=env)
    wait_for_port("127.0.0.1", port, 60, proc)
    return proc, f"http://127.0.0.1:{port}"


class Counted:
    """The weight client's version listings, the publisher's delta encodes and its changed-element counts (where it
    has them), each counted and timed."""

    def __init__(self, client: Any) -> None:
        import trainer.publisher as publisher

        self.ms: dict[str, list[float]] = {"listing": [], "encode": [], "count": []}
        client.versions = self._timed_async("listing", client.versions)
        publisher.encode_delta = self._timed("encode", publisher.encode_delta)
        if hasattr(publisher, "delta_exceeds"):
            publisher.delta_exceeds = self._timed("count", publisher.delta_exceeds)

    def _timed(self, what: str, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.ms[what].append((time.perf_counter() - t0) * 1000)

        return call

    def _timed_async(self, what: str, fn: Any) -> Any:
        async def call(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*args)
            finally:
                self.ms[what].append((time.perf_counter() - t0) * 1000)

        return call

    def figures(self, steps: int) -> dict:
        """Per piece: calls, and ms per step (their sum over the run / steps; the first listing is the start's)."""
        out: dict = {}
        for what, ms in self.ms.items():
            out[f"{what}_calls"] = len(ms)
            out[f"{what}_ms_per_step"] = round(sum(ms[1:] if what == "listing" else ms) / steps, 3)
        return out


async def run(args: argparse.Namespace) -> dict:
    import torch

    import rlboost.delta
    from rlboost.weights.client import WeightClient
    from trainer.publisher import WeightPublisher

    rlboost.delta.warm_up()  # the kernels compiled (or loaded), as the trainer's start-up does, before any timing
    state, scale = model_state(), SCALES[args.update]
    g = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="publish-bench-") as tmp:
        proc, url = spawn_server(Path(tmp) / "data")
        try:
            async with WeightClient(url, token=TOKEN) as client:
                counted = Counted(client)
                pub = WeightPublisher(client, mode="delta", full_every=10)
                await pub.held_versions()  # the trainer's start (WeightVersions.publish_start)
                rows = []
                for v in range(args.steps):
                    t0, c0 = time.perf_counter(), time.process_time()
                    out = await pub.publish(v, state, skip_if_present=True)
                    cpu = (time.process_time() - c0) * 1000
                    rows.append(((time.perf_counter() - t0) * 1000, out.encode_seconds * 1000, out.kind, cpu))
                    state = {k: t + torch.randn(t.shape, generator=g) * scale for k, t in state.items()}
        finally:
            proc.terminate()
            proc.wait(10)
    timed = rows[2:]
    return {
        "update": args.update,
        "steps": args.steps,
        "publish_ms_median": round(statistics.median(r[0] for r in timed), 2),
        "publish_ms_mean": round(statistics.mean(r[0] for r in timed), 2),
        "publish_cpu_ms_median": round(statistics.median(r[3] for r in timed), 2),
        "encode_seconds_ms_median": round(statistics.median(r[1] for r in timed), 2),
        "kinds": {k: sum(r[2] == k for r in rows) for k in ("full", "delta")},
        "deltas_not_encoded": getattr(pub, "deltas_not_encoded", None),
        **counted.figures(args.steps),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/publish_bench.py", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="versions published (the first two are not timed)")
    p.add_argument("--update", choices=sorted(SCALES), default="dense", help="how much each step moves the weights")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = p.parse_args(argv)
    if args.steps < 3:
        p.error("--steps must be at least 3 (the first two are not timed)")
    load = os.getloadavg()[0]
    result = asyncio.run(run(args))
    result["load_1min_before_after"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
