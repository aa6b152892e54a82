"""What the env-runner's unit tests share: a tiny tokenizer with the chat template (the `fmt` fixture is in
conftest.py), an episode's assignment, and the scripted policy that stands in for the rollout-manager."""

from __future__ import annotations

import json

from rlboost.environments.chat import ChatFormat
from rlboost.environments.tools import tool_call_text
from rlboost.models.tokenizer import stop_token_ids, train_tokenizer
from rlboost.wire.episode_io import EpisodeAssignment, TurnRequest, TurnResult
from rlboost.wire.rollout_io import SamplingParams

CALL = tool_call_text("calculator", {"expression": "7*6"})


def make_fmt() -> ChatFormat:
    corpus = [f"<|im_start|>user\nWhat is 7*6?<|im_end|>\n<|im_start|>assistant\n{CALL}<|im_end|>\n"] * 3
    tok = train_tokenizer([*corpus, "<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n42<|im_end|>\n"])
    return ChatFormat(tok, stop_token_ids(tok))


def assignment(max_turns: int = 3, max_tokens: int = 400) -> EpisodeAssignment:
    task = json.dumps({"question": "What is 7*6?", "answer": "42", "metadata": {"extra": 1}, "unknown": 2})
    sampling = SamplingParams(max_new_tokens=64, seed=3)
    return EpisodeAssignment("s0-p0-g0", 1, 0, 0, 0, task, sampling, 5, max_turns, max_tokens)


class Scripted:
    """A policy that answers each turn with the next text of a script, as token ids with made-up log-probs."""

    def __init__(self, fmt: ChatFormat, texts: list[str], version: int = 5) -> None:
        self.fmt, self.texts, self.version = fmt, list(texts), version
        self.requests: list[TurnRequest] = []

    async def __call__(self, r: TurnRequest) -> TurnResult:
        self.requests.append(r)
        ids = self.fmt.encode(self.texts.pop(0)) + sorted(self.fmt.stop_ids)[-1:]
        reason = "stop" if len(ids) <= r.max_new_tokens else "length"  # as a worker: never past the budget
        ids = ids[: r.max_new_tokens]
        return TurnResult(r.episode_id, r.turn, ids, [-0.5] * len(ids), reason, self.version, workers=["w1"])
