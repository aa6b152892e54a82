"""The registry of plain Python environments: entry points in the group `rlboost.environments`, found without
importing them.

`task.environment.name` names an entry point, never a module path, as `task.reward` does (rlboost.reward_registry):
a job spec can only pick an environment some installed package registered on purpose (the built-ins below; a user
package in its pyproject.toml: `[project.entry-points."rlboost.environments"] my_env = "my_pkg.envs:MyEnv"`). The
entry point is a class or factory called with `task.environment.args`; it returns an object with `reset(task)` and
`step(action)` (rlboost.environments.base.Environment). Nothing here imports an environment: spec validation, the
operator and the trainer read package metadata only; loading happens in the environment sandbox
(rlboost.environments.sandbox) inside an env-runner.

`task.environment.verifiers` names a `verifiers` environment by id instead: the module `find_module` locates (without
importing it) is the one verifiers' loader imports.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

ENVIRONMENT_GROUP = "rlboost.environments"
BUILTIN_ENVIRONMENTS: dict[str, str] = {
    "calculator": "rlboost.environments.calculator:CalculatorEnv",
}
ENVIRONMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
REGISTER_HINT = (
    'register it as an entry point in its package\'s pyproject.toml: [project.entry-points."rlboost.environments"] '
    "my_env = \"my_pkg.module:MyEnv\", install the package (in the trainer's and the env-runners' images), and set "
    "task.environment.name: my_env"
)


class EnvironmentNameError(ValueError):
    """`task.environment` names no known environment; the message names the field, the choices and the fix."""


def registered_environments() -> dict[str, str]:
    """Every registered environment: name -> 'module:attr' (built-ins first; a package cannot replace one)."""
    found = {ep.name: ep.value for ep in entry_points(group=ENVIRONMENT_GROUP)}
    return {**found, **BUILTIN_ENVIRONMENTS}


def check_environment_name(name: str) -> str:
    """The entry point ('module:attr') that `name` resolves to, or EnvironmentNameError saying what to do."""
    if ":" in name or not ENVIRONMENT_NAME.match(name):
        raise EnvironmentNameError(
            f"task.environment.name {name!r} is not an entry point name (letters, digits, '_', '.', '-'); "
            f"to use your own environment, {REGISTER_HINT}"
        )
    available = registered_environments()
    if name not in available:
        raise EnvironmentNameError(
            f"task.environment.name {name!r} is not a registered environment; available: "
            f"{', '.join(sorted(available))}. To add one, {REGISTER_HINT}"
        )
    return available[name]


def verifiers_modules(env_id: str) -> list[str]:
    """The modules a verifiers environment id names, as verifiers 0.4's loader imports them: `<env>+<taskset>` or a
    taskset alone; a hub id's `owner/` and `@version` dropped; '-' -> '_', lower case; verifiers' own packages first
    (`verifiers.v1.envs.<env>`, `verifiers.v1.tasksets.<taskset>`), else an installed module of that name."""
    env, _, taskset = env_id.rpartition("+")
    out = []
    for name, group in ((env, "verifiers.v1.envs"), (taskset, "verifiers.v1.tasksets")):
        if name:
            module = name.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
            out.append(f"{group}.{module}" if _found(f"{group}.{module}") else module)
    return out


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_verifiers_id(env_id: str) -> list[str]:
    """The modules of the verifiers environment `env_id`, found (not imported); EnvironmentNameError otherwise."""
    modules = verifiers_modules(env_id)
    if not modules or not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", m) for m in modules):
        raise EnvironmentNameError(f"task.environment.verifiers {env_id!r} is not an environment id")
    if not _found("verifiers.v1"):
        raise EnvironmentNameError(
            f"task.environment.verifiers {env_id!r}: the verifiers package is not installed; install "
            "rlboost[environments] in the trainer's and the env-runners' images"
        )
    missing = [m for m in modules if not _found(m)]
    if missing:
        raise EnvironmentNameError(
            f"task.environment.verifiers {env_id!r}: no installed module {missing[0]!r}; install the environment's "
            "package (e.g. `pip install <env package>` or `prime env install <id>`) in the trainer's and the "
            "env-runners' images, or fix the id"
        )
    return modules


def load_registered(name: str) -> Callable[..., Any]:
    """Import and return the environment factory `name`. Runs the environment's module code: call it only where
    environments are meant to run (the environment sandbox, or the tiny model's warm-up for a built-in)."""
    target = check_environment_name(name)
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise EnvironmentNameError(f"task.environment.name {name!r}: {target!r} is a {type(obj).__name__}")
    return obj


def check_environment(name: str, verifiers: str) -> None:
    """The environment task.environment names exists (metadata only; nothing imported): before the first step."""
    if name:
        check_environment_name(name)
    elif verifiers:
        check_verifiers_id(verifiers)
