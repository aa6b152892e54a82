"""verifiers (0.4) environments loaded by id (task.environment.verifiers) and played by the env-runner: single-turn,
tool-using (an MCP toolset verifiers serves) and multi-turn (the environment plays the user) ones, each from
tests/env_runner/vf_site (environments with small datasets of their own, no network).

Real parts: verifiers itself in the environment's own process (rlboost.environments.sandbox_child, its verifiers
mode), its interception server, its `null` chat harness program (run with this interpreter, nothing downloaded) and
its tool server, all calling the env-runner's OpenAI-compatible endpoint over loopback TCP with the episode's key.
The stand-in: the policy behind the endpoint is scripted (TurnResults made from text), where the real env-runner
asks the rollout-manager (tests/env_runner/test_harness_process.py runs that chain).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from env_runner.episode import HarnessRun
from env_runner.gateway import ChatGateway, serve_gateway
from rlboost.environment_registry import EnvironmentNameError, check_environment
from rlboost.environments.sandbox import EnvConfig, EnvProcess
from rlboost.environments.tools import tool_call_text
from rlboost.spec import JobSpecError, TaskSpec, parse_job_spec
from rlboost.tasks.dataset import generated_task
from rlboost.tasks.verifiers_taskset import VerifiersError, verifiers_examples
from rlboost.wire.episode_io import EpisodeAssignment
from tests.env_runner.scripted import Scripted, assignment

SITE = Path(__file__).parent / "vf_site"
CALL = tool_call_text("calc_calculator", {"expression": "7*6"})


@pytest.fixture(autouse=True)
def vf_site(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.env_runner import sites

    sites.on_path(SITE, monkeypatch)


def _task_of(env_id: str, index: int) -> EpisodeAssignment:
    a = assignment(max_turns=4)
    example = verifiers_examples(env_id, {})[index]
    import json

    a.task_json = json.dumps({"question": example.question, "answer": "", "metadata": example.metadata})
    return a


async def _play(fmt, env_id: str, index: int, *scripts: list[str]):
    """Episodes of task `index` in one environment process, one per script (the model's turns, as text)."""
    policy = Scripted(fmt, [text for script in scripts for text in script])
    gateway = ChatGateway(fmt, policy)
    served, port = await serve_gateway(gateway, "127.0.0.1", 0)
    gateway.tcp_url = f"http://127.0.0.1:{port}/v1"
    env = await EnvProcess.start(EnvConfig("", {}, 60, verifiers=env_id))
    try:
        assert env.kind == "harness"
        return [await HarnessRun(_task_of(env_id, index), env, gateway).run() for _ in scripts], policy
    finally:
        await env.kill()
        await served.cleanup()


async def test_a_single_turn_environment(fmt):
    (result, wrong), policy = await _play(fmt, "rlb-vf-single", 1, ["2"], ["3"])
    assert (wrong.finish_reason, wrong.reward) == ("stop", 0.0)  # scored by the environment; the same process
    assert (result.finish_reason, result.reward, result.turns, result.stats.env_error) == ("stop", 1.0, 1, "")
    assert result.prompt_ids == fmt.prompt([{"role": "user", "content": "What is 1+1?"}])
    assert list(result.loss_mask) == [1] * len(result.response_ids)  # the model's one turn, as sampled
    assert result.response_ids == fmt.encode("2") + sorted(fmt.stop_ids)[-1:]


async def test_a_tool_environment_calls_its_mcp_tool_between_turns(fmt):
    (result,), policy = await _play(fmt, "rlb-vf-tools", 0, [CALL, "42"])
    assert (result.finish_reason, result.reward, result.turns, result.stats.tool_calls) == ("stop", 1.0, 2, 1)
    turn0 = fmt.encode(CALL) + sorted(fmt.stop_ids)[-1:]
    # the tool's result (from verifiers' MCP server) follows the model's call, rendered by the template, mask 0
    tool = fmt.after_turn([{"role": "tool", "content": "42"}], stopped=True)
    assert policy.requests[1].input_ids == result.prompt_ids + turn0 + tool
    assert list(result.loss_mask) == [1] * len(turn0) + [0] * len(tool) + [1] * (
        len(result.response_ids) - len(turn0) - len(tool)
    )


async def test_a_multi_turn_environment_plays_the_user(fmt):
    (result, changed), policy = await _play(fmt, "rlb-vf-chat", 1, ["2", "2"], ["2", "3"])
    assert (result.finish_reason, result.reward, result.turns) == ("stop", 1.0, 2)
    assert (changed.turns, changed.reward) == (2, 0.0)  # its last answer is the one scored
    user = fmt.after_turn([{"role": "user", "content": "Are you sure? Give the number again."}], stopped=True)
    assert policy.requests[1].input_ids[-len(user) :] == user
    assert result.loss_mask.count(0) == len(user)


def test_an_environment_is_named_by_id_and_its_tasks_are_the_prompts():
    task = generated_task(TaskSpec.model_validate({"environment": {"verifiers": "rlb-vf-single"}}))
    assert task.name == "verifiers:rlb-vf-single" and [e.question for e in task.examples][:2] == [
        "What is 0+0?",
        "What is 1+1?",
    ]
    assert task.examples[3].metadata == {"verifiers": {"id": "rlb-vf-single", "index": 3}}
    args = {"taskset": {"num_tasks": 2}}
    assert len(verifiers_examples("rlb-vf-single", args)) == 2
    check_environment("", "rlb-vf-chat")
    with pytest.raises(EnvironmentNameError, match=r"task\.environment\.verifiers 'rlb-vf-nope'"):
        check_environment("", "rlb-vf-nope")
    with pytest.raises(VerifiersError, match=r"task\.environment\.verifiers 'rlb-vf-single'"):
        verifiers_examples("rlb-vf-single", {"taskset": {"num_tasks": "many"}})
    with pytest.raises(JobSpecError, match=r"task\.environment\.verifiers: a verifiers environment's prompts"):
        parse_job_spec({"task": {"environment": {"verifiers": "rlb-vf-single"}, "dataset": {"train": "x.jsonl"}}})
