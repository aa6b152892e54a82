"""The gRPC edge of the rollout boundary: convert domain types to and from protobuf messages.

Only services' transport code imports this; their logic works on `rollout_io` types.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.spec import MAX_WORKER_CAPACITY
from rlboost.wire.rollout_io import (
    Assignment,
    HeldResponse,
    ManagerStatus,
    Pool,
    PromptItem,
    RolloutRequest,
    SamplingParams,
    TokenChunk,
    Trajectory,
    WorkerRegistration,
    WorkerStatus,
)

_POOL_TO_PB = {Pool.RESERVED: pb.POOL_RESERVED, Pool.SPOT: pb.POOL_SPOT}
_POOL_FROM_PB = {v: k for k, v in _POOL_TO_PB.items()}


# gRPC's limits, set explicitly on both ends of every rollout channel (the 4 MiB default is too small for a long
# response's trajectory; unbounded lets one peer make the other allocate anything).
GRPC_MAX_MESSAGE_BYTES = 64 << 20
# The manager cuts the trajectories it streams to the trainer into batches of at most this many bytes.
TRAJECTORY_BATCH_BYTES = 4 << 20
# A re-registering worker reports at most this many held responses per unit of capacity (paused ones fill its
# capacity; the rest are responses that finished shortly before its stream broke).
MAX_HELD_PER_CAPACITY = 8


def grpc_message_options(max_bytes: int = GRPC_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Channel / server options bounding received and sent messages."""
    return [("grpc.max_receive_message_length", max_bytes), ("grpc.max_send_message_length", max_bytes)]


class WireError(ValueError):
    """A protobuf message that does not make a valid domain object; the message says which field."""


def pool_to_pb(pool: Pool) -> int:
    return _POOL_TO_PB[pool]


def pool_from_pb(value: int) -> Pool:
    try:
        return _POOL_FROM_PB[value]
    except KeyError:
        raise WireError(f"pool: unknown value {value}; expected POOL_RESERVED or POOL_SPOT") from None


def sampling_to_pb(s: SamplingParams) -> pb.SamplingParams:
    return pb.SamplingParams(
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        max_new_tokens=s.max_new_tokens,
        seed=s.seed,
        stop_token_ids=list(s.stop_token_ids),
    )


def _no_negative_ids(ids: Sequence[int], what: str) -> None:
    if ids and min(ids) < 0:
        raise WireError(f"{what}: token ids must be >= 0, got {min(ids)}")


def sampling_from_pb(m: pb.SamplingParams) -> SamplingParams:
    if not (m.temperature >= 0 and math.isfinite(m.temperature)):  # `not >=` also refuses NaN
        raise WireError(f"sampling.temperature: must be a finite number >= 0, got {m.temperature}")
    top_p = m.top_p or 1.0  # 0: unset
    if not 0 < top_p <= 1:
        raise WireError(f"sampling.top_p: must be in (0, 1] (0 = off), got {m.top_p}")
    if m.top_k < 0:
        raise WireError(f"sampling.top_k: must be >= 0 (0 = off), got {m.top_k}")
    if m.max_new_tokens <= 0:
        raise WireError(f"sampling.max_new_tokens: must be > 0, got {m.max_new_tokens}")
    _no_negative_ids(m.stop_token_ids, "sampling.stop_token_ids")
    return SamplingParams(
        temperature=m.temperature,
        top_p=top_p,
        top_k=m.top_k,
        max_new_tokens=m.max_new_tokens,
        seed=m.seed,
        stop_token_ids=tuple(m.stop_token_ids),
    )


def registration_to_pb(r: WorkerRegistration) -> pb.Register:
    return pb.Register(
        worker_id=r.worker_id,
        pool=pool_to_pb(r.pool),
        node=r.node,
        capacity=r.capacity,
        weight_version=r.weight_version,
        engine=r.engine,
    )


def registration_from_pb(m: pb.Register) -> WorkerRegistration:
    if not m.worker_id:
        raise WireError("register.worker_id: must not be empty")
    if not 0 < m.capacity <= MAX_WORKER_CAPACITY:
        raise WireError(f"register.capacity: must be in 1..{MAX_WORKER_CAPACITY}, got {m.capacity}")
    return WorkerRegistration(
        worker_id=m.worker_id,
        pool=pool_from_pb(m.pool),
        node=m.node,
        capacity=m.capacity,
        weight_version=m.weight_version,
        engine=m.engine or "torch",
    )


