"""The chat template's part of an agentic episode: what the *environment* says, rendered with the model's chat
template, never what the model said.

`ChatFormat` gives the first prompt (`prompt(messages)`) and, after a model turn, the tokens the template puts
between that turn and the next generation (`after_turn(messages, stopped)`): the template's own end-of-turn glue,
the environment's messages and the generation prompt. It computes them as the difference of two renderings of a
fixed conversation, one with the new messages and one without, so the model's earlier turns are never rendered or
re-tokenised. The env-runner builds every episode with it; the tiny model's warm-up builds its demonstrations the
same way, so both see the same tokens. Needs only a tokenizer object (no torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# A conversation the environment's new messages are rendered after: its assistant turn ends as every model turn
# that stopped does, so the rendering's difference is exactly what follows a model turn.
_SENTINEL = "RLBOOST-TURN-SENTINEL"
_BASE = [{"role": "user", "content": "RLBOOST-USER-SENTINEL"}, {"role": "assistant", "content": _SENTINEL}]


class TemplateError(ValueError):
    """The chat template cannot continue a conversation token-exactly; the message says why."""


class ChatFormat:
    """The model's chat template and tokenizer, for the environment's side of an episode."""

    def __init__(self, tokenizer: Any, stop_ids: Sequence[int], enable_thinking: bool | None = None) -> None:
        self.tokenizer, self.stop_ids = tokenizer, frozenset(stop_ids)
        self.extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        self._base = closed = self._render(_BASE, False)
        after = closed[closed.rindex(_SENTINEL) + len(_SENTINEL) :]  # the template's end of an assistant turn
        stops = [tokenizer.decode([i]) for i in sorted(self.stop_ids)]
        stop = next((s for s in stops if s and after.startswith(s)), "")
        self._glue_after_stop = after[len(stop) :]  # what follows the model's own stop token (e.g. "\n")
        self._glue_after_cut = after  # a turn cut by its budget gets the whole end of turn

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool, tools: list | None = None) -> str:
        extra = {**self.extra, "tools": tools} if tools else self.extra
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False, **extra
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """A model turn's text (special tokens dropped), as the environment reads it."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def prompt(self, messages: list[dict[str, str]], tools: list | None = None) -> list[int]:
        """The episode's first prompt: its messages (and the OpenAI-style `tools` the template describes to the model,
        where it does) and the generation prompt."""
        return self.encode(self._render(messages, True, tools))

    def after_turn(self, messages: list[dict[str, str]], stopped: bool) -> list[int]:
        """What follows a model turn: the end-of-turn glue (all of it when the turn was cut, not `stopped`), the
        environment's `messages` and the generation prompt."""
        full = self._render([*_BASE, *messages], True)
        if not full.startswith(self._base):
            raise TemplateError(
                "the chat template renders earlier turns differently once messages follow them; an episode cannot be "
                "continued token-exactly with it"
            )
        glue = self._glue_after_stop if stopped else self._glue_after_cut
        return self.encode(glue + full[len(self._base) :])

    def ends_with_stop(self, ids: Sequence[int]) -> bool:
        return bool(ids) and ids[-1] in self.stop_ids
