"""Partial rollout over real gRPC (algorithm.partialRollout): a step's stream ends at its target of complete
groups, its unfinished responses are kept with their tokens and continued by the next step under the new weight
version, and the delivered trajectory says which tokens came under which version.

The workers are in-test clients speaking the generated stubs; the manager is the real server.
"""

from __future__ import annotations

import asyncio

from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.wire.rollout_io import CarriedGroup, PromptItem, RolloutRequest, SamplingParams, Trajectory, request_id
from rollout_manager.state import ManagerState

from .client import WorkerClient, collect_rollout, rollout_request, status

PROMPT_1 = [101, 201, 300]  # rollout_request's prompt 1


def send(worker: WorkerClient, a: pb.Assignment, offset: int, tokens: list[int], logprob: float, **end) -> None:
    """A chunk of `a`'s response with every log-prob `logprob` (one value per version, to tell them apart)."""
    c = pb.TokenChunk(
        request_id=a.request_id,
        lease_epoch=a.lease_epoch,
        offset=offset,
        token_ids=tokens,
        logprobs=[logprob] * len(tokens),
        **end,
    )
    worker.send(pb.WorkerMessage(chunks=pb.ChunkBatch(chunks=[c])))


def partial_request(
    step: int, version: int, prompts: int, carried: list[pb.CarriedGroup], target: int = 1
) -> pb.RolloutRequest:
    r = rollout_request(step=step, prompts=prompts, version=version, max_new_tokens=6)
    r.target_groups = target
    r.carried.extend(carried)
    return r


async def move_to(worker: WorkerClient, version: int) -> None:
    assert (await worker.expect("set_weight_version")).set_weight_version.weight_version == version
    worker.version = version
    worker.send(pb.WorkerMessage(weight_version=pb.WeightVersionReport(weight_version=version, checksum="x")))


async def test_unfinished_response_is_carried_and_continued_under_the_next_version(manager):
    w1 = await WorkerClient(manager.target, "w1", capacity=4).connect()
    step0 = asyncio.create_task(collect_rollout(manager.target, partial_request(0, 0, 2, [])))
    assigned = {a.request_id: a for a in (await w1.expect("assign")).assign.assignments}
    a0, a1 = assigned[request_id(0, 0, 0)], assigned[request_id(0, 1, 0)]
    send(w1, a1, 0, [5, 6], -0.25)
    send(w1, a0, 0, [1, 2, 3], -0.5, finished=True, finish_reason="stop")
    (done,) = await asyncio.wait_for(step0, 5)  # the target (1 group) is reached: prompt 1 is not waited for
    assert done.request_id == a0.request_id and not done.version_spans
    send(w1, a1, 2, [7], -0.25)  # between steps it goes on under version 0 (the trainer trains meanwhile)

    carried = pb.CarriedGroup(step=0, prompt_index=1, prompt_ids=PROMPT_1, sample_indices=[0])
    step1 = asyncio.create_task(collect_rollout(manager.target, partial_request(1, 1, 0, [carried])))
    revoke = (await w1.expect("revoke")).revoke
    assert list(revoke.request_ids) == [a1.request_id] and revoke.reason == "carried"
    send(w1, a1, 3, [], -0.25, finish_reason="abort")  # the flush: it continues under version 1
    await move_to(w1, 1)
    (again,) = (await w1.expect("assign")).assign.assignments
    assert again.weight_version == 1 and list(again.input_ids) == PROMPT_1 + [5, 6, 7]
    assert list(again.prior_logprobs) == [-0.25] * 3
    send(w1, again, 3, [8], -0.75, finished=True, finish_reason="stop")

    (traj,) = await asyncio.wait_for(step1, 5)
    assert (traj.step, traj.prompt_index, traj.request_id) == (0, 1, a1.request_id)
    assert list(traj.response_ids) == [5, 6, 7, 8] and traj.finish_reason == "stop"
    assert [(s.weight_version, s.tokens) for s in traj.version_spans] == [(0, 3), (1, 1)]
    assert traj.weight_version == 0  # the oldest: what the staleness bound counts
    assert list(traj.logprobs) == [-0.25] * 3 + [-0.75]  # each segment's behaviour log-probs
    st = await status(manager.target)
    assert (st.pending, st.running, st.finished) == (0, 0, 2)
    await w1.close()


async def test_carried_finished_meanwhile_is_delivered_and_unknown_one_regenerated(manager):
    """A carried response that finished between the steps comes with the next step at once; one the manager did not
    keep (a restart, a resumed trainer) is generated afresh; one the trainer no longer waits for is dropped."""
    w1 = await WorkerClient(manager.target, "w1", capacity=4).connect()
    step0 = asyncio.create_task(collect_rollout(manager.target, partial_request(0, 0, 3, [])))
    assigned = {a.request_id: a for a in (await w1.expect("assign")).assign.assignments}
    send(w1, assigned[request_id(0, 0, 0)], 0, [1], -0.5, finished=True, finish_reason="stop")
    assert len(await asyncio.wait_for(step0, 5)) == 1
    send(w1, assigned[request_id(0, 1, 0)], 0, [4, 4], -0.5, finished=True, finish_reason="stop")

    kept = pb.CarriedGroup(step=0, prompt_index=1, prompt_ids=PROMPT_1, sample_indices=[0])
    unknown = pb.CarriedGroup(step=-5, prompt_index=0, prompt_ids=[9, 9], sample_indices=[0])
    step1 = asyncio.create_task(collect_rollout(manager.target, partial_request(1, 0, 0, [kept, unknown], target=2)))
    revoke = (await w1.expect("revoke")).revoke  # prompt 2 of step 0: not carried on, so cancelled
    assert list(revoke.request_ids) == [request_id(0, 2, 0)] and revoke.reason == "cancelled"
    (fresh,) = (await w1.expect("assign")).assign.assignments
    assert fresh.request_id == request_id(-5, 0, 0) and list(fresh.input_ids) == [9, 9]
    send(w1, fresh, 0, [3], -0.5, finished=True, finish_reason="stop")
    trajs = await asyncio.wait_for(step1, 5)
    assert sorted(t.request_id for t in trajs) == sorted([request_id(0, 1, 0), request_id(-5, 0, 0)])
    assert (await status(manager.target)).pending == 0
    await w1.close()


def test_a_trajectory_finished_as_the_stream_ended_goes_with_the_next_step() -> None:
    """The server hands the state what finished while the stream's last batch went out (ManagerState alone)."""
    st = ManagerState(lease_timeout_s=1.0)
    sampling = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=4, seed=1)
    st.add_step(RolloutRequest(0, 0, [PromptItem(0, [7, 8])], 1, sampling, target_groups=1), now=0.0)
    late = Trajectory(request_id(0, 0, 0), 0, 0, 0, [7, 8], [1], [-0.5], "stop", 0)
    st.carry_step(0, [late])
    carried = [CarriedGroup(0, 0, [7, 8], [0])]
    assert st.add_step(RolloutRequest(1, 1, [], 1, sampling, target_groups=1, carried=carried), now=1.0) == 1
    (delivered,) = st.take_delivered()
    assert delivered is late and st.delivery_step(delivered) == 1
