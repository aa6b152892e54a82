"""A restarted manager's state (no network): held responses adopted with their tokens, received samples skipped."""

from __future__ import annotations

from rlboost.wire.rollout_io import HeldResponse, PromptItem, RolloutRequest, SamplingParams, WorkerRegistration
from rollout_manager.state import ManagerState

PROMPT = [9, 9]


def _state(*workers: str) -> ManagerState:
    st = ManagerState(lease_timeout_s=1.0)
    for wid in workers:
        st.register(WorkerRegistration(wid, "spot", node="n", capacity=4, weight_version=0), now=0.0)
    return st


def _request(received: list[str] | None = None, group: int = 3) -> RolloutRequest:
    sampling = SamplingParams(temperature=0.0, max_new_tokens=6, seed=1, stop_token_ids=(0,))
    return RolloutRequest(0, 0, [PromptItem(0, PROMPT)], group, sampling, received_request_ids=received or [])


def _held(rid: str, tokens: list[int], finished: bool = False, version: int = 0, prompt=PROMPT) -> HeldResponse:
    reason = "stop" if finished else ""
    return HeldResponse(rid, version, list(prompt), tokens, [-0.5] * len(tokens), finished, reason)


def _assigned(st: ManagerState) -> dict[str, list[int]]:
    """request id -> input_ids of what the last scheduling pass assigned."""
    st.schedule(1.0)
    return {a.request_id: a.input_ids for box in st.take_outbox().values() for a in box.assign}


def test_held_before_the_step_is_adopted_when_the_trainer_reattaches_and_received_are_skipped():
    st = _state("a")
    st.on_held("a", [_held("s0-p0-g1", [5, 6, 7]), _held("s0-p0-g2", [4, 0], finished=True)], now=0.5)
    assert st.add_step(_request(received=["s0-p0-g0"]), now=1.0) == 2  # g0: the trainer has it
    (done,) = st.take_delivered()  # g2 ended on its stop token: delivered at once, nothing regenerated
    assert (done.request_id, done.response_ids, done.finish_reason) == ("s0-p0-g2", [4, 0], "stop")
    assert _assigned(st) == {"s0-p0-g1": PROMPT + [5, 6, 7]}  # continued from the held tokens
    assert list(st.requests["s0-p0-g1"].logprobs) == [-0.5] * 3 and st.held.adopted == 2


def test_held_after_a_fresh_start_takes_over_and_stops_the_run_behind_it():
    st = _state("a", "b")
    st.add_step(_request(group=1), now=0.0)
    assert _assigned(st) == {"s0-p0-g0": PROMPT}  # scheduled afresh before the worker holding it re-registered
    runner = st.requests["s0-p0-g0"].worker
    st.on_held("c", [_held("s0-p0-g0", [5, 6])], now=1.5)
    assert st.take_outbox()[runner].revoke == {"adopted": ["s0-p0-g0"]}
    assert _assigned(st) == {"s0-p0-g0": PROMPT + [5, 6]} and st.running == 1 and st.pending == 0


def test_held_with_fewer_tokens_or_another_version_or_prompt_is_not_adopted():
    st = _state()
    st.add_step(_request(group=3), now=0.0)
    st.requests["s0-p0-g0"].tokens = [5, 6, 7]
    st.on_held(
        "a",
        [_held("s0-p0-g0", [5, 6]), _held("s0-p0-g1", [5], version=3), _held("s0-p0-g2", [5], prompt=[1, 2])],
        now=1.0,
    )
    assert st.held.adopted == 0 and not st.requests["s0-p0-g1"].tokens and not st.requests["s0-p0-g2"].tokens


def test_orphans_of_a_step_nobody_reattaches_to_are_forgotten():
    st = ManagerState(lease_timeout_s=1.0, orphan_ttl_s=5.0)
    st.on_held("a", [_held("s0-p0-g0", [5])], now=0.0)
    st.tick(6.0)
    st.add_step(_request(group=1), now=6.5)
    assert st.held.adopted == 0 and not st.requests["s0-p0-g0"].tokens


def test_a_step_whose_samples_were_all_received_yields_nothing_and_is_not_held_open():
    st = _state("a")
    assert st.add_step(_request(received=["s0-p0-g0"], group=1), now=0.0) == 0
    assert not st.has_step(0) and st.pending == 0
