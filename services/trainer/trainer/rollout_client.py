"""The trainer's side of the rollout-manager's `Rollout` call: a request in, domain trajectories streamed out.

    async with RolloutClient("127.0.0.1:50051") as client:
        async for traj in client.rollout(request):   # as each finishes, in any order
            ...

Protobuf stays at this edge (`rlboost.wire.rollout_proto`); callers see `rlboost.wire.rollout_io` types.

With `reattach_s`, a manager lost mid-step (UNAVAILABLE: it was killed, restarted or is shutting down) does not
fail the step: the client waits up to `reattach_s` for a manager on the same address and makes the call again
with the ids of the trajectories it already received, so the new manager rolls out only the rest (adopting the
tokens its workers kept) and nothing is delivered twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
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
from trainer import metrics

log = logging.getLogger(__name__)
# Re-attaching: pauses between calls (the new manager may still be starting, or ending the old call).
FIRST_PAUSE_S, MAX_PAUSE_S = 0.1, 2.0


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

    async def rollout(self, request: RolloutRequest, reattach_s: float = 0.0) -> AsyncIterator[Trajectory]:
        """Ask for a step's rollouts; yield each finished trajectory as it streams in. `reattach_s` > 0: when the
        manager is lost mid-step, wait up to that long for it and re-attach (module docstring)."""
        received = list(request.received_request_ids)
        pause, lost_at = FIRST_PAUSE_S, None  # lost_at: when the manager was lost (None: no loss since progress)
        while True:
            call_request = dataclasses.replace(request, received_request_ids=list(received))
            try:
                async for traj in self._call(call_request):
                    received.append(traj.request_id)
                    pause, lost_at = FIRST_PAUSE_S, None  # progress: the next loss starts afresh
                    yield traj
                return
            except RolloutError as err:
                now, again = time.monotonic(), lost_at is not None
                lost_at = lost_at if again else now
                if reattach_s <= 0 or not _may_reattach(err, again) or now + pause > lost_at + reattach_s:
                    raise
                metrics.ROLLOUT_REATTACHES.inc()
                log.warning(
                    "rollout-manager lost mid-step: re-attaching",
                    extra={"step": request.step, "received": len(received), "error": str(err), "in_s": pause},
                )
            await asyncio.sleep(pause)  # back-off between calls, not synchronisation
            pause = min(pause * 2, MAX_PAUSE_S)
            await self.wait_ready(max(0.1, lost_at + reattach_s - time.monotonic()))

    async def _call(self, request: RolloutRequest) -> AsyncIterator[Trajectory]:
        """One Rollout call."""
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


def _may_reattach(err: RolloutError, again: bool) -> bool:
    """The manager went away (UNAVAILABLE), or, `again` after a loss, still ends our previous call (ALREADY_EXISTS)."""
    return err.code == grpc.StatusCode.UNAVAILABLE or (again and err.step_in_progress)
