"""One registered stream to the rollout-manager: what goes out on it, and the requests running on it.

The outbox has one writer task (grpc.aio allows one write at a time). The flusher sends the chunker's due chunks
as ChunkBatch messages, bounded per request by `chunk_max_tokens` and `chunk_max_ms` (from Registered, later
from ChunkCadence). A heartbeat goes every `heartbeat_interval_ms` unless a ChunkBatch left within that period
(the manager counts any message as a sign of life). A link lives as long as its stream: a reconnect makes a new
one; the session (session.py) runs the requests and keeps their tasks here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc

from rlboost.observability import monotonic_ms
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.spec import RolloutSpec
from rlboost.wire.rollout_io import TokenChunk
from rlboost.wire.rollout_proto import chunk_to_pb
from rollout_worker import metrics
from rollout_worker.chunker import Chunker
from rollout_worker.engine.base import Engine
from rollout_worker.errors import describe

log = logging.getLogger(__name__)

CLOSE = object()  # outbox sentinel: half-close the stream
STOP_WAIT_S = 5.0  # how long the link's tasks may take to stop once cancelled
CUT_AFTER_CLOSE_S = 3.0  # the manager ends its side when we half-close; if it does not within this, cut the stream
SPEC_DEFAULTS = RolloutSpec()  # a Registered timing left at 0 (unset) means the job spec's default


class ManagerLink:
    """The outbox, chunker, heartbeats and request tasks of one connected stream."""

    def __init__(
        self,
        call: grpc.aio.StreamStreamCall,
        registered: pb.Registered,
        engine: Engine,
        tokens_total: Callable[[], int],
    ) -> None:
        """`tokens_total()`: the tokens the worker generated so far (heartbeats export the rate)."""
        self.call, self.registered, self.engine, self.tokens_total = call, registered, engine, tokens_total
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.chunker = Chunker(
            max(1, registered.chunk_max_tokens or SPEC_DEFAULTS.chunk_max_tokens),
            max(1, registered.chunk_max_ms or SPEC_DEFAULTS.chunk_max_ms),
        )
        self.flush = asyncio.Event()
        self.tasks: dict[str, asyncio.Task] = {}  # request id -> its task (the session's requests)
        self.drained = False  # this stream was drained: flushed and half-closed
        self.lost = False  # this stream broke: requests that stop now are paused and kept (held.py)
        self.chunks_sent_at = float("-inf")  # monotonic time of the last ChunkBatch: heartbeats skip while they flow
        self._loops: list[asyncio.Task] = []

    def start(self) -> None:
        """Start writing, flushing and heartbeating."""
        self._loops = [asyncio.create_task(loop()) for loop in (self._writer, self._flusher, self._heartbeat)]

    async def stop(self) -> None:
        """Stop the link's tasks (bounded: never stay off the manager) and cancel the stream."""
        for t in self._loops:
            t.cancel()
        _, stuck = await asyncio.wait(self._loops, timeout=STOP_WAIT_S)
        if stuck:
            log.error("stream tasks did not stop when cancelled", extra={"tasks": len(stuck)})
        self.call.cancel()

    def send(self, msg: pb.WorkerMessage) -> None:
        self.outbox.put_nowait(msg)

    def close(self) -> None:
        """Half-close the stream once the outbox is written; cut it if the manager does not end its side."""
        self.outbox.put_nowait(CLOSE)
        asyncio.get_running_loop().call_later(CUT_AFTER_CLOSE_S, self.call.cancel)

    def set_cadence(self, cadence: pb.ChunkCadence) -> None:
        """The manager's load-adaptive cadence: flush by these bounds from now on (0 = keep the current one)."""
        chunker = self.chunker
        chunker.set_bounds(cadence.chunk_max_tokens or chunker.max_tokens, cadence.chunk_max_ms or chunker.max_ms)
        self.flush.set()  # the flusher waits on the old deadline: recompute it
        log.info("chunk cadence", extra={"chunk_max_tokens": chunker.max_tokens, "chunk_max_ms": chunker.max_ms})

    def send_due(self, flush_all: bool) -> None:
        chunks: list[TokenChunk] = self.chunker.due(monotonic_ms(), flush_all=flush_all)
        if chunks:
            packed = self.registered.packed_tokens  # the manager reads packed tokens (one bytes copy per chunk)
            batch = pb.ChunkBatch(chunks=[chunk_to_pb(c, packed) for c in chunks])
            self.send(pb.WorkerMessage(chunks=batch))
            self.chunks_sent_at = time.monotonic()
            metrics.CHUNKS.inc(len(chunks))
            metrics.BATCHES.inc()

    def send_heartbeat(self) -> None:
        """Version, load and whether the engine's memory is released: the manager assigns a released worker nothing."""
        e = self.engine
        beat = pb.Heartbeat(weight_version=e.weight_version, running=e.running, memory_released=e.memory_released)
        self.send(pb.WorkerMessage(heartbeat=beat))

    async def _writer(self) -> None:
        """The only writer of the stream."""
        while True:
            msg = await self.outbox.get()
            try:
                if msg is CLOSE:
                    await self.call.done_writing()
                    return
                await self.call.write(msg)
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as err:
                log.warning("write to the manager failed", extra={"error": describe(err)})
                return

    async def _flusher(self) -> None:
        while True:
            deadline = self.chunker.next_deadline()
            timeout = None if deadline is None else max(0, deadline - monotonic_ms()) / 1000
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the result when a cancel races the
            # event's wakeup, swallowing the cancel, and this loop then outlived its broken stream (the worker
            # never reconnected to a restarted manager: seen in the all-services chaos run)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.flush.wait()
            self.flush.clear()
            self.send_due(flush_all=False)

    async def _heartbeat(self) -> None:
        period = max(0.01, (self.registered.heartbeat_interval_ms or SPEC_DEFAULTS.heartbeat_interval_ms) / 1000)
        last_t, last_tokens = time.monotonic(), self.tokens_total()
        while True:
            if time.monotonic() - self.chunks_sent_at >= period:  # chunks that flowed within the period said it
                self.send_heartbeat()
            else:
                metrics.HEARTBEATS_SKIPPED.inc()
            await asyncio.sleep(period)  # the heartbeat period itself, not synchronisation
            now = time.monotonic()
            metrics.TOKENS_PER_S.set((self.tokens_total() - last_tokens) / max(now - last_t, 1e-9))
            last_t, last_tokens = now, self.tokens_total()
