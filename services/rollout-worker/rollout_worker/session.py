"""The worker's Connect loop: one bidirectional gRPC stream to the rollout-manager.

Register (id, pool, node, capacity, weight version, engine), then run assignments on the engine and stream
their tokens as ChunkBatch messages (bounded per request by `chunk_max_tokens` and `chunk_max_ms`, both from
Registered, later from ChunkCadence: the manager stretches them as the fleet grows), heartbeat every
`heartbeat_interval_ms` unless a ChunkBatch left within that period (the manager counts any message as a sign
of life), and obey Revoke, DrainCommand and SetWeightVersion.

Contract for requests that stop early: a revoked, drained or otherwise aborted request's last chunk has
`finished=false, finish_reason="abort"` (possibly with no tokens). It tells the manager that every token
generated here has been sent and the request may continue elsewhere from prompt + those tokens.

Drain (SIGTERM or DrainCommand): stop taking work (new assignments are answered with an empty abort chunk),
send a DrainNotice (SIGTERM only), flush every token at once (with a long cadence, much may be buffered),
abort running requests, flush what they made since, close the stream. A stream
that breaks pauses the running requests, keeping their tokens (held.py), and reconnects with backoff; the next
Register reports them (`held`), so a restarted manager continues them from there instead of from scratch.

Collaborators: registration.py (Register / Registered, and what one registration hands the next), link.py
(one stream's outgoing side: outbox, chunk flushing, heartbeats, and the tasks of the requests running on it).

Colocation (`trainer.colocateReserved`, reserved workers): release() stops taking work (assignments that
arrive are held; every heartbeat says `memory_released` from then on, read from the engine), aborts whatever still runs (the manager requeues it; normally nothing, the step's batch
is complete), waits for any weight update in flight and frees the engine's memory; weight versions announced
meanwhile are remembered. resume() takes the memory back, then syncs to the newest announced version and
starts the held assignments (each once the engine holds its version). The manager places work only on
workers holding the work's version, so a worker that resumed is given the next step's work after it synced.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from rlboost.auth.grpc_auth import ClientAuth
from rlboost.observability import monotonic_ms
from rlboost.options.worker import WorkerOptions
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.rollout.v1.rollout_pb2_grpc import RolloutManagerStub
from rlboost.wire.rollout_io import Assignment
from rlboost.wire.rollout_proto import WireError, assignment_from_pb, grpc_message_options
from rollout_worker import metrics
from rollout_worker.engine.base import FINISH_ABORT, Engine, MemoryReport, RepeatedLog
from rollout_worker.errors import ManagerUnreachableError, NotConnectedError, describe
from rollout_worker.held import HeldResponses
from rollout_worker.link import ManagerLink
from rollout_worker.registration import Registration
from rollout_worker.startup import StartupClock

log = logging.getLogger(__name__)

ABORT_WAIT_S = 5.0  # how long an abort may take to stop every request of a stream before they are cancelled
KEEP_FINISHED_S = 30.0  # finished responses are kept this long for a manager that restarts


class WorkerSession:
    """Runs until drained (returns) or the manager stays unreachable (raises ManagerUnreachableError)."""

    def __init__(
        self, options: WorkerOptions, engine: Engine, pull: Callable | None = None, auth: ClientAuth | None = None
    ) -> None:
        """`pull(version)` is an async callable returning an object with .state, .checksum (a WeightPuller.pull);
        `auth`: the worker token and the job CA (None: an open manager)."""
        self.options = options
        self.auth = auth or ClientAuth()
        self.engine = engine
        self.pull = pull
        self.link: ManagerLink | None = None
        self.draining = False
        self._drain_request: tuple[str, bool] = ("", False)  # (reason, notice) of the drain asked for
        self.drained = asyncio.Event()
        self.registrations = 0
        self._held: list[Assignment] = []  # assignments waiting for a newer weight version
        self._update_lock = asyncio.Lock()
        self._bg: set[asyncio.Task] = set()
        self._tokens_total = 0
        self._held_while_released: list[Assignment] = []  # assignments that arrived while the memory was released
        self._deferred_version = 0  # newest version announced while released: synced on resume
        self._memory_lock = asyncio.Lock()
        self._errors = RepeatedLog(log)  # a failure repeated per request logs one line with a count
        self.held = HeldResponses(engine.capacity, KEEP_FINISHED_S)  # responses a restarted manager adopts
        self.registration = Registration(options, engine, self.held)
        self.startup: StartupClock | None = None  # the start-up's parts; the first assignment is its last (startup.py)

    # ---- public ------------------------------------------------------------------------------

    async def run(self) -> None:
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
        self.drained.set()

    def request_drain(self, reason: str, notice: bool = True) -> None:
        """Stop taking work, flush everything, close the stream (SIGTERM: notice=True sends a DrainNotice)."""
        if self.draining:
            return
        self.draining = True
        self._drain_request = (reason, notice)
        log.info("draining", extra={"reason": reason})
        self._spawn(self._drain(reason, notice))

    def schedule_update(self, version: int) -> None:
        """Pull and apply `version` in the background (NATS announcement, SetWeightVersion, newer assignment)."""
        if self.engine.memory_released:
            self._deferred_version = max(self._deferred_version, version)
        elif self.pull is not None and version > self.engine.weight_version:
            self._spawn(self._update_to(version))

    @property
    def released(self) -> bool:
        return self.engine.memory_released

    @property
    def colocation_ack_key(self) -> str:
        """The key this worker's colocation acks are MACed with, from the manager's last Registered."""
        return self.registration.colocation_ack_key

    async def release(self, step: int) -> MemoryReport:
        """Colocation: stop taking work and free the engine's memory while the trainer trains step `step`."""
        async with self._memory_lock:
            link = self.link
            self.engine.hold_for_release()  # announced before the aborts, so their requests do not come straight back here
            self._send_heartbeat()
            try:
                if link is not None and link.tasks:
                    log.warning("release with requests running: they go back to the manager", extra={"step": step})
                    await self._abort_all(link, "release")
                async with self._update_lock:  # a weight update in flight finishes first
                    report = await self.engine.release_memory()
            except BaseException:
                await self.engine.resume_memory()  # not released after all: a no-op that takes work again
                self._take_work_again()
                raise
            _record(report)
            log.info("engine memory released for training", extra={"step": step, **_fields(report)})
            return report

    async def resume(self, step: int) -> MemoryReport:
        """Colocation: take the memory back, sync to the newest announced version, start held assignments."""
        async with self._memory_lock:
            report = await self.engine.resume_memory()
            _record(report)
            log.info("engine memory resumed after training", extra={"step": step, **_fields(report)})
            self._take_work_again()
            return report

    def _take_work_again(self) -> None:
        """After a resume (or a release that failed): say so, sync to the newest version, start the work held."""
        self._send_heartbeat()  # capacity again, without waiting a heartbeat period
        version, self._deferred_version = self._deferred_version, 0
        self.schedule_update(version)
        held, self._held_while_released = self._held_while_released, []
        link = self.link
        if link is not None:
            for a in held:
                self._assign(link, a)

    # ---- one connection ----------------------------------------------------------------------

    async def _connect_once(self) -> None:
        """Register and serve one stream until it ends; raises NotConnectedError if registration fails."""
        if self.draining:
            return
        async with self.auth.aio_channel(self.options.manager, options=grpc_message_options()) as channel:
            call = RolloutManagerStub(channel).Connect()
            registered = await self.registration.register(call)
            link = self.link = ManagerLink(call, registered, self.engine, lambda: self._tokens_total)
            self.registrations += 1
            metrics.CONNECTS.inc()
            metrics.RECONNECTS.inc(self.registrations > 1)
            log.info(
                "registered",
                extra={
                    "manager": self.options.manager,
                    "weight_version": self.engine.weight_version,
                    "reconnect": self.registrations > 1,
                },
            )
            link.start()
            if self.draining:  # asked while this stream was registering: _drain saw no link then
                self._spawn(self._drain(*self._drain_request))
            try:
                await self._reader(link)
            finally:
                self.link = None
                self._keep_for_next_manager(link)
                await self._abort_all(link, "disconnect")
                await link.stop()
        if not self.draining:  # run() starts a fresh retry window: a lost stream is not a failed attempt
            log.warning("stream to the manager ended; reconnecting", extra={"manager": self.options.manager})

    def _keep_for_next_manager(self, link: ManagerLink) -> None:
        """The stream ended: unless draining, what stops now is paused with its tokens (the manager may have
        restarted and know nothing of it); assignments that never started are kept the same way."""
        link.lost = not self.draining
        if link.lost:
            for a in self._held + self._held_while_released:
                self.held.pause_waiting(a)
        self._held.clear()  # a manager that did not restart requeues them itself
        self._held_while_released.clear()

    async def _reader(self, link: ManagerLink) -> None:
        while True:
            try:
                msg = await link.call.read()
            except grpc.aio.AioRpcError as err:
                if not self.draining:
                    log.warning("manager stream broke", extra={"error": describe(err)})
                return
            if msg is grpc.aio.EOF:
                return
            self._handle(link, msg)

    def _handle(self, link: ManagerLink, msg: pb.ManagerMessage) -> None:
        kind = msg.WhichOneof("body")
        if kind == "assign":
            if self.startup is not None:
                self.startup.assigned(self.options.worker_id)
            for a in msg.assign.assignments:
                try:
                    self._assign(link, assignment_from_pb(a))
                except WireError as err:
                    log.error("bad assignment ignored", extra={"request_id": a.request_id, "error": str(err)})
        elif kind == "revoke":
            for rid in msg.revoke.request_ids:
                if self.engine.abort(rid):
                    metrics.ABORTS.labels("revoke").inc()
            log.info("revoked", extra={"requests": len(msg.revoke.request_ids), "reason": msg.revoke.reason})
        elif kind == "drain":
            self.request_drain(msg.drain.reason or "manager", notice=False)
        elif kind == "set_weight_version":
            self.schedule_update(msg.set_weight_version.weight_version)
        elif kind == "chunk_cadence":
            link.set_cadence(msg.chunk_cadence)

    # ---- requests ----------------------------------------------------------------------------

    def _assign(self, link: ManagerLink, a: Assignment) -> None:
        metrics.ASSIGNED.inc()
        if self.draining:
            self._reject(link, a)
        elif self.engine.memory_released:  # started after resume (the manager gives a released worker none normally)
            self._held_while_released.append(a)
        elif a.weight_version > self.engine.weight_version and self.pull is not None:
            self._held.append(a)  # starts once the engine holds that version
            self.schedule_update(a.weight_version)
        else:
            if a.weight_version != self.engine.weight_version:
                log.warning(
                    "assignment for another weight version runs on the version held",
                    extra={"request_id": a.request_id, "wanted": a.weight_version, "held": self.engine.weight_version},
                )
            self._start(link, a)

    def _start(self, link: ManagerLink, a: Assignment) -> None:
        previous = link.tasks.get(a.request_id)
        if previous is not None:  # re-assigned under a new lease: finish the old one first
            self.engine.abort(a.request_id)
        self.held.start(a)
        link.tasks[a.request_id] = asyncio.create_task(self._run_request(link, a, previous))
        metrics.RUNNING.set(self.engine.running)

    def _reject(self, link: ManagerLink, a: Assignment) -> None:
        """Hand an assignment straight back: an empty abort chunk (we are draining)."""
        link.chunker.open(a.request_id, a.lease_epoch, a.generated)
        link.chunker.end(a.request_id, False, FINISH_ABORT)
        link.flush.set()

    async def _run_request(self, link: ManagerLink, a: Assignment, previous: asyncio.Task | None) -> None:
        rid = a.request_id
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        link.chunker.open(rid, a.lease_epoch, a.generated)
        finished, reason, error, invalid_input = False, FINISH_ABORT, "", False
        try:
            async for step in self.engine.generate(a):
                # a new age clock: the flusher, waiting on a later deadline (or none), must see it
                new_deadline = link.chunker.add(rid, step.token_ids, step.logprobs, monotonic_ms())
                self.held.add(a, step.token_ids, step.logprobs)
                self._tokens_total += len(step.token_ids)
                metrics.TOKENS.inc(len(step.token_ids))
                if step.finished:
                    finished, reason = step.finish_reason != FINISH_ABORT, step.finish_reason
                    error, invalid_input = step.error, step.invalid_input
                if new_deadline or step.finished or link.chunker.pending_tokens() >= link.chunker.max_tokens:
                    link.flush.set()
        except Exception as err:  # the engine's trouble, not the request's: it goes back to the manager
            what = f"generation failed: {type(err).__name__}"
            self._errors.error(what, f"{what}: {err}", exc_info=err, request_id=rid)
        finally:
            if error:  # the manager learns why this request ended here (the engine logged it)
                metrics.REQUEST_ERRORS.labels("invalid_input" if invalid_input else "failed_alone").inc()
            link.chunker.end(rid, finished, reason, error, invalid_input)
            self.held.end(a, finished, reason, lost=link.lost and not error, now=time.monotonic())
            if link.tasks.get(rid) is asyncio.current_task():
                del link.tasks[rid]
            metrics.RUNNING.set(self.engine.running)
            link.flush.set()

    async def _abort_all(self, link: ManagerLink, why: str) -> None:
        for rid in list(link.tasks):
            if self.engine.abort(rid):
                metrics.ABORTS.labels(why).inc()
        tasks = list(link.tasks.values())
        if not tasks:
            return
        # Bounded: a request the engine had not yet taken when aborted keeps running, and a stream that broke must
        # not wait for it (the worker would never reconnect). Cancelled, its tokens are kept all the same (held.py).
        _, stuck = await asyncio.wait(tasks, timeout=ABORT_WAIT_S)
        if stuck:
            log.warning("requests still running after an abort: cancelled", extra={"requests": len(stuck), "why": why})
            for task in stuck:
                task.cancel()
            await asyncio.wait(stuck, timeout=ABORT_WAIT_S)

    def _send_heartbeat(self) -> None:
        if self.link is not None:
            self.link.send_heartbeat()

    # ---- drain and weights -------------------------------------------------------------------

    async def _drain(self, reason: str, notice: bool) -> None:
        link = self.link
        if link is None or link.drained:
            return  # not connected: nothing to flush (a stream still registering drains when it is up)
        link.drained = True
        if notice:
            link.send(pb.WorkerMessage(drain=pb.DrainNotice(reason=reason, deadline_ms=self.options.drain_deadline_ms)))
        link.send_due(flush_all=True)  # what is buffered leaves now, before the aborts have to finish
        for a in self._held + self._held_while_released:
            self._reject(link, a)
        self._held.clear()
        self._held_while_released.clear()
        await self._abort_all(link, "drain")
        link.send_due(flush_all=True)
        link.close()
        log.info("drained: every token flushed, stream closing", extra={"reason": reason})

    async def _update_to(self, version: int) -> None:
        async with self._update_lock:
            if self.engine.memory_released:  # released meanwhile: sync on resume
                self._deferred_version = max(self._deferred_version, version)
                return
            if version <= self.engine.weight_version:
                return
            try:
                pulled = await self.pull(version)
                await self.engine.update_weights(pulled.state, version, checksum=pulled.checksum)  # verified
            except Exception as err:
                log.error("weight update failed", extra={"weight_version": version, "error": str(err)})
                return
            metrics.WEIGHT_VERSION.set(version)
            link = self.link
            if link is not None:
                report = pb.WeightVersionReport(weight_version=version, checksum=self.engine.weights_checksum)
                link.send(pb.WorkerMessage(weight_version=report))
                ready = [a for a in self._held if a.weight_version <= version]
                self._held = [a for a in self._held if a.weight_version > version]
                for a in ready:
                    self._start(link, a)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)


def _record(r: MemoryReport) -> None:
    metrics.MEMORY_RELEASED.set(1 if r.action == "release" else 0)
    metrics.RELEASES.labels(r.action).inc()
    if r.action == "release":
        metrics.RELEASE_SECONDS.observe(r.seconds)
        metrics.RELEASED_BYTES.set(r.nbytes)
        metrics.RELEASE_RSS_BYTES.labels("before").set(r.rss_before)
        metrics.RELEASE_RSS_BYTES.labels("after").set(r.rss_after)
    else:
        metrics.RESUME_SECONDS.observe(r.seconds)


def _fields(r: MemoryReport) -> dict[str, object]:
    return {
        "bytes": r.nbytes,
        "rss_before": r.rss_before,
        "rss_after": r.rss_after,
        "seconds": round(r.seconds, 4),
        "effective": r.effective,
    }
