"""The env-runners' gRPC edge (episodes.proto `EpisodeRunners.Attach`): one bidirectional stream per env-runner.

Converts protobuf <-> episode_io types with rlboost.wire.episode_proto and drives the manager's state
(`ManagerState.register_runner`, `on_turn`, `on_episode_result`, ...), on the server's one asyncio loop. The server
calls `flush()` after each scheduling pass: each runner's batched commands (episode assignments, turn results,
cancels) go to its send queue. A runner id is bound to the session its first stream was given, as a worker's is
(identity.WorkerSessions).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from rlboost.rollout.v1 import episodes_pb2 as epb
from rlboost.rollout.v1 import episodes_pb2_grpc as epb_grpc
from rlboost.spec import RolloutSpec
from rlboost.wire import episode_proto as ewire
from rlboost.wire.episode_io import EpisodeCancel
from rlboost.wire.rollout_proto import WireError

from .identity import SessionRefused, WorkerSessions
from .runners import RunnerOutbox
from .state import ManagerState

log = logging.getLogger("rollout_manager.episodes")


class _RunnerConn:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[epb.RunnerCommand | None] = asyncio.Queue()
        self.error: str | None = None


class RunnerEdge(epb_grpc.EpisodeRunnersServicer):
    """The EpisodeRunners service of one manager (served beside RolloutManager on the same port)."""

    def __init__(self, state: ManagerState, rollout: RolloutSpec, clock: Callable[[], float], kick: Callable[[], None]):
        self.state, self.rollout, self.clock, self.kick = state, rollout, clock, kick
        self.sessions = WorkerSessions()
        self._conns: dict[str, _RunnerConn] = {}

    def add_to(self, server: grpc.aio.Server) -> None:
        epb_grpc.add_EpisodeRunnersServicer_to_server(self, server)

    def stop(self) -> None:
        for conn in self._conns.values():
            conn.queue.put_nowait(None)

    def flush(self) -> None:
        """Each runner's batched commands onto its stream."""
        for rid, box in self.state.take_runner_outboxes(self.clock()).items():
            conn = self._conns.get(rid)
            if conn is not None:
                for msg in _outbox_to_pb(box):
                    conn.queue.put_nowait(msg)

    async def Attach(  # noqa: N802 (gRPC method name)
        self, request_iterator: AsyncIterator[epb.RunnerMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[epb.RunnerCommand]:
        try:
            first = await anext(request_iterator)
        except StopAsyncIteration:
            return
        if first.WhichOneof("body") != "register":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "body: the first message must be register")
        try:
            reg = ewire.register_from_pb(first.register)
        except WireError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        rid = reg.runner_id
        try:
            session = self.sessions.admit(rid, first.register.session_token, rid in self._conns)
        except SessionRefused as err:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(err).replace("worker", "env-runner"))
        if (old := self._conns.get(rid)) is not None:
            old.queue.put_nowait(None)
        conn = self._conns[rid] = _RunnerConn()
        self.state.register_runner(reg, self.clock())
        log.info("env-runner registered", extra={"runner_id": rid, "capacity": reg.capacity, "node": reg.node})
        yield epb.RunnerCommand(
            registered=epb.RunnerRegistered(
                heartbeat_interval_ms=self.rollout.heartbeat_interval_ms, session_token=session
            )
        )
        self.kick()
        reader = asyncio.create_task(self._read(rid, request_iterator, conn))
        try:
            while (msg := await conn.queue.get()) is not None:
                yield msg
            if conn.error:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, conn.error)
        finally:
            reader.cancel()
            if self._conns.get(rid) is conn:
                del self._conns[rid]
                self.sessions.end(rid)
                n = self.state.remove_runner(rid, self.clock())
                log.info("env-runner stream ended", extra={"runner_id": rid, "episodes": n, "error": conn.error})
                self.kick()

    async def _read(self, rid: str, it: AsyncIterator[epb.RunnerMessage], conn: _RunnerConn) -> None:
        try:
            async for msg in it:
                if self._conns.get(rid) is not conn:
                    return
                self._handle(rid, msg)
        except WireError as err:
            conn.error = str(err)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            conn.queue.put_nowait(None)

    def _handle(self, rid: str, msg: epb.RunnerMessage) -> None:
        now, st, kind = self.clock(), self.state, msg.WhichOneof("body")
        if kind == "turn":
            st.on_turn(rid, ewire.turn_request_from_pb(msg.turn), now)
        elif kind == "result":
            st.on_episode_result(rid, ewire.result_from_pb(msg.result), now)
        elif kind == "heartbeat":
            st.on_runner_heartbeat(rid, now)
        elif kind == "drain":
            st.on_runner_drain(rid, now)
            log.info("env-runner draining", extra={"runner_id": rid, "reason": msg.drain.reason})
        elif kind == "register":
            raise WireError("register: sent twice on one stream; open a new stream to re-register")
        else:
            raise WireError("body: empty RunnerMessage; set one of turn, result, heartbeat, drain")
        if st.dirty or st.effects.delivered or st.runners.outboxes:
            self.kick()


def _outbox_to_pb(box: RunnerOutbox) -> list[epb.RunnerCommand]:
    """Cancels first (an episode taken back is not continued), then turn results, then new episodes."""
    out = [ewire.cancel_to_pb(EpisodeCancel(ids, reason)) for reason, ids in box.cancel.items()]
    out += [ewire.turn_result_to_pb(t) for t in box.turns]
    if box.assign:
        out.append(ewire.assign_to_pb(box.assign))
    return out
