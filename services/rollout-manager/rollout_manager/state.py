"""The rollout-manager's state machine: workers, requests, leases. No network, no asyncio, no clock.

Every method takes `now` (monotonic seconds) and mutates the state; what must go on the wire is
collected as effects the server takes afterwards: per-worker `Outbox`es (batched assign / revoke /
drain / set-version) and finished `Trajectory`s. Per-chunk work is O(1) dict operations; a scheduling
pass is O(W log W + n) and runs only when something that frees or needs capacity happened (`dirty`).

A request: PENDING -> RUNNING on a worker under a lease (lease_epoch += 1 on every assignment)
-> FINISHED; or RUNNING -> REVOKING (the worker was asked to stop and flush) -> PENDING again with
every token received, continued elsewhere from exactly there. Chunks whose (worker, lease_epoch)
is not the request's current lease are stale and discarded, so a zombie never duplicates tokens.

A restarted manager knows nothing: workers re-register reporting the responses they hold (`on_held`), kept as
orphans until the trainer re-attaches to their step (`add_step` with the ids it already received); then each
orphan is adopted with its tokens (continued from there, or finished) and the rest of the step runs afresh.

`ManagerState` is what the server drives: it takes each event (a worker's registration, message or departure, a
step, a tick) and hands it to the part that owns it, each an object with its own state:

    effects.py          Effects: outboxes, trajectories to deliver, failed steps, `dirty`
    fleet.py            Fleet: the workers, their free slots, versions, offloaded pools, busy seconds
    book.py             RequestBook: requests, pending queues and counts, the ids each step owes
    leases.py           Leases: assign, release, revoke, drop; the requests being revoked
    lifecycle.py        RequestLifecycle: chunks, failed attempts, migrate / finish / give up
    carry_over.py       CarryOver: partial rollout, requests carried into the next step
    speed_placement.py  SpeedPlacement: placement by measured speed, length priors, speed rebalance
    adoption.py         HeldResponses: responses workers held across a manager restart
    scheduling.py       Scheduler: the scheduling pass and balancing
    status.py           Tally, Gauges, manager_status: what the manager reports
    runners.py          EnvRunners: the env-runners (agentic episodes), their free slots and outboxes
    episodes.py         Episodes: a step's episodes on env-runners, each model turn a request
"""

from __future__ import annotations

from collections.abc import Iterable

from rlboost.policies.migration import MigrationReason
from rlboost.wire.episode_io import EpisodeResult, RunnerRegistration, TurnRequest
from rlboost.wire.rollout_io import (
    HeldResponse,
    ManagerStatus,
    Pool,
    RolloutRequest,
    TokenBounds,
    TokenChunk,
    Trajectory,
    WorkerRegistration,
    request_id,
)

from .adoption import HeldResponses
from .book import RequestBook
from .carry_over import CarryOver
from .effects import Effects, Outbox
from .episode_carry import EpisodeCarry
from .episodes import Episodes
from .fleet import Fleet
from .leases import Leases
from .lifecycle import RequestLifecycle
from .records import Request, Worker
from .runners import EnvRunners, RunnerOutbox
from .scheduling import Scheduler
from .speed_placement import SpeedPlacement
from .starved import StarvedWork
from .status import Gauges, Tally, manager_status
from .steps import RequestPolicy, StepError, check_step


