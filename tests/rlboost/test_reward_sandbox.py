"""The reward sandbox with real processes: every way a reward can misbehave costs that sample a 0 and a
reason, the process is replaced, and the good samples of the same batch keep their rewards."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlboost.tasks.base import Example
from rlboost.tasks.sandbox import RewardSandbox, RewardSandboxError, SandboxLimits
from tests.rlboost import reward_plugins

GOOD = Example("What is 1+2?", "3")


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test reward package, installed for this process (spec checks) and the sandbox processes."""
    root = reward_plugins.install(tmp_path / "site")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    return root


LIMITS = SandboxLimits(timeout_seconds=3.0, cpu_seconds=1, memory_mib=512, processes=2)
# The CPU limit counts CPU time, the timeout wall time: beside a CPU-burning neighbour one CPU second can take more
# than 3 s of wall time, and the timeout would fire first. With this timeout only the CPU limit can end a burn.
CPU_LIMITS = dataclasses.replace(LIMITS, timeout_seconds=120.0)


@pytest.fixture
def chaos(plugins: Path, request: pytest.FixtureRequest) -> Iterator[RewardSandbox]:
    limits = CPU_LIMITS if getattr(request, "param", None) == "cpu" else LIMITS
    with RewardSandbox("chaos", limits) as sandbox:
        yield sandbox


def _listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


@pytest.mark.parametrize(
    ("text", "reason", "chaos"),
    [
        ("hang", "timeout", None),
        ("exit", "crash", None),
        ("segfault", "crash", None),
        ("hog", "memory", None),
        ("burn", "cpu", "cpu"),
        ("import os; os.system('touch PWNED')", "refused", None),
        ("socket", "refused", None),
        ("process", "refused", None),
        ("caught", "refused", None),
        ("nan", "bad_value", None),
        ("string", "bad_value", None),
        ("raise", "exception", None),
    ],
    indirect=["chaos"],
)
def test_a_misbehaving_call_scores_zero_and_the_batch_goes_on(
    chaos: RewardSandbox, text: str, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with _listener() as server:
        bad = Example(str(server.getsockname()[1]), "3")
        results = chaos.score([("3", GOOD), (text, bad), ("3", GOOD), ("4", GOOD), ("3", GOOD)])
        server.settimeout(0)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing connected
    assert [r.value for r in results] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert [r.failure for r in results] == [None, reason, None, None, None], results[1].detail
    assert chaos.replaced == 1
    assert not (tmp_path / "PWNED").exists()
    assert [r.value for r in chaos.score([("3", GOOD)] * 4)] == [1.0] * 4  # the replacement works


def test_every_failure_in_one_batch_is_counted_separately(chaos: RewardSandbox) -> None:
    texts = ["exit", "3", "raise", "nan", "3", "exit"]
    results = chaos.score([(t, GOOD) for t in texts])
    assert [r.failure for r in results] == ["crash", None, "exception", "bad_value", None, "crash"]
    assert [r.value for r in results] == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]


def test_builtins_score_as_in_process(plugins: Path) -> None:
    from rlboost.tasks.rewards import exact_match, math_answer

    samples = [("3", GOOD), ("x = \\boxed{3}", GOOD), ("4", GOOD), ("3<|im_end|>", GOOD)]
    for name, fn in (("exact_match", exact_match), ("math_answer", math_answer)):
        with RewardSandbox(name, SandboxLimits(processes=1)) as sandbox:
            assert [r.value for r in sandbox.score(samples)] == [fn(t, e) for t, e in samples]


def test_a_reward_that_does_not_import_fails_clearly_at_start(plugins: Path) -> None:
    with pytest.raises(RewardSandboxError, match="task.reward.*this reward package is broken"):
        RewardSandbox("broken", SandboxLimits(processes=1)).start()


def test_the_reward_gets_the_rows_metadata(chaos: RewardSandbox) -> None:
    rows = [("metadata", Example("q", "3", metadata={"score": 0.25, "source": "gsm8k"})), ("3", GOOD)]
    assert [(r.value, r.failure) for r in chaos.score(rows)] == [(0.25, None), (1.0, None)]


def test_a_failing_term_of_a_weighted_reward_fails_the_sample_with_its_reason(plugins: Path) -> None:
    from rlboost.spec import RewardTerm

    terms = [RewardTerm(name="exact_match"), RewardTerm(name="chaos", weight=0.5)]
    with RewardSandbox(terms, SandboxLimits(processes=1)) as sandbox:
        results = sandbox.score([("raise", GOOD), ("3", GOOD)])
    assert [(r.value, r.failure) for r in results] == [(0.0, "exception"), (1.5, None)]
    assert "bad sample" in results[0].detail


def test_a_steps_budget_cuts_what_runs_and_leaves_what_never_started_unscored(plugins: Path, monkeypatch) -> None:
    """Issue 31: two processes each stuck in a sample past the budget (their own limit is far away): both are cut
    with the kind 'budget', and the third sample, which no process was free to start, fails 'budget' unscored."""
    import rlboost.tasks.sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "QUEUE_BATCH", 1)  # one sample per take: each hang holds one process
    limits = dataclasses.replace(LIMITS, timeout_seconds=600.0, step_budget_seconds=2.0)
    with RewardSandbox("chaos", limits) as sandbox:
        results = sandbox.score([("hang", GOOD), ("hang", GOOD), ("3", GOOD)])
        assert [r.failure for r in results] == ["budget", "budget", "budget"]
        assert results[0].detail.startswith("cut:") and results[2].detail.startswith("not scored:")
        assert [r.value for r in sandbox.score([("3", GOOD), ("4", GOOD)])] == [1.0, 0.0]  # a new call: a new budget


def test_a_slow_sample_holds_one_process_and_the_pool_scores_the_rest(plugins: Path, monkeypatch) -> None:
    """Processes take small batches from one queue: a sample that hangs to its timeout holds its own batch, while
    the other process scores every later batch (a fixed split would have given it half of them)."""
    import rlboost.tasks.sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "QUEUE_BATCH", 2)
    items = [("hang", GOOD), ("3", GOOD)] + [("3", GOOD)] * 8
    with RewardSandbox("chaos", LIMITS) as sandbox:
        results = sandbox.score(items)
    assert [r.failure for r in results] == ["timeout"] + [None] * 9 and [r.value for r in results[1:]] == [1.0] * 9


def test_math_verify_past_the_call_limit_is_a_timeout_not_a_real_zero() -> None:
    """The audit's `9^{9^{9^9}}`: math-verify's own 5 s timeout returned False (0, no failure counted). Its timeouts
    are off now; the sandbox's per-call limit (here 8 s, past math-verify's 5) ends the call as 'timeout'."""
    limits = dataclasses.replace(LIMITS, timeout_seconds=8.0, cpu_seconds=60, processes=1)
    with RewardSandbox("math_verify", limits) as sandbox:
        (result,) = sandbox.score([("\\boxed{9^{9^{9^9}}}", Example("", "5"))])
        assert (result.value, result.failure) == (0.0, "timeout")
        assert [r.value for r in sandbox.score([("\\boxed{5}", Example("", "5"))])] == [1.0]  # the next call is fine
