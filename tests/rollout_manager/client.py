"""In-test rollout worker and trainer clients, written with the generated gRPC stubs (no manager code)."""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from rlboost.auth.credentials import JobCredentials
from rlboost.auth.grpc_auth import ClientAuth
from rlboost.auth.worker_identity import LOCAL_KEY, local_proof
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc

TIMEOUT = 5.0
# A lease that is only a safety net: a test whose subject is not expiry uses it, so that a loaded machine stalling
# the event loop (heartbeats and the ticker share it) for more than a short lease cannot expire a live worker.
# A test of expiry drives the manager's clock instead (ManualClock).
SAFETY_LEASE_MS = 60_000


class ManualClock:
    """The manager's monotonic clock, moved by the test: what expires does so when the test says, not when the
    machine's load happens to delay a heartbeat."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def identity_proof(creds: JobCredentials, worker_id: str, pool: int = pb.POOL_SPOT, job: str = "local") -> str:
    """The proof `rlboost local` gives worker `worker_id` of `pool` (rlboost.auth.worker_identity)."""
    name = "reserved" if pool == pb.POOL_RESERVED else "spot"
    return local_proof(creds.read(LOCAL_KEY), job, name, worker_id)


class WorkerClient:
    """One worker's Connect stream; `heartbeats=True` keeps its lease alive like a real worker."""

    def __init__(
        self,
        target: str,
        worker_id: str,
        *,
        pool: int = pb.POOL_SPOT,
        node: str = "node-a",
        capacity: int = 4,
        version: int = 0,
        heartbeats: bool = True,
        auth: ClientAuth | None = None,
        identity: JobCredentials | None = None,
        job: str = "local",
    ) -> None:
        """`auth`: the token and CA it presents (None: none, for a manager run without credentials);
        `identity`: the job's credentials its identity proof is minted from, as `rlboost local` does (None: it
        presents none); `job`: the manager's --job, which the proof is for."""
        self.target, self.worker_id, self.auth = target, worker_id, auth or ClientAuth()
        self.register = pb.Register(
            worker_id=worker_id, pool=pool, node=node, capacity=capacity, weight_version=version, engine="torch"
        )
        if identity is not None:
            self.register.identity_proof = identity_proof(identity, worker_id, pool, job)
        self.heartbeats = heartbeats
        self.version = version
        self.registered: pb.Registered | None = None
        self._out: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self._inbox: list[pb.ManagerMessage] = []
        self._hb_task: asyncio.Task | None = None

    async def connect(self, first: pb.WorkerMessage | None = None) -> WorkerClient:
        self.channel = self.auth.aio_channel(self.target)
        self.call = pb_grpc.RolloutManagerStub(self.channel).Connect(self._requests())
        self.send(first or pb.WorkerMessage(register=self.register))
        if first is None:
            msg = await asyncio.wait_for(self.call.read(), TIMEOUT)
            assert msg.WhichOneof("body") == "registered"
            self.registered = msg.registered
            if self.heartbeats:
                self._hb_task = asyncio.create_task(self._beat(msg.registered.heartbeat_interval_ms / 1000))
        return self

    async def _requests(self):
        while (msg := await self._out.get()) is not None:
            yield msg

    async def _beat(self, period: float) -> None:
        while True:
            self.send(pb.WorkerMessage(heartbeat=pb.Heartbeat(weight_version=self.version)))
            await asyncio.sleep(period)

    def send(self, msg: pb.WorkerMessage) -> None:
        self._out.put_nowait(msg)

    def chunk(
        self, rid: str, epoch: int, offset: int, tokens: list[int], finished: bool = False, reason: str = ""
    ) -> None:
        c = pb.TokenChunk(
            request_id=rid,
            lease_epoch=epoch,
            offset=offset,
            token_ids=tokens,
            logprobs=[-0.5] * len(tokens),
            finished=finished,
            finish_reason=reason,
        )
        self.send(pb.WorkerMessage(chunks=pb.ChunkBatch(chunks=[c])))

    async def expect(self, kind: str, timeout: float = TIMEOUT) -> pb.ManagerMessage:
        """The next message of this kind (others are kept in the inbox)."""
        for i, m in enumerate(self._inbox):
            if m.WhichOneof("body") == kind:
                return self._inbox.pop(i)

        async def _read() -> pb.ManagerMessage:
            while True:
                m = await self.call.read()
                assert m is not grpc.aio.EOF, f"{self.worker_id}: stream ended while waiting for {kind}"
                if m.WhichOneof("body") == kind:
                    return m
                self._inbox.append(m)

        return await asyncio.wait_for(_read(), timeout)

    def stop_heartbeats(self) -> None:
        if self._hb_task:
            self._hb_task.cancel()

    async def close(self) -> None:
        """Half-close the stream (a clean exit) and wait for the manager to end it."""
        self.stop_heartbeats()
        self._out.put_nowait(None)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
            while await asyncio.wait_for(self.call.read(), TIMEOUT) is not grpc.aio.EOF:
                pass
        await self.channel.close()

    async def drop(self) -> None:
        """Break the stream abruptly (the process died)."""
        self.stop_heartbeats()
        self.call.cancel()
        await self.channel.close()


async def collect_rollout(target: str, request: pb.RolloutRequest) -> list[pb.Trajectory]:
    async with grpc.aio.insecure_channel(target) as ch:
        return [t async for batch in pb_grpc.RolloutManagerStub(ch).Rollout(request) for t in batch.trajectories]


async def status(target: str) -> pb.StatusReply:
    async with grpc.aio.insecure_channel(target) as ch:
        return await pb_grpc.RolloutManagerStub(ch).GetStatus(pb.StatusRequest(), timeout=TIMEOUT)


def rollout_request(
    step: int = 0, prompts: int = 1, group: int = 1, max_new_tokens: int = 6, version: int = 0, seed: int = 7
) -> pb.RolloutRequest:
    return pb.RolloutRequest(
        step=step,
        weight_version=version,
        group_size=group,
        prompts=[pb.Prompt(prompt_index=i, token_ids=[100 + i, 200 + i, 300]) for i in range(prompts)],
        sampling=pb.SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens, seed=seed),
    )
