"""The env-runners the manager knows (agentic episodes): their records, their free episode slots, what they say
about themselves (heartbeats, drain), and the commands for each, batched until the edge flushes them.

Bookkeeping only: what becomes of a runner's episodes when it leaves is episodes.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.wire.episode_io import EpisodeAssignment, RunnerRegistration, TurnResult
from rlboost.wire.rollout_io import RunnerStatus


@dataclass
class RunnerOutbox:
    """Commands for one env-runner, batched until the edge flushes them."""

    assign: list[EpisodeAssignment] = field(default_factory=list)
    turns: list[TurnResult] = field(default_factory=list)
    cancel: dict[str, list[str]] = field(default_factory=dict)  # reason -> episode ids


@dataclass
class Runner:
    reg: RunnerRegistration
    last_seen: float
    episodes: set[str] = field(default_factory=set)  # the episodes it drives
    draining: bool = False
    expired: bool = False  # silent past its lease: its episodes were taken back
    done: int = 0  # episodes it finished

    @property
    def id(self) -> str:
        return self.reg.runner_id

    @property
    def free(self) -> int:
        """Episodes it may take now."""
        return 0 if self.draining or self.expired else max(0, self.reg.capacity - len(self.episodes))


class EnvRunners:
    """The registered env-runners of one manager. Single-threaded, like the state."""

    def __init__(self) -> None:
        self.runners: dict[str, Runner] = {}
        self.outboxes: dict[str, RunnerOutbox] = {}

    def add(self, reg: RunnerRegistration, now: float) -> Runner:
        runner = self.runners[reg.runner_id] = Runner(reg, now)
        return runner

    def remove(self, runner_id: str) -> Runner | None:
        self.outboxes.pop(runner_id, None)
        return self.runners.pop(runner_id, None)

    def alive(self, runner_id: str, now: float) -> Runner | None:
        """The runner spoke: its lease runs from now. None: not registered."""
        runner = self.runners.get(runner_id)
        if runner is not None:
            runner.last_seen, runner.expired = now, False
        return runner

    def silent(self, now: float, lease_timeout_s: float) -> list[Runner]:
        """Runners silent past their lease (their stream may hang on a dead peer), not yet taken back."""
        return [r for r in self.runners.values() if not r.expired and now - r.last_seen > lease_timeout_s]

    def with_room(self) -> list[Runner]:
        """Runners that may take an episode, least loaded (by share of capacity) first."""
        room = [r for r in self.runners.values() if r.free > 0]
        return sorted(room, key=lambda r: (len(r.episodes) / r.reg.capacity, r.id))

    def box(self, runner_id: str) -> RunnerOutbox:
        box = self.outboxes.get(runner_id)
        if box is None:
            box = self.outboxes[runner_id] = RunnerOutbox()
        return box

    def take_outboxes(self) -> dict[str, RunnerOutbox]:
        out, self.outboxes = self.outboxes, {}
        return out

    def status(self, in_tools: dict[str, int]) -> list[RunnerStatus]:
        """Each runner as GetStatus reports it; `in_tools`: runner id -> its episodes between turns."""
        return [
            RunnerStatus(r.id, r.reg.node, r.reg.capacity, len(r.episodes), in_tools.get(r.id, 0), r.draining, r.done)
            for r in self.runners.values()
        ]

    @property
    def capacity(self) -> int:
        return sum(r.reg.capacity for r in self.runners.values() if not (r.draining or r.expired))
