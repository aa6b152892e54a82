"""Rollout-manager ingest benchmark: N simulated workers streaming token chunks into a real manager.

    .venv/bin/python bench/manager_bench.py [--workers 1000] [--seconds 20] [--json [OUT]] [--procs 1]

`--json OUT` writes the report (issue 16's interface: "workers", "tokens_per_s", "manager_cpu_us_per_token",
"assign_latency_p50_s", "assign_latency_p99_s", then the details) and prints the table; `--json` alone prints
the JSON instead of the table.

What runs (all on loopback, all real gRPC with the generated stubs):
- the manager: `python -m rollout_manager` as its own process (so it has its own core, as in production);
- one or two load-generator processes (`--procs`), each an asyncio loop holding one Connect stream
  (and, by default, one channel = one TCP connection) per simulated worker. A worker registers and
  accepts assignments up to its capacity; each request generates `--tokens-per-s`. It flushes as a real
  worker's chunker does: ONE ChunkBatch with every request's buffered tokens when the oldest is
  chunkMaxMs old, a request holds chunkMaxTokens (`--chunk-ms` / `--chunk-tokens`, or what the manager's
  ChunkCadence says under `--max-chunk-messages-per-s`), a request ends, or a Revoke aborts one ("abort"
  flush); it skips a heartbeat when a ChunkBatch left within the heartbeat period. A request ends after a
  length in [`--max-new-tokens`/4, `--max-new-tokens`];
- a trainer client in this process opens Rollout steps (each for 1/4 of all worker slots) whenever fewer
  requests than one step wait in the manager's queue (at most `--max-steps-in-flight` open), so work is
  always pending.

Figures, over a window of `--seconds` after `--warmup` seconds:
- ingest tokens/s: the manager's rlboost_manager_tokens_received_total (from its /metrics) over the window;
- the manager's message load: ChunkBatch and heartbeat messages per second the workers wrote, tokens per
  ChunkBatch, and the flush periods the manager told them;
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
    tokens_per_s: float  # each running request's generation rate (the engine's speed)
    max_new_tokens: int  # responses end at a length in [max/4, max] drawn from the request id
    shared_channels: int  # 0: one channel (TCP connection) per worker, like real pods
    heartbeat_skip: bool = True  # skip a heartbeat after a ChunkBatch within its period (False: a worker before it)


@dataclass
class LoadResult:
    """What one load-generator process measured (monotonic timestamps)."""

    refills: list[tuple[float, float]] = field(default_factory=list)  # (finish written at, latency s)
    sent: dict[int, int] = field(default_factory=dict)  # 100 ms bucket -> tokens written
    batches: dict[int, int] = field(default_factory=dict)  # 100 ms bucket -> ChunkBatch messages written
    beats: dict[int, int] = field(default_factory=dict)  # 100 ms bucket -> heartbeats written
    skipped_beats: int = 0  # heartbeats skipped because a ChunkBatch left within the period (as a real worker)
    cadences: dict[int, int] = field(default_factory=dict)  # chunk period (ms) the manager set -> workers told
    full_at: list[float] = field(default_factory=list)  # when each worker first reached capacity
    lag: list[tuple[float, float]] = field(default_factory=list)  # (tick at, seconds the loop was late), sampled
    assignments: int = 0
    revokes: int = 0
    errors: list[str] = field(default_factory=list)


def _bump(buckets: dict[int, int], at: float, n: int) -> None:
    bucket = int(at * 10)
    buckets[bucket] = buckets.get(bucket, 0) + n


_PACKED: dict[int, tuple[bytes, bytes]] = {}  # n -> (token ids, log-probs) packed, as chunk_to_pb(c, packed=True)


def _packed(n: int) -> tuple[bytes, bytes]:
    if n not in _PACKED:
        _PACKED[n] = (array("i", range(1000, 1000 + n)).tobytes(), array("f", [-0.5] * n).tobytes())
    return _PACKED[n]


class SimWorker:
    """One simulated rollout worker on one Connect stream, flushing exactly as a real worker's chunker does.

    Each running request generates `tokens_per_s`. The worker flushes ONE ChunkBatch with every request's
    buffered tokens when the oldest buffered token is `chunk_max_ms` old, a request holds `chunk_max_tokens`, a
    request finishes or a revoke aborts one; the bounds come from Registered and later ChunkCadence messages
    (the manager's load-adaptive cadence). A heartbeat is skipped when a ChunkBatch left within its period.
    """

    def __init__(self, wid: str, cfg: LoadConfig, channel, result: LoadResult) -> None:
        from rlboost.rollout.v1 import rollout_pb2 as pb
        from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc

        self.pb, self.wid, self.cfg, self.res = pb, wid, cfg, result
        self.stub = pb_grpc.RolloutManagerStub(channel)
        # request id -> [lease_epoch, offset sent, response length, start time, offset at start]
        self.running: dict[str, list] = {}
        self.finishes: deque[float] = deque()  # write times of finishing batches, one per freed slot
        self.aborts: list[str] = []
        self.full_seen = False
        self.wake = asyncio.Event()  # an assignment or a revoke arrived: recompute when to flush

    async def run(self, stop: asyncio.Event) -> None:
        pb = self.pb
        self.call = self.stub.Connect()
        reg = pb.Register(worker_id=self.wid, pool=pb.POOL_SPOT, node=f"node-{self.wid}", capacity=self.cfg.capacity)
        await self.call.write(pb.WorkerMessage(register=reg))
        first = await self.call.read()
        if first.WhichOneof("body") != "registered":
            raise RuntimeError(f"{self.wid}: expected registered, got {first}")
        r = first.registered
        self.packed = r.packed_tokens  # send tokens packed, like a real worker, if the manager reads them
        self.heartbeat_s = r.heartbeat_interval_ms / 1000
        self._set_bounds(r.chunk_max_tokens, r.chunk_max_ms)
        reader = asyncio.create_task(self._read())
        try:
            await self._generate(stop)
        finally:
            reader.cancel()
            self.call.cancel()

    def _set_bounds(self, max_tokens: int, max_ms: int) -> None:
        """The flush period: the age bound, or sooner when a request fills max_tokens at the engine's rate."""
        self.period = min(max_ms / 1000, max_tokens / self.cfg.tokens_per_s)
        self.res.cadences[max_ms] = self.res.cadences.get(max_ms, 0) + 1

    async def _read(self) -> None:
        eof = _EOF()
        while (msg := await self.call.read()) is not eof:
            now = time.monotonic()
            kind = msg.WhichOneof("body")
            if kind == "assign":
                for a in msg.assign.assignments:
                    length = _response_length(a.request_id, a.sampling.max_new_tokens)
                    offset = len(a.input_ids) - a.prompt_len
                    self.running[a.request_id] = [a.lease_epoch, offset, length, now, offset]
                    self.res.assignments += 1
                    if self.finishes:
                        self.res.refills.append((t0 := self.finishes.popleft(), now - t0))
                if not self.full_seen and len(self.running) >= self.cfg.capacity:
                    self.full_seen = True
                    self.res.full_at.append(now)
                self.wake.set()
            elif kind == "revoke":
                for rid in msg.revoke.request_ids:
                    if rid in self.running:
                        self.aborts.append(rid)
                        self.res.revokes += 1
                self.wake.set()
            elif kind == "chunk_cadence":
                self._set_bounds(msg.chunk_cadence.chunk_max_tokens, msg.chunk_cadence.chunk_max_ms)
                self.wake.set()
            elif kind not in ("drain", "set_weight_version", "registered"):
                self.res.errors.append(f"{self.wid}: unexpected {kind}")

    def _next_event(self, last_flush: float, next_beat: float) -> float:
        """When the next flush (age or size bound, or a request's end) or heartbeat is due."""
        if not self.running:
            return next_beat
        rate = self.cfg.tokens_per_s
        started = max(last_flush, min(st[3] for st in self.running.values()))  # the oldest buffered token's age
        ends = min(st[3] + (st[2] - st[4]) / rate for st in self.running.values())
        return min(started + self.period, ends, next_beat)

    async def _generate(self, stop: asyncio.Event) -> None:
        pb = self.pb
        last_flush = last_batch = time.monotonic()
        next_beat = last_flush + random.random() * self.heartbeat_s  # spread the workers over the period
        tick = 0
        while not stop.is_set():
            at = self._next_event(last_flush, next_beat)
            if self.aborts:
                at = time.monotonic()
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, at - time.monotonic())):
                    await self.wake.wait()
            if self.wake.is_set():
                continue  # an assignment, revoke or new cadence: recompute what is due
            now = time.monotonic()
            tick += 1
            if tick % 20 == 0:  # sampled: how far behind its schedule the load generator's loop runs
                self.res.lag.append((now, now - at))
            if now - at > 0.001:  # a late loop lowers the offered rate, never bursts: the engine "paused" meanwhile
                for st in self.running.values():
                    st[3] += now - at
            if now >= next_beat:
                next_beat = max(next_beat + self.heartbeat_s, now)
                if now - last_batch >= self.heartbeat_s or not self.cfg.heartbeat_skip:
                    hb = pb.Heartbeat(weight_version=0, running=len(self.running))
                    await self.call.write(pb.WorkerMessage(heartbeat=hb))
                    _bump(self.res.beats, now, 1)
                else:
                    self.res.skipped_beats += 1
            if self.running and (self.aborts or now >= self._next_event(last_flush, float("inf")) - 1e-4):
                chunks, n_tokens, n_done = self._chunks(pb, now)
                last_flush = now
                if chunks:
                    await self.call.write(pb.WorkerMessage(chunks=pb.ChunkBatch(chunks=chunks)))
                    last_batch = written = time.monotonic()
                    self.finishes.extend([written] * n_done)
                    _bump(self.res.sent, written, n_tokens)
                    _bump(self.res.batches, written, 1)

    def _chunks(self, pb, now: float) -> tuple[list, int, int]:
        """Every request's tokens generated by `now` (plus abort flushes); returns (chunks, tokens, finished)."""
        out, n_tokens, n_done = [], 0, 0
        for rid in self.aborts:
            st = self.running.pop(rid, None)
            if st is not None:
                out.append(pb.TokenChunk(request_id=rid, lease_epoch=st[0], offset=st[1], finish_reason="abort"))
        self.aborts.clear()
        rate = self.cfg.tokens_per_s
        for rid, st in list(self.running.items()):
            ended = now >= st[3] + (st[2] - st[4]) / rate - 1e-4  # as _next_event computes the end
            generated = st[2] if ended else min(st[2], st[4] + int((now - st[3]) * rate))
            n = generated - st[1]
            if n <= 0:
                continue
            done = generated >= st[2]
            chunk = pb.TokenChunk(
                request_id=rid,
                lease_epoch=st[0],
                offset=st[1],
                finished=done,
                finish_reason=("length" if st[2] >= self.cfg.max_new_tokens else "stop") if done else "",
            )
            ids, lps = _packed(n)
            if self.packed:
                chunk.token_ids_packed, chunk.logprobs_packed = ids, lps
            else:
                chunk.token_ids.extend(array("i", ids))
                chunk.logprobs.extend(array("f", lps))
            out.append(chunk)
            st[1] = generated
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
        + (
            f"  max_chunk_messages_per_s: {args.max_chunk_messages_per_s}\n"
            if args.max_chunk_messages_per_s is not None
            else ""
        )
    )  # the knob only when set: a baseline manager (--manager-tree) predates it
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
        if len(loads) % (5 if args.workers > 200 else 1) == 0:  # sparse at 1,000 workers: a GetStatus costs CPU
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
                target, args.capacity, args.tokens_per_s, args.max_new_tokens, args.shared_channels, args.heartbeat_skip
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
    batches = sum(n for r in results for b, n in r.batches.items() if t0 * 10 <= b < t1 * 10)
    beats = sum(n for r in results for b, n in r.beats.items() if t0 * 10 <= b < t1 * 10)
    cadences: dict[int, int] = {}
    for r in results:
        for ms, n in r.cadences.items():
            cadences[ms] = cadences.get(ms, 0) + n
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
            "tokens_per_s_per_request": args.tokens_per_s,
            "max_chunk_messages_per_s": args.max_chunk_messages_per_s,
            "heartbeat_skip": args.heartbeat_skip,
            "max_new_tokens": args.max_new_tokens,
            "loadgen_procs": args.procs,
            "offered_tokens_per_s": args.workers * args.capacity * args.tokens_per_s,
            "window_s": round(dur, 2),
        },
        "ingest_tokens_per_s": ingested / dur,
        "sent_tokens_per_s": sent / dur,
        # the manager's message load: ChunkBatch and heartbeat messages the workers wrote in the window
        "chunk_batches_per_s": batches / dur,
        "heartbeats_per_s": beats / dur,
        "tokens_per_chunk_batch": sent / batches if batches else None,
        "heartbeats_skipped": sum(r.skipped_beats for r in results),
        "chunk_max_ms_told": {str(ms): n for ms, n in sorted(cadences.items())},  # period -> times workers were told
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
        "pending_samples": m["pending"],
        "refills_over_100ms": sum(1 for lat in refills if lat > 0.1),
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
        f"{c['tokens_per_s_per_request']:.0f} tok/s per request; spec {c['chunk_tokens']} tok / {c['chunk_ms']} ms, "
        f"maxChunkMessagesPerS {c['max_chunk_messages_per_s'] if c['max_chunk_messages_per_s'] is not None else 'default'}",
    )
    per_msg = r["tokens_per_chunk_batch"]
    t.add_row(
        "ChunkBatch / heartbeat messages",
        f"{r['chunk_batches_per_s']:.0f} / {r['heartbeats_per_s']:.0f} per s",
        f"{per_msg:.0f} tok per ChunkBatch; periods told {r['chunk_max_ms_told']}" if per_msg else "",
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
    p.add_argument("--chunk-tokens", type=int, default=32, help="the spec's rollout.chunkMaxTokens")
    p.add_argument("--chunk-ms", type=int, default=50, help="the spec's rollout.chunkMaxMs")
    p.add_argument(
        "--tokens-per-s",
        type=float,
        default=0.0,
        help="each running request's generation rate (default: chunk-tokens per chunk-ms, one full chunk per period)",
    )
    p.add_argument(
        "--max-chunk-messages-per-s",
        type=int,
        default=None,
        help="the spec's rollout.maxChunkMessagesPerS (default: the spec's default; 0: the fixed cadence; a baseline "
        "manager ignores it)",
    )
    p.add_argument("--max-new-tokens", type=int, default=1024, help="response length of every request")
    p.add_argument("--procs", type=int, default=1, choices=(1, 2), help="load-generator processes")
    p.add_argument("--shared-channels", type=int, default=0, help="channels per loadgen process (0: one per worker)")
    p.add_argument("--max-steps-in-flight", type=int, default=64, help="most Rollout calls open at once")
    p.add_argument("--heartbeat-ms", type=int, default=500, help="worker heartbeat period")
    p.add_argument(
        "--heartbeat-skip",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="workers skip a heartbeat after a ChunkBatch within its period (--no-heartbeat-skip: as before)",
    )
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
    args.tokens_per_s = args.tokens_per_s or args.chunk_tokens * 1000 / max(1, args.chunk_ms)
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
