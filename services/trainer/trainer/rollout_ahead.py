"""algorithm.rolloutAhead: the next step's rollout, asked for as soon as this step's has ended, so the workers generate
it while the trainer trains this step (one-step off-policy, as veRL's and AReaL's asynchronous trainers do).

The next step's Rollout is made at the weight version the workers hold (this step's, v) and its samples are counted
against the version that step trains at (v + 1): stale by one, so they take the workers' log-probs as the ratio's old
policy (docs/algorithms.md, "The estimator"). Not run ahead: the job's last step, a step after which an evaluation runs
(the evaluation has the workers to itself: its time and its deadline are its own) or a suspension was asked for (the
pod is about to stop), and the first step of a run or a resumed run. A checkpoint records the prompt cursor from
before the next step took its prompts, so a resumed run takes them again (generated afresh, on-policy: a resumed run
is not bit-exact with an uninterrupted one here).

On-policy runs use the same holder for a shorter lead (`Trainer._opens_next_early`): the next step is opened once this
step's weights are published, before its report, at those weights; the same requests as after the report, so those
runs stay bit-exact, resumed or not.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.assembly import OpenedStep
from trainer.rollout_stream import StartedRollout


@dataclass
class Prefetched:
    """A step opened ahead: its request (None: the data ran out when it was opened) and its Rollout call."""

    step: int
    opened: OpenedStep | None
    started: StartedRollout | None


class RolloutAhead:
    """Holds the one step opened before its turn, if any (run ahead, or on-policy once the weights are published)."""

    def __init__(self, steps_ahead: int) -> None:
        self.enabled = steps_ahead > 0
        self.held: Prefetched | None = None

    def take(self, step: int) -> Prefetched | None:
        """The step, if it was opened ahead (then no longer held)."""
        held, self.held = self.held, None
        assert held is None or held.step == step, f"step {held.step} was opened ahead, step {step} runs"
        return held

    def hold(self, prefetched: Prefetched) -> None:
        self.held = prefetched

    def cancel(self) -> None:
        """End a held step's Rollout call (a suspension, the job's end or failure): the manager drops its requests."""
        if self.held is not None and self.held.started is not None:
            self.held.started.cancel()
        self.held = None
