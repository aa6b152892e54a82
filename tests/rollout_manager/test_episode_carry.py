"""Partial rollout of agentic episodes in the pure state machine (episode_carry.py; no network, real records): a
step's stream ends at its target groups, its running episodes are carried and go on on their env-runners, the next
step continues them under its version (the turn generating then re-homed from its next token), and delivers them
with each model token's version; those that finished or failed meanwhile, those no longer waited for, those a
restarted manager does not hold, and a step sent again."""

from __future__ import annotations

from rlboost.wire.episode_io import EpisodeAssignment, EpisodeResult, RunnerRegistration, TurnRequest
from rlboost.wire.rollout_io import (
    CarriedGroup,
    EpisodeSettings,
    EpisodeStats,
    Pool,
    PromptItem,
    RolloutRequest,
    SamplingParams,
    TokenChunk,
    WorkerRegistration,
    request_id,
)
from rollout_manager.state import ManagerState
from rollout_manager.steps import RequestPolicy

TASKS = [f'{{"question": "q{i}", "answer": "a"}}' for i in range(3)]
SAMPLING = SamplingParams(temperature=0.0, max_new_tokens=4, seed=7, stop_token_ids=(0,))


def _state(drop: bool = True) -> ManagerState:
    st = ManagerState(lease_timeout_s=60.0, policy=RequestPolicy(drop_failed=drop))
    st.register(WorkerRegistration("w0", Pool.SPOT, "n0", 4, 0), now=0.0)
    st.register_runner(RunnerRegistration("r0", "cpu0", 4), now=0.0)
    return st


def _step(step: int, version: int, prompts: int, carried: list[CarriedGroup] = ()) -> RolloutRequest:
    """A partial step of episodes (target: 1 group of 1), as trainer.partial_assembly asks for it."""
    tasks = [PromptItem(i, [], TASKS[i]) for i in range(prompts)]
    return RolloutRequest(
        step, version, tasks, 1, SAMPLING, episodes=EpisodeSettings(3, 64), target_groups=1, carried=list(carried)
    )


def _carried(prompt: int) -> CarriedGroup:
    return CarriedGroup(0, prompt, [], [0], TASKS[prompt])


def _start(st: ManagerState, prompts: int = 2) -> dict[str, EpisodeAssignment]:
    """Step 0 (version 0) started: its episodes on r0, by id."""
    assert st.add_step(_step(0, 0, prompts), 0.0) == prompts
    st.schedule(0.0)
    return {a.episode_id: a for a in st.take_runner_outboxes(0.0)["r0"].assign}


def _turn(st: ManagerState, a: EpisodeAssignment, turn: int, ids: list[int], now: float):
    """The runner asks for the episode's model turn; returns its placed assignment on w0."""
    st.on_turn("r0", TurnRequest(a.episode_id, a.lease_epoch, turn, ids, 4), now)
    st.schedule(now)
    (placed,) = st.take_outbox()["w0"].assign
    return placed


def _result(a: EpisodeAssignment, spans: list[tuple[int, int]], n: int = 4) -> EpisodeResult:
    return EpisodeResult(
        a.episode_id, a.lease_epoch, [5, 6], list(range(1, n + 1)), [-0.1] * n, b"\x01" * n, "stop", 2,
        version_spans=spans, reward=1.0, stats=EpisodeStats(),
    )  # fmt: skip


def _end_step_0(st: ManagerState, done: EpisodeAssignment, carried: int = 1) -> None:
    """`done` finishes: step 0's target (1 group) is reached and its stream ends (as the server does it)."""
    st.on_episode_result("r0", _result(done, [(0, 4)]), 0.2)
    (first,) = st.take_delivered()
    assert first.request_id == done.episode_id and st.delivery_step(first) == 0
    assert st.carry_step(0) == carried


def test_a_running_episode_is_carried_and_delivered_by_the_next_step_with_its_versions():
    st = _state()
    eps = _start(st)
    done, carried = eps[request_id(0, 0, 0)], eps[request_id(0, 1, 0)]
    turn = _turn(st, carried, 0, [5, 6], 0.1)
    st.on_chunks("w0", [TokenChunk(turn.request_id, turn.lease_epoch, 0, [7], [-0.5])], 0.1)
    _end_step_0(st, done)
    st.on_chunks("w0", [TokenChunk(turn.request_id, turn.lease_epoch, 1, [8], [-0.5])], 0.3)  # goes on meanwhile
    assert not st.take_runner_outboxes(0.3).get("r0", None)  # its runner is not told anything: it drives on
    assert st.status().episodes.carried == 1

    assert st.add_step(_step(1, 1, 0, [_carried(1)]), 1.0) == 1  # the trainer trained, and moved to version 1
    assert st.take_outbox()["w0"].revoke == {"carried": [turn.request_id]}
    assert st.status().episodes.carried == 0  # the step's now
    st.on_chunks("w0", [TokenChunk(turn.request_id, turn.lease_epoch, 2, [], [], False, "abort")], 1.1)
    st.on_weight_version("w0", 1, 1.2)
    st.schedule(1.2)
    (again,) = st.take_outbox()["w0"].assign
    assert (again.weight_version, again.input_ids, again.prompt_len) == (1, [5, 6, 7, 8], 2)  # no token regenerated
    st.on_chunks("w0", [TokenChunk(again.request_id, again.lease_epoch, 2, [0], [-0.25], True, "stop")], 1.3)
    (result,) = st.take_runner_outboxes(1.4)["r0"].turns
    assert (result.token_ids, result.weight_version, result.version_spans) == ([7, 8, 0], 0, [(0, 2), (1, 1)])

    later = _turn(st, carried, 1, [5, 6, 7, 8, 0, 9], 1.5)  # its next turn: at the step's version
    assert later.weight_version == 1
    st.on_chunks("w0", [TokenChunk(later.request_id, later.lease_epoch, 0, [0], [-0.1], True, "stop")], 1.6)
    st.take_runner_outboxes(1.6)
    st.on_episode_result("r0", _result(carried, [(0, 2), (1, 3)], 5), 1.7)
    (traj,) = st.take_delivered()
    assert (traj.request_id, traj.step, st.delivery_step(traj)) == (carried.episode_id, 0, 1)
    assert (traj.weight_version, traj.version_spans) == (0, [(0, 2), (1, 3)])  # staleness counts its oldest turn
    assert not st.has_step(1) and not st.episodes.episodes


