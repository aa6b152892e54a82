"""The environment sandbox process: loads one environment, then serves its episodes' calls read from stdin,
confined as the reward sandbox is (rlboost.tasks.sandbox_child: PR_SET_PDEATHSIG, its own network namespace where
permitted, RLIMIT_AS, a CPU budget per call, and, once the environment is loaded, the audit hook refusing
sockets, processes and exec of text).

Run by rlboost.environments.sandbox (`python -m rlboost.environments.sandbox_child '<config json>'`), never by hand.
Config: {"name": entry point, "args": {...}, "memory_mib": n, "cpu_seconds": n}.

Protocol (JSON lines; replies on the protocol fd, the original stdout; what the environment prints goes to stderr):
    {"op": "reset", "task": {question, answer, messages, metadata}}  ->  {"messages": [...]}
    {"op": "step", "action": text}  ->  {"observation": [...], "reward": x | null, "done": bool,
                                         "tool_calls": n, "tool_failures": n}
    {"op": "run", "task": {...}, "policy": {base_url, api_key, episode_id, socket_path}}   (a harness environment)
                                    ->  {"reward": x | null, "tool_calls": n, "tool_failures": n}
The first line is {"ready": true, "netns": bool, "kind": "steps" | "harness"} or {"fail": "load", "detail": text}.
A harness reaches the env-runner's chat endpoint over its Unix socket (config "gateway_socket"): the audit hook lets
it create Unix sockets and connect to that path, and to nothing else. A call that raises, is
refused or returns something that is no reply answers {"fail": reason, "detail": text} and the process exits: the
parent starts a fresh one for the next episode.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import inspect
import json
import math
import os
import resource
import signal
import socket
import sys
import traceback
import typing
from typing import Any

from rlboost.environment_registry import load_registered
from rlboost.environments.base import EnvironmentReplyError, messages_from, step_from
from rlboost.environments.harness import PolicyEndpoint, is_harness, outcome_from
from rlboost.tasks.base import Example

# the reward sandbox's confinement, shared: the same limits and the same audit hook
from rlboost.tasks.sandbox_child import _PR_SET_PDEATHSIG, _audit, _confine_process, _cpu_budget, _violations


def _load(config: dict[str, Any]) -> Any:
    if config.get("verifiers"):
        from rlboost.environments.verifiers_env import VerifiersEnvironment

        return VerifiersEnvironment(config["verifiers"], config.get("args", {}))
    factory = load_registered(config["name"])
    return factory(**config.get("args", {}))


def _confine(config: dict[str, Any]) -> bool:
    """The sandbox's confinement; a verifiers environment keeps the network (its interception server, tool servers
    and harness program talk over loopback, and its harness reaches the endpoint over TCP): the parent's death still
    ends it, and its address space is capped. Whether it has a network namespace of its own."""
    if not config.get("verifiers"):
        return _confine_process(config["memory_mib"])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    limit = config["memory_mib"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return False


def _reset(env: Any, request: dict[str, Any]) -> dict[str, Any]:
    return {"messages": messages_from(env.reset(Example(**request["task"])), "reset()")}


def _step(env: Any, request: dict[str, Any]) -> dict[str, Any]:
    step = step_from(env.step(request["action"]))
    if step.reward is not None and not math.isfinite(step.reward):
        raise EnvironmentReplyError(f"step() reward {step.reward} is not finite")
    return {
        "observation": step.observation,
        "reward": None if step.reward is None else float(step.reward),
        "done": step.done,
        "tool_calls": step.tool_calls,
        "tool_failures": step.tool_failures,
    }


def _run(env: Any, request: dict[str, Any]) -> dict[str, Any]:
    """A harness's whole episode: its model turns go to the endpoint, what it returns is the outcome."""
    value = env.run(Example(**request["task"]), PolicyEndpoint(**request["policy"]))
    if inspect.isawaitable(value):  # one loop for the process: what the environment keeps open lives on
        value = _LOOP.run_until_complete(_awaited(value))
    out = outcome_from(value)
    return {"reward": out.reward, "tool_calls": int(out.tool_calls), "tool_failures": int(out.tool_failures)}


async def _awaited(value: Any) -> Any:
    return await value


_OPS = {"reset": _reset, "step": _step, "run": _run}
_LOOP = asyncio.new_event_loop()


# Code the standard library generates from a class's own declarations, which HTTP clients (httpx, h11, openai)
# produce when they import lazily mid-call: dataclasses' methods and typing's forward references. Compiling and
# running it is allowed for a harness; what that code could reach (sockets, processes) is still refused.
_GENERATED_BY = frozenset(
    {(dataclasses.__file__, "_create_fn"), (typing.__file__, "__init__"), (typing.__file__, "_evaluate")}
)


def _gateway_audit(gateway_socket: str):
    """The sandbox's audit hook, less what a harness needs to reach the endpoint: Unix sockets (asyncio's own
    wake-up pair included), a connect to the endpoint's path (a connect anywhere else is refused), and the code the
    standard library generates as its HTTP client's modules load (_GENERATED_BY)."""

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event == "socket.__new__" and len(args) > 1 and args[1] == socket.AF_UNIX:
            return
        if event == "socket.connect" and gateway_socket and len(args) > 1 and args[1] == gateway_socket:
            return
        if event in ("compile", "exec"):
            caller = sys._getframe(1).f_code  # noqa: SLF001 - who compiles is what decides
            if (caller.co_filename, caller.co_name) in _GENERATED_BY:
                return
        _audit(event, args)

    return audit


def _prepare_clients() -> None:
    """What the openai client computes once (its platform headers read /etc/os-release and may ask `uname`), done
    before the audit hook is installed; absent packages are fine (a harness need not use them)."""
    try:
        from openai._base_client import platform_headers

        platform_headers("0", platform=None)
    except Exception:  # noqa: BLE001,S110 - optional: the harness may use another client
        pass


def _call(env: Any, request: dict[str, Any], cpu_seconds: int) -> dict[str, Any]:
    """One call's reply, or the failure that ends this process."""
    _cpu_budget(cpu_seconds)
    try:
        reply = _OPS.get(request.get("op"), _step)(env, request)
    except MemoryError:
        return {"fail": "memory", "detail": "MemoryError (task.environment.memoryMib)"}
    except BaseException as err:  # noqa: BLE001 - any failure of the environment fails its episode
        if _violations:
            return {"fail": "refused", "detail": _violations[-1]}
        return {"fail": "crash", "detail": f"{type(err).__name__}: {err}"[:500]}
    if _violations:  # the environment caught the refusal and returned anyway
        return {"fail": "refused", "detail": _violations[-1]}
    return reply


def main() -> None:
    config = json.loads(sys.argv[1])
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the environment prints goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    netns = _confine(config)
    try:
        env = _load(config)
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which names task.environment
        detail = "".join(traceback.format_exception_only(err)).strip()
        proto.write(json.dumps({"fail": "load", "detail": detail}) + "\n")
        sys.exit(1)
    kind = "harness" if is_harness(env) else "steps"
    if kind == "harness":
        _prepare_clients()
    if not config.get("verifiers"):  # verifiers starts processes and servers of its own: no audit hook (docs)
        sys.addaudithook(_gateway_audit(config.get("gateway_socket", "")) if kind == "harness" else _audit)
    proto.write(json.dumps({"ready": True, "netns": netns, "kind": kind}) + "\n")
    for line in sys.stdin:
        reply = _call(env, json.loads(line), config["cpu_seconds"])
        proto.write(json.dumps(reply) + "\n")
        if "fail" in reply:
            os._exit(3)  # a failed call may have left the environment in any state


if __name__ == "__main__":
    main()
