"""The trainer service: DeepSpeed GRPO that consumes rollouts as a stream and publishes weights.

Run it (each flag also reads RLBOOST_<FLAG> from the environment):

    python -m trainer --config job.yaml --manager 127.0.0.1:50051 --weight-server http://127.0.0.1:8000 \
        --token-file token.txt --model-dir runs/x/model --metrics-port 9102 --run-dir runs/x/trainer \
        --nats-url nats://127.0.0.1:4222 --namespace default --job local [--steps N] [--dump-rollouts F] \
        [--checkpoint-dir DIR [--resume]]

Several ranks: start one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK)
in the environment (torchrun or a StatefulSet); rank 0 talks to the peers, the others follow it.

Exit 0 after JobDone(ok=True); on failure JobDone(ok=False) is published and the process exits 1 with one
clear line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from rlboost.observability import serve_http, setup_logging
from rlboost.service_args import env_default, parse_service_args, service_parser

log = logging.getLogger("trainer")


def build_parser() -> argparse.ArgumentParser:
    p = service_parser("trainer", "DeepSpeed GRPO trainer: streams rollouts, publishes weights.")
    p.add_argument("--manager", default=env_default("manager", "127.0.0.1:50051"), help="rollout-manager host:port")
    p.add_argument("--weight-server", default=env_default("weight-server", "http://127.0.0.1:8000"), help="base URL")
    p.add_argument("--token-file", default=env_default("token-file", ""), help="file holding the upload bearer token")
    p.add_argument("--model-dir", default=env_default("model-dir", ""), help="HF model directory (fp32 weights)")
    p.add_argument("--metrics-port", type=int, default=int(env_default("metrics-port", 0)), help="/metrics, /healthz")
    p.add_argument("--run-dir", default=env_default("run-dir", "runs/trainer"), help="steps.jsonl goes here")
    p.add_argument("--steps", type=int, default=env_default("steps", None), help="override algorithm.steps")
    p.add_argument("--dump-rollouts", default=env_default("dump-rollouts", ""), help="append trajectories as JSONL")
    p.add_argument("--checkpoint-dir", default=env_default("checkpoint-dir", ""), help="checkpoints go here")
    p.add_argument("--resume", action="store_true", default=bool(env_default("resume", "")),
                   help="continue from the newest valid checkpoint in --checkpoint-dir")  # fmt: skip
    p.add_argument("--connect-timeout", type=float, default=30.0, help="seconds to wait for NATS and the manager")
    p.add_argument("--colocation-timeout", type=float, default=float(env_default("colocation-timeout", 120)),
                   help="trainer.colocateReserved: seconds to wait for the reserved workers' release/resume acks")  # fmt: skip
    return p


def _fail(prog: str, message: str, code: int = 2) -> None:
    print(f"{prog}: {message}", file=sys.stderr)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_service_args(parser, argv)
    setup_logging("trainer", args.log_level)
    if not args.model_dir or not (Path(args.model_dir) / "config.json").exists():
        _fail(parser.prog, f"--model-dir {args.model_dir!r}: not a model directory (needs config.json + safetensors)")
    if args.steps is not None and int(args.steps) < 1:
        _fail(parser.prog, f"--steps must be >= 1, got {args.steps}")
    if args.colocation_timeout <= 0:
        _fail(parser.prog, f"--colocation-timeout must be > 0 seconds, got {args.colocation_timeout}")
    if args.resume and not args.checkpoint_dir:
        _fail(parser.prog, "--resume needs --checkpoint-dir (where the checkpoints are)")
    token = ""
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as err:
            _fail(parser.prog, f"--token-file {args.token_file!r}: cannot read it ({err.strerror})")

    from trainer.loop import Trainer, TrainerOptions  # torch/deepspeed load here, after the flags are checked

    opts = TrainerOptions(
        manager=args.manager, weight_server=args.weight_server, token=token, model_dir=Path(args.model_dir),
        run_dir=Path(args.run_dir), nats_url=args.nats_url, namespace=args.namespace, job=args.job,
        steps=int(args.steps) if args.steps is not None else None,
        dump_rollouts=Path(args.dump_rollouts) if args.dump_rollouts else None, connect_timeout_s=args.connect_timeout,
        checkpoint_dir=Path(args.checkpoint_dir) if args.checkpoint_dir else None, resume=args.resume,
        colocation_timeout_s=args.colocation_timeout,
    )  # fmt: skip
    try:
        trainer = Trainer(args.spec, opts)
    except Exception as err:  # noqa: BLE001 (bad model dir, reward entry point...: one line, no traceback)
        _fail(parser.prog, f"cannot start: {err}", code=1)
    if args.metrics_port:
        try:
            serve_http(args.metrics_port, health=lambda: trainer.healthy, host=args.host)
        except OSError as err:
            _fail(parser.prog, f"--metrics-port {args.metrics_port}: {err.strerror}", code=1)
    try:
        done = asyncio.run(trainer.run())
    except KeyboardInterrupt:
        _fail(parser.prog, "interrupted", code=130)
    except Exception as err:  # noqa: BLE001 (logged in full by the loop; the user gets one line)
        _fail(parser.prog, f"failed: {type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''}", 1)
    log.info("job done", extra={"steps": done.steps, "final_weights_checksum": done.final_weights_checksum})
    return 0


if __name__ == "__main__":
    sys.exit(main())
