"""The env-runner's episode: token-exact transcripts (the model's turns kept as sampled, the environment's parts
rendered by the chat template's difference), one episode driven against the real calculator in its confined
process, the chat gateway's token-in/token-out bookkeeping and its refusals.

The stand-in: the policy is scripted here (a function returning TurnResults), where the real env-runner asks the
rollout-manager; tests/env_runner/test_env_runner_process.py runs the real chain of processes.
"""

from __future__ import annotations

import pytest

from env_runner.episode import EpisodeRun, task_of
from env_runner.gateway import ChatGateway, GatewayError
from env_runner.transcript import Transcript
from rlboost.environments.chat import ChatFormat
from rlboost.environments.sandbox import EnvConfig, EnvProcess
from rlboost.wire.episode_io import TurnRequest, TurnResult
from tests.env_runner.scripted import CALL, Scripted, assignment


def test_the_chat_format_renders_only_what_the_environment_says(fmt: ChatFormat):
    prompt = fmt.prompt([{"role": "user", "content": "What is 7*6?"}])
    assert fmt.tokenizer.decode(prompt) == "<|im_start|>user\nWhat is 7*6?<|im_end|>\n<|im_start|>assistant\n"
    after = fmt.after_turn([{"role": "tool", "content": "42"}], stopped=True)
    assert fmt.tokenizer.decode(after) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    cut = fmt.after_turn([{"role": "tool", "content": "42"}], stopped=False)  # the model's turn had no end: closed
    assert fmt.tokenizer.decode(cut).startswith("<|im_end|>\n<|im_start|>tool")


def test_a_transcript_keeps_model_turns_as_sampled_and_masks_the_rest():
    t = Transcript([9, 9])
    t.add_turn(TurnResult("e", 0, [1, 2], [-0.1, -0.2], "stop", 3, version_spans=[(2, 1), (3, 1)], workers=["a"]))
    t.add_environment([7, 7, 7])
    t.add_turn(TurnResult("e", 1, [4], [-0.4], "stop", 4, workers=["a", "b"]))
    assert t.tokens == [9, 9, 1, 2, 7, 7, 7, 4]
    assert bytes(t.mask) == b"\x01\x01\x00\x00\x00\x01" and t.logprobs == [-0.1, -0.2, 0.0, 0.0, 0.0, -0.4]
    assert t.version_spans() == [(2, 1), (3, 4), (4, 1)]  # environment tokens at the version of the turn before
    assert t.workers == ["a", "b"] and t.turns == 2


async def test_an_episode_is_driven_turn_by_turn_against_the_real_environment(fmt: ChatFormat):
    policy = Scripted(fmt, [CALL, "42"])
    env = await EnvProcess.start(EnvConfig("calculator", {}))
    try:
        result = await EpisodeRun(assignment(), env, ChatGateway(fmt, policy)).run()
    finally:
        await env.kill()
    assert (result.finish_reason, result.reward, result.turns) == ("stop", 1.0, 2)
    first, second = policy.requests
    assert first.input_ids == result.prompt_ids and second.turn == 1
    turn0 = fmt.encode(CALL) + sorted(fmt.stop_ids)[-1:]
    assert second.input_ids[len(result.prompt_ids) : len(result.prompt_ids) + len(turn0)] == turn0  # as sampled
    assert result.response_ids == second.input_ids[len(result.prompt_ids) :] + fmt.encode("42") + turn0[-1:]
    assert len(result.loss_mask) == len(result.response_ids) == len(result.logprobs)
    assert result.loss_mask.count(0) == len(second.input_ids) - len(result.prompt_ids) - len(turn0)
    assert result.stats.tool_calls == 1 and result.stats.tool_failures == 0 and result.stats.tool_seconds > 0
    assert result.version_spans == [(5, len(result.response_ids))]


