"""A stand-in rollout-manager for the worker's tests, on the generated servicer base over real gRPC.

It is NOT the real manager (that is services/rollout-manager, written concurrently, and services never
import each other): it registers one worker stream at a time, records everything the worker sends and
lets the test push ManagerMessages, so the worker's side of the protocol is tested on its own.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import grpc

from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1.rollout_pb2_grpc import RolloutManagerServicer, add_RolloutManagerServicer_to_server
from rlboost.wire.rollout_io import TokenChunk
from rlboost.wire.rollout_proto import chunk_from_pb


class StandInManager(RolloutManagerServicer):
    def __init__(self, registered: pb.Registered) -> None:
        self.registered = registered
        self.registrations: list[pb.Register] = []
        self.received: list[pb.WorkerMessage] = []
        self.received_at: list[float] = []  # time.monotonic() of each message in `received`
        self.chunks: dict[str, list[TokenChunk]] = defaultdict(list)
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.streams_ended = 0
        self.server: grpc.aio.Server | None = None
        self.answering = asyncio.Event()  # cleared: hold every Register unanswered (a slow manager)
        self.answering.set()

    async def start(self, port: int) -> StandInManager:
        self.server = grpc.aio.server()
        add_RolloutManagerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"127.0.0.1:{port}")
        await self.server.start()
        return self

    async def stop(self) -> None:
        await self.server.stop(grace=None)

    def send(self, **body: object) -> None:
        self.outbox.put_nowait(pb.ManagerMessage(**body))

    def assign(self, *assignments: pb.Assignment) -> None:
        self.send(assign=pb.AssignBatch(assignments=list(assignments)))

    def of_kind(self, kind: str) -> list[pb.WorkerMessage]:
        return [m for m in self.received if m.WhichOneof("body") == kind]

    def tokens(self, rid: str) -> list[int]:
        return [t for c in self.chunks[rid] for t in c.token_ids]

    def last_chunk(self, rid: str) -> TokenChunk | None:
        chunks = self.chunks.get(rid)
        return chunks[-1] if chunks else None

    async def Connect(self, request_iterator, context):  # noqa: N802 (generated servicer's naming)
        first = await context.read()
        self.registrations.append(first.register)
        await self.answering.wait()
        await context.write(pb.ManagerMessage(registered=self.registered))

        async def pump() -> None:
            while True:
                await context.write(await self.outbox.get())

        pumping = asyncio.create_task(pump())
        try:
            while (msg := await context.read()) is not grpc.aio.EOF:
                self.received.append(msg)
                self.received_at.append(time.monotonic())
                if msg.WhichOneof("body") == "chunks":
                    for c in msg.chunks.chunks:
                        self.chunks[c.request_id].append(chunk_from_pb(c))
        finally:
            pumping.cancel()
            self.streams_ended += 1
