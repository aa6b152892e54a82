"""Packed tokens on the manager's wire (TokenChunk.*_packed from workers, Trajectory.*_packed to the trainer):
the manager offers them, reads them with the same bounds as repeated tokens, checked once per batch, and sends
them only to a trainer that asks; a worker or trainer that does not use them works as before."""

from __future__ import annotations

import asyncio
from array import array

import grpc
import pytest

from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc

from .client import WorkerClient, rollout_request


def _chunk(a: pb.Assignment, offset: int, tokens: list[int], logprobs: list[float], **kw) -> pb.TokenChunk:
    return pb.TokenChunk(
        request_id=a.request_id,
        lease_epoch=a.lease_epoch,
        offset=offset,
        token_ids_packed=array("i", tokens).tobytes(),
        logprobs_packed=array("f", logprobs).tobytes(),
        **kw,
    )


async def _rollout(target: str, request: pb.RolloutRequest) -> list[pb.Trajectory]:
    async with grpc.aio.insecure_channel(target) as ch:
        return [t async for batch in pb_grpc.RolloutManagerStub(ch).Rollout(request) for t in batch.trajectories]


@pytest.mark.parametrize("trainer_packed", [True, False], ids=["packed-trainer", "older-trainer"])
async def test_packed_batches_arrive_whole_and_go_out_as_the_trainer_asks(manager, trainer_packed):
    worker = await WorkerClient(manager.target, "w1", capacity=2).connect()
    assert worker.registered.packed_tokens
    request = rollout_request(prompts=2, max_new_tokens=4)
    request.packed_trajectories = trainer_packed
    rollout = asyncio.create_task(_rollout(manager.target, request))
    a, b = (await worker.expect("assign")).assign.assignments
    first = [_chunk(a, 0, [11, 12], [-0.25, -0.5]), _chunk(b, 0, [21], [-1.0])]  # one batch, two requests
    worker.send(pb.WorkerMessage(chunks=pb.ChunkBatch(chunks=first)))
    old_style = pb.TokenChunk(
        request_id=b.request_id,
        lease_epoch=b.lease_epoch,
        offset=1,
        token_ids=[22, 23, 24],
        logprobs=[-0.125] * 3,
        finished=True,
        finish_reason="length",
    )
    last = [_chunk(a, 2, [13], [-0.75], finished=True, finish_reason="stop"), old_style]  # a batch mixing both forms
    worker.send(pb.WorkerMessage(chunks=pb.ChunkBatch(chunks=last)))
    trajs = {t.request_id: t for t in await asyncio.wait_for(rollout, 5)}

    def tokens(t: pb.Trajectory) -> tuple[list[int], list[float]]:
        if not trainer_packed:
            assert not t.response_ids_packed
            return list(t.response_ids), list(t.logprobs)
        assert not t.response_ids
        return array("i", t.response_ids_packed).tolist(), array("f", t.logprobs_packed).tolist()

    assert tokens(trajs[a.request_id]) == ([11, 12, 13], [-0.25, -0.5, -0.75])
    assert tokens(trajs[b.request_id]) == ([21, 22, 23, 24], [-1.0, -0.125, -0.125, -0.125])
    assert manager.state.tally.tokens_received == 7
    await worker.close()


@pytest.mark.parametrize(
    ("chunk", "field"),
    [
        (
            {"token_ids_packed": array("i", [5, -3]).tobytes(), "logprobs_packed": array("f", [-1, -1]).tobytes()},
            "chunk.token_ids: token ids must be >= 0",
        ),
        (
            {
                "token_ids_packed": array("i", [5, 6]).tobytes(),
                "logprobs_packed": array("f", [-1, float("nan")]).tobytes(),
            },
            "chunk.logprobs: every log-probability must be finite",
        ),
        ({"token_ids_packed": b"\x05\x00\x00", "logprobs_packed": b"\x00\x00\x80"}, "chunk.token_ids_packed"),
        (
            {"token_ids_packed": array("i", [5, 6]).tobytes(), "logprobs_packed": array("f", [-1]).tobytes()},
            "chunk.logprobs_packed: 1 values for 2 tokens",
        ),
    ],
)
async def test_a_malformed_packed_chunk_ends_the_stream_naming_the_field(manager, chunk, field):
    worker = await WorkerClient(manager.target, "w1", capacity=1).connect()
    rollout = asyncio.create_task(_rollout(manager.target, rollout_request(max_new_tokens=4)))
    a = (await worker.expect("assign")).assign.assignments[0]
    good = _chunk(a, 0, [1], [-0.5])  # the batch's good chunk is not kept either: the whole message is refused
    bad = pb.TokenChunk(request_id=a.request_id, lease_epoch=a.lease_epoch, offset=1, **chunk)
    worker.send(pb.WorkerMessage(chunks=pb.ChunkBatch(chunks=[good, bad])))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await worker.expect("assign")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in err.value.details()
    assert manager.state.tally.tokens_received == 0
    rollout.cancel()
