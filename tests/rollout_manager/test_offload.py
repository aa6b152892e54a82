"""The offload controller on a real ManagerState (pure, no network): when the reserved pool is offloaded, what is
measured, how the window adapts, and that work is never stranded."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from rlboost.policies.migration import MigrationReason
from rlboost.policies.offload import OffloadConfig, OffloadWindow
from rlboost.wire.rollout_io import (
    Pool,
    PromptItem,
    RolloutRequest,
    SamplingParams,
    TokenChunk,
    WorkerRegistration,
)
from rollout_manager.offload import OffloadController
from rollout_manager.state import ManagerState

CONFIG = OffloadConfig(initial_s=1.0, min_s=0.1, max_s=100.0, gain=0.5)


def _cluster(**capacity: int) -> ManagerState:
    """Workers named r* are reserved, s* spot, with the capacity given."""
    st = ManagerState(lease_timeout_s=60.0)
    for wid, cap in capacity.items():
        pool = Pool.RESERVED if wid.startswith("r") else Pool.SPOT
        st.register(WorkerRegistration(wid, pool, node=f"node-{wid}", capacity=cap, weight_version=0), now=0.0)
    return st


def _start(st: ManagerState, offload: OffloadController, requests: int) -> dict[str, str]:
    """A step of `requests` samples rolled out as the server does it; returns {worker: request id} assigned."""
    sampling = SamplingParams(temperature=0.0, max_new_tokens=8, seed=1, stop_token_ids=(0,))
    st.add_step(RolloutRequest(0, 0, [PromptItem(0, [9, 9])], requests, sampling), 0.0)
    offload.start_step(0.0)
    st.schedule(0.0)
    return {wid: box.assign[0].request_id for wid, box in st.take_outbox().items()}


def _flush(st: ManagerState, wid: str, rid: str, reason: str, now: float) -> None:
    """The worker's last chunk of a request: "abort" after a revoke, "stop" when it finished."""
    epoch = st.requests[rid].lease_epoch
    st.on_chunks(wid, [TokenChunk(rid, epoch, 0, [5], [0.0], reason == "stop", reason)], now)


def test_reserved_work_moves_to_spot_once_the_window_elapses_and_t_grows_with_the_trainer_wait():
    st, window = _cluster(r=1, s=1), OffloadWindow(CONFIG)
    offload = OffloadController(st, window)
    held = _start(st, offload, requests=2)
    assert offload.tick(0.5, period_s=0.5) == 0 and not st.offloaded_pools  # before T = 1 s
    assert offload.tick(1.0, period_s=0.5) == 1  # T elapsed: the reserved worker's request is revoked
    assert st.offloaded_pools == {Pool.RESERVED} and offload.offloaded_at == 1.0
    assert st.take_outbox()["r"].revoke == {"offload": [held["r"]]}
    assert offload.tick(1.5, period_s=0.5) == 0  # once per step
    _flush(st, "r", held["r"], "abort", 1.6)
    _flush(st, "s", held["s"], "stop", 1.7)
    st.schedule(1.8)
    assert st.take_outbox()["s"].assign[0].request_id == held["r"]  # continued on spot, not on reserved
    # spot was busy all along; the trainer waited 3 s after the offload: T grows by 0.5 * 3 * (1 - 0.5 / 2)
    assert offload.end_step(4.0) == pytest.approx(2.125) == window.window_s
    assert not st.offloaded_pools and st.dirty  # reserved workers take the next step's work
    assert REGISTRY.get_sample_value("rlboost_manager_offload_window_seconds") == pytest.approx(2.125)


