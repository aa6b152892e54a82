"""The `rlboost` command line: bad input (one clear line, exit 2), `serve`, and `rlboost local`'s
orchestration end to end with real processes — a real nats-server, real gRPC, real HTTP health checks —
where every service is replaced by tests/rlboost/fake_service.py (the real services are covered by
tests/e2e/test_local_e2e.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rlboost.cli.main import main
from rlboost.cli.serve_cmd import COMPONENTS, UnknownComponentError, command_for
from tests.helpers import wait_until

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_service.py")

DRIVER = """
import sys
from pathlib import Path
from rich.console import Console
from rlboost.local.plan import LocalOptions
from rlboost.local.runner import run_local
from rlboost.spec import JobSpec
run_dir, python, model, report, chaos = sys.argv[1:6]
spec = JobSpec.model_validate({"model": {"source": "path", "path": model}, "algorithm": {"steps": 2},
                               "rollout": {"spot": {"replicas": 2}}})
opts = LocalOptions(run_dir=Path(run_dir), python=python, chaos_kill_every=float(chaos) if chaos != "-" else None)
sys.exit(run_local(spec, opts, Console(width=160), Path(report)))
"""


def rlboost(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-m", "rlboost.cli.main", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def test_bad_config_names_the_field_and_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("algorithm:\n  groupSize: 1\n")
    res = rlboost("local", "--config", str(cfg), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 2
    assert "algorithm.groupSize" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "run").exists()  # nothing started


def test_bad_flags_name_the_flag() -> None:
    res = rlboost("local", "--steps", "0")
    assert res.returncode == 2 and "--steps (algorithm.steps)" in res.stderr and "Traceback" not in res.stderr
    res = rlboost("local", "--workers-spot", "99")
    assert res.returncode == 2 and "--workers-spot: 99 is outside" in res.stderr
    res = rlboost("local", "--trace-time-scale", "0")
    assert res.returncode == 2 and "--trace-time-scale: must be > 0" in res.stderr
    res = rlboost("local", "--chaos-kill-every", "2", "--chaos-targets", "spot,etcd")
    assert res.returncode == 2 and "--chaos-targets: unknown 'etcd'" in res.stderr and "Traceback" not in res.stderr
    res = rlboost("local", "--chaos-step-seconds", "2")
    assert res.returncode == 2 and "give its period with --chaos-kill-every S" in res.stderr
    res = rlboost("local", "--chaos-kill-every", "1", "--chaos-step-seconds", "0")
    assert res.returncode == 2 and "--chaos-step-seconds: must be > 0" in res.stderr
    res = rlboost("local", "--chaos-targets", "nats")
    assert res.returncode == 2 and "add --chaos-kill-every S" in res.stderr
    res = rlboost("local", "--chaos-kill-every", "1", "--chaos-signal", "STOP", "--chaos-targets", "spot,nats")
    assert res.returncode == 2 and "--chaos-signal STOP: only spot workers are frozen" in res.stderr
    res = rlboost("local", "--config", "/nonexistent.yaml")
    assert res.returncode == 2 and "config file not found: /nonexistent.yaml" in res.stderr


def test_bad_trace_names_the_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("0,1\n10;2\n")
    res = rlboost("local", "--spot-trace", str(trace))
    assert res.returncode == 2 and f"{trace}:2: expected 'seconds,instances'" in res.stderr


def test_serve_unknown_component_lists_choices() -> None:
    res = rlboost("serve", "frobnicator")
    assert res.returncode == 2
    assert "unknown component 'frobnicator'" in res.stderr and all(c in res.stderr for c in COMPONENTS)
    with pytest.raises(UnknownComponentError):
        command_for("nope", [])
    assert command_for("rollout-worker", ["--config", "x"]) == [PY, "-m", "rollout_worker", "--config", "x"]


def test_serve_execs_the_service_with_its_flags() -> None:
    """Execs a real service package (`--help` only, so nothing starts listening)."""
    if not (REPO / "services/rollout-manager/rollout_manager/__main__.py").exists():
        pytest.skip("rollout_manager has no __main__ yet")
    res = rlboost("serve", "rollout-manager", "--help")
    assert res.returncode == 0, res.stderr
    assert "--config" in res.stdout


def test_main_without_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "local" in capsys.readouterr().out


def _fake_env(tmp_path: Path, trainer: str) -> tuple[dict[str, str], list[str]]:
    """Environment and driver arguments for a run whose services are all fake_service.py."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"")
    wrapper = tmp_path / "fake-python"
    wrapper.write_text(f'#!/bin/sh\nexec {PY} {FAKE} "$@"\n')
    wrapper.chmod(0o755)
    env = {
        **os.environ,
        "FAKE_PID_DIR": str(pid_dir),
        "FAKE_TRAINER": trainer,
        "FAKE_DELAY": "3",
        "PYTHONPATH": str(REPO),
    }
    return env, [str(tmp_path / "run"), str(wrapper), str(model), str(tmp_path / "report.json")]


