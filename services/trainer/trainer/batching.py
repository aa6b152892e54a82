"""Turn a step's stream of finished trajectories into micro-batches, as soon as each can be trained on.

Micro-batch membership is fixed up front: the step's (prompt_index, sample_index) pairs in sorted order,
cut into runs of `micro_batch_size`. Micro-batch k is released when every sample in it has arrived and
every group it touches is complete (advantages need the whole group; with algorithm.advantageNormalization
'batch' every group of the step: trainer.advantages), and only after micro-batch k-1.
Fixed membership and order make the gradient a pure function of the rollouts, whatever order they
arrive in: the run is reproducible (and resumable bit-exactly) given the same rollouts. Torch-free.
"""

from __future__ import annotations

from rlboost.wire.rollout_io import Trajectory
from trainer import advantages
from trainer.grpo import Sample


class StreamError(ValueError):
    """A trajectory that does not belong to the step being assembled."""


class StepAssembler:
    """Collects one step's trajectories and releases ready micro-batches in order."""

    def __init__(
        self,
        step: int,
        num_prompts: int,
        group_size: int,
        micro_batch_size: int,
        normalization: str = "group",
    ) -> None:
        if num_prompts < 1 or group_size < 1 or micro_batch_size < 1:
            raise ValueError("num_prompts, group_size and micro_batch_size must all be >= 1")
        self.step, self.num_prompts, self.group_size = step, num_prompts, group_size
        self.normalization = normalization  # algorithm.advantageNormalization
        order = [(p, g) for p in range(num_prompts) for g in range(group_size)]
        self._chunks = [order[i : i + micro_batch_size] for i in range(0, len(order), micro_batch_size)]
        self._samples: dict[tuple[int, int], Sample] = {}
        self._groups_in: set[int] = set()  # groups with every sample in
        self._groups_done: set[int] = set()  # ... and their advantages set
        self._next_chunk = 0
        self.duplicates = 0

    @property
    def total(self) -> int:
        return self.num_prompts * self.group_size

    @property
    def received(self) -> int:
        return len(self._samples)

    @property
    def complete(self) -> bool:
        return self._next_chunk == len(self._chunks)

    def add(
        self,
        traj: Trajectory,
        reward: float,
        stale: bool = False,
        weight: float = 1.0,
        reward_failure: str | None = None,
        excluded: str = "",
    ) -> list[list[Sample]]:
        """Take one trajectory and its reward; return the micro-batches that became ready (possibly none), in order.

        `stale`/`weight`/`reward_failure`/`excluded`: see `Sample` (bounded staleness; weight 0 skips a too-stale
        sample's loss; a failed reward call's kind; out of its group's baseline)."""
        key = self.validate(traj)
        if key in self._samples:
            self.duplicates += 1  # a re-sent trajectory must not count twice
            return []
        self._samples[key] = Sample(
            traj, float(reward), stale=stale, weight=weight, reward_failure=reward_failure, excluded=excluded
        )
        self._maybe_finish_group(traj.prompt_index)
        return self._release()

    def has(self, traj: Trajectory) -> bool:
        """Whether this trajectory's (prompt, sample) is already in (a re-sent one: a retried step's rollout)."""
        return (traj.prompt_index, traj.sample_index) in self._samples

    def samples(self) -> list[Sample]:
        """Every sample received so far, in canonical order."""
        return [self._samples[k] for k in sorted(self._samples)]

    def missing(self) -> list[tuple[int, int]]:
        return [k for chunk in self._chunks for k in chunk if k not in self._samples]

    def validate(self, traj: Trajectory) -> tuple[int, int]:
        """Its (prompt_index, sample_index), or StreamError when it does not belong to this step."""
        if traj.step != self.step:
            raise StreamError(f"trajectory {traj.request_id}: step {traj.step}, expected {self.step}")
        if not (0 <= traj.prompt_index < self.num_prompts and 0 <= traj.sample_index < self.group_size):
            raise StreamError(
                f"trajectory {traj.request_id}: (prompt_index, sample_index)=({traj.prompt_index}, "
                f"{traj.sample_index}) outside {self.num_prompts} prompts x {self.group_size} samples"
            )
        return traj.prompt_index, traj.sample_index

    def _maybe_finish_group(self, p: int) -> None:
        if any((p, g) not in self._samples for g in range(self.group_size)):
            return
        self._groups_in.add(p)
        if self.normalization != "batch":
            advantages.assign([self._group(p)], self.normalization)
            self._groups_done.add(p)
        elif len(self._groups_in) == self.num_prompts:  # the step's std needs every group
            advantages.assign([self._group(q) for q in range(self.num_prompts)], self.normalization)
            self._groups_done = set(self._groups_in)

    def _group(self, p: int) -> list[Sample]:
        return [self._samples[(p, g)] for g in range(self.group_size)]

    def _release(self) -> list[list[Sample]]:
        out = []
        while self._next_chunk < len(self._chunks):
            chunk = self._chunks[self._next_chunk]
            if not all(p in self._groups_done for p, _ in chunk):
                break
            out.append([self._samples[k] for k in chunk])
            self._next_chunk += 1
        return out