def assignment_to_pb(a: Assignment) -> pb.Assignment:
    return pb.Assignment(
        request_id=a.request_id,
        lease_epoch=a.lease_epoch,
        input_ids=a.input_ids,
        prompt_len=a.prompt_len,
        sampling=sampling_to_pb(a.sampling),
        weight_version=a.weight_version,
        prior_logprobs=a.prior_logprobs,
    )


def assignment_from_pb(m: pb.Assignment) -> Assignment:
    if not 0 < m.prompt_len <= len(m.input_ids):
        raise WireError(f"assignment.prompt_len: {m.prompt_len} is outside 1..len(input_ids)={len(m.input_ids)}")
    prior = list(m.prior_logprobs)
    if prior and len(prior) != len(m.input_ids) - m.prompt_len:
        raise WireError(
            f"assignment.prior_logprobs: {len(prior)} values for {len(m.input_ids) - m.prompt_len} generated tokens"
        )
    return Assignment(
        request_id=m.request_id,
        lease_epoch=m.lease_epoch,
        input_ids=list(m.input_ids),
        prompt_len=m.prompt_len,
        sampling=sampling_from_pb(m.sampling),
        weight_version=m.weight_version,
        prior_logprobs=prior,
    )


def held_to_pb(h: HeldResponse) -> pb.HeldResponse:
    return pb.HeldResponse(
        request_id=h.request_id,
        weight_version=h.weight_version,
        prompt_ids=h.prompt_ids,
        token_ids=h.token_ids,
        logprobs=h.logprobs,
        finished=h.finished,
        finish_reason=h.finish_reason,
    )


def held_from_pb(m: pb.Register) -> list[HeldResponse]:
    """The responses a re-registering worker holds; WireError names the first malformed one."""
    if len(m.held) > MAX_HELD_PER_CAPACITY * max(1, m.capacity):
        raise WireError(
            f"register.held: {len(m.held)} responses is over {MAX_HELD_PER_CAPACITY} x capacity ({m.capacity})"
        )
    out = []
    for i, h in enumerate(m.held):
        what = f"register.held[{i}]"
        if not h.request_id:
            raise WireError(f"{what}.request_id: must not be empty")
        if len(h.logprobs) != len(h.token_ids):
            raise WireError(f"{what}.logprobs: {len(h.logprobs)} values for {len(h.token_ids)} tokens")
        _no_negative_ids(h.token_ids, f"{what}.token_ids")
        _no_negative_ids(h.prompt_ids, f"{what}.prompt_ids")
        if not math.isfinite(sum(h.logprobs)):
            raise WireError(f"{what}.logprobs: every log-probability must be finite")
        if h.finished and h.finish_reason not in ("stop", "length"):
            raise WireError(f"{what}.finish_reason: a finished response ends with 'stop' or 'length'")
        out.append(
            HeldResponse(
                h.request_id,
                h.weight_version,
                list(h.prompt_ids),
                list(h.token_ids),
                list(h.logprobs),
                h.finished,
                h.finish_reason,
            )  # fmt: skip
        )
    return out


def chunk_to_pb(c: TokenChunk) -> pb.TokenChunk:
    return pb.TokenChunk(
        request_id=c.request_id,
        lease_epoch=c.lease_epoch,
        offset=c.offset,
        token_ids=c.token_ids,
        logprobs=c.logprobs,
        finished=c.finished,
        finish_reason=c.finish_reason,
        error=c.error,
        invalid_input=c.invalid_input,
    )


def chunk_from_pb(m: pb.TokenChunk) -> TokenChunk:
    # the manager's hot path (one call per chunk): each field read once; `[:]` copies a repeated field
    # into a list about twice as fast as list() with upb
    token_ids, logprobs, offset = m.token_ids[:], m.logprobs[:], m.offset
    if len(logprobs) != len(token_ids):
        raise WireError(f"chunk.logprobs: {len(logprobs)} values for {len(token_ids)} tokens")
    if offset < 0:
        raise WireError(f"chunk.offset: must be >= 0, got {offset}")
    _no_negative_ids(token_ids, "chunk.token_ids")
    if not math.isfinite(sum(logprobs)):  # one sum in C: NaN or an infinity anywhere makes it non-finite
        raise WireError("chunk.logprobs: every log-probability must be finite")
    chunk = TokenChunk(m.request_id, m.lease_epoch, offset, token_ids, logprobs, m.finished, m.finish_reason)
    if m.finish_reason == "abort":  # only a last, aborted chunk carries an error: no extra reads on the hot path
        chunk.error, chunk.invalid_input = m.error, m.invalid_input
    return chunk


