"""What the manager's state machine leaves for the server after each call: the commands for each worker (batched in
an `Outbox`), the finished trajectories to stream, the steps that failed, and whether a scheduling pass is due.

The state machine has no network and no clock: its parts write here, and the server takes it all afterwards
(`take_outbox`, `take_delivered`, `take_failed_steps`), so the commands of one call go out together.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlboost.wire.rollout_io import Assignment, Trajectory


@dataclass
class Outbox:
    """Commands for one worker, batched until the server flushes them."""

    assign: list[Assignment] = field(default_factory=list)
    revoke: dict[str, list[str]] = field(default_factory=dict)  # reason -> request ids
    drain: str | None = None
    set_version: int | None = None


class Effects:
    """The effects of the calls since the server last took them. Single-threaded, like the state."""

    def __init__(self) -> None:
        self.outboxes: dict[str, Outbox] = {}
        self.delivered: list[Trajectory] = []
        self.failed_steps: dict[int, str] = {}  # step -> why (a request failed its attempts; policy: fail)
        self.turns: list[Trajectory] = []  # finished model turns of agentic episodes, for their env-runners
        # something freed or needs capacity: the next scheduling pass has work (a pass with none costs nothing)
        self.dirty = False

    def box(self, worker_id: str) -> Outbox:
        box = self.outboxes.get(worker_id)
        if box is None:
            box = self.outboxes[worker_id] = Outbox()
        return box

    def revoke(self, worker_id: str, reason: str, request_id: str) -> None:
        """Ask the worker to stop `request_id` (batched with the other revokes of `reason`)."""
        self.box(worker_id).revoke.setdefault(reason, []).append(request_id)

    def forget_worker(self, worker_id: str) -> None:
        """The worker is gone: its unsent commands with it."""
        self.outboxes.pop(worker_id, None)

    def deliver(self, traj: Trajectory) -> None:
        """A finished trajectory for its step's stream (CarryOver.delivery_step says which)."""
        self.delivered.append(traj)

    def turn_done(self, traj: Trajectory) -> None:
        """A model turn of an episode finished: its tokens go to the episode's env-runner, not to a step's stream."""
        self.turns.append(traj)

    def take_turns(self) -> list[Trajectory]:
        out, self.turns = self.turns, []
        return out

    def fail_step(self, step: int, why: str) -> None:
        """The step failed (the first reason is kept)."""
        self.failed_steps.setdefault(step, why)

    def take_outbox(self) -> dict[str, Outbox]:
        out, self.outboxes = self.outboxes, {}
        return out

    def take_delivered(self) -> list[Trajectory]:
        out, self.delivered = self.delivered, []
        return out

    def take_failed_steps(self) -> dict[int, str]:
        """Steps that failed (a request used up its attempts and the policy is to fail), with why."""
        out, self.failed_steps = self.failed_steps, {}
        return out
