"""The gRPC edge of the env-runner boundary (episodes.proto): domain types to and from protobuf messages.

Only the manager's and the env-runner's transport code import this; their logic works on `episode_io` types.
Token ids and log-probs travel packed (int32 / float32 little-endian), as trajectories do.
"""

from __future__ import annotations

import math

from rlboost.rollout.v1 import episodes_pb2 as epb
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.wire.episode_io import (
    MAX_RUNNER_CAPACITY,
    MAX_TURNS,
    EpisodeAssignment,
    EpisodeCancel,
    EpisodeResult,
    RunnerRegistration,
    TurnRequest,
    TurnResult,
)
from rlboost.wire.rollout_proto import (
    WireError,
    episode_stats_from_pb,
    episode_stats_to_pb,
    pack,
    sampling_from_pb,
    sampling_to_pb,
    unpack,
)

FINISH_REASONS = ("stop", "length", "failed")


def _spans_to_pb(spans: list[tuple[int, int]]) -> list[pb.VersionSpan]:
    return [pb.VersionSpan(weight_version=v, tokens=n) for v, n in spans]


def _spans_from_pb(spans, tokens: int, what: str) -> list[tuple[int, int]]:
    out = [(s.weight_version, s.tokens) for s in spans]
    if out and (sum(n for _, n in out) != tokens or min(n for _, n in out) < 1):
        raise WireError(f"{what}: spans of {[n for _, n in out]} tokens do not cover its {tokens} tokens")
    return out


def _ids(data: bytes, what: str) -> list[int]:
    ids = unpack(data, "i", what).tolist()
    if ids and min(ids) < 0:
        raise WireError(f"{what}: token ids must be >= 0, got {min(ids)}")
    return ids


def _logprobs(data: bytes, tokens: int, what: str) -> list[float]:
    values = unpack(data, "f", what).tolist()
    if len(values) != tokens:
        raise WireError(f"{what}: {len(values)} values for {tokens} tokens")
    if not math.isfinite(sum(values)):
        raise WireError(f"{what}: every log-probability must be finite")
    return values


# ---- env-runner -> manager ----


def register_to_pb(r: RunnerRegistration, session_token: str = "") -> epb.RunnerMessage:
    reg = epb.RunnerRegister(runner_id=r.runner_id, node=r.node, capacity=r.capacity, session_token=session_token)
    return epb.RunnerMessage(register=reg)


def register_from_pb(m: epb.RunnerRegister) -> RunnerRegistration:
    if not m.runner_id:
        raise WireError("register.runner_id: must not be empty")
    if not 0 < m.capacity <= MAX_RUNNER_CAPACITY:
        raise WireError(f"register.capacity: must be in 1..{MAX_RUNNER_CAPACITY}, got {m.capacity}")
    return RunnerRegistration(m.runner_id, m.node, m.capacity)


def turn_request_to_pb(t: TurnRequest) -> epb.RunnerMessage:
    msg = epb.TurnRequest(
        episode_id=t.episode_id,
        lease_epoch=t.lease_epoch,
        turn=t.turn,
        input_ids_packed=pack(t.input_ids, "i"),
        max_new_tokens=t.max_new_tokens,
    )
    return epb.RunnerMessage(turn=msg)


def turn_request_from_pb(m: epb.TurnRequest) -> TurnRequest:
    if not m.episode_id:
        raise WireError("turn.episode_id: must not be empty")
    if not 0 <= m.turn < MAX_TURNS:
        raise WireError(f"turn.turn: must be in 0..{MAX_TURNS - 1}, got {m.turn}")
    if m.max_new_tokens < 1:
        raise WireError(f"turn.max_new_tokens: must be >= 1, got {m.max_new_tokens}")
    ids = _ids(m.input_ids_packed, "turn.input_ids_packed")
    if not ids:
        raise WireError("turn.input_ids_packed: a turn needs the episode's tokens so far")
    return TurnRequest(m.episode_id, m.lease_epoch, m.turn, ids, m.max_new_tokens)


def result_to_pb(r: EpisodeResult) -> epb.RunnerMessage:
    msg = epb.EpisodeResult(
        episode_id=r.episode_id,
        lease_epoch=r.lease_epoch,
        prompt_ids=r.prompt_ids,
        response_ids_packed=pack(r.response_ids, "i"),
        logprobs_packed=pack(r.logprobs, "f"),
        loss_mask=r.loss_mask,
        version_spans=_spans_to_pb(r.version_spans),
        finish_reason=r.finish_reason,
        has_reward=r.reward is not None,
        reward=r.reward or 0.0,
        turns=r.turns,
        stats=episode_stats_to_pb(r.stats),
        workers=r.workers,
    )
    return epb.RunnerMessage(result=msg)


