"""Step time of the same tiny GRPO job in `rlboost local` and in TRL's `GRPOTrainer`, one after the other (issue 34).

    pip install 'rlboost[compare]'                                    # trl 1.16.0 + accelerate (the TRL side only)
    python bench/trl_compare.py                                       # 12 steps each, every core of this process
    python bench/trl_compare.py --cores 1 --trl-threads 1             # both on one core, TRL with one thread
    python bench/trl_compare.py --steps 20 --json trl.json            # the figures as JSON
    python bench/trl_compare.py --only trl --trl-threads 2            # one side only

The job is the embedded default of `rlboost local` (`rlboost.spec.JobSpec()`): the tiny Qwen3 model that
`rlboost local` creates (2 layers, hidden 128, random init + supervised warm-up on the task's format, from the model
cache), the addition task (operands 0..5, 400 prompts from seed 1234, batches in rlboost's seeded order) and the
`exact_match` reward. `--steps` overrides `algorithm.steps` on both sides.

Both sides run on the same cores: `--cores N` pins either side's process (and every process it starts) to the
first N cores this one may use (default: all of them), one side after the other, the load average read before and after
each. rlboost runs its own processes (NATS, weight-server, manager, trainer, 1 reserved + 2 spot torch workers, one
thread each but the trainer's: rlboost.local.plan); TRL runs in one process with `--trl-threads` torch threads
(default: the cores). "Equal cores" is the default; `--cores 1 --trl-threads 1` is TRL's single-thread case against
rlboost squeezed onto that one core.

Per side: seconds per step (median of the step wall times after step 0, which includes start-up: the time between
consecutive step reports for rlboost, between the trainer's step begin and end callbacks for TRL), the fastest
step, the mean, response tokens per second (response tokens of those steps / their summed time), and the wall time
of the whole run. `--json PATH` writes `rlboost_s_per_step` and `trl_s_per_step` and the details.

TRL configuration, field for field from the rlboost spec (docs/algorithms.md has the general mapping):

| rlboost (`JobSpec()` default)                | TRL `GRPOConfig`                                              |
| ---                                          | ---                                                           |
| `algorithm.promptsPerStep` 32 x `groupSize` 8 | `num_generations` 8, generation batch 256 = `per_device_train_batch_size` 32 x `gradient_accumulation_steps` 8 (`steps_per_generation` 8: one generation and one optimizer step per step) |
| `algorithm.microBatchSize` 32                | `per_device_train_batch_size` 32                               |
| `maxNewTokens` 8, `temperature` 1, `topP` 1   | `max_completion_length` 8, `temperature` 1.0, `top_p` 1.0, `top_k` 0 (off, as rlboost) |
| stop at `<|im_end|>` / `<|endoftext|>`        | the model's generation_config eos ids (the same two)           |
| `learningRate` 2e-3, constant, AdamW wd 0     | `learning_rate` 2e-3, `lr_scheduler_type` constant, `optim` adamw_torch, `weight_decay` 0 |
| `gradClip` 1.0                               | `max_grad_norm` 1.0                                           |
| `clipRatio` 0.2, `klCoef` 0 (no reference)    | `epsilon` 0.2, `beta` 0.0 (no reference model)                |
| `lossAggregation: sequence`                  | `loss_type` grpo                                              |
| `advantageNormalization: group` (eps 1e-6)    | `scale_rewards` group (eps 1e-4)                              |
| `updatesPerStep` 1                           | `num_iterations` 1                                            |
| `seed` 0; prompts in the task's seeded order | `seed` 0; the same prompts per step (`shuffle_dataset` False)   |
| fp32 trainer (CPU), bf16 weights to workers   | fp32 (`use_cpu`, no bf16)                                      |
| `trainer.sharePrompts` true: each prompt once per micro-batch | no equivalent: every row's prompt computed again (`sharePrompts: false` in a `--rlboost-config` file does the same) |
| no activation checkpointing                  | `gradient_checkpointing` False (TRL's default True recomputes the forward: slower) |
| `exact_match` on the decoded response        | the same function on TRL's decoded completion                 |

What is not the same: TRL samples with transformers' `generate` in the training process (its own random stream),
rlboost on its workers with per-request seeds, so the responses differ sample for sample; TRL shuffles the
generation batch before cutting micro-batches. The work per step (256 responses of at most 8 tokens, 8 micro-batches
of 32, one AdamW step) is the same; rlboost computes each micro-batch's 4 prompts once, TRL each of its 32 rows'
prompts (its micro-batches are cut from a shuffled batch, so a plain forward is all it could do).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 1800  # one side is about a minute on 2 idle cores; a hung run must not hold the bench
TRL_MISSING = (
    "trl_compare: the TRL side needs trl (not installed): pip install 'rlboost[compare]' "
    "(trl==1.16.0, accelerate==1.15.0), or run --only rlboost"
)


# ---- the job, as both sides see it ---------------------------------------------------------------------------


def default_spec(steps: int):
    """The embedded default job (`rlboost local` with no --config) with `steps` steps."""
    from rlboost.spec import JobSpec

    spec = JobSpec()
    spec.algorithm.steps = steps
    return spec


def model_dir() -> Path:
    """The default job's tiny model, as `rlboost local` creates it (from the model cache when it was made before)."""
    from rlboost.models import ensure_model

    spec = default_spec(1)
    out = Path(tempfile.gettempdir()) / "rlboost-trl-compare" / "model"
    return ensure_model(spec.model, spec.task, out)


