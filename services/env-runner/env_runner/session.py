"""The env-runner's Attach loop: one bidirectional gRPC stream to the rollout-manager (episodes.proto).

Register (id, node, capacity), then drive each assigned episode in a task of its own: every model turn is a
TurnRequest on the stream whose TurnResult resolves the turn's future; the finished episode goes back as an
EpisodeResult. An EpisodeCancel stops an episode. A heartbeat every `heartbeat_interval_ms` says how many
episodes run and how many are in their tools. Writes go through one outbox (gRPC allows one pending write).

A stream that breaks takes its episodes with it (the manager starts them again on a runner; their environments'
state cannot move) and the runner reconnects with back-off. Drain (SIGTERM): a DrainNotice, no new episodes, the
running ones get `drain_timeout` seconds to finish, then the stream closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from rlboost.auth.grpc_auth import ClientAuth
from rlboost.environments.chat import ChatFormat
from rlboost.environments.sandbox import EnvFailure, EnvPool
from rlboost.options.env_runner import EnvRunnerOptions
from rlboost.rollout.v1 import episodes_pb2 as epb
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1.episodes_pb2_grpc import EpisodeRunnersStub
from rlboost.wire import episode_proto as ewire
from rlboost.wire.episode_io import EpisodeAssignment, EpisodeResult, RunnerRegistration, TurnRequest, TurnResult
from rlboost.wire.rollout_io import EpisodeStats
from rlboost.wire.rollout_proto import WireError, grpc_message_options

from . import metrics
from .episode import EpisodeRun, HarnessRun
from .gateway import ChatGateway, serve_gateway

log = logging.getLogger(__name__)


class NotConnectedError(Exception):
    """The manager could not be reached or refused the registration."""


class ManagerUnreachableError(RuntimeError):
    """The manager stayed unreachable past --reconnect-timeout."""


class RunnerSession:
    """Runs until drained (returns) or the manager stays unreachable (raises ManagerUnreachableError)."""

    def __init__(
        self, options: EnvRunnerOptions, fmt: ChatFormat, pool: EnvPool, capacity: int, auth: ClientAuth | None = None
    ) -> None:
        self.options, self.fmt, self.pool, self.capacity = options, fmt, pool, capacity
        self.auth = auth or ClientAuth()
        self.registration = RunnerRegistration(options.runner_id, options.node, capacity)
        self.session_token = ""
        self.episodes: dict[str, asyncio.Task] = {}
        self.turns: dict[tuple[str, int], asyncio.Future[TurnResult]] = {}
        self.outbox: asyncio.Queue[epb.RunnerMessage | None] | None = None
        self.draining = False
        self.registered = asyncio.Event()
        self.gateway = ChatGateway(fmt, self._turn, pool.config.gateway_socket)
        metrics.CAPACITY.set(capacity)

    # ---- public ------------------------------------------------------------------------------

    async def run(self) -> None:
        served = []  # the endpoint: on its Unix socket (confined harnesses), and on loopback TCP for verifiers
        if self.gateway.socket_path:
            served.append((await serve_gateway(self.gateway, path=self.gateway.socket_path))[0])
        if self.pool.config.verifiers:
            runner, port = await serve_gateway(self.gateway, "127.0.0.1", 0)
            served.append(runner)
            self.gateway.tcp_url = f"http://127.0.0.1:{port}/v1"
        try:
            await self._attached()
        finally:
            for runner in served:
                await runner.cleanup()

    async def _attached(self) -> None:
        while not self.draining:
            try:
                async for attempt in AsyncRetrying(
                    stop=stop_after_delay(self.options.reconnect_timeout),
                    wait=wait_exponential(multiplier=0.1, max=2.0),
                    retry=retry_if_exception_type(NotConnectedError),
                    reraise=True,
                ):
                    with attempt:
                        await self._connect_once()
            except NotConnectedError as err:
                raise ManagerUnreachableError(f"rollout-manager at {self.options.manager} unreachable: {err}") from None

    async def drain(self, reason: str) -> None:
        """SIGTERM: no new episodes; the running ones get drain_timeout seconds; then the stream closes."""
        if self.draining:
            return
        self.draining = True
        log.info("draining", extra={"reason": reason, "episodes": len(self.episodes)})
        self._put(
            epb.RunnerMessage(drain=pb.DrainNotice(reason=reason, deadline_ms=int(self.options.drain_timeout * 1000)))
        )
        running = list(self.episodes.values())
        if running:
            await asyncio.wait(running, timeout=self.options.drain_timeout)
        self._put(None)

    # ---- one connection ----------------------------------------------------------------------

    async def _connect_once(self) -> None:
        async with self.auth.aio_channel(self.options.manager, options=grpc_message_options()) as channel:
            call = EpisodeRunnersStub(channel).Attach()
            heartbeat_s = await self._register(call)
            self.outbox = asyncio.Queue()
            tasks = [asyncio.create_task(self._writer(call)), asyncio.create_task(self._heartbeats(heartbeat_s))]
            try:
                await self._reader(call)
            finally:
                for t in tasks:
                    t.cancel()
                self.outbox = None
                self.registered.clear()
                await self._lose_episodes()
        if not self.draining:
            log.warning("stream to the manager ended; reconnecting", extra={"manager": self.options.manager})

    async def _register(self, call) -> float:
        """Send RunnerRegister and read RunnerRegistered; the heartbeat period (s). NotConnectedError if refused."""
        try:
            await call.write(ewire.register_to_pb(self.registration, self.session_token))
            first = await call.read()
        except grpc.aio.AioRpcError as err:
            if err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED):
                raise  # not worth retrying: the message says what to fix
            raise NotConnectedError(f"{err.code().name}: {err.details()}") from None
        if first is grpc.aio.EOF or first.WhichOneof("body") != "registered":
            raise NotConnectedError("the manager closed the stream before RunnerRegistered")
        self.session_token = first.registered.session_token
        self.registered.set()
        log.info("registered", extra={"manager": self.options.manager, "capacity": self.capacity})
        return max(0.05, first.registered.heartbeat_interval_ms / 1000)

    async def _reader(self, call) -> None:
        while True:
            try:
                msg = await call.read()
            except grpc.aio.AioRpcError as err:
                if not self.draining:
                    log.warning("manager stream broke", extra={"error": f"{err.code().name}: {err.details()}"})
                return
            if msg is grpc.aio.EOF:
                return
            try:
                self._handle(msg)
            except WireError as err:
                log.error("bad message from the manager ignored", extra={"error": str(err)})

    def _handle(self, msg: epb.RunnerCommand) -> None:
        kind = msg.WhichOneof("body")
        if kind == "assign":
            for a in ewire.assign_from_pb(msg.assign):
                self._start(a)
        elif kind == "turn":
            t = ewire.turn_result_from_pb(msg.turn)
            fut = self.turns.pop((t.episode_id, t.turn), None)
            if fut is not None and not fut.done():
                fut.set_result(t)
        elif kind == "cancel":
            for eid in msg.cancel.episode_ids:
                if (task := self.episodes.pop(eid, None)) is not None:
                    task.cancel()
            log.info("episodes cancelled", extra={"episodes": len(msg.cancel.episode_ids), "reason": msg.cancel.reason})

    async def _writer(self, call) -> None:
        assert self.outbox is not None
        while (msg := await self.outbox.get()) is not None:
            try:
                await call.write(msg)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                return
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await call.done_writing()

    async def _heartbeats(self, period_s: float) -> None:
        while True:
            await asyncio.sleep(period_s)
            in_tools = len(self.episodes) - len(self.turns)
            metrics.RUNNING.set(len(self.episodes))
            metrics.IN_TOOLS.set(max(0, in_tools))
            self._put(epb.RunnerMessage(heartbeat=epb.RunnerHeartbeat(running=len(self.episodes), in_tools=in_tools)))

    def _put(self, msg: epb.RunnerMessage | None) -> None:
        if self.outbox is not None:
            self.outbox.put_nowait(msg)

    async def _lose_episodes(self) -> None:
        """The stream ended: its episodes stop here (the manager starts them again elsewhere)."""
        tasks, self.episodes = list(self.episodes.values()), {}
        for t in tasks:
            t.cancel()
        for fut in self.turns.values():
            fut.cancel()
        self.turns.clear()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- episodes ----------------------------------------------------------------------------

    def _start(self, a: EpisodeAssignment) -> None:
        if self.draining:
            return  # a draining runner takes none (the manager assigns none after its DrainNotice)
        if (old := self.episodes.pop(a.episode_id, None)) is not None:
            old.cancel()  # assigned again (its lease was taken back meanwhile): the manager's newer lease wins
        self.episodes[a.episode_id] = asyncio.create_task(self._episode(a), name=f"episode {a.episode_id}")
        metrics.RUNNING.set(len(self.episodes))

    async def _episode(self, a: EpisodeAssignment) -> None:
        try:
            result = await self._drive(a)
            self._put(ewire.result_to_pb(result))
        finally:
            if self.episodes.get(a.episode_id) is asyncio.current_task():
                del self.episodes[a.episode_id]
            metrics.RUNNING.set(len(self.episodes))

    async def _drive(self, a: EpisodeAssignment) -> EpisodeResult:
        try:
            env = await self.pool.acquire()
        except EnvFailure as err:
            metrics.ENV_FAILURES.labels(err.reason).inc()
            stats = EpisodeStats(env_error=f"{err.reason}: {err.detail}")
            return EpisodeResult(a.episode_id, a.lease_epoch, [], [], [], b"", "failed", 0, stats=stats)
        try:
            return await (HarnessRun if env.kind == "harness" else EpisodeRun)(a, env, self.gateway).run()
        finally:
            self.pool.release(env)

    async def _turn(self, request: TurnRequest) -> TurnResult:
        """One model turn through the manager: sent, and awaited until its TurnResult arrives."""
        fut: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        self.turns[(request.episode_id, request.turn)] = fut
        self._put(ewire.turn_request_to_pb(request))
        start = time.monotonic()
        try:
            return await fut
        finally:
            self.turns.pop((request.episode_id, request.turn), None)
            metrics.TURN_SECONDS.observe(time.monotonic() - start)
