"""Agentic episodes in the manager: a step's episodes handed to env-runners as requests are handed to workers, each
model turn made an ordinary request, and the finished episode delivered on the step's stream.

An episode: PENDING -> RUNNING on an env-runner (lease_epoch += 1 on every assignment) -> delivered; or, when its
runner's stream breaks or it goes silent, back to PENDING to start again from its task on another runner (its
environment's state died with the runner; a lost runner counts against rollout.maxRequestAttempts). While it runs,
each `TurnRequest` becomes a request `<episode>-t<turn>` (the episode's tokens so far as its prompt, its version, a
seed of its own) that the scheduler places, migrates, offloads and leases as any other; its finished tokens go back
to the runner (`turns_done`), not to the trainer. Between turns the episode holds no engine slot: it is "in tools"
(its environment is stepping), and free worker slots while nothing else is pending count as idle slot-seconds.

An episode its environment failed (crash, timeout), or that lost too many runners, follows rollout.onFailedRequest:
'drop' delivers it with finish reason 'failed' (trained with zero weight), 'fail' fails its step naming it.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from dataclasses import dataclass, replace
from enum import StrEnum

from rlboost.wire.episode_io import (
    EpisodeAssignment,
    EpisodeResult,
    TurnRequest,
    TurnResult,
    turn_request_id,
    turn_seed,
)
from rlboost.wire.rollout_io import (
    EpisodeCounts,
    EpisodeStats,
    RolloutRequest,
    SamplingParams,
    Trajectory,
    request_id,
    sample_seed,
)

from . import metrics
from .book import RequestBook
from .carry_over import CarryOver
from .effects import Effects
from .leases import Leases
from .records import Request
from .runners import EnvRunners, Runner
from .steps import RequestPolicy

log = logging.getLogger("rollout_manager.episodes")

FAILED = "failed"
PLACEHOLDER_PROMPT = [0]  # a failed episode with no tokens: one token, so the trainer can collate its (weightless) row


class EpisodePhase(StrEnum):
    PENDING = "pending"
    RUNNING = "running"  # on an env-runner: a turn generating, or its environment stepping


@dataclass(slots=True)
class Episode:
    id: str
    step: int
    prompt_index: int
    sample_index: int
    task_json: str
    sampling: SamplingParams  # the episode's seed; max_new_tokens: one turn's budget
    version: int
    max_turns: int
    max_episode_tokens: int
    vocab_size: int
    pending_since: float
    phase: EpisodePhase = EpisodePhase.PENDING
    runner: str | None = None
    lease_epoch: int = 0
    attempts: int = 0  # runners it was lost with
    turn: str | None = None  # the request id of its model turn, while one is pending or running
    turns: int = 0  # model turns asked for so far (this assignment)
    in_tools_since: float | None = None  # on its runner between turns: its environment is stepping
    # partial rollout (episode_carry.py): the later step whose stream delivers it (None: its own); carried: its
    # stream ended at its target, it goes on under its version until a step lists it
    stream: int | None = None
    carried: bool = False

    @property
    def stream_step(self) -> int:
        return self.step if self.stream is None else self.stream

    def assignment(self) -> EpisodeAssignment:
        return EpisodeAssignment(
            self.id,
            self.lease_epoch,
            self.step,
            self.prompt_index,
            self.sample_index,
            self.task_json,
            self.sampling,
            self.version,
            self.max_turns,
            self.max_episode_tokens,
        )


class Episodes:
    """The episodes of one manager and their turns. Single-threaded, like the state."""

    def __init__(
        self,
        book: RequestBook,
        leases: Leases,
        effects: Effects,
        runners: EnvRunners,
        policy: RequestPolicy,
        carry: CarryOver,
    ) -> None:
        self.book, self.leases, self.effects, self.runners, self.policy = book, leases, effects, runners, policy
        self.carry = carry  # partial rollout: a carried episode's trajectory waits there for the step listing it
        self.episodes: dict[str, Episode] = {}
        self.carried_failures: dict[str, str] = {}  # carried episode id -> why it failed (rollout.onFailedRequest)
        self.pending: deque[str] = deque()  # may hold stale ids (cancelled): skipped
        self._turn_owner: dict[str, tuple[str, int]] = {}  # turn request id -> (episode id, turn)
        self.counts = EpisodeCounts()
        self._last_tick: float | None = None

    # ---- steps -------------------------------------------------------------------------------------

    def add_step(self, r: RolloutRequest, received: set[str], now: float) -> set[str]:
        """The step's episodes (prompts x group_size, less those already received), pending at the queue's tail."""
        ids: set[str] = set()
        for p in r.prompts:
            for g in range(r.group_size):
                eid = request_id(r.step, p.prompt_index, g)
                if eid in received:
                    continue
                self._retire_carried(eid, now)
                if eid in self.episodes:
                    continue
                self.new_episode(r, r.step, p.prompt_index, g, p.task_json, now)
                ids.add(eid)
        return ids

    def new_episode(self, r: RolloutRequest, step: int, prompt_index: int, g: int, task: str, now: float) -> Episode:
        """Episode g of a prompt of `step` (r.step, or an earlier step whose group r carries), pending under r's
        version; its seed is its own step's, so an episode started afresh is the one it replaces."""
        assert r.episodes is not None
        eid = request_id(step, prompt_index, g)
        seed = sample_seed(r.sampling.seed, step, prompt_index, g)
        ep = self.episodes[eid] = Episode(
            eid,
            step,
            prompt_index,
            g,
            task,
            replace(r.sampling, seed=seed),
            r.weight_version,
            r.episodes.max_turns,
            r.episodes.max_episode_tokens,
            r.vocab_size,
            now,
        )
        self.pending.append(eid)
        return ep

    def _retire_carried(self, eid: str, now: float) -> None:
        """A step sent again (a resumed trainer) names an episode still carried past its step's end: the carried
        incarnation goes (its runner told), so nothing of it is delivered on a stream that no longer waits for it."""
        if (ep := self.episodes.get(eid)) is not None and ep.carried:
            self.cancel({eid}, now)
        self.carry.withdraw(eid)
        self.carried_failures.pop(eid, None)

    def cancel(self, ids: set[str], now: float | None, reason: str = "cancelled") -> int:
        """Forget these episodes (their step was cancelled): their turns dropped, their runners told."""
        n = 0
        for eid in ids:
            ep = self.episodes.pop(eid, None)
            if ep is None:
                continue
            n += 1
            self._drop_turn(ep, now)
            if ep.runner is not None:
                self.runners.box(ep.runner).cancel.setdefault(reason, []).append(eid)
                self._let_go(ep)
        return n

    # ---- placement ---------------------------------------------------------------------------------

    def assign(self, now: float) -> int:
        """Pending episodes onto the runners with room, least loaded first. Returns how many were assigned."""
        if not self.pending:
            return 0
        heap = [(len(r.episodes) / r.reg.capacity, r.id) for r in self.runners.with_room()]
        heapq.heapify(heap)
        made = 0
        while heap and self.pending:
            ep = self.episodes.get(self.pending.popleft())
            if ep is None or ep.phase is not EpisodePhase.PENDING:
                continue
            _, rid = heapq.heappop(heap)
            runner = self.runners.runners[rid]
            self._assign(ep, runner, now)
            made += 1
            if runner.free > 0:
                heapq.heappush(heap, (len(runner.episodes) / runner.reg.capacity, rid))
        return made

    def _assign(self, ep: Episode, runner: Runner, now: float) -> None:
        ep.lease_epoch += 1
        ep.phase, ep.runner, ep.turns, ep.in_tools_since = EpisodePhase.RUNNING, runner.id, 0, now
        runner.episodes.add(ep.id)
        self.runners.box(runner.id).assign.append(ep.assignment())
        metrics.EPISODE_ASSIGNMENTS.inc()

    # ---- what runners send -------------------------------------------------------------------------

    def _held(self, runner_id: str, episode_id: str, lease_epoch: int) -> Episode | None:
        """The episode, if `runner_id` holds it under `lease_epoch` (else a stale message: counted, ignored)."""
        ep = self.episodes.get(episode_id)
        if ep is None or ep.runner != runner_id or ep.lease_epoch != lease_epoch:
            metrics.STALE_EPISODE_MESSAGES.inc()
            return None
        return ep

    def on_turn(self, runner_id: str, t: TurnRequest, now: float) -> None:
        """A runner asks for a model turn: it becomes a pending request (or is refused with a failed TurnResult)."""
        ep = self._held(runner_id, t.episode_id, t.lease_epoch)
        if ep is None:
            return
        if ep.turn is not None and self._turn_owner.get(ep.turn) == (ep.id, t.turn):
            return  # the same turn asked again (a resent message): it is already on its way
        if (problem := self._turn_problem(ep, t)) is not None:
            self.runners.box(runner_id).turns.append(
                TurnResult(ep.id, t.turn, [], [], FAILED, ep.version, error=problem)
            )
            return
        rid = turn_request_id(ep.id, t.turn)
        sampling = replace(ep.sampling, seed=turn_seed(ep.sampling.seed, t.turn), max_new_tokens=t.max_new_tokens)
        req = Request(
            id=rid,
            step=ep.step,
            prompt_index=ep.prompt_index,
            sample_index=ep.sample_index,
            prompt=t.input_ids,
            sampling=sampling,
            weight_version=ep.version,
            pending_since=now,
            vocab_size=ep.vocab_size,
            lease_epoch=self.book.dropped_epochs.pop(rid, 0),
            episode=ep.id,
        )
        self.book.requests[rid] = req
        self.book.enqueue(req)
        self._turn_owner[rid] = (ep.id, t.turn)
        ep.turn, ep.turns, ep.in_tools_since = rid, ep.turns + 1, None
        self.effects.dirty = True
        metrics.TURNS.inc()

    def _turn_problem(self, ep: Episode, t: TurnRequest) -> str | None:
        """Why a turn request cannot be taken (one line naming the field), or None."""
        if ep.turn is not None:
            return f"turn {t.turn}: the episode's turn {self._turn_owner.get(ep.turn, ('', '?'))[1]} is still running"
        if t.turn != ep.turns or t.turn >= ep.max_turns:
            return f"turn {t.turn}: expected turn {ep.turns} (at most {ep.max_turns}: algorithm.maxTurns)"
        if len(t.input_ids) + t.max_new_tokens > ep.max_episode_tokens or t.max_new_tokens > ep.sampling.max_new_tokens:
            return (
                f"turn {t.turn}: {len(t.input_ids)} tokens + max_new_tokens {t.max_new_tokens} is over the episode's "
                f"{ep.max_episode_tokens} (algorithm.maxEpisodeTokens) or a turn's {ep.sampling.max_new_tokens}"
            )
        if len(t.input_ids) > self.policy.max_prompt_tokens:
            return f"turn {t.turn}: {len(t.input_ids)} tokens is over rollout.maxPromptTokens"
        if ep.vocab_size and max(t.input_ids) >= ep.vocab_size:
            return f"turn {t.turn}: token ids must lie in [0, vocab_size={ep.vocab_size})"
        return None

    def turns_done(self, finished: list[Trajectory], now: float) -> None:
        """Model turns that finished (ManagerState's effects): each back to its episode's runner."""
        for traj in finished:
            owner = self._turn_owner.pop(traj.request_id, None)
            ep = self.episodes.get(owner[0]) if owner else None
            if ep is None or ep.turn != traj.request_id or ep.runner is None:
                continue  # its episode was cancelled or taken back meanwhile
            ep.turn, ep.in_tools_since = None, now
            error = "the turn failed rollout.maxRequestAttempts attempts" if traj.finish_reason == FAILED else ""
            self.runners.box(ep.runner).turns.append(TurnResult.of(ep.id, owner[1], traj, error))

    def on_result(self, runner_id: str, r: EpisodeResult, now: float) -> None:
        """A runner's finished episode: delivered on its step's stream (a failed one per rollout.onFailedRequest)."""
        ep = self._held(runner_id, r.episode_id, r.lease_epoch)
        if ep is None:
            return
        self._drop_turn(ep, now)
        if ep.vocab_size and r.response_ids and max(r.response_ids) >= ep.vocab_size:
            r = replace(r, finish_reason=FAILED, stats=replace(r.stats, env_error="token ids outside the vocabulary"))
        runner = self.runners.runners.get(runner_id)
        if runner is not None:
            runner.done += 1
        traj = _trajectory(ep, r, runner_id)
        if r.finish_reason == FAILED:
            why = r.stats.env_error or "its env-runner reported it failed"
            self._fail(ep, f"episode {ep.id} failed: {why}", traj)
            return
        self._deliver(ep, traj)
        self.counts.finished += 1
        metrics.EPISODES.labels("finished").inc()

    def runner_left(self, runner: Runner, now: float, why: str) -> int:
        """`runner` left or went silent: its episodes start again elsewhere (their environments died with it), or
        fail after rollout.maxRequestAttempts runners. Returns how many it held."""
        held = [self.episodes[eid] for eid in runner.episodes if eid in self.episodes]
        for ep in held:
            self._drop_turn(ep, now)
            self._let_go(ep)
            ep.attempts += 1
            metrics.EPISODES.labels("lost").inc()
            if ep.attempts >= self.policy.max_attempts:
                self._fail(ep, f"episode {ep.id} lost its env-runner {ep.attempts} times (last: {why})", None)
                continue
            ep.phase, ep.pending_since = EpisodePhase.PENDING, now
            self.pending.appendleft(ep.id)
        runner.episodes.clear()
        self.effects.dirty = True
        return len(held)

    # ---- ending ------------------------------------------------------------------------------------

    def _fail(self, ep: Episode, why: str, traj: Trajectory | None) -> None:
        log.warning("episode failed", extra={"episode_id": ep.id, "why": why, "dropped": self.policy.drop_failed})
        self.counts.failed += 1
        metrics.EPISODES.labels("failed").inc()
        if self.policy.drop_failed:
            self._deliver(ep, traj if traj is not None else _failed_trajectory(ep))
            return
        self.episodes.pop(ep.id, None)
        self._let_go(ep)
        if ep.carried:  # no stream waits for it now: the step that lists it next fails
            self.carried_failures[ep.id] = why
        else:
            self.effects.fail_step(ep.stream_step, why)
        self.effects.dirty = True

    def _deliver(self, ep: Episode, traj: Trajectory) -> None:
        self.episodes.pop(ep.id, None)
        self._let_go(ep)
        self.effects.dirty = True
        if ep.carried:  # its stream ended at its target: the step that lists it next delivers it
            self.carry.keep_done(traj)
            return
        owed = self.book.steps.get(ep.stream_step)
        if owed is not None:
            owed.discard(ep.id)
            if not owed:
                del self.book.steps[ep.stream_step]
        if ep.stream is None:
            self.effects.deliver(traj)
        else:
            self.carry.deliver_to(traj, ep.stream)

    def _let_go(self, ep: Episode) -> None:
        runner = self.runners.runners.get(ep.runner) if ep.runner else None
        if runner is not None:
            runner.episodes.discard(ep.id)
        ep.runner, ep.in_tools_since = None, None

    def _drop_turn(self, ep: Episode, now: float | None) -> None:
        if ep.turn is not None:
            self._turn_owner.pop(ep.turn, None)
            self.leases.drop(ep.turn, now)
            ep.turn = None

    # ---- periodic and status -----------------------------------------------------------------------

    def tick(self, now: float, free_slots: int, lease_timeout_s: float) -> list[Runner]:
        """Count idle slot-seconds while episodes are in tools and nothing is pending; the runners gone silent."""
        last, self._last_tick = self._last_tick, now
        in_tools = self.in_tools()
        capacity = self.runners.capacity
        busy = sum(len(r.episodes) for r in self.runners.runners.values())
        if last is not None:
            self.counts.runner_episode_seconds += (now - last) * busy
            self.counts.runner_capacity_seconds += (now - last) * capacity
        if last is not None and in_tools and self.book.pending_total == 0 and free_slots > 0:
            idle = (now - last) * free_slots
            self.counts.idle_slot_seconds_in_tools += idle
            metrics.IDLE_SLOT_SECONDS_IN_TOOLS.inc(idle)
        metrics.EPISODE_STATE.labels("pending").set(self.pending_count())
        metrics.EPISODE_STATE.labels("running").set(len(self.episodes) - self.pending_count())
        metrics.EPISODE_STATE.labels("in_tools").set(in_tools)
        metrics.EPISODE_STATE.labels("carried").set(self.carried())
        metrics.ENV_RUNNERS.set(len(self.runners.runners))
        metrics.ENV_RUNNER_UTILISATION.set(busy / capacity if capacity else 0.0)
        return self.runners.silent(now, lease_timeout_s)

    def carried(self) -> int:
        return sum(ep.carried for ep in self.episodes.values())

    def in_tools(self) -> int:
        return sum(ep.in_tools_since is not None for ep in self.episodes.values())

    def pending_count(self) -> int:
        return sum(ep.phase is EpisodePhase.PENDING for ep in self.episodes.values())

    def status(self) -> EpisodeCounts:
        return replace(
            self.counts,
            pending=self.pending_count(),
            running=len(self.episodes) - self.pending_count(),
            in_tools=self.in_tools(),
            carried=self.carried(),
        )

    def in_tools_by_runner(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ep in self.episodes.values():
            if ep.in_tools_since is not None and ep.runner is not None:
                out[ep.runner] = out.get(ep.runner, 0) + 1
        return out


def _trajectory(ep: Episode, r: EpisodeResult, runner_id: str) -> Trajectory:
    """The Trajectory of a runner's finished episode (its oldest model token's version is the one staleness counts)."""
    versions = {v for v, _ in r.version_spans}
    return Trajectory(
        request_id=ep.id,
        step=ep.step,
        prompt_index=ep.prompt_index,
        sample_index=ep.sample_index,
        prompt_ids=r.prompt_ids or list(PLACEHOLDER_PROMPT),
        response_ids=r.response_ids,
        logprobs=r.logprobs,
        finish_reason=r.finish_reason,
        weight_version=min(versions) if versions else ep.version,
        workers=r.workers,
        version_spans=r.version_spans if len(versions) > 1 else [],
        loss_mask=r.loss_mask,
        turns=r.turns,
        reward=r.reward,
        episode=replace(r.stats, runner=runner_id),
    )


def _failed_trajectory(ep: Episode) -> Trajectory:
    """A failed episode with no tokens (it lost its runners): a weightless row for the trainer."""
    return Trajectory(
        ep.id,
        ep.step,
        ep.prompt_index,
        ep.sample_index,
        list(PLACEHOLDER_PROMPT),
        [],
        [],
        FAILED,
        ep.version,
        episode=EpisodeStats(env_error="lost its env-runners"),
    )
