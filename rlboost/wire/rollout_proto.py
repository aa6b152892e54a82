"""The gRPC edge of the rollout boundary: convert domain types to and from protobuf messages.

Only services' transport code imports this; their logic works on `rollout_io` types.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Sequence

import numpy as np

from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.spec import MAX_WORKER_CAPACITY
from rlboost.wire.rollout_io import (
    Assignment,
    CarriedGroup,
    EpisodeCounts,
    EpisodeSettings,
    EpisodeStats,
    HeldResponse,
    ManagerStatus,
    Pool,
    PromptItem,
    RolloutRequest,
    RunnerStatus,
    SamplingParams,
    TokenBounds,
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


# Packed token fields (TokenChunk.*_packed, Trajectory.*_packed): int32 / float32, little-endian, 4 bytes each.
_NATIVE_LE = sys.byteorder == "little"
_min, _max = np.minimum.reduce, np.maximum.reduce


def pack(values: Sequence[int] | Sequence[float], typecode: str) -> bytes:
    """`values` as packed little-endian 4-byte values ('i': int32, 'f': float32); one C loop, no per-value object."""
    packed = values if isinstance(values, array) and values.typecode == typecode else array(typecode, values)
    if not _NATIVE_LE:
        packed = array(typecode, packed)
        packed.byteswap()
    return packed.tobytes()


def unpack(data: bytes, typecode: str, what: str) -> array:
    """Packed little-endian 4-byte values as an array ('i' or 'f'); WireError naming `what` if not whole values."""
    if len(data) % 4:
        raise WireError(f"{what}: {len(data)} bytes is not a whole number of 4-byte values")
    out = array(typecode)
    out.frombytes(data)
    if not _NATIVE_LE:
        out.byteswap()
    return out


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


MAX_WORKER_ID = 253  # a pod name (DNS subdomain); rlboost.options.WorkerOptions.worker_id's bound


def registration_from_pb(m: pb.Register) -> WorkerRegistration:
    if not m.worker_id:
        raise WireError("register.worker_id: must not be empty")
    if len(m.worker_id) > MAX_WORKER_ID:
        raise WireError(f"register.worker_id: at most {MAX_WORKER_ID} characters, got {len(m.worker_id)}")
    if len(m.node) > MAX_WORKER_ID or len(m.engine) > 64:
        raise WireError("register.node/engine: at most 253 / 64 characters")
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
        ticket=a.ticket,
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
        ticket=m.ticket,
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
        ticket=h.ticket,
        lease_epoch=h.lease_epoch,
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
                h.ticket,
                h.lease_epoch,
            )
        )
    return out


def chunk_to_pb(c: TokenChunk, packed: bool = False) -> pb.TokenChunk:
    """`packed`: tokens in the *_packed fields (the manager's Registered.packed_tokens says it reads them)."""
    m = pb.TokenChunk(
        request_id=c.request_id,
        lease_epoch=c.lease_epoch,
        offset=c.offset,
        finished=c.finished,
        finish_reason=c.finish_reason,
        error=c.error,
        invalid_input=c.invalid_input,
    )
    _put_tokens(m, "token_ids", c.token_ids, c.logprobs, packed)
    return m


def _put_tokens(m, ids_field: str, token_ids: Sequence[int], logprobs: Sequence[float], packed: bool) -> None:
    """A TokenChunk's or Trajectory's tokens: `<ids_field>_packed` and `logprobs_packed`, or the repeated fields."""
    if packed:
        setattr(m, f"{ids_field}_packed", pack(token_ids, "i"))
        m.logprobs_packed = pack(logprobs, "f")
    else:
        getattr(m, ids_field).extend(token_ids)
        m.logprobs.extend(logprobs)


def chunk_from_pb(m: pb.TokenChunk) -> TokenChunk:
    """One chunk, its tokens repeated or packed, checked alone (the manager's batches go through chunks_from_pb)."""
    if m.token_ids_packed or m.logprobs_packed:
        chunk = _packed_chunk(m, m.token_ids_packed, m.logprobs_packed)
        _check_bounds(chunk.token_ids, chunk.logprobs)
        return chunk
    # `[:]` copies a repeated field into a list about twice as fast as list() with upb
    token_ids, logprobs, offset = m.token_ids[:], m.logprobs[:], m.offset
    if len(logprobs) != len(token_ids):
        raise WireError(f"chunk.logprobs: {len(logprobs)} values for {len(token_ids)} tokens")
    if offset < 0:
        raise WireError(f"chunk.offset: must be >= 0, got {offset}")
    _no_negative_ids(token_ids, "chunk.token_ids")
    if not math.isfinite(sum(logprobs)):  # one sum in C: NaN or an infinity anywhere makes it non-finite
        raise WireError("chunk.logprobs: every log-probability must be finite")
    return _chunk(m, offset, token_ids, logprobs)


def chunks_from_pb(batch: pb.ChunkBatch) -> tuple[list[TokenChunk], TokenBounds | None]:
    """A worker's ChunkBatch, the manager's hot path: packed chunks become arrays (one copy each) and are checked
    together, with four numpy reductions over the batch's joined bytes instead of passes over every chunk.
    Also returns the batch's TokenBounds for the manager's own checks; None if any chunk came unpacked (an older
    worker: each is then checked alone, as chunk_from_pb does)."""
    chunks: list[TokenChunk] = []
    ids_parts: list[bytes] = []
    logprob_parts: list[bytes] = []
    unpacked = False
    for m in batch.chunks:
        ids_packed, logprobs_packed = m.token_ids_packed, m.logprobs_packed  # each upb read costs: read once
        if ids_packed or logprobs_packed:
            chunks.append(_packed_chunk(m, ids_packed, logprobs_packed))
            ids_parts.append(ids_packed)
            logprob_parts.append(logprobs_packed)
        else:
            chunk = chunk_from_pb(m)
            unpacked = unpacked or bool(chunk.token_ids)
            chunks.append(chunk)
    if not ids_parts:
        return chunks, None if unpacked else TokenBounds(-1, 0.0, 0.0)
    ids = np.frombuffer(b"".join(ids_parts), "<i4")
    logprobs = np.frombuffer(b"".join(logprob_parts), "<f4")
    bounds = _check_bounds(ids, logprobs)
    return chunks, None if unpacked else bounds


def _packed_chunk(m: pb.TokenChunk, ids_packed: bytes, logprobs_packed: bytes) -> TokenChunk:
    """A chunk whose tokens came packed; its repeated token_ids/logprobs, if any, are ignored (as an older reader
    ignores the packed ones)."""
    token_ids = unpack(ids_packed, "i", "chunk.token_ids_packed")
    logprobs = unpack(logprobs_packed, "f", "chunk.logprobs_packed")
    if len(logprobs) != len(token_ids):
        raise WireError(f"chunk.logprobs_packed: {len(logprobs)} values for {len(token_ids)} tokens")
    offset = m.offset
    if offset < 0:
        raise WireError(f"chunk.offset: must be >= 0, got {offset}")
    return _chunk(m, offset, token_ids, logprobs)


def _chunk(m: pb.TokenChunk, offset: int, token_ids, logprobs) -> TokenChunk:
    chunk = TokenChunk(m.request_id, m.lease_epoch, offset, token_ids, logprobs, m.finished, m.finish_reason)
    if m.finish_reason == "abort":  # only a last, aborted chunk carries an error: no extra reads on the hot path
        chunk.error, chunk.invalid_input = m.error, m.invalid_input
    return chunk


def _check_bounds(token_ids, logprobs) -> TokenBounds:
    """Token ids >= 0 and finite log-probs (NaN propagates through numpy's min/max), else WireError."""
    if not len(token_ids):
        return TokenBounds(-1, 0.0, 0.0)
    ids, lps = np.asarray(token_ids), np.asarray(logprobs)  # arrays: no copy
    low = int(_min(ids))  # the ufuncs themselves: ndarray.min() adds a Python-level wrapper per call
    if low < 0:
        raise WireError(f"chunk.token_ids: token ids must be >= 0, got {low}")
    lp_min, lp_max = float(_min(lps)), float(_max(lps))
    if not (math.isfinite(lp_min) and math.isfinite(lp_max)):
        raise WireError("chunk.logprobs: every log-probability must be finite")
    return TokenBounds(int(_max(ids)), lp_min, lp_max)


def rollout_request_to_pb(r: RolloutRequest) -> pb.RolloutRequest:
    return pb.RolloutRequest(
        step=r.step,
        weight_version=r.weight_version,
        group_size=r.group_size,
        sampling=sampling_to_pb(r.sampling),
        prompts=[
            pb.Prompt(prompt_index=p.prompt_index, token_ids=p.token_ids, task_json=p.task_json) for p in r.prompts
        ],
        vocab_size=r.vocab_size,
        received_request_ids=r.received_request_ids,
        packed_trajectories=True,  # read by trajectory_from_pb, which takes either form
        target_groups=r.target_groups,
        carried=[
            pb.CarriedGroup(
                step=c.step,
                prompt_index=c.prompt_index,
                prompt_ids=c.prompt_ids,
                sample_indices=c.sample_indices,
                task_json=c.task_json,
            )
            for c in r.carried
        ],
        episodes=None
        if r.episodes is None
        else pb.EpisodeSettings(max_turns=r.episodes.max_turns, max_episode_tokens=r.episodes.max_episode_tokens),
    )


def rollout_request_from_pb(m: pb.RolloutRequest) -> RolloutRequest:
    if m.group_size <= 0:
        raise WireError(f"rollout.group_size: must be > 0, got {m.group_size}")
    episodes = _episodes_from_pb(m)
    if episodes is None and any(not p.token_ids for p in m.prompts):
        raise WireError("rollout.prompts: every prompt needs at least one token")
    if episodes is not None and any(not p.task_json for p in m.prompts):
        raise WireError("rollout.prompts: an episodes step needs every prompt's task_json (the environment's task)")
    for p in m.prompts:
        _no_negative_ids(p.token_ids, f"rollout.prompts[{p.prompt_index}].token_ids")
    if m.vocab_size < 0:
        raise WireError(f"rollout.vocab_size: must be >= 0 (0 = unchecked), got {m.vocab_size}")
    return RolloutRequest(
        step=m.step,
        weight_version=m.weight_version,
        group_size=m.group_size,
        sampling=sampling_from_pb(m.sampling),
        prompts=[PromptItem(p.prompt_index, list(p.token_ids), p.task_json) for p in m.prompts],
        vocab_size=m.vocab_size,
        received_request_ids=list(m.received_request_ids),
        target_groups=m.target_groups,
        carried=_carried_from_pb(m, episodes is not None),
        episodes=episodes,
    )


def _episodes_from_pb(m: pb.RolloutRequest) -> EpisodeSettings | None:
    """RolloutRequest.episodes, checked (None: a single-turn step)."""
    if not m.HasField("episodes"):
        return None
    e = m.episodes
    if e.max_turns < 1:
        raise WireError(f"rollout.episodes.max_turns: must be >= 1, got {e.max_turns}")
    if e.max_episode_tokens < 1:
        raise WireError(f"rollout.episodes.max_episode_tokens: must be >= 1, got {e.max_episode_tokens}")
    return EpisodeSettings(e.max_turns, e.max_episode_tokens)


def _carried_from_pb(m: pb.RolloutRequest, episodes: bool) -> list[CarriedGroup]:
    """RolloutRequest.carried, checked: a prompt (an episodes step: a task), sample indices within the group;
    WireError names the field."""
    if m.target_groups < 0:
        raise WireError(f"rollout.target_groups: must be >= 0 (0 = every request), got {m.target_groups}")
    out = []
    for i, c in enumerate(m.carried):
        what = f"rollout.carried[{i}]"
        if episodes and not c.task_json:
            raise WireError(f"{what}.task_json: a carried group of an episodes step needs its environment task")
        if not (episodes or c.prompt_ids):
            raise WireError(f"{what}.prompt_ids: a carried group needs its prompt")
        _no_negative_ids(c.prompt_ids, f"{what}.prompt_ids")
        if any(not 0 <= g < m.group_size for g in c.sample_indices):
            raise WireError(f"{what}.sample_indices: each must lie in [0, group_size={m.group_size})")
        out.append(CarriedGroup(c.step, c.prompt_index, list(c.prompt_ids), list(c.sample_indices), c.task_json))
    return out


def trajectory_to_pb(t: Trajectory, packed: bool = False) -> pb.Trajectory:
    """`packed`: response tokens in the *_packed fields (the RolloutRequest asked for packed_trajectories)."""
    m = pb.Trajectory(
        request_id=t.request_id,
        step=t.step,
        prompt_index=t.prompt_index,
        sample_index=t.sample_index,
        prompt_ids=t.prompt_ids,
        finish_reason=t.finish_reason,
        weight_version=t.weight_version,
        workers=t.workers,
        version_spans=[pb.VersionSpan(weight_version=v, tokens=n) for v, n in t.version_spans],
        loss_mask=t.loss_mask,
        turns=t.turns,
        has_reward=t.reward is not None,
        reward=t.reward or 0.0,
    )
    if t.episode is not None:
        m.episode.CopyFrom(episode_stats_to_pb(t.episode))
    _put_tokens(m, "response_ids", t.response_ids, t.logprobs, packed)
    return m


def episode_stats_to_pb(e: EpisodeStats) -> pb.EpisodeStats:
    return pb.EpisodeStats(
        tool_calls=e.tool_calls,
        tool_failures=e.tool_failures,
        tool_seconds=e.tool_seconds,
        env_error=e.env_error,
        runner=e.runner,
    )


def episode_stats_from_pb(m: pb.EpisodeStats) -> EpisodeStats:
    return EpisodeStats(m.tool_calls, m.tool_failures, m.tool_seconds, m.env_error, m.runner)


def trajectory_from_pb(m: pb.Trajectory) -> Trajectory:
    if m.response_ids_packed or m.logprobs_packed:
        response_ids = unpack(m.response_ids_packed, "i", "trajectory.response_ids_packed").tolist()
        logprobs = unpack(m.logprobs_packed, "f", "trajectory.logprobs_packed").tolist()
    else:
        response_ids, logprobs = list(m.response_ids), list(m.logprobs)
    return Trajectory(
        request_id=m.request_id,
        step=m.step,
        prompt_index=m.prompt_index,
        sample_index=m.sample_index,
        prompt_ids=list(m.prompt_ids),
        response_ids=response_ids,
        logprobs=logprobs,
        finish_reason=m.finish_reason,
        weight_version=m.weight_version,
        workers=list(m.workers),
        version_spans=[(s.weight_version, s.tokens) for s in m.version_spans],
        loss_mask=_loss_mask(m.loss_mask, len(response_ids), "trajectory.loss_mask"),
        turns=m.turns,
        reward=m.reward if m.has_reward else None,
        episode=episode_stats_from_pb(m.episode) if m.HasField("episode") else None,
    )


def _loss_mask(mask: bytes, tokens: int, what: str) -> bytes:
    """A loss mask, checked: empty, or one byte (0 or 1) per response token."""
    if mask and (len(mask) != tokens or mask.translate(None, b"\x00\x01")):
        raise WireError(f"{what}: {len(mask)} bytes for {tokens} tokens; one 0 or 1 per response token, or none")
    return bytes(mask)


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
            tokens_per_s=w.tokens_per_s,
            weight_sync_s=w.weight_sync_s,
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
        busy_seconds=s.busy_seconds,
        runners=[pb.RunnerStatus(**r.__dict__) for r in s.runners],
        episodes_pending=s.episodes.pending,
        episodes_running=s.episodes.running,
        episodes_in_tools=s.episodes.in_tools,
        episodes_finished=s.episodes.finished,
        episodes_failed=s.episodes.failed,
        idle_slot_seconds_in_tools=s.episodes.idle_slot_seconds_in_tools,
        runner_episode_seconds=s.episodes.runner_episode_seconds,
        runner_capacity_seconds=s.episodes.runner_capacity_seconds,
        episodes_carried=s.episodes.carried,
        preemptions=s.preemptions,
        preempted_slot_seconds=s.preempted_slot_seconds,
        slot_seconds=s.slot_seconds,
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
            tokens_per_s=w.tokens_per_s,
            weight_sync_s=w.weight_sync_s,
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
        busy_seconds=dict(m.busy_seconds),
        runners=[_runner_status(r) for r in m.runners],
        episodes=EpisodeCounts(
            m.episodes_pending,
            m.episodes_running,
            m.episodes_in_tools,
            m.episodes_finished,
            m.episodes_failed,
            m.idle_slot_seconds_in_tools,
            m.runner_episode_seconds,
            m.runner_capacity_seconds,
            carried=m.episodes_carried,
        ),
        preemptions=m.preemptions,
        preempted_slot_seconds=m.preempted_slot_seconds,
        slot_seconds=m.slot_seconds,
    )


def _runner_status(r: pb.RunnerStatus) -> RunnerStatus:
    return RunnerStatus(r.runner_id, r.node, r.capacity, r.running, r.in_tools, r.draining, r.episodes_done)
