"""rlboost.environments: tool calls parsed from the model's text (a malformed one an observation), the calculator,
and the confined environment process: reset and step over JSON lines, and every way an environment fails (a hang
hits its deadline, a crash, a refused socket, a reply that is none, an unknown name) as an EnvFailure naming it.

The faulty environments are a real package registered under `rlboost.environments` the way a user's is: a module and
a dist-info with entry_points.txt in a directory on the path of this process and of the sandbox's children.
"""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from rlboost.environment_registry import EnvironmentNameError, check_environment_name, check_verifiers_id
from rlboost.environments.base import EnvironmentReplyError, Step, step_from
from rlboost.environments.calculator import CalculatorEnv, calculate
from rlboost.environments.sandbox import EnvConfig, EnvFailure, EnvPool, EnvProcess
from rlboost.environments.tools import ToolCall, ToolCallError, parse_tool_calls, tool_call_text
from rlboost.tasks.base import Example

TASK = Example("What is 7*6?", "42")

FAULTY = textwrap.dedent(
    """
    import socket, time
    from rlboost.environments.base import Step

    class Faulty:
        def __init__(self, mode="ok"):
            self.mode = mode
        def reset(self, task):
            return [{"role": "user", "content": task.question}]
        def step(self, action):
            if self.mode == "hang":
                time.sleep(3600)
            if self.mode == "crash":
                raise RuntimeError("the tool blew up")
            if self.mode == "socket":
                socket.create_connection(("127.0.0.1", 9))
            if self.mode == "bad_reply":
                return {"not": "a step"}
            return Step([], reward=0.5, done=True)
    """
)


@pytest.fixture
def faulty_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The entry point `faulty` of a package installed (as metadata and a module) in a directory on the path."""
    site = tmp_path / "site"
    dist = site / "faulty_envs-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: faulty-envs\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[rlboost.environments]\nfaulty = faulty_envs:Faulty\n")
    (site / "faulty_envs.py").write_text(FAULTY)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", f"{site}:{__import__('os').environ.get('PYTHONPATH', '')}")
    return "faulty"


def test_tool_calls_are_parsed_and_a_malformed_one_says_why():
    good = tool_call_text("calculator", {"expression": "7*6"})
    calls = parse_tool_calls(f"thinking... {good} and <tool_call>{{not json</tool_call> <tool_call>[1]</tool_call>")
    assert calls[0] == ToolCall("calculator", {"expression": "7*6"})
    assert isinstance(calls[1], ToolCallError) and "not JSON" in str(calls[1])
    assert isinstance(calls[2], ToolCallError) and '"name"' in str(calls[2])
    assert parse_tool_calls("42") == []


def test_the_calculator_answers_calls_and_scores_the_final_answer():
    env = CalculatorEnv()
    assert env.reset(TASK) == [{"role": "user", "content": "What is 7*6?"}]
    step = env.step(tool_call_text("calculator", {"expression": "7*6"}))
    assert step.observation == [{"role": "tool", "content": "42"}] and not step.done and step.tool_calls == 1
    bad = env.step('<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>')
    assert bad.tool_failures == 1 and bad.observation[0]["content"].startswith("error: calculator:")
    unknown = env.step('<tool_call>{"name": "search", "arguments": {}}</tool_call>')
    assert "no tool 'search'" in unknown.observation[0]["content"]
    assert env.step("42") == Step([], reward=1.0, done=True)
    assert env.step("41").reward == 0.0


def test_the_calculator_evaluates_arithmetic_only():
    assert calculate("(2+3)*4 - 6/3") == "18"
    for bad in ("__import__('os')", "2**1000", "1/0", "(1"):
        with pytest.raises((ValueError, ZeroDivisionError)):
            calculate(bad)


def test_a_step_reply_must_be_a_step():
    assert step_from(("done", 1.0, True)) == Step([{"role": "user", "content": "done"}], 1.0, True)
    with pytest.raises(EnvironmentReplyError, match="Step"):
        step_from({"observation": []})
    with pytest.raises(EnvironmentReplyError, match="not a number"):
        step_from(Step([], reward="1", done=True))  # type: ignore[arg-type]


def test_unknown_environments_are_refused_naming_the_field():
    with pytest.raises(EnvironmentNameError, match="task.environment.name 'nope'.*calculator"):
        check_environment_name("nope")
    with pytest.raises(EnvironmentNameError, match="task.environment.verifiers 'vf-nope'"):
        check_verifiers_id("vf-nope")


async def test_an_episode_in_the_confined_process():
    proc = await EnvProcess.start(EnvConfig("calculator", {}))
    try:
        assert await proc.reset(TASK) == [{"role": "user", "content": "What is 7*6?"}]
        step = await proc.step(tool_call_text("calculator", {"expression": "7*6"}))
        assert step.observation == [{"role": "tool", "content": "42"}] and step.tool_calls == 1
        assert (await proc.step("42")).reward == 1.0
    finally:
        await proc.kill()


@pytest.mark.parametrize(
    ("mode", "reason"), [("hang", "timeout"), ("crash", "crash"), ("socket", "refused"), ("bad_reply", "crash")]
)
async def test_a_failing_environment_fails_its_call_with_the_reason(faulty_env: str, mode: str, reason: str):
    pool = EnvPool(EnvConfig(faulty_env, {"mode": mode}, step_timeout_s=2.0))
    proc = await pool.acquire()
    await proc.reset(TASK)
    with pytest.raises(EnvFailure) as failed:
        await proc.step("anything")
    assert failed.value.reason == reason
    assert not proc.alive
    pool.release(proc)  # a dead process is not kept: the next episode gets a fresh one
    fresh = await pool.acquire()
    assert fresh is not proc and pool.started == 2
    pool.release(fresh)
    await pool.close()


async def test_an_environment_that_cannot_load_names_the_field(faulty_env: str):
    with pytest.raises(EnvFailure) as failed:
        await EnvProcess.start(EnvConfig(faulty_env, {"no_such_arg": 1}))
    assert failed.value.reason == "load" and "task.environment.name 'faulty'" in str(failed.value)


async def test_a_cancelled_call_does_not_leave_its_reply_for_the_next_episode(faulty_env: str):
    pool = EnvPool(EnvConfig(faulty_env, {"mode": "hang"}, step_timeout_s=60.0))
    proc = await pool.acquire()
    await proc.reset(TASK)
    call = asyncio.create_task(proc.step("x"))
    await asyncio.sleep(0)  # the request is written; its reply never read
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    pool.release(proc)
    assert not proc.alive and not pool._idle
    await pool.close()  # waits for the kill
    assert proc.proc.returncode is not None