def test_idle_spot_slots_shrink_the_window():
    st = _cluster(r=1, s=1)
    offload = OffloadController(st, OffloadWindow(CONFIG))
    held = _start(st, offload, requests=2)
    offload.tick(0.25, period_s=0.25)  # spot busy: nothing measured
    _flush(st, "s", held["s"], "stop", 0.3)
    offload.tick(0.5, period_s=0.25)  # spot's one slot free while nothing waits
    offload.tick(0.75, period_s=0.25)
    assert offload.spot_idle_s == pytest.approx(0.5)
    _flush(st, "r", held["r"], "stop", 0.8)
    assert offload.end_step(0.9) == pytest.approx(1.0 - 0.5 * 0.5 * 0.75)  # no offload, so no trainer wait


def test_spot_capacity_that_vanishes_gives_the_work_back_to_reserved():
    st = _cluster(r=1, s=1)
    offload = OffloadController(st, OffloadWindow(CONFIG))
    held = _start(st, offload, requests=2)
    offload.tick(1.0, period_s=1.0)
    _flush(st, "r", held["r"], "abort", 1.1)
    st.remove_worker("s", MigrationReason.STREAM_BROKEN, 1.2)  # spot preempted
    offload.tick(1.5, period_s=0.5)
    assert not st.offloaded_pools
    st.schedule(1.5)
    assert len(st.take_outbox()["r"].assign) == 1 and st.pending == 1  # reserved works again, at its capacity


def test_without_spot_capacity_or_without_a_window_nothing_is_offloaded():
    st = _cluster(r=2)
    reserved_only = OffloadController(st, OffloadWindow(CONFIG))
    _start(st, reserved_only, requests=2)
    assert reserved_only.tick(1e6, period_s=1.0) == 0 and not st.offloaded_pools
    assert reserved_only.end_step(1e6) == 1.0  # T unchanged: there was no spot to offload to

    st = _cluster(r=1, s=1)
    off = OffloadController(st, None)
    _start(st, off, requests=2)
    assert off.tick(1e6, period_s=1.0) == 0 and off.end_step(1e6) is None
    assert not st.offloaded_pools and not st.take_outbox()


def test_offload_puts_the_longest_running_reserved_request_first_in_line_for_spot():
    """Issue 17: at the window the request with most tokens is placed first, on the least-loaded spot worker."""
    st = _cluster(r=3)
    offload = OffloadController(st, OffloadWindow(CONFIG))
    sampling = SamplingParams(temperature=0.0, max_new_tokens=64, seed=1, stop_token_ids=(0,))
    st.add_step(RolloutRequest(0, 0, [PromptItem(0, [9, 9])], 3, sampling), 0.0)
    for wid, cap in (("s", 1), ("t", 2)):  # spot present for the window, its slots taken: all three go to r
        st.register(WorkerRegistration(wid, Pool.SPOT, node=f"node-{wid}", capacity=cap, weight_version=0), now=0.0)
        st.workers[wid].running.update(f"other-{wid}-{i}" for i in range(cap))
    offload.start_step(0.0)
    st.schedule(0.0)
    held = [a.request_id for a in st.take_outbox()["r"].assign]
    for rid, tokens in zip(held, (3, 9, 1), strict=True):  # the reserved worker streamed 3, 9 and 1 tokens
        epoch = st.requests[rid].lease_epoch
        st.on_chunks("r", [TokenChunk(rid, epoch, 0, [5] * tokens, [0.0] * tokens, False, "")], 0.5)
    for wid in ("s", "t"):  # their own work finished: both spot workers empty
        st.workers[wid].running.clear()
    assert offload.tick(1.0, period_s=0.5) == 3
    revoke_order = st.take_outbox()["r"].revoke["offload"]
    assert revoke_order == [held[2], held[0], held[1]]  # shortest first: the longest flushes last
    for rid in revoke_order:  # the worker flushes in the revoke's order
        epoch = st.requests[rid].lease_epoch
        st.on_chunks("r", [TokenChunk(rid, epoch, 0, [], [], False, "abort")], 1.1)
    st.schedule(1.2)
    assigned = {wid: [a.request_id for a in box.assign] for wid, box in st.take_outbox().items()}
    assert assigned["s"][0] == held[1]  # the 9-token request first, to the emptiest spot worker
    assert "r" not in assigned
