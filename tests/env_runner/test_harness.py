"""Harness environments: the user's own agent loop, in the confined environment process, drives an episode through
the env-runner's OpenAI-compatible endpoint with the real `openai` client (over the endpoint's Unix socket, the only
place the sandbox lets it connect to). The episode's tokens are the endpoint's bookkeeping: the model's turns as
sampled, the harness's messages rendered by the chat template (mask 0).

The stand-in: the policy behind the endpoint is scripted here (TurnResults made from text), where the real env-runner
asks the rollout-manager; tests/env_runner/test_harness_process.py runs the real chain of processes.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from env_runner.episode import HarnessRun
from env_runner.gateway import ChatGateway, serve_gateway
from rlboost.environments.harness import Outcome, is_harness, outcome_from
from rlboost.environments.sandbox import EnvConfig, EnvProcess
from tests.env_runner import sites
from tests.env_runner.scripted import CALL, Scripted, assignment

SOLVER = textwrap.dedent(
    '''
    import json, socket, time
    from rlboost.environments.calculator import calculate
    from rlboost.environments.harness import Outcome

    class Solver:
        """Asks the model; runs each calculator call it makes (a tool message); its last answer is scored."""
        def __init__(self, mode="ok"):
            self.mode = mode
        def run(self, task, policy):
            if self.mode == "socket":
                socket.create_connection(("127.0.0.1", 9))
            client = policy.openai()
            messages = [{"role": "user", "content": task.question}]
            calls = 0
            for _ in range(4):
                reply = client.chat.completions.create(model=policy.model, messages=messages)
                message = reply.choices[0].message
                messages.append({"role": "assistant", "content": message.content})
                if not message.tool_calls:
                    return Outcome(reward=float(message.content.strip() == task.answer), tool_calls=calls)
                calls += len(message.tool_calls)
                if self.mode == "hang":
                    time.sleep(3600)
                expression = json.loads(message.tool_calls[0].function.arguments)["expression"]
                messages.append({"role": "tool", "content": calculate(expression)})
            return Outcome(reward=0.0, tool_calls=calls)
    '''
)


@pytest.fixture
def solver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    sites.on_path(sites.install(tmp_path / "site", "solver_env", SOLVER, {"solver": "Solver"}), monkeypatch)
    return "solver"


async def _episode(fmt, solver: str, texts: list[str], tmp_path: Path, mode: str = "ok", timeout: float = 30):
    policy = Scripted(fmt, texts)
    gateway = ChatGateway(fmt, policy, str(tmp_path / "policy.sock"))
    served, _ = await serve_gateway(gateway, path=gateway.socket_path)
    env = await EnvProcess.start(EnvConfig(solver, {"mode": mode}, timeout, gateway_socket=gateway.socket_path))
    try:
        assert env.kind == "harness"
        return await HarnessRun(assignment(), env, gateway).run(), policy
    finally:
        await env.kill()
        await served.cleanup()


async def test_a_harness_drives_its_episode_through_the_endpoint_with_the_openai_client(fmt, solver, tmp_path):
    result, policy = await _episode(fmt, solver, [CALL, "42"], tmp_path)
    assert (result.finish_reason, result.reward, result.turns) == ("stop", 1.0, 2)
    assert result.stats.tool_calls == 1 and result.stats.env_error == ""
    first, second = policy.requests
    turn0 = fmt.encode(CALL) + sorted(fmt.stop_ids)[-1:]
    assert first.input_ids == result.prompt_ids == fmt.prompt([{"role": "user", "content": "What is 7*6?"}])
    # token in, token out: the second turn's prompt holds the first turn's ids exactly as sampled, then the
    # harness's tool message as the chat template renders it after a stopped turn
    tool = fmt.after_turn([{"role": "tool", "content": "42"}], stopped=True)
    assert second.input_ids == result.prompt_ids + turn0 + tool
    assert result.response_ids == turn0 + tool + fmt.encode("42") + turn0[-1:]
    assert list(result.loss_mask) == [1] * len(turn0) + [0] * len(tool) + [1] * (len(fmt.encode("42")) + 1)
    assert all(lp == (-0.5 if m else 0.0) for lp, m in zip(result.logprobs, result.loss_mask, strict=True))


@pytest.mark.parametrize(("mode", "reason"), [("socket", "refused"), ("hang", "timeout")])
async def test_a_harness_that_leaves_its_sandbox_or_hangs_fails_its_episode(fmt, solver, tmp_path, mode, reason):
    result, _ = await _episode(fmt, solver, [CALL, "42"], tmp_path, mode=mode, timeout=2)
    assert result.finish_reason == "failed" and result.stats.env_error.startswith(reason), result.stats.env_error


def test_what_a_harness_returns_is_its_outcome():
    assert outcome_from(0.5) == Outcome(0.5) and outcome_from(None) == Outcome(None)
    assert outcome_from(Outcome(1.0, tool_calls=2)).tool_calls == 2
    with pytest.raises(ValueError, match="run\\(\\) returned"):
        outcome_from("yes")
    with pytest.raises(ValueError, match="finite"):
        outcome_from(Outcome(float("nan")))
    assert is_harness(type("H", (), {"run": lambda self, t, p: 1})())
    assert not is_harness(type("E", (), {"run": lambda s: 1, "step": lambda s, a: 1})())
