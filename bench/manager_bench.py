"""Rollout-manager ingest benchmark: N simulated workers streaming token chunks into a real manager.

    .venv/bin/python bench/manager_bench.py [--workers 1000] [--seconds 20] [--json [OUT]] [--procs 1]

`--json OUT` writes the report (issue 16's interface: "workers", "tokens_per_s", "manager_cpu_us_per_token",
"assign_latency_p50_s", "assign_latency_p99_s", then the details) and prints the table; `--json` alone prints
the JSON instead of the table.

What runs (all on loopback, all real gRPC with the generated stubs):
- the manager: `python -m rollout_manager` as its own process (so it has its own core, as in production);
- one or two load-generator processes (`--procs`), each an asyncio loop holding one Connect stream
  (and, by default, one channel = one TCP connection) per simulated worker. A worker registers,
  accepts assignments up to its capacity, and every `--chunk-ms` sends ONE ChunkBatch with a
  `--chunk-tokens` chunk for each request it runs (the real worker's per-worker batching). A request
  ends after `--max-new-tokens`; a Revoke is answered with an "abort" flush, like a real worker;
- a trainer client in this process opens Rollout steps (each for 1/4 of all worker slots) whenever fewer
  requests than one step wait in the manager's queue (at most `--max-steps-in-flight` open), so work is
  always pending.

Figures, over a window of `--seconds` after `--warmup` seconds:
- ingest tokens/s: the manager's rlboost_manager_tokens_received_total (from its /metrics) over the window;
- assignment latency (refill): for every request a worker finishes, the time from writing the ChunkBatch
  that finishes it to receiving the Assignment that fills the freed slot (CLOCK_MONOTONIC is shared by
  processes). It spans loadgen send queue -> wire -> manager read, schedule, send -> wire -> loadgen
  read, i.e. how long a GPU slot sits idle while work is pending;
- the manager's own histogram (pending -> assignment decision); since the bench oversubscribes the
  workers on purpose, it mostly measures time spent queued behind busy workers, and is reported as such;
- CPU seconds of the manager process (utime + stime from /proc/<pid>/stat: its own CPU, whatever else runs on
  the machine) and the 1-minute load average during the run; CPU per ingested token is the headline figure.

The load generators share the machine with the manager, so on a small box the figures are a lower
bound on what the manager alone can do (the report says how busy the machine was).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
import zlib
from array import array
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

# ---- load generator (runs in its own process) ---------------------------------------------------


@dataclass
class LoadConfig:
    """What each simulated worker does; picklable so it crosses into the load-generator processes."""

    target: str
    capacity: int
    chunk_tokens: int
    chunk_ms: int
    max_new_tokens: int  # responses end at a length in [max/4, max] drawn from the request id
    heartbeat_ms: int
    shared_channels: int  # 0: one channel (TCP connection) per worker, like real pods


@dataclass
class LoadResult:
    """What one load-generator process measured (monotonic timestamps)."""

    refills: list[tuple[float, float]] = field(default_factory=list)  # (finish written at, latency s)
    sent: dict[int, int] = field(default_factory=dict)  # 100 ms bucket -> tokens written
    full_at: list[float] = field(default_factory=list)  # when each worker first reached capacity
    lag: list[tuple[float, float]] = field(default_factory=list)  # (tick at, seconds the loop was late), sampled
    assignments: int = 0
    revokes: int = 0
    errors: list[str] = field(default_factory=list)


class SimWorker:
    """One simulated rollout worker on one Connect stream."""

    def __init__(self, wid: str, cfg: LoadConfig, channel, result: LoadResult) -> None:
        from rlboost.rollout.v1 import rollout_pb2 as pb
        from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc

        self.pb, self.wid, self.cfg, self.res = pb, wid, cfg, result
        self.stub = pb_grpc.RolloutManagerStub(channel)
        self.running: dict[str, list[int]] = {}  # request id -> [lease_epoch, offset, response length]
        self.finishes: deque[float] = deque()  # write times of finishing batches, one per freed slot
        self.aborts: list[str] = []
        self.full_seen = False

    async def run(self, stop: asyncio.Event) -> None:
        pb = self.pb
        self.call = self.stub.Connect()
        reg = pb.Register(worker_id=self.wid, pool=pb.POOL_SPOT, node=f"node-{self.wid}", capacity=self.cfg.capacity)
        await self.call.write(pb.WorkerMessage(register=reg))
        first = await self.call.read()
        if first.WhichOneof("body") != "registered":
            raise RuntimeError(f"{self.wid}: expected registered, got {first}")
        self.packed = (
            first.registered.packed_tokens
        )  # send tokens packed, like a real worker, if the manager reads them
        reader = asyncio.create_task(self._read())
        try:
            await self._generate(stop)
        finally:
            reader.cancel()
            self.call.cancel()

    async def _read(self) -> None:
        eof = _EOF()
        while (msg := await self.call.read()) is not eof:
            now = time.monotonic()
            kind = msg.WhichOneof("body")
            if kind == "assign":
                for a in msg.assign.assignments:
                    length = _response_length(a.request_id, a.sampling.max_new_tokens)
                    self.running[a.request_id] = [a.lease_epoch, len(a.input_ids) - a.prompt_len, length]
                    self.res.assignments += 1
                    if self.finishes:
                        self.res.refills.append((t0 := self.finishes.popleft(), now - t0))
                if not self.full_seen and len(self.running) >= self.cfg.capacity:
                    self.full_seen = True
                    self.res.full_at.append(now)
            elif kind == "revoke":
                for rid in msg.revoke.request_ids:
                    if rid in self.running:
                        self.aborts.append(rid)
                        self.res.revokes += 1
            elif kind not in ("drain", "set_weight_version", "registered"):
                self.res.errors.append(f"{self.wid}: unexpected {kind}")

    async def _generate(self, stop: asyncio.Event) -> None:
        pb, cfg = self.pb, self.cfg
        period = cfg.chunk_ms / 1000
        tokens = list(range(1000, 1000 + cfg.chunk_tokens))
        logprobs = [-0.5] * cfg.chunk_tokens
        if self.packed:  # the same values, as the bytes a real worker's chunk_to_pb(c, packed=True) makes
            tokens = [array("i", tokens[:n]).tobytes() for n in range(cfg.chunk_tokens + 1)]
            logprobs = [array("f", logprobs[:n]).tobytes() for n in range(cfg.chunk_tokens + 1)]
        beat_every = max(1, cfg.heartbeat_ms // cfg.chunk_ms)
        next_at = time.monotonic() + random.random() * period  # spread the workers over the period
        tick = 0
        while not stop.is_set():
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            now = time.monotonic()
            if tick % 20 == 0:  # sampled: how far behind its schedule the load generator's loop runs
                self.res.lag.append((now, now - next_at))
            next_at = max(next_at + period, now)  # a late loop lowers the offered rate, never bursts
            tick += 1
            chunks, n_tokens, n_done = self._chunks(pb, tokens, logprobs)
            if chunks:
                await self.call.write(pb.WorkerMessage(chunks=pb.ChunkBatch(chunks=chunks)))
                written = time.monotonic()
                self.finishes.extend([written] * n_done)
                bucket = int(written * 10)
                self.res.sent[bucket] = self.res.sent.get(bucket, 0) + n_tokens
            if tick % beat_every == 0:
                hb = pb.Heartbeat(weight_version=0, running=len(self.running))
                await self.call.write(pb.WorkerMessage(heartbeat=hb))

    def _chunks(self, pb, tokens: list, logprobs: list) -> tuple[list, int, int]:
        """One chunk per running request (plus abort flushes); returns (chunks, tokens, requests finished)."""
        out, n_tokens, n_done = [], 0, 0
        for rid in self.aborts:
            st = self.running.pop(rid, None)
            if st is not None:
                out.append(pb.TokenChunk(request_id=rid, lease_epoch=st[0], offset=st[1], finish_reason="abort"))
        self.aborts.clear()
        for rid, st in list(self.running.items()):
            n = min(self.cfg.chunk_tokens, st[2] - st[1])
            done = st[1] + n >= st[2]
            chunk = pb.TokenChunk(
                request_id=rid,
                lease_epoch=st[0],
                offset=st[1],
                finished=done,
                finish_reason=("length" if st[2] >= self.cfg.max_new_tokens else "stop") if done else "",
            )
            if self.packed:  # prebuilt bytes per length
                chunk.token_ids_packed, chunk.logprobs_packed = tokens[n], logprobs[n]
            else:
                chunk.token_ids.extend(tokens[:n])
                chunk.logprobs.extend(logprobs[:n])
            out.append(chunk)
            st[1] += n
            n_tokens += n
            if done:
                del self.running[rid]
                n_done += 1
        return out, n_tokens, n_done


def _response_length(rid: str, max_new: int) -> int:
    """Responses end anywhere in [max_new/4, max_new] (as RL responses do), the same for a migrated request."""
    low = max(1, max_new // 4)
    return low + zlib.crc32(rid.encode()) % (max_new - low + 1)


def _EOF():  # noqa: N802 (grpc's sentinel, imported lazily)
    import grpc

    return grpc.aio.EOF


async def _loadgen(ids: list[str], cfg: LoadConfig, stop_evt) -> LoadResult:
    import grpc

    result = LoadResult()
    opts = [("grpc.use_local_subchannel_pool", 1)]  # a channel per worker really gets its own connection
    shared = [grpc.aio.insecure_channel(cfg.target, options=opts) for _ in range(cfg.shared_channels)]
    channels = shared or [grpc.aio.insecure_channel(cfg.target, options=opts) for _ in ids]
    stop = asyncio.Event()
    workers = [SimWorker(wid, cfg, channels[i % len(channels)], result) for i, wid in enumerate(ids)]
    tasks = [asyncio.create_task(w.run(stop)) for w in workers]
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, stop_evt.wait)
    stop.set()
    for t in asyncio.as_completed(tasks, timeout=30):
        try:
            await t
        except Exception as err:  # noqa: BLE001 (a broken stream is a result to report, not a crash)
            if not isinstance(err, asyncio.CancelledError) and len(result.errors) < 20:
                result.errors.append(f"{type(err).__name__}: {str(err)[:200]}")
    for ch in channels:
        await ch.close(grace=0)
    return result


def loadgen_main(ids: list[str], cfg: LoadConfig, stop_evt, result_q) -> None:
    """Entry point of a load-generator process."""
    result = asyncio.run(_loadgen(ids, cfg, stop_evt))
    result_q.put(result)


# ---- trainer client -------------------------------------------------------------------------------


@dataclass
class TrainerStats:
    trajectories: list[tuple[float, int]] = field(default_factory=list)  # (received at, response tokens)
    steps_done: int = 0


async def _trainer(
    target: str, per_step: int, slots: int, max_in_flight: int, max_new: int, stats: TrainerStats
) -> None:
    """Keep the manager's queue fed: open another Rollout step whenever fewer than `per_step` requests wait.

    What waits is known here without asking the manager (a GetStatus at 1,000 workers costs the manager more
    than the ingest it would measure): requests opened - trajectories received - worker slots. Steps are opened
    on that rather than on whole steps delivered, so a trainer stream that falls behind does not starve the workers.
    """
    import grpc

    from rlboost.rollout.v1 import rollout_pb2 as pb
    from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc

    prompts = [pb.Prompt(prompt_index=i, token_ids=[1, 2, 3, 4, 5, 6, 7, 8]) for i in range(per_step)]
    sampling = pb.SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=max_new, seed=1)
    async with grpc.aio.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)]) as ch:
        stub = pb_grpc.RolloutManagerStub(ch)

        async def one_step(step: int) -> None:
            req = pb.RolloutRequest(
                step=step, weight_version=0, group_size=1, prompts=prompts, sampling=sampling, packed_trajectories=True
            )  # packed, as the trainer's rollout client asks (an older manager sends them repeated)
            async for batch in stub.Rollout(req):
                now = time.monotonic()
                stats.trajectories.extend(
                    (now, len(t.response_ids) or len(t.response_ids_packed) // 4) for t in batch.trajectories
                )
            stats.steps_done += 1

        running: set[asyncio.Task] = set()
        initial_steps = 5  # steps are 1/4 of the slots: five fill them all and leave work pending
        for step in itertools.count():
            while len(running) >= max_in_flight:
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    t.result()
            running.add(asyncio.create_task(one_step(step)))
            if step < initial_steps:
                continue  # the first steps fill every slot at once (the initial-fill figure)
            opened = (step + 1) * per_step
            while opened - len(stats.trajectories) - slots >= per_step:
                await asyncio.sleep(0.05)  # waiting for trajectories that arrive on other tasks


# ---- manager process and its metrics ----------------------------------------------------------------


def _start_manager(port: int, metrics_port: int, args, tmp: Path) -> subprocess.Popen:
    cfg = tmp / "job.yaml"
    cfg.write_text(
        "rollout:\n"
        f"  heartbeat_interval_ms: {args.heartbeat_ms}\n"
        f"  lease_timeout_ms: {args.lease_timeout_ms}\n"
        f"  chunk_max_tokens: {args.chunk_tokens}\n"
        f"  chunk_max_ms: {args.chunk_ms}\n"
    )
    cmd = [sys.executable, "-m", "rollout_manager", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--metrics-port", str(metrics_port), "--nats-url", "", "--config", str(cfg), "--log-level", "WARNING"]
    env = dict(os.environ)
    if args.manager_tree:  # another checkout's manager (a baseline), against this checkout's load generator
        tree = Path(args.manager_tree).resolve()
        paths = [str(tree), str(tree / "services" / "rollout-manager"), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(paths)
    log = open(tmp / "manager.log", "w")  # noqa: SIM115 (the manager writes it until it exits)
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env)


def _scrape(metrics_port: int) -> dict[str, float]:
    """Sum of each sample name (labels folded) from the manager's /metrics; histogram buckets keyed by le."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + (f"|{s.labels['le']}" if "le" in s.labels else "")
            out[key] = out.get(key, 0.0) + s.value
    return out


