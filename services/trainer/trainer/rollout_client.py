"""The trainer's side of the rollout-manager's `Rollout` call: a request in, domain trajectories streamed out.

    async with RolloutClient("127.0.0.1:50051") as client:
        async for traj in client.rollout(request):   # as each finishes, in any order
            ...

Protobuf stays at this edge (`rlboost.wire.rollout_proto`); callers see `rlboost.wire.rollout_io` types.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from rlboost.auth.grpc_auth import ClientAuth
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1 import rollout_pb2_grpc
from rlboost.wire.rollout_io import ManagerStatus, RolloutRequest, Trajectory
from rlboost.wire.rollout_proto import (
    grpc_message_options,
    rollout_request_to_pb,
    status_from_pb,
    trajectory_from_pb,
)

log = logging.getLogger(__name__)


class RolloutError(RuntimeError):
    """The manager could not be reached or failed the call; the message says which and why, `code` the status."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code

    @property
    def step_in_progress(self) -> bool:
        """The manager still rolls this step out (e.g. it is still dropping a cancelled call's requests)."""
        return self.code == grpc.StatusCode.ALREADY_EXISTS


class RolloutClient:
    """An async gRPC channel to the rollout-manager."""

    def __init__(self, target: str, auth: ClientAuth | None = None) -> None:
        """`auth`: the trainer token and the job CA (None: an open, plaintext manager)."""
        self.target = target
        self.auth = auth or ClientAuth()
        self._channel: grpc.aio.Channel | None = None
        self._stub: rollout_pb2_grpc.RolloutManagerStub | None = None

    async def __aenter__(self) -> RolloutClient:
        self._channel = self.auth.aio_channel(self.target, options=grpc_message_options())
        self._stub = rollout_pb2_grpc.RolloutManagerStub(self._channel)
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def wait_ready(self, timeout: float) -> None:
        """Wait until the manager accepts connections, or raise RolloutError."""
        assert self._channel is not None, "use `async with RolloutClient(...)`"
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except TimeoutError:
            raise RolloutError(f"rollout-manager at {self.target} not reachable after {timeout:.0f}s") from None

    async def rollout(self, request: RolloutRequest) -> AsyncIterator[Trajectory]:
        """Ask for a step's rollouts; yield each finished trajectory as it streams in."""
        assert self._stub is not None, "use `async with RolloutClient(...)`"
        call = self._stub.Rollout(rollout_request_to_pb(request), wait_for_ready=True)
        try:
            async for batch in call:
                for msg in batch.trajectories:
                    yield trajectory_from_pb(msg)
        except grpc.aio.AioRpcError as err:
            raise RolloutError(
                f"rollout-manager at {self.target} failed step {request.step}: {err.code().name}: {err.details()}",
                err.code(),
            ) from None
        finally:
            call.cancel()

    async def status(self, timeout: float = 2.0) -> ManagerStatus | None:
        """The manager's status (workers per pool, counters) for the step's metrics; None when it does not answer
        in time: metrics are not worth failing or delaying a step for."""
        assert self._stub is not None, "use `async with RolloutClient(...)`"
        try:
            return status_from_pb(await self._stub.GetStatus(pb.StatusRequest(), timeout=timeout))
        except grpc.aio.AioRpcError as err:
            log.debug("manager status unavailable", extra={"error": err.code().name})
            return None
