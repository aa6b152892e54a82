"""Token in, token out: an episode's exact tokens (the chat template's part of them: rlboost.environments.chat).

`Transcript` holds an episode's tokens after its first prompt: each model turn's sampled ids with their log-probs
and weight versions (mask 1) and each environment part (mask 0, log-prob 0, the version of the turn before it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rlboost.wire.episode_io import TurnResult


@dataclass
class Transcript:
    """An episode's tokens: its first prompt, then model turns (mask 1) and environment parts (mask 0)."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    mask: bytearray = field(default_factory=bytearray)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per response token
    workers: list[str] = field(default_factory=list)
    turns: int = 0

    @property
    def tokens(self) -> list[int]:
        """Everything so far: the next turn's prompt."""
        return self.prompt_ids + self.ids

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.ids)

    def add_turn(self, t: TurnResult) -> None:
        """A model turn, exactly as sampled."""
        self.ids += t.token_ids
        self.mask += b"\x01" * len(t.token_ids)
        self.logprobs += t.logprobs
        spans = t.version_spans or [(t.weight_version, len(t.token_ids))]
        for version, n in spans:
            self.versions += [version] * n
        self.workers += [w for w in t.workers if not self.workers or self.workers[-1] != w]
        self.turns += 1

    def add_environment(self, ids: Sequence[int]) -> None:
        """The environment's part (never trained on), at the version of the turn before it."""
        self.ids += ids
        self.mask += b"\x00" * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [self.versions[-1] if self.versions else 0] * len(ids)

    def version_spans(self) -> list[tuple[int, int]]:
        """Run-length (version, tokens) of the response."""
        spans: list[tuple[int, int]] = []
        for v in self.versions:
            if spans and spans[-1][0] == v:
                spans[-1] = (v, spans[-1][1] + 1)
            else:
                spans.append((v, 1))
        return spans
