"""Agentic episodes in the pure state machine (no network): episodes handed to env-runners, each model turn an
ordinary request (placed, migrated when its worker dies, finished back to the runner), results delivered on the
step's stream, a lost runner's episodes started again, failures per rollout.onFailedRequest, idle slot-seconds."""

from __future__ import annotations

import pytest

from rlboost.policies.migration import MigrationReason
from rlboost.wire.episode_io import EpisodeResult, RunnerRegistration, TurnRequest
from rlboost.wire.rollout_io import (
    EpisodeSettings,
    EpisodeStats,
    Pool,
    PromptItem,
    RolloutRequest,
    SamplingParams,
    TokenChunk,
    WorkerRegistration,
)
from rollout_manager.state import ManagerState, StepError
from rollout_manager.steps import RequestPolicy


def _state(workers: int = 1, runners: int = 1, drop: bool = False, attempts: int = 5) -> ManagerState:
    st = ManagerState(lease_timeout_s=1.0, policy=RequestPolicy(drop_failed=drop, max_attempts=attempts))
    for i in range(workers):
        st.register(WorkerRegistration(f"w{i}", Pool.SPOT, f"n{i}", 2, 0), now=0.0)
    for i in range(runners):
        st.register_runner(RunnerRegistration(f"r{i}", f"cpu{i}", 4), now=0.0)
    return st


def _episodes_step(st: ManagerState, prompts: int = 1, group: int = 2, step: int = 0) -> int:
    sampling = SamplingParams(temperature=0.0, max_new_tokens=4, seed=7, stop_token_ids=(0,))
    tasks = [PromptItem(i, [], f'{{"question": "q{i}", "answer": "a"}}') for i in range(prompts)]
    return st.add_step(RolloutRequest(step, 0, tasks, group, sampling, episodes=EpisodeSettings(3, 64)), 0.0)


def _assigned(st: ManagerState, now: float = 0.0):
    st.schedule(now)
    return {rid: box.assign for rid, box in st.take_runner_outboxes(now).items() if box.assign}


def _finish_turn(st: ManagerState, tokens: list[int], now: float = 0.1) -> str:
    """Schedule the pending turn and finish it on its worker with `tokens`; returns the worker's id."""
    st.schedule(now)
    ((wid, box),) = [(w, b) for w, b in st.take_outbox().items() if b.assign]
    a = box.assign[0]
    st.on_chunks(wid, [TokenChunk(a.request_id, a.lease_epoch, 0, tokens, [-0.5] * len(tokens), True, "stop")], now)
    return wid


def _result(a, turns: int = 1, reason: str = "stop", reward: float | None = 1.0, error: str = "") -> EpisodeResult:
    return EpisodeResult(
        a.episode_id,
        a.lease_epoch,
        [5, 6],
        [1, 2, 3, 4],
        [-0.1, 0.0, 0.0, -0.2],
        b"\x01\x00\x00\x01",
        reason,
        turns,
        version_spans=[(0, 4)],
        reward=reward,
        stats=EpisodeStats(tool_calls=1, env_error=error),
    )


def test_episodes_go_to_runners_least_loaded_and_the_step_owes_them():
    st = _state(runners=2)
    assert _episodes_step(st, prompts=2, group=2) == 4
    assigned = _assigned(st)
    assert sorted(len(v) for v in assigned.values()) == [2, 2]
    assert st.status().episodes.running == 4 and st.status().episodes.in_tools == 4
    assert st.has_step(0)


def test_a_turn_is_a_request_whose_tokens_go_back_to_the_runner():
    st = _state()
    _episodes_step(st, group=1)
    ((rid, (a,)),) = _assigned(st).items()
    st.on_turn(rid, TurnRequest(a.episode_id, a.lease_epoch, 0, [5, 6], 4), 0.05)
    assert st.pending == 1 and st.status().episodes.in_tools == 0
    wid = _finish_turn(st, [9, 0])
    (turn,) = st.take_runner_outboxes(0.2)[rid].turns
    assert (turn.episode_id, turn.turn, turn.token_ids, turn.finish_reason) == (a.episode_id, 0, [9, 0], "stop")
    assert turn.workers == [wid] and not st.take_delivered()  # a turn never reaches the trainer's stream
    assert st.status().episodes.in_tools == 1


def test_the_finished_episode_is_delivered_with_its_mask_turns_and_reward():
    st = _state()
    _episodes_step(st, group=1)
    ((rid, (a,)),) = _assigned(st).items()
    st.on_episode_result(rid, _result(a, turns=2), 0.3)
    (traj,) = st.take_delivered()
    assert traj.request_id == a.episode_id == "s0-p0-g0"
    assert (traj.loss_mask, traj.turns, traj.reward, traj.episode.runner) == (b"\x01\x00\x00\x01", 2, 1.0, rid)
    assert not st.has_step(0) and st.status().episodes.finished == 1


