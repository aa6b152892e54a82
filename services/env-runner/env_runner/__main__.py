"""Run an env-runner (agentic episodes).

    python -m env_runner --config job.yaml --manager 127.0.0.1:50051 --model-dir run/model --runner-id env-0

It loads the model's tokenizer and chat template (`--model-dir`, else pulled from `--weight-server`, signed by the
job's trainer), starts one confined process of the job's environment (`task.environment`) to check it loads (an
unknown or broken environment stops it here, naming the field), then attaches to the rollout-manager and drives
the episodes it is given. SIGTERM drains. The flags (each also RLBOOST_<FLAG>) are the fields of rlboost.options.env_runner.EnvRunnerOptions.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import tempfile

from rlboost.observability import serve_http, setup_logging
from rlboost.options.base import parse_service_args
from rlboost.options.env_runner import EnvRunnerOptions

log = logging.getLogger("env_runner")


class StartupError(RuntimeError):
    """The env-runner cannot start; the message names the flag or field and the fix."""


def _defaults(args: EnvRunnerOptions) -> EnvRunnerOptions:
    host = socket.gethostname()
    update = {}
    if not args.runner_id:
        update["runner_id"] = f"{host}-{os.getpid()}"
    if not args.node:
        update["node"] = host
    return args.model_copy(update=update)


async def _model_dir(args: EnvRunnerOptions) -> str:
    """The directory holding the tokenizer: --model-dir, or the assets pulled (verified) from the weight-server."""
    if args.model_dir:
        return args.model_dir
    if not args.weight_server:
        raise StartupError("--model-dir or --weight-server: the env-runner needs the model's tokenizer from one")
    from rlboost.auth.grpc_auth import ClientAuth
    from rlboost.weights.client import WeightClient

    auth = ClientAuth.for_role(args.credentials_dir, "observer")  # reads of the weight-server: the observer's
    target = tempfile.mkdtemp(prefix="rlboost-env-runner-model-")
    async with WeightClient(args.weight_server, token=auth.token, ca=auth.ca) as client:
        if args.credentials_dir:
            from rlboost.weights.signing import ManifestVerifier

            client.verifier = ManifestVerifier.from_credentials(args.credentials_dir)
        try:
            await client.wait_for_version(0, args.startup_timeout)
            await client.pull_assets(target)
        except TimeoutError:
            raise StartupError(
                f"--weight-server {args.weight_server}: no weight version within {args.startup_timeout:.0f}s "
                "(--startup-timeout), so no tokenizer; is the trainer running?"
            ) from None
    return target


def _chat_format(args: EnvRunnerOptions, model_dir: str):
    from rlboost.environments.chat import ChatFormat
    from rlboost.models.tokenizer import load_tokenizer, stop_token_ids

    tokenizer = load_tokenizer(model_dir)
    if not isinstance(tokenizer.chat_template, str):
        raise StartupError(f"{model_dir}: the model's tokenizer has no chat template; episodes need one")
    return ChatFormat(tokenizer, stop_token_ids(tokenizer), args.spec.task.dataset.thinking)


async def _checked_pool(args: EnvRunnerOptions, gateway_socket: str):
    """The environment's process pool, after one process loaded it (else StartupError naming task.environment)."""
    from rlboost.environment_registry import EnvironmentNameError, check_environment
    from rlboost.environments.sandbox import EnvConfig, EnvFailure, EnvPool

    env = args.spec.task.environment
    if not env.active:
        raise StartupError("task.environment is not set: this job has no environment for an env-runner to run")
    try:
        check_environment(env.name, env.verifiers)
        pool = EnvPool(EnvConfig.from_spec(env, gateway_socket))
        pool.release(await pool.acquire())
    except EnvironmentNameError as err:
        raise StartupError(str(err)) from None
    except EnvFailure as err:
        raise StartupError(f"{env.field}: the environment does not start: {err.detail}") from None
    return pool


async def serve(args: EnvRunnerOptions, started: list) -> int:
    from rlboost.auth.grpc_auth import ClientAuth

    from .session import ManagerUnreachableError, RunnerSession

    # the chat endpoint's Unix socket: harness environments (confined, no network) reach it there
    gateway_socket = os.path.join(tempfile.mkdtemp(prefix="rlboost-env-runner-"), "policy.sock")
    try:
        fmt = _chat_format(args, await _model_dir(args))
        pool = await _checked_pool(args, gateway_socket)
    except StartupError as err:
        print(f"env-runner: {err}", file=sys.stderr)
        return 2
    capacity = args.capacity or args.spec.rollout.env_runners.capacity
    session = RunnerSession(args, fmt, pool, capacity, ClientAuth.for_role(args.credentials_dir, "env-runner"))
    started.append(session)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda s=sig: asyncio.ensure_future(session.drain(signal.Signals(s).name)))
    log.info("env-runner ready", extra={"runner_id": args.runner_id, "capacity": capacity, "netns": True})
    try:
        await session.run()
    except ManagerUnreachableError as err:
        print(f"env-runner: {err}", file=sys.stderr)
        return 1
    finally:
        await pool.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _defaults(parse_service_args(EnvRunnerOptions, argv))
    setup_logging("env-runner", args.log_level)
    started: list = []
    if args.metrics_port:
        try:
            serve_http(args.metrics_port, health=lambda: True, host=args.host)
        except OSError as err:
            print(
                f"env-runner: cannot serve metrics on {args.host}:{args.metrics_port}: {err.strerror}", file=sys.stderr
            )
            return 1
    return asyncio.run(serve(args, started))


if __name__ == "__main__":
    sys.exit(main())