async def test_an_episode_stops_at_its_turns_and_tokens(fmt: ChatFormat):
    prompt = fmt.prompt([{"role": "user", "content": "What is 7*6?"}])
    after = fmt.after_turn([{"role": "tool", "content": "42"}], stopped=True)
    turn = len(fmt.encode(CALL)) + 1
    most = len(prompt) + 2 * turn + len(after) + 3  # a second turn fits, the tool's answer after it does not
    env = await EnvProcess.start(EnvConfig("calculator", {}))
    try:
        turns = await EpisodeRun(assignment(max_turns=1), env, ChatGateway(fmt, Scripted(fmt, [CALL]))).run()
        tokens = await EpisodeRun(assignment(max_tokens=most), env, ChatGateway(fmt, Scripted(fmt, [CALL] * 3))).run()
    finally:
        await env.kill()
    assert (turns.finish_reason, turns.turns, turns.reward) == ("length", 1, None)
    assert (tokens.finish_reason, tokens.turns) == ("length", 2)
    assert len(tokens.prompt_ids) + len(tokens.response_ids) == most - 3


async def test_a_failed_turn_fails_the_episode(fmt: ChatFormat):
    async def failing(r: TurnRequest) -> TurnResult:
        return TurnResult(r.episode_id, r.turn, [], [], "failed", 0, error="no worker")

    env = await EnvProcess.start(EnvConfig("calculator", {}))
    try:
        result = await EpisodeRun(assignment(), env, ChatGateway(fmt, failing)).run()
    finally:
        await env.kill()
    assert result.finish_reason == "failed" and "no worker" in result.stats.env_error


def test_a_task_is_read_from_the_manager_s_json():
    ex = task_of('{"question": "q", "answer": 3, "metadata": {"k": 1}, "other": true}')
    assert (ex.question, ex.answer, ex.metadata) == ("q", "3", {"k": 1})
    with pytest.raises(ValueError, match="task_json"):
        task_of("[1]")


async def test_the_gateway_continues_the_conversation_token_exactly(fmt: ChatFormat):
    policy = Scripted(fmt, [CALL, "42"])
    gateway = ChatGateway(fmt, policy)
    key = gateway.open(assignment())
    messages = [{"role": "user", "content": "What is 7*6?"}]
    first = await gateway.complete(key, {"messages": messages})
    reply = first["choices"][0]
    assert (
        reply["finish_reason"] == "tool_calls" and reply["message"]["tool_calls"][0]["function"]["name"] == "calculator"
    )
    assert first["rlboost"]["token_ids"] == fmt.encode(CALL) + sorted(fmt.stop_ids)[-1:]
    messages += [reply["message"], {"role": "tool", "content": "42"}]
    second = await gateway.complete(key, {"messages": messages, "max_tokens": 8})
    assert second["choices"][0]["message"]["content"] == "42" and second["rlboost"]["turn"] == 1
    # the second turn's prompt holds the first turn's ids as sampled, then the template's part, mask 0
    t = gateway.episodes[key].transcript
    assert policy.requests[1].input_ids[: len(t.prompt_ids) + len(first["rlboost"]["token_ids"])] == (
        t.prompt_ids + first["rlboost"]["token_ids"]
    )
    assert policy.requests[1].max_new_tokens == 8


async def test_the_gateway_refuses_what_it_cannot_continue(fmt: ChatFormat):
    gateway = ChatGateway(fmt, Scripted(fmt, [CALL, "42"]))
    with pytest.raises(GatewayError) as no_key:
        await gateway.complete("wrong", {"messages": [{"role": "user", "content": "hi"}]})
    assert no_key.value.status == 401
    key = gateway.open(assignment())
    await gateway.complete(key, {"messages": [{"role": "user", "content": "What is 7*6?"}]})
    edited = [{"role": "user", "content": "What is 8*6?"}, {"role": "tool", "content": "48"}]
    with pytest.raises(GatewayError, match=r"messages\[0\]: differs"):
        await gateway.complete(key, {"messages": edited})
    with pytest.raises(GatewayError, match="messages"):
        await gateway.complete(key, {"messages": "hello"})


async def test_the_gateway_serves_chat_completions_over_http(fmt: ChatFormat):
    import httpx

    from env_runner.gateway import serve_gateway

    gateway = ChatGateway(fmt, Scripted(fmt, [CALL]))
    key = gateway.open(assignment())
    runner, port = await serve_gateway(gateway, "127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1") as client:
            body = {"model": "policy", "messages": [{"role": "user", "content": "What is 7*6?"}]}
            ok = await client.post("/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
            refused = await client.post("/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
            models = await client.get("/models")
    finally:
        await runner.cleanup()
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["tool_calls"][0]["type"] == "function"
    assert refused.status_code == 401 and "Authorization" in refused.json()["error"]["message"]
    assert models.json()["data"][0]["id"] == "policy"
