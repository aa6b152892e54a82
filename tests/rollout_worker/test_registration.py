"""rollout_worker.registration alone, over a stand-in stream: what Register says and proves, what Registered
leaves for the next registration, and the held responses handed over once."""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest

from rlboost.options.worker import WorkerOptions
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.wire.rollout_io import Assignment, SamplingParams
from rollout_worker.errors import IdentityProofUnreadableError, NotConnectedError
from rollout_worker.held import HeldResponses
from rollout_worker.registration import Registration


class Call:
    """The worker's end of a Connect stream: what was written, and the manager's first answer."""

    def __init__(self, *answers: object) -> None:
        self.sent: list[pb.WorkerMessage] = []
        self.answers, self.cancelled = list(answers), False

    async def write(self, msg: pb.WorkerMessage) -> None:
        self.sent.append(msg)

    async def read(self) -> object:
        return self.answers.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


def registered(token: str, key: str = "") -> pb.ManagerMessage:
    return pb.ManagerMessage(registered=pb.Registered(session_token=token, colocation_ack_key=key))


def setup(tmp_path, **options: object) -> tuple[Registration, HeldResponses]:
    engine = SimpleNamespace(capacity=3, weight_version=7, name="torch")
    held = HeldResponses(capacity=3)
    opts = WorkerOptions(worker_id="w-1", pool="spot", node="node-a", **options)
    return Registration(opts, engine, held), held


async def test_register_says_who_the_worker_is_and_a_reconnect_carries_the_session_token(tmp_path):
    reg, _ = setup(tmp_path)
    first = Call(registered("s-1", "ack-key"))
    assert (await reg.register(first)).session_token == "s-1"
    sent = first.sent[0].register
    assert (sent.worker_id, sent.pool, sent.node, sent.capacity, sent.weight_version, sent.engine) == (
        "w-1",
        pb.POOL_SPOT,
        "node-a",
        3,
        7,
        "torch",
    )
    assert sent.session_token == "" and reg.colocation_ack_key == "ack-key"
    again = Call(registered("s-2"))
    await reg.register(again)
    assert again.sent[0].register.session_token == "s-1" and reg.session_token == "s-2"


async def test_held_responses_are_reported_once_then_the_manager_owns_them(tmp_path):
    reg, held = setup(tmp_path)
    a = Assignment("r", 1, [5, 6], 2, SamplingParams(max_new_tokens=4), 7)
    held.start(a)
    held.add(a, [9], [-0.5])
    held.end(a, finished=False, reason="abort", lost=True, now=0.0)
    call = Call(registered("s"))
    await reg.register(call)
    assert [h.request_id for h in call.sent[0].register.held] == ["r"]
    assert held.report(0.0) == []


async def test_an_answer_other_than_registered_is_a_failed_attempt(tmp_path):
    reg, _ = setup(tmp_path)
    call = Call(pb.ManagerMessage(drain=pb.DrainCommand(reason="x")))
    with pytest.raises(NotConnectedError, match="did not answer Register with Registered"):
        await reg.register(call)
    assert call.cancelled
    with pytest.raises(NotConnectedError):
        await reg.register(Call(grpc.aio.EOF))


async def test_the_identity_proof_is_read_at_each_registration(tmp_path):
    token = tmp_path / "token"
    token.write_text("proof-1\n")
    reg, _ = setup(tmp_path, identity_token_file=str(token))
    assert reg.identity_proof() == "proof-1"
    token.write_text("proof-2\n")
    assert reg.identity_proof() == "proof-2"
    token.unlink()
    with pytest.raises(IdentityProofUnreadableError, match="--identity-token-file"):
        await reg.register(Call(registered("s")))