def rollout_request_to_pb(r: RolloutRequest) -> pb.RolloutRequest:
    return pb.RolloutRequest(
        step=r.step,
        weight_version=r.weight_version,
        group_size=r.group_size,
        sampling=sampling_to_pb(r.sampling),
        prompts=[pb.Prompt(prompt_index=p.prompt_index, token_ids=p.token_ids) for p in r.prompts],
        vocab_size=r.vocab_size,
        received_request_ids=r.received_request_ids,
    )


def rollout_request_from_pb(m: pb.RolloutRequest) -> RolloutRequest:
    if m.group_size <= 0:
        raise WireError(f"rollout.group_size: must be > 0, got {m.group_size}")
    if any(not p.token_ids for p in m.prompts):
        raise WireError("rollout.prompts: every prompt needs at least one token")
    for p in m.prompts:
        _no_negative_ids(p.token_ids, f"rollout.prompts[{p.prompt_index}].token_ids")
    if m.vocab_size < 0:
        raise WireError(f"rollout.vocab_size: must be >= 0 (0 = unchecked), got {m.vocab_size}")
    return RolloutRequest(
        step=m.step,
        weight_version=m.weight_version,
        group_size=m.group_size,
        sampling=sampling_from_pb(m.sampling),
        prompts=[PromptItem(prompt_index=p.prompt_index, token_ids=list(p.token_ids)) for p in m.prompts],
        vocab_size=m.vocab_size,
        received_request_ids=list(m.received_request_ids),
    )


def trajectory_to_pb(t: Trajectory) -> pb.Trajectory:
    return pb.Trajectory(
        request_id=t.request_id,
        step=t.step,
        prompt_index=t.prompt_index,
        sample_index=t.sample_index,
        prompt_ids=t.prompt_ids,
        response_ids=t.response_ids,
        logprobs=t.logprobs,
        finish_reason=t.finish_reason,
        weight_version=t.weight_version,
        workers=t.workers,
    )


def trajectory_from_pb(m: pb.Trajectory) -> Trajectory:
    return Trajectory(
        request_id=m.request_id,
        step=m.step,
        prompt_index=m.prompt_index,
        sample_index=m.sample_index,
        prompt_ids=list(m.prompt_ids),
        response_ids=list(m.response_ids),
        logprobs=list(m.logprobs),
        finish_reason=m.finish_reason,
        weight_version=m.weight_version,
        workers=list(m.workers),
    )


def status_to_pb(s: ManagerStatus) -> pb.StatusReply:
    workers = [
        pb.WorkerStatus(
            worker_id=w.worker_id,
            pool=pool_to_pb(w.pool),
            node=w.node,
            weight_version=w.weight_version,
            running=w.running,
            capacity=w.capacity,
            tokens_generated=w.tokens_generated,
            inflight_tokens=w.inflight_tokens,
            draining=w.draining,
            memory_released=w.memory_released,
        )
        for w in s.workers
    ]
    return pb.StatusReply(
        workers=workers,
        pending=s.pending,
        running=s.running,
        finished=s.finished,
        migrations=s.migrations,
        tokens_received=s.tokens_received,
        tokens_lost=s.tokens_lost,
        tokens_regenerated=s.tokens_regenerated,
        migrations_by_reason=s.migrations_by_reason,
    )


def status_from_pb(m: pb.StatusReply) -> ManagerStatus:
    workers = [
        WorkerStatus(
            worker_id=w.worker_id,
            pool=pool_from_pb(w.pool),
            node=w.node,
            weight_version=w.weight_version,
            running=w.running,
            capacity=w.capacity,
            tokens_generated=w.tokens_generated,
            inflight_tokens=w.inflight_tokens,
            draining=w.draining,
            memory_released=w.memory_released,
        )
        for w in m.workers
    ]
    return ManagerStatus(
        workers=workers,
        pending=m.pending,
        running=m.running,
        finished=m.finished,
        migrations=m.migrations,
        tokens_received=m.tokens_received,
        tokens_lost=m.tokens_lost,
        tokens_regenerated=m.tokens_regenerated,
        migrations_by_reason=dict(m.migrations_by_reason),
    )