def step_prompts(steps: int) -> list[dict]:
    """The rows TRL trains on: rlboost's prompts of each step in order (question as one user turn, answer)."""
    from rlboost.tasks.base import make_task

    spec = default_spec(steps)
    task, n = make_task(spec.task), spec.algorithm.prompts_per_step
    return [
        {"prompt": task.messages(example), "question": example.question, "answer": example.answer}
        for step in range(steps)
        for _, example in task.batch(step, n)
    ]


# ---- the TRL side (a child process: its threads and cores are its own) ---------------------------------------


def trl_config(spec, out_dir: str):
    """GRPOConfig mapped from the rlboost spec (the table in the module docstring)."""
    from trl import GRPOConfig

    alg = spec.algorithm
    micro = alg.micro_batch_size
    return GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=alg.prompts_per_step * alg.group_size // micro,
        num_generations=alg.group_size,
        max_completion_length=alg.max_new_tokens,
        temperature=alg.temperature,
        top_p=alg.top_p,
        top_k=0,
        learning_rate=alg.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=alg.grad_clip,
        beta=alg.kl_coef,
        epsilon=alg.clip_ratio,
        loss_type="grpo",
        scale_rewards="group",
        num_iterations=alg.updates_per_step,
        seed=alg.seed,
        shuffle_dataset=False,
        max_steps=alg.steps,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1 << 30,
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
        gradient_checkpointing=False,  # TRL's default recomputes the forward in backward; rlboost does not
    )


def trl_reward(tokens: list[int]):
    """rlboost's exact_match as a TRL reward function; counts each batch's response tokens into `tokens`."""
    from rlboost.tasks.base import Example
    from rlboost.tasks.rewards import exact_match

    def exact_match_reward(completions, question, answer, completion_ids, **_) -> list[float]:
        tokens.append(sum(len(ids) for ids in completion_ids))
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [exact_match(t, Example(q, a)) for t, q, a in zip(texts, question, answer, strict=True)]

    return exact_match_reward