def result_from_pb(m: epb.EpisodeResult) -> EpisodeResult:
    """An env-runner's finished episode; WireError names the first field that does not fit."""
    if m.finish_reason not in FINISH_REASONS:
        raise WireError(f"result.finish_reason: {m.finish_reason!r} is not one of {', '.join(FINISH_REASONS)}")
    response = _ids(m.response_ids_packed, "result.response_ids_packed")
    prompt = list(m.prompt_ids)
    if (not prompt or min(prompt) < 0) and m.finish_reason != "failed":
        raise WireError("result.prompt_ids: a finished episode needs its first prompt (token ids >= 0)")
    mask = bytes(m.loss_mask)
    if len(mask) != len(response) or mask.translate(None, b"\x00\x01"):
        raise WireError(f"result.loss_mask: {len(mask)} bytes for {len(response)} tokens; one 0 or 1 per token")
    if m.has_reward and not math.isfinite(m.reward):
        raise WireError("result.reward: must be a finite number")
    return EpisodeResult(
        episode_id=m.episode_id,
        lease_epoch=m.lease_epoch,
        prompt_ids=prompt,
        response_ids=response,
        logprobs=_logprobs(m.logprobs_packed, len(response), "result.logprobs_packed"),
        loss_mask=mask,
        finish_reason=m.finish_reason,
        turns=m.turns,
        version_spans=_spans_from_pb(m.version_spans, len(response), "result.version_spans"),
        reward=m.reward if m.has_reward else None,
        stats=episode_stats_from_pb(m.stats),
        workers=list(m.workers),
    )


# ---- manager -> env-runner ----


def assign_to_pb(assignments: list[EpisodeAssignment]) -> epb.RunnerCommand:
    batch = [
        epb.EpisodeAssignment(
            episode_id=a.episode_id,
            lease_epoch=a.lease_epoch,
            step=a.step,
            prompt_index=a.prompt_index,
            sample_index=a.sample_index,
            task_json=a.task_json,
            sampling=sampling_to_pb(a.sampling),
            weight_version=a.weight_version,
            max_turns=a.max_turns,
            max_episode_tokens=a.max_episode_tokens,
        )
        for a in assignments
    ]
    return epb.RunnerCommand(assign=epb.EpisodeAssignBatch(assignments=batch))


def assign_from_pb(m: epb.EpisodeAssignBatch) -> list[EpisodeAssignment]:
    out = []
    for a in m.assignments:
        if a.max_turns < 1 or a.max_episode_tokens < 1:
            raise WireError(f"assign[{a.episode_id}]: max_turns and max_episode_tokens must be >= 1")
        out.append(
            EpisodeAssignment(
                a.episode_id,
                a.lease_epoch,
                a.step,
                a.prompt_index,
                a.sample_index,
                a.task_json,
                sampling_from_pb(a.sampling),
                a.weight_version,
                a.max_turns,
                a.max_episode_tokens,
            )
        )
    return out


def turn_result_to_pb(r: TurnResult) -> epb.RunnerCommand:
    msg = epb.TurnResult(
        episode_id=r.episode_id,
        turn=r.turn,
        token_ids_packed=pack(r.token_ids, "i"),
        logprobs_packed=pack(r.logprobs, "f"),
        finish_reason=r.finish_reason,
        weight_version=r.weight_version,
        version_spans=_spans_to_pb(r.version_spans),
        workers=r.workers,
        error=r.error,
    )
    return epb.RunnerCommand(turn=msg)


def turn_result_from_pb(m: epb.TurnResult) -> TurnResult:
    if m.finish_reason not in FINISH_REASONS:
        raise WireError(f"turn.finish_reason: {m.finish_reason!r} is not one of {', '.join(FINISH_REASONS)}")
    ids = _ids(m.token_ids_packed, "turn.token_ids_packed")
    return TurnResult(
        m.episode_id,
        m.turn,
        ids,
        _logprobs(m.logprobs_packed, len(ids), "turn.logprobs_packed"),
        m.finish_reason,
        m.weight_version,
        _spans_from_pb(m.version_spans, len(ids), "turn.version_spans"),
        list(m.workers),
        m.error,
    )


def cancel_to_pb(c: EpisodeCancel) -> epb.RunnerCommand:
    return epb.RunnerCommand(cancel=epb.EpisodeCancel(episode_ids=c.episode_ids, reason=c.reason))


def cancel_from_pb(m: epb.EpisodeCancel) -> EpisodeCancel:
    return EpisodeCancel(list(m.episode_ids), m.reason)