def test_a_turn_whose_worker_dies_continues_elsewhere_from_its_tokens():
    st = _state(workers=2)
    _episodes_step(st, group=1)
    ((rid, (a,)),) = _assigned(st).items()
    st.on_turn(rid, TurnRequest(a.episode_id, a.lease_epoch, 0, [5, 6], 4), 0.05)
    st.schedule(0.1)
    ((wid, box),) = [(w, b) for w, b in st.take_outbox().items() if b.assign]
    first = box.assign[0]
    st.on_chunks(wid, [TokenChunk(first.request_id, first.lease_epoch, 0, [7], [-0.1])], 0.1)
    st.remove_worker(wid, MigrationReason.STREAM_BROKEN, 0.2)
    st.schedule(0.3)
    ((other, box),) = [(w, b) for w, b in st.take_outbox().items() if b.assign]
    again = box.assign[0]
    assert other != wid and again.input_ids == [5, 6, 7] and again.prompt_len == 2  # the turn's tokens kept
    st.on_chunks(other, [TokenChunk(again.request_id, again.lease_epoch, 1, [0], [-0.2], True, "stop")], 0.4)
    (turn,) = st.take_runner_outboxes(0.5)[rid].turns
    assert turn.token_ids == [7, 0] and turn.workers == [wid, other]


def test_turns_are_checked_against_the_episode():
    st = _state()
    _episodes_step(st, group=1)
    ((rid, (a,)),) = _assigned(st).items()
    st.on_turn(rid, TurnRequest(a.episode_id, a.lease_epoch, 1, [5], 4), 0.0)  # turn 0 comes first
    st.on_turn(rid, TurnRequest(a.episode_id, a.lease_epoch, 0, [5] * 61, 4), 0.0)  # over maxEpisodeTokens
    st.on_turn(rid, TurnRequest(a.episode_id, a.lease_epoch + 1, 0, [5], 4), 0.0)  # stale: ignored
    refused = st.take_runner_outboxes(0.0)[rid].turns
    assert [t.finish_reason for t in refused] == ["failed", "failed"] and st.pending == 0
    assert "expected turn 0" in refused[0].error and "maxEpisodeTokens" in refused[1].error


def test_a_lost_runner_s_episodes_start_again_on_another_runner():
    st = _state(runners=1)
    _episodes_step(st, group=1)
    ((rid, (a,)),) = _assigned(st).items()
    st.on_turn(rid, TurnRequest(a.episode_id, a.lease_epoch, 0, [5, 6], 4), 0.05)
    assert st.pending == 1
    st.remove_runner(rid, 0.1)
    assert st.pending == 0  # its turn went with it
    st.register_runner(RunnerRegistration("r9", "cpu9", 4), 0.2)
    ((rid2, (b,)),) = _assigned(st, 0.3).items()
    assert rid2 == "r9" and b.episode_id == a.episode_id and b.lease_epoch == a.lease_epoch + 1


def test_a_runner_gone_silent_loses_its_episodes():
    st = _state(runners=2)
    _episodes_step(st, group=1)
    ((rid, _),) = _assigned(st).items()
    other = "r1" if rid == "r0" else "r0"
    st.on_runner_heartbeat(other, 2.0)
    st.tick(2.0)  # past the 1 s lease
    assert st.runners.runners[rid].expired
    ((again, _),) = _assigned(st, 2.1).items()
    assert again == other


@pytest.mark.parametrize("drop", [True, False])
def test_an_environment_failure_follows_on_failed_request(drop: bool):
    st = _state(drop=drop)
    _episodes_step(st, group=1)
    ((rid, (a,)),) = _assigned(st).items()
    st.on_episode_result(rid, _result(a, reason="failed", reward=None, error="timeout: no reply within 1s"), 0.3)
    if drop:
        (traj,) = st.take_delivered()
        assert traj.finish_reason == "failed" and traj.episode.env_error.startswith("timeout")
    else:
        assert not st.take_delivered()
        assert "timeout" in st.take_failed_steps()[0]
    assert st.status().episodes.failed == 1


def test_an_episode_that_keeps_losing_runners_fails():
    st = _state(drop=True, attempts=2)
    _episodes_step(st, group=1)
    for i in range(2):
        ((rid, _),) = _assigned(st, float(i)).items()
        st.remove_runner(rid, float(i))
        st.register_runner(RunnerRegistration(f"x{i}", "cpu", 4), float(i))
    (traj,) = st.take_delivered()
    assert traj.finish_reason == "failed" and traj.prompt_ids == [0] and traj.response_ids == []


def test_cancel_step_drops_its_episodes_turns_and_tells_the_runner():
    st = _state()
    _episodes_step(st, group=1)
    ((rid, (a,)),) = _assigned(st).items()
    st.on_turn(rid, TurnRequest(a.episode_id, a.lease_epoch, 0, [5, 6], 4), 0.05)
    st.cancel_step(0, 0.1)
    assert st.pending == 0 and not st.has_step(0) and not st.episodes.episodes
    assert st.take_runner_outboxes(0.1)[rid].cancel == {"cancelled": [a.episode_id]}