def test_a_turn_pending_when_the_next_step_takes_it_moves_to_its_version_at_once():
    st = _state()
    eps = _start(st)
    carried = eps[request_id(0, 1, 0)]
    _end_step_0(st, eps[request_id(0, 0, 0)])
    st.on_turn("r0", TurnRequest(carried.episode_id, carried.lease_epoch, 0, [5, 6], 4), 0.3)  # under version 0
    st.add_step(_step(1, 1, 0, [_carried(1)]), 1.0)
    st.on_weight_version("w0", 1, 1.1)
    st.schedule(1.1)
    (placed,) = st.take_outbox()["w0"].assign
    assert placed.weight_version == 1 and not st.book.pending.get(0)


def test_an_episode_finished_between_steps_is_delivered_at_once_and_one_not_listed_is_dropped():
    st = _state()
    eps = _start(st, prompts=3)
    _end_step_0(st, eps[request_id(0, 0, 0)], carried=2)
    meanwhile, unlisted = eps[request_id(0, 1, 0)], eps[request_id(0, 2, 0)]
    st.on_episode_result("r0", _result(meanwhile, [(0, 4)]), 0.5)
    assert not st.take_delivered()  # no stream waits for it until a step lists it
    assert st.add_step(_step(1, 1, 0, [_carried(1)]), 1.0) == 1
    (traj,) = st.take_delivered()
    assert traj.request_id == meanwhile.episode_id and st.delivery_step(traj) == 1
    assert st.take_runner_outboxes(1.0)["r0"].cancel == {"cancelled": [unlisted.episode_id]}
    assert not st.episodes.episodes


def test_an_episode_a_restarted_manager_does_not_hold_starts_afresh_with_its_own_seed():
    st = _state()
    original = _start(st)[request_id(0, 1, 0)]
    fresh = _state()  # a restarted manager: it holds nothing of step 0
    assert fresh.add_step(_step(1, 1, 0, [_carried(1)]), 1.0) == 1
    fresh.schedule(1.0)
    (again,) = fresh.take_runner_outboxes(1.0)["r0"].assign
    assert (again.episode_id, again.step, again.task_json) == (original.episode_id, 0, TASKS[1])
    assert (again.sampling.seed, again.weight_version) == (original.sampling.seed, 1)
    fresh.on_episode_result("r0", _result(again, [(1, 4)]), 1.5)
    (traj,) = fresh.take_delivered()
    assert fresh.delivery_step(traj) == 1


def test_an_episode_that_failed_while_carried_fails_the_step_that_lists_it():
    st = _state(drop=False)
    eps = _start(st)
    _end_step_0(st, eps[request_id(0, 0, 0)])
    carried = eps[request_id(0, 1, 0)]
    failed = _result(carried, [(0, 4)])
    failed.finish_reason, failed.stats = "failed", EpisodeStats(env_error="the environment crashed")
    st.on_episode_result("r0", failed, 0.5)
    assert not st.take_failed_steps()  # no stream waits for it now
    st.add_step(_step(1, 1, 0, [_carried(1)]), 1.0)
    assert "the environment crashed" in st.take_failed_steps()[1]


def test_a_step_sent_again_retires_the_carried_episode_of_the_same_id():
    """A resumed trainer sends step 0 again while its episode is still carried: the carried incarnation is
    cancelled on its runner and the step owes a new one, which is delivered on the step's own stream."""
    st = _state()
    eps = _start(st)
    _end_step_0(st, eps[request_id(0, 0, 0)])
    carried = eps[request_id(0, 1, 0)]
    assert st.add_step(_step(0, 1, 2), 2.0) == 2
    st.schedule(2.0)
    box = st.take_runner_outboxes(2.0)["r0"]
    assert box.cancel == {"cancelled": [carried.episode_id]}
    again = {a.episode_id: a for a in box.assign}[carried.episode_id]
    assert again.lease_epoch == 1  # a new episode record: the runner drops the carried one's messages by its id
    st.on_episode_result("r0", _result(again, [(1, 4)]), 2.5)
    (traj,) = st.take_delivered()
    assert st.delivery_step(traj) == 0 and traj.weight_version == 1
