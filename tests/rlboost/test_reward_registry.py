"""task.reward names an entry point of the group rlboost.rewards: built-ins, user packages, clear errors."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import pytest

from rlboost.reward_registry import BUILTIN_REWARDS, REWARD_GROUP, check_reward_name, registered_rewards
from rlboost.spec import JobSpecError, TaskSpec, parse_job_spec
from tests.rlboost import reward_plugins

ROOT = Path(__file__).resolve().parents[2]


def test_the_builtins_are_the_entry_points_pyproject_registers() -> None:
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][REWARD_GROUP]
    assert table == BUILTIN_REWARDS
    assert TaskSpec().reward == "exact_match"


def test_the_old_module_function_form_is_refused_with_how_to_register() -> None:
    with pytest.raises(JobSpecError) as err:
        parse_job_spec({"task": {"reward": "cProfile:run"}})
    assert err.value.problems[0].path == "task.reward"
    assert "'cProfile:run' is a 'module:function' path" in str(err.value)
    assert '[project.entry-points."rlboost.rewards"]' in str(err.value)


@pytest.mark.parametrize("name", ["no_such_reward", "cProfile", "os.system"])
def test_an_unregistered_name_lists_the_available_ones(name: str) -> None:
    with pytest.raises(JobSpecError) as err:
        parse_job_spec({"task": {"reward": name}})
    assert err.value.problems[0].path == "task.reward"
    assert "available: exact_match, format, format_reward, math_answer, math_verify, reasoning_gym, regex_match" in str(
        err.value
    )


def test_a_user_package_registers_its_own_but_cannot_replace_a_builtin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(reward_plugins.install(tmp_path)))
    assert parse_job_spec({"task": {"reward": "chaos"}}).task.reward == "chaos"
    assert check_reward_name("chaos") == "chaos_rewards:chaos"
    assert registered_rewards()["exact_match"] == "rlboost.tasks.rewards:exact_match"
    assert "chaos_rewards" not in sys.modules  # validating a spec imports no reward


def test_the_operator_checks_a_registered_reward_without_importing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlboost_operator.checks import SpecProblemError, check_reward

    monkeypatch.syspath_prepend(str(reward_plugins.install(tmp_path)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    check_reward("chaos")
    with pytest.raises(SpecProblemError, match="broken_rewards.* defines no 'score'"):
        check_reward("broken")
    assert "chaos_rewards" not in sys.modules