def test_free_slots_while_episodes_are_in_tools_count_as_idle_slot_seconds():
    st = _state(workers=1)  # 2 slots
    _episodes_step(st, group=1)
    _assigned(st)  # in tools (its environment resets) from here on
    st.tick(0.2)
    st.tick(0.7)
    assert st.status().episodes.idle_slot_seconds_in_tools == pytest.approx(1.0)  # 0.5 s x 2 free slots
    st.on_turn("r0", TurnRequest("s0-p0-g0", 1, 0, [5, 6], 4), 0.7)  # a turn: not in tools any more
    st.tick(0.9)
    assert st.status().episodes.idle_slot_seconds_in_tools == pytest.approx(1.0)


def test_an_episodes_step_is_refused_when_its_turns_could_not_fit():
    st = _state()
    sampling = SamplingParams(max_new_tokens=4)
    r = RolloutRequest(0, 0, [PromptItem(0, [], "{}")], 1, sampling, episodes=EpisodeSettings(3, 10**6))
    with pytest.raises(StepError, match="max_episode_tokens"):
        st.add_step(r, 0.0)


def test_an_episode_is_counted_by_its_oldest_turn_s_version():
    """Bounded staleness (algorithm.maxStaleness) counts an episode by version turn by turn: the delivered episode's
    weight_version is its oldest model turn's, and its version spans say which tokens were sampled at which."""
    st = _state()
    _episodes_step(st, group=1)
    ((rid, (a,)),) = _assigned(st).items()
    result = _result(a, turns=2)
    result.version_spans = [(3, 2), (4, 2)]  # turn 0 (and the environment's reply) at 3, turn 1 at 4
    st.on_episode_result(rid, result, 0.3)
    (traj,) = st.take_delivered()
    assert (traj.weight_version, traj.version_spans) == (3, [(3, 2), (4, 2)])


def test_a_turn_on_a_reserved_worker_is_offloaded_to_spot_with_its_tokens():
    """Adaptive offload applies per turn: once the window elapses, a turn generating on a reserved worker is revoked
    and continues on a spot worker from the tokens it streamed; the runner gets one turn, from both workers."""
    from rlboost.policies.offload import OffloadConfig, OffloadWindow
    from rollout_manager.offload import OffloadController

    st = ManagerState(lease_timeout_s=60.0, policy=RequestPolicy())
    for wid, pool in (("reserved", Pool.RESERVED), ("spot", Pool.SPOT)):
        st.register(WorkerRegistration(wid, pool, f"node-{wid}", 1, 0), now=0.0)
    st.register_runner(RunnerRegistration("r0", "cpu0", 4), now=0.0)
    offload = OffloadController(st, OffloadWindow(OffloadConfig(initial_s=1.0, min_s=0.1, max_s=10.0, gain=0.5)))
    _episodes_step(st, group=2)
    offload.start_step(0.0)
    ((rid, episodes),) = _assigned(st).items()
    for a in episodes:  # both episodes' first turns: one on each worker
        st.on_turn(rid, TurnRequest(a.episode_id, a.lease_epoch, 0, [5, 6], 4), 0.05)
    st.schedule(0.1)
    held = {wid: box.assign[0] for wid, box in st.take_outbox().items()}
    first, other = held["reserved"], held["spot"]
    st.on_chunks("reserved", [TokenChunk(first.request_id, first.lease_epoch, 0, [7], [-0.1])], 0.2)
    assert offload.tick(1.0, period_s=1.0) == 1  # the window elapsed: the reserved worker's turn is revoked
    assert st.take_outbox()["reserved"].revoke == {"offload": [first.request_id]}
    st.on_chunks("reserved", [TokenChunk(first.request_id, first.lease_epoch, 1, [], [], False, "abort")], 1.1)
    st.on_chunks("spot", [TokenChunk(other.request_id, other.lease_epoch, 0, [0], [-0.3], True, "stop")], 1.1)
    st.schedule(1.2)
    again = st.take_outbox()["spot"].assign[0]
    assert (again.request_id, again.input_ids, again.prompt_len) == (first.request_id, [5, 6, 7], 2)
    st.on_chunks("spot", [TokenChunk(again.request_id, again.lease_epoch, 1, [0], [-0.2], True, "stop")], 1.3)
    turns = {t.episode_id: t for t in st.take_runner_outboxes(1.4)[rid].turns}
    offloaded = turns[first.request_id.rsplit("-t", 1)[0]]
    assert (offloaded.token_ids, offloaded.workers) == ([7, 0], ["reserved", "spot"])
    assert offloaded.logprobs == pytest.approx([-0.1, -0.2])  # float32 on the wire