def _proc_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds the process has used, from /proc/<pid>/stat (its threads included)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick  # utime, stime (fields 14 and 15 of proc(5))


def _hist_quantiles(before: dict[str, float], after: dict[str, float], name: str, qs: tuple[float, ...]) -> dict:
    """Quantiles of a Prometheus histogram over the window, linearly interpolated inside buckets."""
    prefix = f"{name}_bucket|"
    bounds = sorted((float(k[len(prefix) :]), after[k] - before.get(k, 0.0)) for k in after if k.startswith(prefix))
    total = bounds[-1][1] if bounds else 0.0
    out = {}
    for q in qs:
        if total <= 0:
            out[q] = None
            continue
        rank, lo, prev = q * total, 0.0, 0.0
        for le, cum in bounds:
            if cum >= rank:
                hi = le if le != float("inf") else lo
                out[q] = lo + (hi - lo) * ((rank - prev) / (cum - prev) if cum > prev else 1.0)
                break
            lo, prev = le, cum
    return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


# ---- orchestration --------------------------------------------------------------------------------------


async def _wait_registered(target: str, n: int, timeout: float) -> None:
    import grpc

    from rlboost.rollout.v1 import rollout_pb2 as pb
    from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc

    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(target) as ch:
        stub = pb_grpc.RolloutManagerStub(ch)
        while time.monotonic() < deadline:
            reply = await stub.GetStatus(pb.StatusRequest(), timeout=10)
            if len(reply.workers) >= n:
                return
            await asyncio.sleep(0.2)  # polling a remote process's status: nothing to await on
    raise TimeoutError(f"only some of {n} workers registered within {timeout:.0f}s")


