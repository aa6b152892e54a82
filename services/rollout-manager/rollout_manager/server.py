"""The rollout-manager's gRPC edge (grpc.aio): worker streams, the trainer's Rollout, GetStatus.

Converts protobuf <-> domain types with rlboost.wire.rollout_proto and drives the pure
`ManagerState` and its `OffloadController` (offload.py), giving both the time. Everything runs in one asyncio loop: readers update the state, then wake the
scheduler task, which places work and flushes batched commands to each worker's send queue.

    manager = RolloutManagerServer(spec.rollout)
    port = await manager.start("127.0.0.1", 0)   # 0 = pick a free port
    ...
    await manager.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple

import grpc

from rlboost.auth.grpc_auth import ServerAuth
from rlboost.auth.worker_identity import IdentityRefused, WorkerIdentityVerifier
from rlboost.observability import LoopWatchdog
from rlboost.policies.cadence import CadenceTracker
from rlboost.policies.migration import MigrationReason
from rlboost.policies.offload import OffloadWindow
from rlboost.policies.partial_rollout import stream_ended, stream_target
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1 import rollout_pb2_grpc as pb_grpc
from rlboost.spec import RolloutSpec
from rlboost.wire import rollout_proto as wire
from rlboost.wire.rollout_io import Pool, RolloutRequest, Trajectory, request_id

from . import metrics
from .effects import Outbox
from .episode_edge import RunnerEdge
from .identity import SessionRefused, WorkerSessions
from .offload import OffloadController
from .state import ManagerState
from .steps import RequestPolicy, StepError
from .tickets import TicketBook

log = logging.getLogger(__name__)


class PortInUseError(OSError):
    """The gRPC port could not be bound."""


class StepFailed(NamedTuple):
    """Marks, in a step's result queue, that the step failed (a request used up its attempts), and why."""

    reason: str


