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
The first line is {"ready": true, "netns": bool} or {"fail": "load", "detail": text}. A call that raises, is
refused or returns something that is no reply answers {"fail": reason, "detail": text} and the process exits: the
parent starts a fresh one for the next episode.
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from typing import Any

from rlboost.environment_registry import load_registered
from rlboost.environments.base import EnvironmentReplyError, messages_from, step_from
from rlboost.tasks.base import Example

# the reward sandbox's confinement, shared: the same limits and the same audit hook
from rlboost.tasks.sandbox_child import _audit, _confine_process, _cpu_budget, _violations


def _load(config: dict[str, Any]) -> Any:
    factory = load_registered(config["name"])
    return factory(**config.get("args", {}))


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


def _call(env: Any, request: dict[str, Any], cpu_seconds: int) -> dict[str, Any]:
    """One call's reply, or the failure that ends this process."""
    _cpu_budget(cpu_seconds)
    try:
        reply = _reset(env, request) if request.get("op") == "reset" else _step(env, request)
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
    netns = _confine_process(config["memory_mib"])
    try:
        env = _load(config)
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which names task.environment
        detail = "".join(traceback.format_exception_only(err)).strip()
        proto.write(json.dumps({"fail": "load", "detail": detail}) + "\n")
        sys.exit(1)
    sys.addaudithook(_audit)
    proto.write(json.dumps({"ready": True, "netns": netns}) + "\n")
    for line in sys.stdin:
        reply = _call(env, json.loads(line), config["cpu_seconds"])
        proto.write(json.dumps(reply) + "\n")
        if "fail" in reply:
            os._exit(3)  # a failed call may have left the environment in any state


if __name__ == "__main__":
    main()