async def _pending(target: str) -> int:
    """Requests waiting for a slot right now (the trainer must keep this above 0 for refills to be measured)."""
    import grpc

    from rlboost.rollout.v1 import rollout_pb2 as pb
    from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(target) as ch:
        return (await pb_grpc.RolloutManagerStub(ch).GetStatus(pb.StatusRequest(), timeout=10)).pending


async def _measure(args, target: str, metrics_port: int, manager_pid: int, stop_evt) -> dict:
    await _wait_registered(target, args.workers, timeout=60 + args.workers / 20)
    slots = args.workers * args.capacity
    stats = TrainerStats()
    t_rollout = time.monotonic()
    trainer = asyncio.create_task(
        _trainer(target, max(1, slots // 4), slots, args.max_steps_in_flight, args.max_new_tokens, stats)
    )
    await asyncio.sleep(args.warmup)  # let the first fill and the first finishes settle
    m0, cpu0, t0 = _scrape(metrics_port), _proc_cpu(manager_pid), time.monotonic()
    loads, pending = [os.getloadavg()[0]], []
    while time.monotonic() - t0 < args.seconds:
        await asyncio.sleep(min(1.0, args.seconds - (time.monotonic() - t0)))
        loads.append(os.getloadavg()[0])
        if len(loads) % 5 == 0:  # sparse: a GetStatus of 1,000 workers costs the manager CPU we are measuring
            pending.append(await _pending(target))
        if trainer.done():
            trainer.result()  # surface the trainer's failure
    m1, cpu1, t1 = _scrape(metrics_port), _proc_cpu(manager_pid), time.monotonic()
    trainer.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await trainer
    stop_evt.set()
    return {
        "t_rollout": t_rollout,
        "t0": t0,
        "t1": t1,
        "m0": m0,
        "m1": m1,
        "cpu": sum(cpu1) - sum(cpu0),
        "cpu_system": cpu1[1] - cpu0[1],
        "loads": loads,
        "pending": pending,
        "stats": stats,
    }


def run(args) -> dict:
    """Run the whole benchmark; returns the report as a dict."""
    from rlboost.nats_server import free_port, wait_for_port

    port, metrics_port = free_port(), free_port()
    target = f"127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="mgrbench-") as tmpdir:
        manager = _start_manager(port, metrics_port, args, Path(tmpdir))
        ctx = mp.get_context("spawn")
        stop_evt, result_q = ctx.Event(), ctx.Queue()
        procs = []
        try:
            wait_for_port("127.0.0.1", port, 30, manager)
            wait_for_port("127.0.0.1", metrics_port, 10, manager)
            cfg = LoadConfig(
                target,
                args.capacity,
                args.chunk_tokens,
                args.chunk_ms,
                args.max_new_tokens,
                args.heartbeat_ms,
                args.shared_channels,
            )
            ids = [f"w{i:05d}" for i in range(args.workers)]
            for p in range(args.procs):
                part = ids[p :: args.procs]
                procs.append(ctx.Process(target=loadgen_main, args=(part, cfg, stop_evt, result_q)))
                procs[-1].start()
            m = asyncio.run(_measure(args, target, metrics_port, manager.pid, stop_evt))
            results = [result_q.get(timeout=120) for _ in procs]
        finally:
            stop_evt.set()
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
            manager.terminate()
            try:
                manager.wait(timeout=20)
            except subprocess.TimeoutExpired:
                manager.kill()
            log_tail = (Path(tmpdir) / "manager.log").read_text()[-2000:]
    return _report(args, m, results, log_tail)


def _report(args, m: dict, results: list[LoadResult], manager_log: str) -> dict:
    t0, t1 = m["t0"], m["t1"]
    dur = t1 - t0
    m0, m1 = m["m0"], m["m1"]
    ingested = m1.get("rlboost_manager_tokens_received_total", 0) - m0.get("rlboost_manager_tokens_received_total", 0)
    refills = [lat for r in results for (ts, lat) in r.refills if t0 <= ts < t1]
    sent = sum(n for r in results for b, n in r.sent.items() if t0 * 10 <= b < t1 * 10)
    trajs = [n for (ts, n) in m["stats"].trajectories if t0 <= ts < t1]
    full = [ts for r in results for ts in r.full_at]
    hist = _hist_quantiles(m0, m1, "rlboost_manager_assignment_latency_seconds", (0.5, 0.99))
    assigned = m1.get("rlboost_manager_assignments_total", 0) - m0.get("rlboost_manager_assignments_total", 0)
    return {
        # the interface other tools read (issue 16): assignment latency = slot refill, seen by the workers
        "workers": args.workers,
        "tokens_per_s": ingested / dur,
        "manager_cpu_us_per_token": m["cpu"] / ingested * 1e6 if ingested else None,
        "assign_latency_p50_s": _pct(refills, 0.5),
        "assign_latency_p99_s": _pct(refills, 0.99),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        },
        "config": {
            "workers": args.workers,
            "capacity": args.capacity,
            "chunk_tokens": args.chunk_tokens,
            "chunk_ms": args.chunk_ms,
            "max_new_tokens": args.max_new_tokens,
            "loadgen_procs": args.procs,
            "offered_tokens_per_s": args.workers * args.capacity * args.chunk_tokens * 1000 / args.chunk_ms,
            "window_s": round(dur, 2),
        },
        "ingest_tokens_per_s": ingested / dur,
        "sent_tokens_per_s": sent / dur,
        "trajectories_per_s": len(trajs) / dur,
        "manager_finished_per_s": (
            m1.get("rlboost_manager_trajectories_total", 0) - m0.get("rlboost_manager_trajectories_total", 0)
        )
        / dur,
        "trajectory_tokens_per_s": sum(trajs) / dur,
        "trajectories_total": len(m["stats"].trajectories),
        "steps_delivered": m["stats"].steps_done,
        "assignments_in_window": int(assigned),
        "refill_latency_ms": {
            "count": len(refills),
            "p50": _ms(_pct(refills, 0.5)),
            "p99": _ms(_pct(refills, 0.99)),
            "max": _ms(max(refills) if refills else None),
        },
        "manager_histogram_ms": {"p50": _ms(hist.get(0.5)), "p99": _ms(hist.get(0.99))},
        "pending_min": min(m["pending"]) if m["pending"] else None,
        "loadgen_lag_ms": {
            "p50": _ms(_pct(lags := [lag for r in results for (ts, lag) in r.lag if t0 <= ts < t1], 0.5)),
            "p99": _ms(_pct(lags, 0.99)),
        },
        "initial_fill_s": (max(full) - m["t_rollout"]) if len(full) == args.workers else None,
        "manager_cpu_s": m["cpu"],
        "manager_cpu_util": m["cpu"] / dur,
        "manager_cpu_system_s": m["cpu_system"],
        "loadavg_1m": {"start": m["loads"][0], "max": max(m["loads"]), "end": m["loads"][-1]},
        "revokes": m1.get("rlboost_manager_revokes_total", 0) - m0.get("rlboost_manager_revokes_total", 0),
        "lease_expiries": m1.get("rlboost_manager_lease_expiries_total", 0),
        "stale_chunks": m1.get("rlboost_manager_stale_chunks_total", 0),
        "errors": [e for r in results for e in r.errors][:10],
        "manager_log_tail": manager_log.strip().splitlines()[-5:],
    }


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 2)