class ManagerState:
    """All scheduling state of one manager. Single-threaded: call from one asyncio loop."""

    def __init__(
        self,
        lease_timeout_s: float,
        revoke_timeout_s: float | None = None,
        balance_min_excess: int = 2,
        policy: RequestPolicy | None = None,
        orphan_ttl_s: float = 300.0,
        speed_aware: bool = True,
    ):
        """`speed_aware`: place by measured worker speed (placement.place_by_speed); False: least-loaded only.
        `orphan_ttl_s`: held responses of a step nobody re-attaches to are forgotten after this."""
        self.policy = p = policy or RequestPolicy()
        self.lease_timeout_s = lease_timeout_s
        revoke_timeout_s = revoke_timeout_s if revoke_timeout_s is not None else lease_timeout_s
        self.effects = Effects()
        self.fleet = Fleet(self.effects)
        self.book = RequestBook()
        self.tally = Tally()
        self.leases = Leases(self.book, self.fleet, self.effects, revoke_timeout_s)
        self.carry = CarryOver(self.book, self.effects, self.leases)
        self.speed = SpeedPlacement(
            self.book, self.fleet, self.leases, speed_aware, p.speed_migration_cost_s, p.speed_rebalance_moves
        )
        self.lifecycle = RequestLifecycle(
            self.book, self.fleet, self.leases, self.effects, self.carry, self.speed, self.tally, p
        )
        self.held = HeldResponses(
            self.book, self.effects, self.leases, self.lifecycle, p.max_step_requests, orphan_ttl_s
        )
        self.scheduler = Scheduler(self.book, self.fleet, self.leases, self.speed, self.effects, balance_min_excess)
        self.runners = EnvRunners()
        self.episodes = Episodes(self.book, self.leases, self.effects, self.runners, p, self.carry)
        self.episode_carry = EpisodeCarry(self.episodes, self.carry, self.book)  # partial rollout of episodes
        self.gauges = Gauges()
        self._next_stall_check = 0.0
        self.starved = StarvedWork()  # pending work no worker can take: said, not waited on in silence (issue 31)

    # ---- what the server reads ---------------------------------------------------------------------

    @property
    def workers(self) -> dict[str, Worker]:
        return self.fleet.workers

    @property
    def requests(self) -> dict[str, Request]:
        return self.book.requests

    @property
    def dirty(self) -> bool:
        """Something freed or needs capacity since the last scheduling pass."""
        return self.effects.dirty

    @property
    def offloaded_pools(self) -> set[Pool]:
        return self.fleet.offloaded_pools

    @property
    def pending(self) -> int:
        return self.book.pending_total

    @property
    def running(self) -> int:
        return self.book.held_total

    def has_step(self, step: int) -> bool:
        return step in self.book.steps

    def take_outbox(self) -> dict[str, Outbox]:
        return self.effects.take_outbox()

    def take_delivered(self) -> list[Trajectory]:
        return self.effects.take_delivered()

    def take_failed_steps(self) -> dict[int, str]:
        """Steps that failed (a request used up its attempts and the policy is to fail), with why."""
        return self.effects.take_failed_steps()

    def delivery_step(self, traj: Trajectory) -> int:
        """The step whose stream delivers a trajectory `take_delivered` gave (once per trajectory)."""
        return self.carry.delivery_step(traj)

    def status(self, now: float | None = None) -> ManagerStatus:
        """`now`: the clock the state is driven with, for the busy seconds of spells still open (None: omitted)."""
        status = manager_status(self.fleet, self.book, self.tally, now)
        status.runners = self.runners.status(self.episodes.in_tools_by_runner())
        status.episodes = self.episodes.status()
        costs = self.lifecycle.costs  # what preemptions cost (issue 34)
        status.preemptions, status.slot_seconds = costs.preemptions, self.fleet.slot_seconds(now)
        status.preempted_slot_seconds = costs.slot_seconds_lost(now)
        return status

    # ---- workers -----------------------------------------------------------------------------------

    def register(self, reg: WorkerRegistration, now: float) -> None:
        """A worker joined (or re-joined under the same id: its old incarnation's requests migrate)."""
        if reg.worker_id in self.fleet.workers:
            self.remove_worker(reg.worker_id, MigrationReason.STREAM_BROKEN, now)
        self.fleet.add(reg, now)

    def remove_worker(self, worker_id: str, reason: MigrationReason, now: float) -> int:
        """The worker's stream ended: every request it held migrates with its tokens. Returns how many."""
        w = self.fleet.remove(worker_id, now)
        return 0 if w is None else self.lifecycle.worker_left(w, reason, now)

    def on_held(self, worker_id: str, held: list[HeldResponse], now: float) -> None:
        """A (re-)registered worker reports the responses it kept across its broken stream (adoption.py)."""
        self.held.on_held(worker_id, held, now)

    def on_heartbeat(self, worker_id: str, weight_version: int, now: float, memory_released: bool = False) -> None:
        self.fleet.on_heartbeat(worker_id, weight_version, now, memory_released)

    def on_weight_version(self, worker_id: str, weight_version: int, now: float) -> None:
        self.fleet.on_weight_version(worker_id, weight_version, now)

    def on_drain_notice(self, worker_id: str, now: float) -> None:
        """The worker announced it is going away (SIGTERM): no new work; its requests migrate when it stops."""
        w = self.fleet.workers.get(worker_id)
        fresh = w is not None and not w.draining  # a second notice (NATS, then SIGTERM) is the same preemption
        self.fleet.on_drain_notice(worker_id, now)
        if fresh:
            self.lifecycle.costs.notice(w, self.book.requests, now, "worker")

    def drain(self, node: str, worker_ids: list[str], reason: str, now: float | None = None) -> list[str]:
        """A preemption notice: mark matching workers draining and send them DrainCommand. Returns their ids.
        `now`: the server's clock, from which the notice's cost is counted (None: not counted)."""
        fresh = {w.id for w in self.fleet.workers.values() if not w.draining}
        drained = self.fleet.drain(node, worker_ids, reason)
        for wid in fresh.intersection(drained) if now is not None else ():
            self.lifecycle.costs.notice(self.fleet.workers[wid], self.book.requests, now, "manager")
        return drained

    def on_chunks(
        self, worker_id: str, chunks: list[TokenChunk], now: float, bounds: TokenBounds | None = None
    ) -> None:
        """One worker's batch of chunks (lifecycle.py: kept, refused or stale; finished or migrated)."""
        self.lifecycle.on_chunks(worker_id, chunks, now, bounds)

    def on_request_failed(
        self, worker_id: str, request_id: str, lease_epoch: int, error: str, now: float, invalid_input: bool = False
    ) -> bool:
        """The worker reports that generating the request failed on it. False if the report is stale."""
        return self.lifecycle.on_request_failed(worker_id, request_id, lease_epoch, error, now, invalid_input)

    # ---- steps -------------------------------------------------------------------------------------

    def add_step(self, r: RolloutRequest, now: float) -> int:
        """Expand prompts x group_size into pending requests, less those the trainer already received (it
        re-attached), adopting the responses workers hold. Returns how many trajectories the step yields."""
        if r.step in self.book.steps:
            raise StepError(f"rollout.step: step {r.step} is already being rolled out; wait for it or cancel it")
        check_step(r, self.policy)
        received = set(r.received_request_ids)
        if r.episodes is not None:  # agentic: episodes for the env-runners, each turn a request later
            return self._add_episodes(r, received, now)
        ids = self._new_requests(r, received, now)
        total = len(ids) + self.carry.continue_step(r, ids, received, now)  # partial rollout: earlier steps' samples
        if ids:
            self.book.steps[r.step] = ids  # the same set: adopted responses that finished leave it below
        self.held.adopt_orphans(ids, now)
        self.effects.dirty = True
        return total

    def _add_episodes(self, r: RolloutRequest, received: set[str], now: float) -> int:
        ids = self.episodes.add_step(r, received, now)
        total = len(ids) + self.episode_carry.continue_step(r, ids, received, now)  # partial rollout: carried ones
        if ids:
            self.book.steps[r.step] = ids  # what the step's stream owes: its episodes
        self.effects.dirty = True
        return total

    def _new_requests(self, r: RolloutRequest, received: set[str], now: float) -> set[str]:
        """The step's requests, pending at the tail of its version's queue, but those already received."""
        ids: set[str] = set()
        queue = self.book.queue(r.weight_version)
        for p in r.prompts:
            for g in range(r.group_size):
                rid = request_id(r.step, p.prompt_index, g)
                if rid in received:
                    continue
                self._retire_earlier(rid, now)
                self.book.new_request(r, r.step, p.prompt_index, g, p.token_ids, now)
                queue.append(rid)
                ids.add(rid)
        self.book.pending_count[r.weight_version] += len(ids)
        return ids

    def _retire_earlier(self, rid: str, now: float) -> None:
        """A step sent again (a resumed trainer) while a request of the same id still lives, e.g. carried past its
        step's end: its earlier incarnation is dropped first, revoked from its worker with its lease epoch kept, so
        that none of its late chunks passes as the new one's (a silent replace left the old lease on the worker at
        the same epoch) and no trajectory of it is delivered later."""
        self.carry.withdraw(rid)
        if rid in self.book.requests:
            self.leases.drop(rid, now)

    def cancel_step(self, step: int, now: float | None = None) -> int:
        """The trainer went away: drop the step's requests, revoking the running ones. Returns how many."""
        ids = self.book.steps.pop(step, set())
        self.episodes.cancel(ids, now)  # an episodes step's ids are episodes: they go, with their turns
        for rid in ids:
            self.leases.drop(rid, now)
            self.lifecycle.costs.forget(rid, now)
        self.effects.dirty = True
        return len(ids)

    def carry_step(self, step: int, late: Iterable[Trajectory] = ()) -> int:
        """The step's stream ended at its target: its unfinished requests are carried into the next (carry_over.py),
        with `late` ones, finished but not sent before the stream ended. Returns how many requests are carried."""
        self.episode_carry.carry_step(step)  # an episodes step's: its episodes go on, on their runners
        return self.carry.carry_step(step, late)

    def revoke(self, rid: str, reason: MigrationReason, now: float, wire_reason: str | None = None) -> bool:
        """Ask the worker to stop the request and flush; it migrates on the flush or at the deadline."""
        return self.leases.revoke(rid, reason, now, wire_reason)

    # ---- periodic ----------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Lease expiry and revoke deadlines; call a few times per heartbeat interval."""
        for w in self.fleet.workers.values():
            if not w.expired and now - w.last_seen > self.lease_timeout_s:
                self.lifecycle.expire(w, now)
        for req in self.leases.overdue(now):  # the worker never flushed: the epoch fences whatever it still sends
            self.lifecycle.migrate(req, req.revoke_reason, now)
        free = self._free_slots() if self.episodes.episodes else 0  # O(workers): only with episodes
        for runner in self.episodes.tick(now, free, self.lease_timeout_s):
            runner.expired = True  # if it is slow rather than dead, it stops what it still drives
            self.runners.box(runner.id).cancel.setdefault("lease_expired", []).extend(runner.episodes)
            self.episodes.runner_left(runner, now, "lease expired")
        if now >= self._next_stall_check:
            self._next_stall_check = now + min(1.0, self.policy.stall_timeout_s / 4)
            self.leases.revoke_stalled(now, self.policy.stall_timeout_s)
            self.held.forget_old(now)
            self.starved.check(now, self.book.pending_count, self.fleet.workers.values())
        self.gauges.update(now, self.fleet, self.book, self.tally)

    def schedule(self, now: float) -> int:
        """Place pending work and move idle workers to newer weight versions; hand pending episodes to env-runners.
        Returns the requests assigned."""
        self.episodes.assign(now)
        return self.scheduler.schedule(now)

    def _free_slots(self) -> int:
        return sum(self.fleet.idle_slots(pool) for pool in Pool)

    # ---- env-runners (agentic episodes) -------------------------------------------------------------

    def register_runner(self, reg: RunnerRegistration, now: float) -> None:
        """An env-runner joined (or re-joined under the same id: its old incarnation's episodes start again)."""
        if reg.runner_id in self.runners.runners:
            self.remove_runner(reg.runner_id, now, "re-registered")
        self.runners.add(reg, now)
        self.effects.dirty = True

    def remove_runner(self, runner_id: str, now: float, why: str = "stream ended") -> int:
        """The runner's stream ended: its episodes start again on others. Returns how many it held."""
        runner = self.runners.remove(runner_id)
        return 0 if runner is None else self.episodes.runner_left(runner, now, why)

    def on_runner_heartbeat(self, runner_id: str, now: float) -> None:
        if (runner := self.runners.alive(runner_id, now)) is not None and runner.free:
            self.effects.dirty = True

    def on_runner_drain(self, runner_id: str, now: float) -> None:
        """The runner is going away: no new episodes (those it drives finish, or start again if it dies first)."""
        if (runner := self.runners.alive(runner_id, now)) is not None:
            runner.draining = True

    def on_turn(self, runner_id: str, turn: TurnRequest, now: float) -> None:
        if self.runners.alive(runner_id, now) is not None:
            self.episodes.on_turn(runner_id, turn, now)

    def on_episode_result(self, runner_id: str, result: EpisodeResult, now: float) -> None:
        if self.runners.alive(runner_id, now) is not None:
            self.episodes.on_result(runner_id, result, now)

    def take_runner_outboxes(self, now: float) -> dict[str, RunnerOutbox]:
        """The commands for each env-runner: finished turns first handed to their episodes."""
        self.episodes.turns_done(self.effects.take_turns(), now)
        return self.runners.take_outboxes()

    def balance(self, now: float) -> int:
        """Revoke excess requests from overloaded workers when others sit idle. Returns how many."""
        return self.scheduler.balance(now)

    def capacity_by_pool(self) -> dict[Pool, int]:
        return self.fleet.capacity_by_pool()

    def set_pool_offloaded(self, pool: Pool, offloaded: bool) -> None:
        """Stop (or resume) giving a pool new work: reserved workers once the offload window elapsed."""
        self.fleet.set_pool_offloaded(pool, offloaded)

    def idle_slots(self, pool: Pool) -> int:
        """Free request slots of a pool's schedulable workers."""
        return self.fleet.idle_slots(pool)