def _run_processes(run_dir: Path) -> list[int]:
    """Pids of live (non-zombie) processes whose command line mentions the run directory."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(run_dir) in cmd and state not in ("Z", "X") and int(proc.name) != os.getpid():
            pids.append(int(proc.name))
    return pids


def test_local_run_completes_with_report_and_leaves_nothing(tmp_path: Path) -> None:
    env, argv = _fake_env(tmp_path, "ok")
    res = subprocess.run([PY, "-c", DRIVER, *argv, "-"], env=env, capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert [s["step"] for s in report["steps"]] == [1, 2] and report["steps"][1]["weight_version"] == 2
    assert report["final_weights_checksum"] == "c2" and report["tokens_lost"] == 3 and report["migrations"] == 1
    # The manager's counters come from its typed status (GetStatus); reasons that never happened are left out.
    assert (report["tokens_regenerated"], report["tokens_received"]) == (2, 200)
    assert report["migrations_by_reason"] == {"drained": 1}
    assert {w["worker_id"]: w["weight_version"] for w in report["workers"]} == {"reserved-0": 2, "spot-0": 2}
    run = tmp_path / "run"
    assert (run / "reward.png").exists() and (run / "job.yaml").exists()
    assert not (run / "token").exists()  # every token is in the job's credentials
    assert (run / "credentials" / "token-trainer").stat().st_mode & 0o777 == 0o600
    assert {p.name.split("-")[0] for p in (tmp_path / "pids").iterdir()} >= {
        "weight_server",
        "rollout_manager",
        "rollout_worker",
        "trainer",
    }
    assert "summary" in res.stdout
    assert _run_processes(run) == []


def test_child_failure_stops_everything_with_one_clear_block(tmp_path: Path) -> None:
    env, argv = _fake_env(tmp_path, "fail")
    res = subprocess.run([PY, "-c", DRIVER, *argv, "-"], env=env, capture_output=True, text=True, timeout=90)
    assert res.returncode == 1
    # restarted as on Kubernetes, until trainer.backoffLimit (3) restarts in a row failed too
    assert "trainer keeps dying (4 times in a row, the last after" in res.stdout and "(exit code 5)" in res.stdout
    assert "CUDA out of memory (pretend)" in res.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] is False and "trainer" in report["error"]
    assert _run_processes(tmp_path / "run") == []


def test_sigterm_to_the_cli_stops_every_child(tmp_path: Path) -> None:
    env, argv = _fake_env(tmp_path, "hang")
    proc = subprocess.Popen([PY, "-c", DRIVER, *argv, "-"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(
            lambda: any(p.name.startswith("trainer-") for p in (tmp_path / "pids").iterdir()),
            timeout=60,
            what="trainer started",
        )
        children = _run_processes(tmp_path / "run")
        assert len(children) >= 7  # nats, weight-server, manager, 3 workers, trainer
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out.decode()
    assert b"interrupted by SIGTERM" in out
    assert _run_processes(tmp_path / "run") == []


def test_chaos_kills_and_replaces_spot_workers(tmp_path: Path) -> None:
    env, argv = _fake_env(tmp_path, "slow")
    res = subprocess.run([PY, "-c", DRIVER, *argv, "0.5"], env=env, capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["preemptions"] >= 1
    logs = {p.stem for p in (tmp_path / "run" / "logs").glob("spot-*.log")}
    assert "spot-2" in logs  # a replacement with a fresh id was started
    assert _run_processes(tmp_path / "run") == []


# ---- rlboost delta bench --source real ---------------------------------------------------------------------
def _delta_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, "-m", "rlboost.cli.delta_cmd", "delta", "bench", "--source", "real", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow  # a real DeepSpeed engine in a subprocess (+ JIT cache): ~30 s on this loaded 2-core machine
def test_delta_bench_real_source_benches_consecutive_states_of_real_trainer_steps(tmp_path: Path) -> None:
    """The CLI spawns `python -m trainer.delta_updates` (real engine, 2 real GRPO steps on the tiny model),
    then benches v0->v1 and v1->v2: bit-exact, the documented keys, and states that really changed."""
    out = _delta_cli(
        "--json",
        "--steps",
        "2",
        "--hidden",
        "32",
        "--layers",
        "1",
        "--heads",
        "2",
        "--warmup-steps",
        "0",
        "--repeat",
        "1",
        "--lr",
        "1e-4",
        "--keep",
        str(tmp_path / "states"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    keys = {"changed_fraction", "bytes_per_changed_element", "encode_gb_per_s", "apply_gb_per_s", "bit_exact"}
    assert keys | {"source"} <= set(result) and result["source"] == "real"
    assert result["bit_exact"] is True
    assert [p["pair"] for p in result["pairs"]] == ["v0->v1", "v1->v2"]
    for pair in result["pairs"]:
        assert keys <= set(pair) and pair["bit_exact"] is True
        assert 0 < pair["changed_fraction"] < 1  # a real step moved some bf16 weights, not all
    assert result["params"] > 10_000 and result["model"]["hiddenSize"] == 32
    states = sorted(p.name for p in (tmp_path / "states").glob("v*.safetensors"))
    assert states == ["v0.safetensors", "v1.safetensors", "v2.safetensors"]


def test_delta_bench_real_source_bad_input_is_one_clear_line(tmp_path: Path) -> None:
    """Bad flags are refused before any training; a model the spec cannot build is refused by the child with
    the field named, passed through as the CLI's one error line."""
    missing = _delta_cli("--spec", str(tmp_path / "nope.yaml"))
    indivisible = _delta_cli("--hidden", "30", "--heads", "4", "--steps", "1", "--keep", str(tmp_path / "s"))
    zero = _delta_cli("--steps", "0")
    for proc, needle in ((missing, "no such file"), (indivisible, "numHeads"), (zero, "--steps")):
        assert proc.returncode == 2, proc.stderr[-2000:]
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("module", "child"), [("rollout_manager", "rollout-manager"), ("weight_server", "weight-server")]
)
def test_a_service_killed_from_outside_is_restarted_on_its_port_and_the_run_completes(
    tmp_path: Path, module: str, child: str
) -> None:
    """As the OOM killer would: SIGKILL from outside the runner (issue 31: the weight-server's failed the job)."""
    env, argv = _fake_env(tmp_path, "slow")
    env["FAKE_DELAY"] = "15"  # the trainer's steps come after the service was killed and restarted
    proc = subprocess.Popen([PY, "-c", DRIVER, *argv, "-"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pids = tmp_path / "pids"

    def managers() -> list[Path]:
        return sorted(pids.glob(f"{module}-*"), key=lambda p: p.stat().st_mtime)

    try:
        first = wait_until(managers, timeout=60, what="manager started")[0]
        # the runner starts the trainer once the manager was ready: from then on a death is restarted
        wait_until(lambda: list(pids.glob("trainer-*")), timeout=60, what="trainer started")
        os.kill(int(first.name.split("-")[1]), signal.SIGKILL)
        wait_until(lambda: len(managers()) == 2, timeout=30, what=f"{child} restarted")
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out.decode()
    report = json.loads((tmp_path / "report.json").read_text())
    assert [e for e in report["spot_events"] if e.startswith(f"restarted {child}")], report["spot_events"]
    (restart,) = report["restarts"]
    assert (restart["process"], restart["cause"], restart["ended"]) == (child, "died", "SIGKILL")
    assert f"restarted {child} (died: SIGKILL after" in out.decode()  # said, with no live display
    assert _run_processes(tmp_path / "run") == []


def test_a_job_where_no_worker_would_start_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """Issue 31: no worker at all is refused by the spec (and the CRD's CEL rule); with spot workers that could exist
    but none that starts locally (no trace), `rlboost local` refuses too, rather than waiting in silence."""
    none = tmp_path / "none.yaml"
    none.write_text("rollout:\n  reserved: {replicas: 0}\n  spot: {replicas: 0, maxReplicas: 0}\n")
    res = rlboost("local", "--config", str(none), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 2 and "rollout.reserved.replicas and rollout.spot.maxReplicas are both 0" in res.stderr
    idle = tmp_path / "idle.yaml"
    idle.write_text("rollout:\n  reserved: {replicas: 0}\n  spot: {replicas: 0, minReplicas: 0, maxReplicas: 4}\n")
    res = rlboost("local", "--config", str(idle), "--run-dir", str(tmp_path / "run"))
    assert res.returncode == 2 and "no rollout worker would start" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_validate_and_render_run_the_operators_offline_module_in_a_process_of_their_own() -> None:
    """`rlboost validate` / `render` exec `python -m rlboost_operator.offline` (the core imports no service); the
    module itself: tests/rlboost_operator/test_offline.py."""
    from rlboost.cli.main import build_parser
    from rlboost.cli.offline_cmd import OPERATOR_MODULE, operator_argv

    parser = build_parser()
    args = parser.parse_args(["validate", "a.yaml", "b.yaml"])
    assert operator_argv(args) == [PY, "-m", OPERATOR_MODULE, "validate", "a.yaml", "b.yaml"]
    args = parser.parse_args(["render", "a.yaml", "-n", "ml", "--spot-replicas", "3"])
    assert operator_argv(args) == [
        PY,
        "-m",
        OPERATOR_MODULE,
        "render",
        "a.yaml",
        "--namespace",
        "ml",
        "--spot-replicas",
        "3",
    ]
    proc = subprocess.run(
        [PY, "-m", "rlboost.cli.main", "validate", "/no/such.yaml"], capture_output=True, text=True, timeout=120
    )
    assert (
        proc.returncode == 2 and proc.stderr.strip().startswith("rlboost validate: ") and "/no/such.yaml" in proc.stderr
    )