def run_trl_child(steps: int, threads: int, out: Path) -> None:
    """In the child: train `steps` steps with GRPOTrainer, write the step times and tokens to `out`."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    torch.set_num_threads(threads)
    directory, spec = model_dir(), default_spec(steps)
    times: list[float] = []
    cpu: list[float] = []
    tokens: list[int] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)
            cpu.append(time.process_time() - self.c0)  # every thread of the process

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    with tempfile.TemporaryDirectory() as tmp:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=trl_reward(tokens),
            args=trl_config(spec, tmp),
            train_dataset=Dataset.from_list(step_prompts(steps)),
            processing_class=tokenizer,
            callbacks=[StepClock()],
        )
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
    cpu_per_step = {"trl": round(statistics.median(cpu[1:]), 4)}
    figures = {"step_seconds": times, "tokens": tokens, "wall_seconds": wall, "threads": threads}
    out.write_text(json.dumps({**figures, "cpu_seconds_per_step": cpu_per_step}))


# ---- running each side ---------------------------------------------------------------------------------------


def chosen_cores(cores: int) -> list[int]:
    """The first `cores` cores this process may use (0: all of them): where both sides run."""
    allowed = sorted(os.sched_getaffinity(0))
    return allowed[:cores] if cores else allowed


def pinned(cores: list[int]):
    """A preexec_fn that pins the child (and every process it starts) to `cores`."""
    return lambda: os.sched_setaffinity(0, cores)


def run_trl(steps: int, threads: int, work: Path, cores: list[int]) -> dict:
    """The TRL side in a child process; its raw figures. Refuses with one line when trl is not installed."""
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        raise SystemExit(TRL_MISSING)
    out = work / "trl.json"
    cmd = [sys.executable, __file__, "--_trl-child", str(out), "--steps", str(steps), "--trl-threads", str(threads)]
    done = subprocess.run(
        cmd, cwd=work, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=child_env(), preexec_fn=pinned(cores)
    )
    if done.returncode != 0:
        raise SystemExit(f"trl_compare: the TRL run failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def child_env() -> dict[str, str]:
    """The environment of either side: rlboost's CPU numerics (AVX2 kernels) for TRL too, so both use one ISA."""
    from rlboost.cpu_numerics import CPU_NUMERICS_ENV

    return {**CPU_NUMERICS_ENV, **os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}


def run_rlboost(steps: int, work: Path, cores: list[int], config: str = "") -> dict:
    """`rlboost local --steps N` on the embedded default; the step wall times from the trainer's step records, and
    the CPU seconds per step of each of its processes (sampled while it runs)."""
    run_dir, report = work / "rlboost-run", work / "rlboost.json"
    metrics = run_dir / "tracking" / "metrics.jsonl"
    cmd = [sys.executable, "-m", "rlboost.cli.main", "local", "--steps", str(steps)]
    cmd += ["--run-dir", str(run_dir), "--json-report", str(report)]
    cmd += ["--config", str(Path(config).resolve())] if config else []
    t0 = time.perf_counter()
    with open(work / "rlboost.log", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT, env=child_env(), preexec_fn=pinned(cores)
        )
        cpu = CpuSampler(proc.pid, metrics, steps).follow(proc)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"trl_compare: rlboost local failed:\n{(work / 'rlboost.log').read_text()[-3000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    stamps = [r["time"] for r in records]
    steps_s = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]  # step k+1's wall: report k to report k+1
    first = records[0]["rollout_seconds"] + records[0]["train_seconds"] + records[0]["sync_seconds"]
    return {
        "step_seconds": [first, *steps_s],
        "tokens": [int(r["tokens"]) for r in records],
        "wall_seconds": wall,
        "threads": "1 per worker, torch's default in the trainer",
        "final_weights_checksum": json.loads(report.read_text()).get("final_weights_checksum", ""),
        "cpu_seconds_per_step": cpu,
        "step_split_s": step_split(records[1:]),
        "step_timeline_ms": step_timeline(run_dir / "logs"),
    }


def step_split(records: list[dict]) -> dict:
    """The trainer's own split of a step (StepReport fields), medians over the timed steps."""
    keys = ("rollout_seconds", "train_seconds", "sync_seconds", "train_compute_seconds", "trainer_idle_seconds")
    keys += ("first_trajectory_seconds",)
    return {k: round(statistics.median(r[k] for r in records), 4) for k in keys}


# A step's events in the services' structured logs: (name in the timeline, service, log message, first or last of
# the step's lines). A step runs from the trainer's "step done" of the step before to its own.
EVENTS = (
    ("manager_has_request", "rollout-manager", "rollout step started", "first"),
    ("first_worker_pulled", "rollout-worker", "pulled weights", "first"),
    ("last_worker_applied", "rollout-worker", "weights updated in place", "last"),
    ("manager_delivered_all", "rollout-manager", "rollout step delivered", "first"),
    ("trainer_stepped_and_extracted", "trainer", "state extracted", "first"),
    ("trainer_uploaded", "trainer", "weights uploaded", "first"),
    ("step_done", "trainer", "step done", "first"),
)


