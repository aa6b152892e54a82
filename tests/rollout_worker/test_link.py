"""rollout_worker.link alone, over a stand-in stream: chunks leave as batches at the cadence given, heartbeats
say the engine's state, and a close half-closes the stream after what is queued."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from rlboost.rollout.v1 import rollout_pb2 as pb
from rollout_worker.link import SPEC_DEFAULTS, ManagerLink


class Call:
    def __init__(self) -> None:
        self.written: list[pb.WorkerMessage] = []
        self.half_closed = self.cancelled = False

    async def write(self, msg: pb.WorkerMessage) -> None:
        self.written.append(msg)

    async def done_writing(self) -> None:
        self.half_closed = True

    def cancel(self) -> None:
        self.cancelled = True


ENGINE = SimpleNamespace(weight_version=4, running=2, memory_released=False)


def link(registered: pb.Registered | None = None) -> tuple[ManagerLink, Call]:
    call = Call()
    return ManagerLink(call, registered or pb.Registered(), ENGINE, lambda: 0), call


def test_unset_timings_are_the_specs_defaults_and_a_cadence_replaces_them():
    lk, _ = link()
    assert (lk.chunker.max_tokens, lk.chunker.max_ms) == (SPEC_DEFAULTS.chunk_max_tokens, SPEC_DEFAULTS.chunk_max_ms)
    lk.set_cadence(pb.ChunkCadence(chunk_max_tokens=0, chunk_max_ms=300))
    assert (lk.chunker.max_tokens, lk.chunker.max_ms) == (SPEC_DEFAULTS.chunk_max_tokens, 300)
    assert lk.flush.is_set()  # the flusher recomputes its deadline


def test_due_chunks_leave_as_one_batch_and_the_heartbeat_says_the_engines_state():
    lk, _ = link(pb.Registered(chunk_max_tokens=2, chunk_max_ms=1000))
    lk.chunker.open("a", 1, 0)
    lk.chunker.add("a", [1, 2, 3], [-0.1, -0.2, -0.3], 0)
    lk.send_due(flush_all=True)
    lk.send_heartbeat()
    batch, beat = lk.outbox.get_nowait(), lk.outbox.get_nowait()
    assert [list(c.token_ids) for c in batch.chunks.chunks] == [[1, 2], [3]]
    assert lk.chunks_sent_at > float("-inf")
    assert (beat.heartbeat.weight_version, beat.heartbeat.running, beat.heartbeat.memory_released) == (4, 2, False)


async def test_close_half_closes_after_what_is_queued_and_stop_cancels_the_stream():
    lk, call = link(pb.Registered(heartbeat_interval_ms=10_000))
    lk.start()
    lk.send(pb.WorkerMessage(drain=pb.DrainNotice(reason="SIGTERM")))
    lk.close()
    for _ in range(200):
        if call.half_closed:
            break
        await asyncio.sleep(0.01)
    assert call.half_closed and [m.WhichOneof("body") for m in call.written] == ["drain"]  # nothing after the close
    await lk.stop()
    assert call.cancelled
