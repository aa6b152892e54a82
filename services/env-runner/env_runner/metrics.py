"""Prometheus metrics of the env-runner (served on --metrics-port by rlboost.observability.serve_http)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

EPISODES = Counter(
    "rlboost_env_runner_episodes_total",
    "Episodes driven to their end, by finish reason: stop (the environment ended it), length (maxTurns or "
    "maxEpisodeTokens), failed (its environment failed; the manager follows rollout.onFailedRequest)",
    ["finish_reason"],
)
TURNS_PER_EPISODE = Histogram(
    "rlboost_env_runner_turns_per_episode", "Model turns of each episode", buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
)
TOOL_CALLS = Counter("rlboost_env_runner_tool_calls_total", "Tool calls the environments ran")
TOOL_FAILURES = Counter(
    "rlboost_env_runner_tool_failures_total",
    "Tool calls that failed (malformed, unknown tool, wrong arguments, the tool raised): each an observation",
)
TOOL_SECONDS = Histogram(
    "rlboost_env_runner_tool_seconds",
    "Wall time of one environment call (reset, or a step with its tools)",
    buckets=(0.001, 0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
ENV_FAILURES = Counter(
    "rlboost_env_runner_environment_failures_total",
    "Environment calls that failed their episode: timeout (task.environment.stepTimeoutSeconds), crash, cpu, "
    "memory, refused (the sandbox's audit hook), bad_reply, load",
    ["reason"],
)
RUNNING = Gauge("rlboost_env_runner_episodes_running", "Episodes this env-runner drives now")
CAPACITY = Gauge("rlboost_env_runner_capacity", "Episodes this env-runner drives at most")
IN_TOOLS = Gauge("rlboost_env_runner_episodes_in_tools", "Of the running episodes, those whose environment steps now")
TURN_SECONDS = Histogram(
    "rlboost_env_runner_turn_seconds",
    "Wall time of one model turn as the env-runner waits for it (queueing, generation, migration)",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
GATEWAY_CALLS = Counter(
    "rlboost_env_runner_gateway_calls_total",
    "Calls of the OpenAI-compatible chat endpoint, by outcome: ok, refused (a bad request: 4xx), failed",
    ["outcome"],
)