def step_timeline(logs: Path) -> dict:
    """Median milliseconds from a step's start to each of its EVENTS, over the steps after the first two and
    before the last (steady state), with the workers' pull seconds: where a step's wall time goes."""
    rows = []
    for path in logs.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    rows.append(json.loads(line))
    done = sorted(r["ts"] for r in rows if r.get("msg") == "step done")
    spans = list(zip(done[2:-2], done[3:-1], strict=True))
    out: dict = {}
    for name, service, msg, which in EVENTS:
        offsets = []
        for start, end in spans:
            ts = [
                r["ts"] for r in rows if r.get("service") == service and r.get("msg") == msg and start < r["ts"] <= end
            ]
            if ts:
                offsets.append(((min(ts) if which == "first" else max(ts)) - start) * 1000)
        if offsets:
            out[name] = round(statistics.median(offsets), 1)
    pulls = [r["seconds"] * 1000 for r in rows if r.get("msg") == "pulled weights" and "seconds" in r]
    if pulls:
        out["worker_pull_ms_median"] = round(statistics.median(pulls), 1)
    out.update(publish_ms(rows, spans))
    return out


def publish_ms(rows: list[dict], spans: list[tuple[float, float]]) -> dict:
    """The trainer's publish per step, medians in ms: from its state extracted to its upload done (cast, checksum,
    delta or snapshot, the weight-server's answers), and the encode part of it (`encode_seconds`)."""
    if not spans:
        return {}
    trainer = [r for r in rows if r.get("service") == "trainer"]
    publish = []
    for start, end in spans:
        ts = {m: [r["ts"] for r in trainer if r.get("msg") == m and start < r["ts"] <= end] for m in PUBLISH_SPAN}
        if all(ts.values()):
            publish.append((min(ts[PUBLISH_SPAN[1]]) - min(ts[PUBLISH_SPAN[0]])) * 1000)
    encode = [r["encode_seconds"] * 1000 for r in trainer if "encode_seconds" in r and r["ts"] > spans[0][0]]
    out = {"trainer_publish_ms_median": round(statistics.median(publish), 1)} if publish else {}
    if encode:
        out["trainer_encode_ms_median"] = round(statistics.median(encode), 1)
    return out


PUBLISH_SPAN = ("state extracted", "weights uploaded")  # the trainer's log lines that bound a step's publish


ROLES = (  # a process's role, by what its command line holds (first match)
    ("trainer", "-m trainer"),
    ("rollout-worker", "-m rollout_worker"),
    ("rollout-manager", "-m rollout_manager"),
    ("weight-server", "-m weight_server"),
    ("nats", "nats-server"),
    ("reward-sandbox", "sandbox_child"),
    ("rlboost-local", "rlboost.cli.main"),
)


class CpuSampler:
    """CPU seconds of every process of an `rlboost local` run, by role, between the report of step 1 and that of
    the last step but one (start-up and shut-down left out), per step. Polls the process tree and metrics.jsonl."""

    def __init__(self, root: int, metrics: Path, steps: int, poll_s: float = 0.1) -> None:
        self.root, self.metrics, self.steps, self.poll_s = root, metrics, steps, poll_s
        self.first: tuple[int, dict[int, tuple[str, float]]] | None = None
        self.last: tuple[int, dict[int, tuple[str, float]]] | None = None

    def follow(self, proc: subprocess.Popen) -> dict:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while proc.poll() is None:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("trl_compare: rlboost local ran past its timeout")
            self._sample()
            time.sleep(self.poll_s)
        return self.per_step()

    def _reports(self) -> int:
        try:
            return self.metrics.read_text().count("\n")
        except OSError:
            return 0

    def _sample(self) -> None:
        reports = self._reports()
        if reports < 2 or reports > self.steps - 1:
            return
        snap = (reports, self._tree())
        if self.first is None:
            self.first = snap
        self.last = snap

    def _tree(self) -> dict[int, tuple[str, float]]:
        import psutil

        out = {}
        try:
            procs = [psutil.Process(self.root), *psutil.Process(self.root).children(recursive=True)]
        except psutil.Error:
            return out
        for p in procs:
            try:
                line, t = " ".join(p.cmdline()), p.cpu_times()
            except psutil.Error:
                continue
            role = next((r for r, needle in ROLES if needle in line), "other")
            out[p.pid] = (role, t.user + t.system)
        return out

    def per_step(self) -> dict:
        if self.first is None or self.last is None or self.last[0] == self.first[0]:
            return {}
        (n0, a), (n1, b) = self.first, self.last
        roles: dict[str, float] = {}
        for pid, (role, cpu) in b.items():
            roles[role] = roles.get(role, 0.0) + cpu - (a[pid][1] if pid in a else 0.0)
        out = {role: round(cpu / (n1 - n0), 4) for role, cpu in sorted(roles.items())}
        out["total"] = round(sum(roles.values()) / (n1 - n0), 4)
        return out