def _print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    c = r["config"]
    t = Table(title=f"rollout-manager ingest: {c['workers']} workers x {c['capacity']} slots, {c['window_s']} s window")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("note")
    rl, h, la = r["refill_latency_ms"], r["manager_histogram_ms"], r["loadavg_1m"]
    t.add_row("ingest (manager counter)", f"{r['ingest_tokens_per_s'] / 1e6:.3f} M tok/s", "")
    per_token = r["manager_cpu_us_per_token"]
    t.add_row(
        "manager CPU per token", f"{per_token:.3f} us" if per_token else "-", "goal <= 0.5 us (2 M tok/s per core)"
    )
    t.add_row(
        "offered / written by loadgen",
        f"{c['offered_tokens_per_s'] / 1e6:.2f} / {r['sent_tokens_per_s'] / 1e6:.3f} M tok/s",
        f"{c['chunk_tokens']} tok chunks every {c['chunk_ms']} ms, batched per worker",
    )
    t.add_row(
        "trajectories to trainer",
        f"{r['trajectories_per_s']:.0f} /s",
        f"{r['trajectory_tokens_per_s'] / 1e6:.3f} M tok/s; manager finished {r['manager_finished_per_s']:.0f} /s",
    )
    t.add_row(
        "assignment latency p50 / p99",
        f"{rl['p50']} / {rl['p99']} ms",
        f"slot refill, n={rl['count']}; goal p99 <= 50 ms",
    )
    t.add_row("manager histogram p50 / p99", f"{h['p50']} / {h['p99']} ms", "pending -> assign, incl. queueing")
    lag = r["loadgen_lag_ms"]
    t.add_row("pending requests (min)", f"{r['pending_min']}", "> 0: workers never starved for work")
    t.add_row("loadgen loop lag p50 / p99", f"{lag['p50']} / {lag['p99']} ms", "large: the load generator is the bound")
    t.add_row(
        "initial fill",
        f"{r['initial_fill_s']:.2f} s" if r["initial_fill_s"] else "-",
        "Rollout call -> every slot busy",
    )
    t.add_row(
        "manager CPU",
        f"{r['manager_cpu_s']:.1f} s",
        f"{r['manager_cpu_util'] * 100:.0f}% of one core, {r['manager_cpu_system_s']:.1f} s in the kernel",
    )
    t.add_row(
        "load average (1 min)",
        f"{la['start']:.2f} -> {la['max']:.2f}",
        f"{r['machine']['cpus']} cores, shared with the loadgen",
    )
    t.add_row(
        "revokes / lease expiries / stale",
        f"{r['revokes']:.0f} / {r['lease_expiries']:.0f} / {r['stale_chunks']:.0f}",
        "",
    )
    Console().print(t)
    if r["errors"]:
        Console().print("[red]load-generator errors:[/red]", *r["errors"], sep="\n  ")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Benchmark the rollout-manager's token ingest and assignment latency.")
    p.add_argument("--workers", type=int, default=1000, help="simulated workers (one Connect stream each)")
    p.add_argument("--seconds", type=float, default=20.0, help="measurement window")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds after the first Rollout before measuring")
    p.add_argument("--capacity", type=int, default=4, help="concurrent requests per worker")
    p.add_argument("--chunk-tokens", type=int, default=32, help="tokens per request per chunk")
    p.add_argument("--chunk-ms", type=int, default=50, help="each worker sends one ChunkBatch this often")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="response length of every request")
    p.add_argument("--procs", type=int, default=1, choices=(1, 2), help="load-generator processes")
    p.add_argument("--shared-channels", type=int, default=0, help="channels per loadgen process (0: one per worker)")
    p.add_argument("--max-steps-in-flight", type=int, default=64, help="most Rollout calls open at once")
    p.add_argument("--heartbeat-ms", type=int, default=500, help="worker heartbeat period")
    p.add_argument("--lease-timeout-ms", type=int, default=10000, help="manager lease timeout")
    p.add_argument(
        "--manager-tree",
        default="",
        help="run the manager from this checkout (e.g. a baseline commit's `git archive`); default: this one",
    )
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="OUT",
        help="write one JSON object to OUT (no OUT or '-': print it) instead of printing a table",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("workers", "capacity", "chunk_tokens", "chunk_ms", "max_new_tokens"):
        if getattr(args, name) <= 0:
            print(f"manager_bench: --{name.replace('_', '-')} must be > 0", file=sys.stderr)
            return 2
    report = run(args)
    if args.json == "-":
        print(json.dumps(report, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        _print_table(report)
    else:
        _print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
