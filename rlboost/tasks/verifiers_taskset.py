"""A `verifiers` (0.4) environment's own tasks as the job's prompts (task.environment.verifiers): the trainer's
side. The environment is loaded by id with `args` merged into its verifiers config; `verifiers_examples` lists its
taskset, each Example carrying the task's index (rlboost.environments.verifiers_env plays the episodes). verifiers
is imported only here, when such a job runs.
"""

from __future__ import annotations

from typing import Any

from rlboost.tasks.base import Example

KEY = "verifiers"  # Example.metadata[KEY] = {"id": env id, "index": the task's index in its taskset}
FIELD = "task.environment.verifiers"


class VerifiersError(ValueError):
    """A verifiers environment that cannot be loaded or run; the message names the field."""


def env_config(env_id: str, args: dict[str, Any]) -> Any:
    """The verifiers config of `env_id` with `args` merged in; rlboost's defaults: the subprocess runtime and the
    `null` chat harness (no code execution) unless args say otherwise."""
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise VerifiersError(
            f"{FIELD}: the verifiers package is not installed; install rlboost[environments]"
        ) from None
    env, _, taskset = env_id.rpartition("+")
    data: dict[str, Any] = {k: v for k, v in args.items() if k not in ("taskset", "agent")}
    data["taskset"] = {**args.get("taskset", {}), "id": taskset}
    if env:
        data["id"] = env
    agent = dict(args.get("agent", {}))
    agent.setdefault("harness", {"id": "null"})
    agent.setdefault("runtime", {"type": "subprocess"})
    data["agent"] = agent
    try:
        return vf.resolve_env_config(data)
    except Exception as err:  # noqa: BLE001 - verifiers' own validation: one line naming the field
        raise VerifiersError(f"{FIELD} {env_id!r} (with task.environment.args): {_line(err)}") from None


def load(env_id: str, args: dict[str, Any]) -> Any:
    import verifiers.v1 as vf

    config = env_config(env_id, args)
    try:
        return vf.load_environment(config)
    except Exception as err:  # noqa: BLE001
        raise VerifiersError(f"{FIELD} {env_id!r}: {_line(err)}") from None


def verifiers_examples(env_id: str, args: dict[str, Any]) -> list[Example]:
    """The environment's tasks as the job's prompts (the trainer's task): their prompt text, their index."""
    env = load(env_id, args)
    tasks = list(env.taskset)
    if not tasks:
        raise VerifiersError(f"{FIELD} {env_id!r}: its taskset has no tasks (task.environment.args.taskset)")
    return [
        Example(_prompt_text(t.data.prompt), "", metadata={KEY: {"id": env_id, "index": i}})
        for i, t in enumerate(tasks)
    ]


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt or [] if getattr(m, "role", None) == "user"]
    content = getattr(users[-1], "content", "") if users else ""
    return content if isinstance(content, str) else str(content)


def _line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:500]