def summary(raw: dict) -> dict:
    """s/step (median after step 0), fastest, mean, tokens/s over the same steps, from a side's raw figures."""
    times, tokens = raw["step_seconds"][1:], raw["tokens"][1:]
    return {
        "s_per_step": round(statistics.median(times), 4),
        "fastest_step_s": round(min(times), 4),
        "mean_step_s": round(statistics.mean(times), 4),
        "tokens_per_s": round(sum(tokens) / sum(times), 1),
        "response_tokens_per_step": round(statistics.mean(tokens), 1),
        "steps_timed": len(times),
        "wall_seconds": round(raw["wall_seconds"], 2),
        "threads": raw["threads"],
        **{
            k: raw[k]
            for k in ("final_weights_checksum", "cpu_seconds_per_step", "step_split_s", "step_timeline_ms")
            if k in raw
        },
    }


def measured(side: str, run) -> dict:
    """Run one side with the load average beside it."""
    before = os.getloadavg()
    out = summary(run())
    out["load_before"], out["load_after"] = [round(x, 2) for x in before], [round(x, 2) for x in os.getloadavg()]
    print(
        f"{side:8s} {out['s_per_step']:.3f} s/step (fastest {out['fastest_step_s']:.3f}, mean {out['mean_step_s']:.3f})"
        f"  {out['tokens_per_s']:.0f} tokens/s  load {before[0]:.2f} -> {out['load_after'][0]:.2f}",
        flush=True,
    )
    return out


def compare(args: argparse.Namespace) -> dict:
    """Both sides (or `--only` one), one after the other, on the same cores; the figures."""
    cores = chosen_cores(args.cores)
    threads = args.trl_threads or len(cores)
    sides = ["rlboost", "trl"] if args.only == "both" else [args.only]
    result: dict = {"steps": args.steps, "cores": len(cores), "trl_threads": threads, "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="trl-compare-") as tmp:
        work = Path(tmp)
        model_dir()  # created once, before either side is timed
        for side in sides:
            if side == "rlboost":
                run = lambda: run_rlboost(args.steps, work, cores, args.rlboost_config)  # noqa: E731
            else:
                run = lambda: run_trl(args.steps, threads, work, cores)  # noqa: E731
            result[side] = measured(side, run)
            result[f"{side}_s_per_step"] = result[side]["s_per_step"]
    if "rlboost" in result and "trl" in result:
        result["rlboost_over_trl"] = round(result["rlboost_s_per_step"] / result["trl_s_per_step"], 3)
        print(f"rlboost / TRL step time: {result['rlboost_over_trl']:.2f} (goal: 0.5 at equal cores)")
    return result


def machine() -> str:
    return f"{platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, {platform.platform()}".strip()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/trl_compare.py", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12, help="steps per side (step 0, start-up, is not timed)")
    p.add_argument("--cores", type=int, default=0, help="pin both sides to this many cores (0: all allowed)")
    p.add_argument("--trl-threads", type=int, default=0, help="TRL's torch threads (0: one per core of --cores)")
    p.add_argument(
        "--rlboost-config",
        default="",
        metavar="YAML",
        help="rlboost's job spec instead of the embedded default (e.g. a copy of examples/local.yaml with "
        "`trainer: {sharePrompts: false}`, TRL's arithmetic); TRL's side stays the default job",
    )
    p.add_argument("--only", choices=["both", "rlboost", "trl"], default="both", help="run one side only")
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    p.add_argument("--_trl-child", dest="trl_child", metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be at least 2 (step 0 includes start-up and is not timed)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.trl_child:
        run_trl_child(args.steps, args.trl_threads or 1, Path(args.trl_child))
        return 0
    result = compare(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
