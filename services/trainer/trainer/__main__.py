"""The trainer service: DeepSpeed GRPO that consumes rollouts as a stream and publishes weights.

Run it (the flags are the fields of `rlboost.options.trainer.TrainerOptions`; each also reads RLBOOST_<FLAG>):

    python -m trainer --config job.yaml --manager 127.0.0.1:50051 --weight-server http://127.0.0.1:8600 \
        --token-file token.txt --model-dir runs/x/model --metrics-port 9102 --run-dir runs/x/trainer \
        --nats-url nats://127.0.0.1:4222 --namespace default --job local [--steps N] [--dump-rollouts F] \
        [--checkpoint-dir DIR [--resume]]

Several ranks: start one process per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK)
in the environment (torchrun or a StatefulSet); rank 0 talks to the peers, the others follow it.

Exit 0 after JobDone(ok=True); on failure JobDone(ok=False) is published and the process exits 1 with one
clear line on stderr.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rlboost.observability import serve_http, setup_logging
from rlboost.options.base import parse_service_args
from rlboost.options.trainer import TrainerOptions

if TYPE_CHECKING:
    from rlboost.wire.events import JobDone
    from trainer.loop import Trainer

log = logging.getLogger("trainer")


def _fail(prog: str, message: str, code: int = 2) -> None:
    print(f"{prog}: {message}", file=sys.stderr)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    args = parse_service_args(TrainerOptions, argv)  # bounds and --resume's --checkpoint-dir are checked there
    prog = args.prog()
    setup_logging("trainer", args.log_level)
    if not args.model_dir or not (Path(args.model_dir) / "config.json").exists():
        _fail(prog, f"--model-dir {args.model_dir!r}: not a model directory (needs config.json + safetensors)")
    from rlboost.auth.credentials import CredentialsError
    from rlboost.auth.grpc_auth import ClientAuth

    try:  # with the job's credentials the trainer token is the upload token too; else --token-file's
        auth = ClientAuth.for_role(args.credentials_dir, "trainer")
    except CredentialsError as err:
        _fail(prog, f"--credentials-dir: {err}")
    token = auth.token
    if not token and args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as err:
            _fail(prog, f"--token-file {args.token_file!r}: cannot read it ({err.strerror})")

    from trainer import loop  # torch/deepspeed load here, after the flags are checked

    try:
        trainer = loop.Trainer(args.spec, args, auth=auth, token=token)
    except Exception as err:  # noqa: BLE001 (bad model dir, reward entry point...: one line, no traceback)
        _fail(prog, f"cannot start: {err}", code=1)
    if args.metrics_port:
        try:
            serve_http(args.metrics_port, health=trainer.is_healthy, host=args.host)
        except OSError as err:
            _fail(prog, f"--metrics-port {args.metrics_port}: {err.strerror}", code=1)
    try:
        done = asyncio.run(_run_until_sigterm(trainer))
    except KeyboardInterrupt:
        _fail(prog, "interrupted", code=130)
    except asyncio.CancelledError:
        if not trainer.terminating:
            raise
        _fail(prog, f"stopped by SIGTERM after {trainer.steps_done} steps (checkpoints: --checkpoint-dir)", code=143)
    except Exception as err:  # noqa: BLE001 (logged in full by the loop; the user gets one line)
        _fail(prog, f"failed: {type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''}", 1)
    from trainer import ranks

    ranks.shutdown()
    log.info("job done", extra={"steps": done.steps, "final_weights_checksum": done.final_weights_checksum})
    return 0


async def _run_until_sigterm(trainer: Trainer) -> JobDone:
    """trainer.run(), cancelled by SIGTERM. In a pod the trainer is PID 1, which ignores a signal it has no handler
    for: without one every scale-down (a suspension, the job's end) waited out the grace period and its SIGKILL
    (30 s a time in the cluster lane). A suspended trainer has its checkpoint; any other resumes from its newest."""
    from trainer import ranks

    task = asyncio.current_task()
    assert task is not None

    def on_sigterm() -> None:
        trainer.terminating = True
        task.cancel()

    def follower_on_sigterm() -> None:  # its thread waits in a collective, which no cancel ends; rank 0 saves
        log.info("stopped by SIGTERM", extra={"rank": ranks.rank()})
        os._exit(143)

    handler = on_sigterm if ranks.rank() == 0 else follower_on_sigterm
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, handler)
    return await trainer.run()


if __name__ == "__main__":
    sys.exit(main())