class _WorkerConn:
    """One worker's open Connect stream: its send queue and why it ended, if malformed."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[pb.ManagerMessage | None] = asyncio.Queue()
        self.error: str | None = None


class RolloutManagerServer(pb_grpc.RolloutManagerServicer):
    """The RolloutManager gRPC service around one ManagerState."""

    def __init__(
        self,
        rollout: RolloutSpec,
        balance_interval_s: float = 1.0,
        offload: OffloadWindow | None = None,
        clock=time.monotonic,
        auth: ServerAuth | None = None,
        health_max_lag_s: float = 10.0,
        tickets: TicketBook | None = None,
        colocation_ack_key: Callable[[str], str] | None = None,
        identities: WorkerIdentityVerifier | None = None,
        register_timeout_s: float = 10.0,
    ) -> None:
        """`auth`: role tokens and TLS (identity.METHOD_ROLES); None = open and plaintext (no credentials dir).
        `tickets`: assignment tickets (tickets.py), checked on held responses; None = none given, held
        responses adopted unchecked (no credentials dir: anyone may connect as any worker anyway).
        `colocation_ack_key`: a reserved worker id's own colocation-ack key (rlboost.auth.colocation_acks), given
        in its Registered; None = none given (no credentials dir: the trainer checks no acks either).
        `identities`: checks each Register's identity proof against the id and pool it claims
        (rlboost.auth.worker_identity); None = ids taken as asserted (no credentials dir)."""
        self.rollout = rollout
        self.identities = identities
        self.register_timeout_s = register_timeout_s  # a stream's first message (Register) comes within it
        self.auth = auth or ServerAuth()
        self.tickets = tickets
        self.colocation_ack_key = colocation_ack_key
        self.sessions = WorkerSessions()
        self.clock = clock
        self.state = ManagerState(
            lease_timeout_s=rollout.lease_timeout_ms / 1000, policy=RequestPolicy.from_spec(rollout)
        )
        self.balance_interval_s = balance_interval_s
        self.offload = OffloadController(self.state, offload)  # offload None: reserved workers run to the end
        self.runner_edge = RunnerEdge(self.state, rollout, self.clock, self.kick)  # env-runners (agentic episodes)
        self._conns: dict[str, _WorkerConn] = {}
        self._sinks: dict[int, asyncio.Queue[Trajectory | StepFailed | None]] = {}  # None: shutting down
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._server: grpc.aio.Server | None = None
        self._last_balance = 0.0
        self.watchdog = LoopWatchdog(max_lag_s=health_max_lag_s)
        self.cadence = CadenceTracker(rollout)  # the workers' chunk bounds, stretched with the fleet
        metrics.CHUNK_MAX_MS.set(self.cadence.current.max_ms)
        self._preemption_flush_bounds()
        self._received = {kind: metrics.WORKER_MESSAGES.labels(kind) for kind in _WORKER_MESSAGE_KINDS}

    # ---- lifecycle ---------------------------------------------------------------------------------

    async def start(self, host: str, port: int) -> int:
        """Bind and serve; returns the bound port. Raises PortInUseError when it cannot bind."""
        # bdp_probe off: the pings that size each connection's receive window cost the manager a send per ping on
        # every one of 1,000 worker connections (a quarter of its CPU at 100 workers), while what it receives
        # (small chunk batches, one RolloutRequest) never needs more than the default 64 KiB window
        options = [("grpc.so_reuseport", 0), ("grpc.http2.bdp_probe", 0), *wire.grpc_message_options()]
        self._server = grpc.aio.server(options=options, interceptors=self.auth.interceptors)
        pb_grpc.add_RolloutManagerServicer_to_server(self, self._server)
        self.runner_edge.add_to(self._server)
        try:
            bound = self.auth.add_port(self._server, f"{host}:{port}")
        except RuntimeError as err:
            raise PortInUseError(f"cannot listen on {host}:{port}: {err}") from None
        if bound == 0:
            raise PortInUseError(f"cannot listen on {host}:{port}: address in use or not available")
        await self._server.start()
        self._last_balance = self.clock()
        self._tasks = [asyncio.create_task(self._scheduler()), asyncio.create_task(self._ticker())]
        self.watchdog.start()
        log.info("rollout-manager listening", extra={"host": host, "port": bound})
        return bound

    async def stop(self, grace: float = 1.0) -> None:
        """End every open stream cleanly, then stop serving."""
        for conn in self._conns.values():
            conn.queue.put_nowait(None)
        self.runner_edge.stop()
        for sink in self._sinks.values():
            sink.put_nowait(None)
        await self.watchdog.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self._server is not None:
            await self._server.stop(grace)

    def healthy(self) -> bool:
        """Serving and making progress: its loop turns (no block over health_max_lag_s) and the scheduler and
        ticker tasks run."""
        return self.watchdog.healthy() and all(not t.done() for t in self._tasks)

    def kick(self) -> None:
        """Something changed: schedule and flush on the scheduler task's next turn."""
        self._wake.set()

    async def _scheduler(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._run_policies()

    async def _ticker(self) -> None:
        period = min(self.rollout.heartbeat_interval_ms, self.rollout.lease_timeout_ms) / 4000
        while True:
            await asyncio.sleep(period)
            now = self.clock()
            self.state.tick(now)
            if now - self._last_balance >= self.balance_interval_s:
                self._last_balance = now
                self.state.balance(now)
            self.offload.tick(now, period)
            self._retune_cadence()
            self._run_policies()

    def _retune_cadence(self) -> None:
        """rollout.maxChunkMessagesPerS: the fleet grew or shrank enough that every worker flushes at a new period."""
        bounds = self.cadence.update(len(self._conns))
        if bounds is None:
            return
        metrics.CHUNK_MAX_MS.set(bounds.max_ms)
        self._preemption_flush_bounds()
        log.info(
            "chunk cadence changed",
            extra={"workers": len(self._conns), "chunk_max_ms": bounds.max_ms, "chunk_max_tokens": bounds.max_tokens},
        )
        msg = pb.ManagerMessage(
            chunk_cadence=pb.ChunkCadence(chunk_max_tokens=bounds.max_tokens, chunk_max_ms=bounds.max_ms)
        )
        for conn in self._conns.values():
            conn.queue.put_nowait(msg)

    def _preemption_flush_bounds(self) -> None:
        """A killed worker's unsent tokens are bounded by the cadence it flushed at (preemption_costs.py)."""
        bounds = self.cadence.current
        self.state.lifecycle.costs.flush_bounds = (bounds.max_tokens, bounds.max_ms / 1000)

    def _run_policies(self) -> None:
        now = self.clock()
        if self.state.dirty:
            self.state.schedule(now)
        self._flush()

    def _flush(self) -> None:
        for wid, box in self.state.take_outbox().items():
            conn = self._conns.get(wid)
            if conn is not None:
                if self.tickets is not None:  # the worker hands it back if it holds the response across a restart
                    for a in box.assign:
                        a.ticket = self.tickets.issue(a.request_id, wid, a.lease_epoch)
                for msg in _outbox_to_pb(box):
                    conn.queue.put_nowait(msg)
        for traj in self.state.take_delivered():
            sink = self._sinks.get(self.state.delivery_step(traj))
            if sink is not None:
                sink.put_nowait(traj)
        for step, why in self.state.take_failed_steps().items():
            sink = self._sinks.get(step)
            if sink is not None:
                sink.put_nowait(StepFailed(why))
            else:  # nobody waits for it: drop the rest of the step now
                self.state.cancel_step(step, self.clock())
        self.runner_edge.flush()  # after the step's failures: a cancelled episode's turn result is not sent

    # ---- worker stream -----------------------------------------------------------------------------

    async def Connect(  # noqa: N802 (gRPC method name)
        self, request_iterator: AsyncIterator[pb.WorkerMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ManagerMessage]:
        try:
            async with asyncio.timeout(self.register_timeout_s):
                first = await anext(request_iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            metrics.IDENTITY_REFUSED.labels("no_register").inc()
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"register: no Register within {self.register_timeout_s:g}s of opening the stream (--register-timeout)",
            )
        if first.WhichOneof("body") != "register":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "body: the first message must be register")
        try:
            reg = wire.registration_from_pb(first.register)
            held = wire.held_from_pb(first.register)
        except wire.WireError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        wid = reg.worker_id
        if (refusal := self._identity_refusal(first.register.identity_proof, wid, reg.pool)) is not None:
            await context.abort(*refusal)
        try:
            session = self.sessions.admit(wid, first.register.session_token, self._live(wid))
        except SessionRefused as err:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(err))
        old = self._conns.get(wid)
        if old is not None:  # the same worker reconnecting (or a new one after its lease expired) replaces it
            old.queue.put_nowait(None)
        conn = self._conns[wid] = _WorkerConn()
        self.state.register(reg, self.clock())
        if self.tickets is not None:  # only what this session's worker id was assigned
            held = self.tickets.admit(wid, held)
        self.state.on_held(wid, held, self.clock())  # after a manager restart: what it kept of its responses
        log.info(
            "worker registered",
            extra={"worker_id": wid, "pool": reg.pool.value, "capacity": reg.capacity, "held": len(held)},
        )
        r, bounds = self.rollout, self.cadence.current  # the cadence the fleet flushes at now
        yield pb.ManagerMessage(
            registered=pb.Registered(
                heartbeat_interval_ms=r.heartbeat_interval_ms,
                lease_timeout_ms=r.lease_timeout_ms,
                chunk_max_tokens=bounds.max_tokens,
                chunk_max_ms=bounds.max_ms,
                session_token=session,
                packed_tokens=True,
                colocation_ack_key=self._ack_key(wid, reg.pool),
            )
        )
        self.kick()
        reader = asyncio.create_task(self._read(wid, request_iterator, conn))
        try:
            while (msg := await conn.queue.get()) is not None:
                yield msg
            if conn.error:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, conn.error)
        finally:
            reader.cancel()
            if self._conns.get(wid) is conn:
                del self._conns[wid]
                self.sessions.end(wid)
                n = self.state.remove_worker(wid, MigrationReason.STREAM_BROKEN, self.clock())
                log.info("worker stream ended", extra={"worker_id": wid, "migrated": n, "error": conn.error})
                self.kick()

    def _identity_refusal(self, proof: str, wid: str, pool: Pool) -> tuple[grpc.StatusCode, str] | None:
        """Why a stream may not register as `wid` of `pool` (status and message), or None when its proof says
        it is that worker (or this manager checks no proofs)."""
        if self.identities is None:
            return None
        try:
            self.identities.verify(proof, wid, pool.value)
        except IdentityRefused as err:
            reason = "denied" if err.denied else "unauthenticated"
            metrics.IDENTITY_REFUSED.labels(reason).inc()
            log.warning(
                "worker refused", extra={"worker_id": wid, "pool": pool.value, "reason": reason, "error": str(err)}
            )
            code = grpc.StatusCode.PERMISSION_DENIED if err.denied else grpc.StatusCode.UNAUTHENTICATED
            return code, str(err)
        return None

    def _live(self, wid: str) -> bool:
        """A stream is open for `wid` and its worker is not silent past its lease."""
        worker = self.state.workers.get(wid)
        return wid in self._conns and worker is not None and not worker.expired

    def _ack_key(self, worker_id: str, pool: Pool) -> str:
        """The colocation-ack key of a reserved worker (bound to `worker_id`, this stream's session); '' else."""
        if self.colocation_ack_key is None or pool != Pool.RESERVED:
            return ""
        return self.colocation_ack_key(worker_id)

    async def _read(self, wid: str, it: AsyncIterator[pb.WorkerMessage], conn: _WorkerConn) -> None:
        try:
            async for msg in it:
                if self._conns.get(wid) is not conn:
                    return
                self._handle(wid, msg)
        except wire.WireError as err:
            conn.error = str(err)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            conn.queue.put_nowait(None)

    def _handle(self, wid: str, msg: pb.WorkerMessage) -> None:
        now = self.clock()
        kind = msg.WhichOneof("body")
        st = self.state
        if kind in self._received:
            self._received[kind].inc()
        if kind == "chunks":
            chunks, bounds = wire.chunks_from_pb(msg.chunks)
            st.on_chunks(wid, chunks, now, bounds)
        elif kind == "heartbeat":
            st.on_heartbeat(wid, msg.heartbeat.weight_version, now, msg.heartbeat.memory_released)
        elif kind == "weight_version":
            st.on_weight_version(wid, msg.weight_version.weight_version, now)
        elif kind == "drain":
            st.on_drain_notice(wid, now)
            log.info("worker draining", extra={"worker_id": wid, "reason": msg.drain.reason})
        elif kind == "register":
            raise wire.WireError("register: sent twice on one stream; open a new stream to re-register")
        else:
            raise wire.WireError("body: empty WorkerMessage; set one of chunks, heartbeat, drain, weight_version")
        if st.dirty or st.effects.delivered:
            self.kick()

    # ---- trainer -----------------------------------------------------------------------------------

    async def Rollout(  # noqa: N802
        self, request: pb.RolloutRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.TrajectoryBatch]:
        try:
            req = wire.rollout_request_from_pb(request)
            if req.step in self._sinks or self.state.has_step(req.step):  # refused, and the first call untouched
                await context.abort(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"rollout.step: step {req.step} is already being rolled out; wait for it or cancel it",
                )
            total = self.state.add_step(req, self.clock())
        except (wire.WireError, StepError) as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        sink: asyncio.Queue[Trajectory | StepFailed | None] = asyncio.Queue()
        self._sinks[req.step] = sink
        packed = request.packed_trajectories  # the trainer reads packed tokens: no per-token protobuf objects
        # grpc.aio does not interrupt a handler blocked on our queue when the client cancels: wake it
        context.add_done_callback(lambda _: sink.put_nowait(None))
        self.offload.start_step(self.clock())
        log.info(
            "rollout step started",
            extra={
                "step": req.step,
                "requests": total,
                "version": req.weight_version,
                "already_received": len(req.received_request_ids),
            },
        )
        self.kick()
        delivered = 0
        target = GroupTarget(req) if req.target_groups else None  # partial rollout: end at the target
        try:
            while delivered < total and not (target and target.reached):
                traj = await sink.get()
                if isinstance(traj, StepFailed):
                    await context.abort(grpc.StatusCode.ABORTED, f"step {req.step} failed: {traj.reason}")
                if traj is None:
                    if context.cancelled() or context.done():
                        return  # the trainer went away; `finally` drops the step
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "rollout-manager shutting down; retry the step")
                batch = [traj, *_drain_ready(sink)]  # everything finished so far, in messages bounded by bytes
                if not isinstance(batch[-1], Trajectory):
                    sink.put_nowait(batch.pop())  # an end marker: handled on the next turn
                delivered += len(batch)
                if target is not None:
                    target.count(batch)
                for msg in _batches(batch, packed):
                    yield msg
        finally:
            if self._sinks.get(req.step) is sink:
                del self._sinks[req.step]
            if delivered < total and not (target and target.reached):
                n = self.state.cancel_step(req.step, self.clock())
                log.info("rollout cancelled", extra={"step": req.step, "dropped": n})
                self.kick()
            else:
                if delivered < total:  # partial rollout: the rest goes on into the next step, with what finished
                    late = [t for t in _drain_all(sink) if isinstance(t, Trajectory)]  # while the last batch went
                    n = self.state.carry_step(req.step, late)
                    log.info("rollout step reached its target", extra={"step": req.step, "carried": n})
                self.offload.end_step(self.clock())
                self.kick()  # the reserved pool takes work again
                log.info("rollout step delivered", extra={"step": req.step, "trajectories": delivered})

    async def GetStatus(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.StatusReply:  # noqa: N802
        return wire.status_to_pb(self.state.status(self.clock()))


class GroupTarget:
    """Partial rollout: counts a stream's complete groups (its new prompts' and the carried ones') towards
    RolloutRequest.target_groups."""

    def __init__(self, r: RolloutRequest) -> None:
        received = set(r.received_request_ids)
        owed = [
            ((r.step, p.prompt_index), request_id(r.step, p.prompt_index, g))
            for p in r.prompts
            for g in range(r.group_size)
        ]
        owed += [
            ((c.step, c.prompt_index), request_id(c.step, c.prompt_index, g))
            for c in r.carried
            for g in c.sample_indices
        ]
        self.left = Counter(group for group, rid in owed if rid not in received)
        self.want = stream_target(r.target_groups, len(self.left))
        self.done = 0

    @property
    def reached(self) -> bool:
        return stream_ended(self.done, self.want)

    def count(self, batch: list[Trajectory]) -> None:
        for t in batch:
            group = (t.step, t.prompt_index)
            self.left[group] -= 1
            self.done += self.left[group] == 0


_WORKER_MESSAGE_KINDS = ("chunks", "heartbeat", "weight_version", "drain")


def _outbox_to_pb(box: Outbox) -> list[pb.ManagerMessage]:
    """One message per kind: assignments batched, revokes batched per reason; drain last."""
    out = []
    if box.revoke:
        out += [pb.ManagerMessage(revoke=pb.Revoke(request_ids=ids, reason=r)) for r, ids in box.revoke.items()]
    if box.set_version is not None:
        out.append(pb.ManagerMessage(set_weight_version=pb.SetWeightVersion(weight_version=box.set_version)))
    if box.assign:
        out.append(pb.ManagerMessage(assign=pb.AssignBatch(assignments=[wire.assignment_to_pb(a) for a in box.assign])))
    if box.drain is not None:
        out.append(pb.ManagerMessage(drain=pb.DrainCommand(reason=box.drain)))
    return out


def _drain_ready(queue: asyncio.Queue) -> list:
    """Everything already queued, without waiting; stops after an end marker (None, StepFailed)."""
    out = []
    while not queue.empty():
        item = queue.get_nowait()
        out.append(item)
        if not isinstance(item, Trajectory):
            break
    return out


def _drain_all(queue: asyncio.Queue) -> list:
    """Everything queued, without waiting."""
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


def _batches(
    trajectories: list[Trajectory], packed: bool = False, max_bytes: int = wire.TRAJECTORY_BATCH_BYTES
) -> list[pb.TrajectoryBatch]:
    """The trajectories as TrajectoryBatch messages of at most `max_bytes` each (one alone may be larger: the
    spec's bounds on prompt and response lengths keep it far below the gRPC message limit)."""
    out: list[pb.TrajectoryBatch] = []
    current, size = pb.TrajectoryBatch(), 0
    for t in trajectories:
        msg = wire.trajectory_to_pb(t, packed)
        n = msg.ByteSize() + 8  # + the field's tag and length prefix
        if current.trajectories and size + n > max_bytes:
            out.append(current)
            current, size = pb.TrajectoryBatch(), 0
        current.trajectories.append(msg)
        size += n
    if current.trajectories:
        out.append(current)
    return out
