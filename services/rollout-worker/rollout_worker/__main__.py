"""The rollout-worker service: pull the current weights, register with the rollout-manager, generate.

    python -m rollout_worker --config job.yaml --worker-id spot-0 --pool spot --node node-a \\
        --manager 127.0.0.1:50051 --weight-server http://127.0.0.1:8600 --model-dir run/model \\
        --metrics-port 9101 --nats-url nats://127.0.0.1:4222 --namespace default --job local

The flags are the fields of `rlboost.options.worker.WorkerOptions`; each is also an environment variable
RLBOOST_<FLAG> (e.g. RLBOOST_WORKER_ID). `--weight-server ''` uses the model directory's own weights as
version 0; `--nats-url ''` disables weight announcements.
No model directory (`--model-dir ''`, or an absent or empty one: a spot pod): once the weight-server holds a
version, the worker pulls the model's assets (config, tokenizer, chat template) from it into that directory (a
temporary one for ''), builds the engine from the config while it pulls the weights, as always: a new spot VM
needs nothing but the weight-server's address.
Peer fan-out (`--peer-port`, 0 = any free port, -1 = off; `--peer-advertise`, `--zone`, `--region`): the worker
serves the weight payloads it holds to other workers and pulls from them first (rlboost.weights.fanout).
`--variant NAME` (with `--pool spot`): the worker is one of the spot variant rollout.spot.variants names and takes
its capacity and tensorParallel (SGLang's tp_size); it registers in the spot pool like any spot worker.
SIGTERM drains: DrainNotice, abort running requests, flush every token, close the stream, exit 0. Before it has
registered (the job ended while it waited for its first version, NATS or a weight-server), SIGTERM or SIGINT
interrupts the wait at once and the worker exits 0: "stopped before registering: the job ended".
Colocation (`trainer.colocateReserved: true`, reserved workers with NATS): the worker follows the trainer's
release / resume commands on rlboost.<ns>.<job>.colocation and acks each on ...colocation-acks.
Start-up failures (model does not load, manager / weight-server / NATS unreachable) print one line, exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

from rlboost import gc_pauses
from rlboost.observability import serve_http, setup_logging
from rlboost.options.base import parse_service_args
from rlboost.options.worker import WorkerOptions
from rlboost.spec import PoolSpec

log = logging.getLogger("rollout_worker")
PROG = "rollout-worker"
STOP_WAIT_S = 5.0  # how long a start-up interrupted by SIGTERM may take to unwind before the worker exits anyway
T = TypeVar("T")


class StartupError(RuntimeError):
    """Something the worker needs is missing; the message is the one line printed."""


async def _amain(args: WorkerOptions) -> int:
    from rlboost.auth.credentials import CredentialsError
    from rlboost.auth.grpc_auth import ClientAuth
    from rollout_worker.engine.base import EngineError
    from rollout_worker.errors import SessionEndedError
    from rollout_worker.weights import WeightsError

    try:
        auth = ClientAuth.for_role(args.credentials_dir, "worker")  # the worker token and the job CA
    except CredentialsError as err:
        print(f"{PROG}: --credentials-dir: {err}", file=sys.stderr)
        return 1
    pool_spec = _pool_spec(args)
    opened = _Opened(
        _make_engine(args.engine or pool_spec.engine, args.capacity or pool_spec.capacity, args, pool_spec)
    )
    stop = _Stop()
    try:
        session = await stop.unless_stopped(_start(args, auth, pool_spec, opened))
        if session is None:  # the job ended (its supervisor's SIGTERM) before this worker registered
            log.info("stopped before registering: the job ended", extra={"signal": stop.reason})
            await opened.close(args)
            _exit_at_once(0)
        stop.session = session  # from now on a signal drains the session
        stop.install()
        frozen = gc_pauses.freeze_after_start()  # the engine's and libraries' objects: out of every full collection
        log.info("started: start-up's objects kept out of garbage collection", extra={"objects": frozen})
        await session.run()
        log.info("worker stopped", extra={"worker_id": args.worker_id})
        return 0
    except (EngineError, WeightsError, SessionEndedError, StartupError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 1
    finally:
        await opened.close(args)


def _exit_at_once(code: int) -> NoReturn:
    """Exit now, not when the threads of an interrupted start-up are done: a model load in a thread cannot be
    cancelled, and the interpreter's exit (asyncio.run's too) would wait for it, seconds to minutes. A worker that
    never registered has nothing left to flush but its log."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class _Opened:
    """What start-up opened (engine, weight client, NATS, peer fan-out, a pulled model directory): closed at exit."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.client = self.nats = self.fanout = None
        self.pulled_dir: str | None = None

    async def close(self, args: WorkerOptions) -> None:
        with contextlib.suppress(Exception):
            await self.engine.close()
        if self.nats is not None:
            with contextlib.suppress(Exception):
                await self.nats.close()
        if self.fanout is not None:
            await self.fanout.close()
        if self.client is not None:
            await self.client.aclose()
        if self.pulled_dir is not None and not args.model_dir:  # a temporary directory of ours
            shutil.rmtree(self.pulled_dir, ignore_errors=True)


class _Stop:
    """SIGTERM / SIGINT: the supervisor ends the job (or the pod). During start-up it interrupts whatever the worker
    waits for, the first weight version, a NATS or weight-server that went away with the job, and the worker exits
    0 at once instead of retrying into the supervisor's SIGKILL; once the session runs, it drains the session."""

    def __init__(self) -> None:
        self.event, self.reason, self.session = asyncio.Event(), "", None
        self.install()

    def install(self) -> None:
        """Take SIGTERM and SIGINT on the running loop; again after start-up, as the SGLang engine takes SIGTERM
        for its own request loop while it starts."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig.name)

    def _on_signal(self, name: str) -> None:
        if self.session is not None:
            self.session.request_drain(name, True)
        self.reason = self.reason or name
        self.event.set()

    async def unless_stopped(self, start: Coroutine[Any, Any, T]) -> T | None:
        """`start`'s result, or None when a signal comes first: `start` is then cancelled (and awaited for at most
        STOP_WAIT_S: a cancelled engine load in a thread finishes its load first)."""
        work, stopped = asyncio.ensure_future(start), asyncio.ensure_future(self.event.wait())
        try:
            await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            if not self.event.is_set() and not work.done():  # we were cancelled ourselves
                work.cancel()
        if not self.event.is_set():
            return work.result()
        work.cancel()
        await asyncio.wait({work}, timeout=STOP_WAIT_S)
        if work.done() and not work.cancelled():
            work.exception()  # retrieved: a start-up that failed as the job ended is no error of the worker
        return None


async def _start(args: WorkerOptions, auth, pool_spec: PoolSpec, opened: _Opened):
    """Load the engine and the newest weights, subscribe to announcements; the session, ready to register."""
    from rollout_worker.session import WorkerSession
    from rollout_worker.startup import StartupClock
    from rollout_worker.weights import WeightPuller

    engine, puller, version, clock = opened.engine, None, 0, StartupClock()
    if args.weight_server:
        from rlboost.weights.client import WeightClient

        if args.spec.weight_sync.mode == "delta":  # the codec's JIT beside the first pull, not after it
            import rlboost.delta

            rlboost.delta.warm_up_in_background()
        client = opened.client = WeightClient(
            args.weight_server, token=auth.token, streams=args.spec.weight_sync.streams, ca=auth.ca
        )
        client.verifier = _manifest_verifier(args.credentials_dir)
        if args.peer_port >= 0:
            opened.fanout = await _start_fanout(client, args, auth.token)
        puller = WeightPuller(client)
        model_dir = args.model_dir
        if needs_assets(model_dir):
            model_dir = opened.pulled_dir = model_dir or tempfile.mkdtemp(prefix="rlboost-model-")
            await clock.timed("assets", _pull_assets(client, args.weight_server, model_dir, args.startup_timeout))
        version = await _start_beside_first_pull(engine, model_dir, puller, args.startup_timeout, clock)
    else:
        await clock.timed("engine", engine.start(args.model_dir))
    session = WorkerSession(args, engine, puller.pull if puller else None, auth)
    session.startup = clock
    if args.nats_url:
        opened.nats = await _subscribe_weights(args, session)
        if args.pool == "reserved" and args.spec.trainer.colocate_reserved:
            await _subscribe_colocation(opened.nats, args, session)
    if puller is not None:  # versions announced while the engine loaded (before the subscription) are missed
        session.schedule_update(await puller.wait_latest(args.startup_timeout))
    from rollout_worker import metrics

    metrics.WEIGHT_VERSION.set(engine.weight_version)
    clock.ready(args.worker_id)
    log.info(
        "worker ready",
        extra={
            "worker_id": args.worker_id,
            "weight_version": version,
            "capacity": engine.capacity,
            "engine": args.engine or pool_spec.engine,
            "device": args.device,
            "dtype": args.dtype,
            "variant": args.variant,
            "tensor_parallel": pool_spec.tensor_parallel,
        },
    )
    return session


def _manifest_verifier(credentials_dir: str):
    """The job's public key, which every weight version must be signed for; None without credentials."""
    if not credentials_dir:
        return None
    from rlboost.auth.credentials import CredentialsError
    from rlboost.weights.signing import ManifestVerifier

    try:
        return ManifestVerifier.from_credentials(credentials_dir)
    except (CredentialsError, ValueError) as err:
        raise StartupError(f"--credentials-dir: cannot load the job's manifest key: {err}") from None


async def _start_fanout(client, args: WorkerOptions, token: str | None):
    """Serve the weights this worker holds to the others and register with the weight-server's directory."""
    from rlboost.weights.fanout import PeerFanout
    from rollout_worker import metrics

    client.on_peer_rejected = lambda url: _peer_rejected(url, metrics)
    cache = tempfile.mkdtemp(prefix="rlboost-peer-")
    fanout = PeerFanout(
        client,
        args.worker_id,
        cache,
        args.zone,
        args.region,
        token,
        on_served=_served_counter(),
        identity=lambda: _identity_proof(args.identity_token_file),  # the directory binds our entry to it
    )
    try:
        url = await fanout.start(args.host, args.peer_port, args.peer_advertise)
    except OSError as err:
        await fanout.close()
        raise StartupError(f"--peer-port {args.peer_port}: cannot listen on {args.host}: {err}") from None
    log.info("serving weights to peers", extra={"url": url, "zone": args.zone, "region": args.region})
    return fanout


def _identity_proof(path: str) -> str:
    """The proof the peer directory wants ('' when unreadable: the directory refuses it, pulls use the server)."""
    from rollout_worker.errors import IdentityProofUnreadableError
    from rollout_worker.registration import read_identity_proof

    try:
        return read_identity_proof(path)
    except IdentityProofUnreadableError as err:
        log.warning("identity proof unreadable for the peer directory", extra={"error": str(err)})
        return ""


def _served_counter():
    """Counts served bytes, and logs the first range served (a relay's first chunk: tests wait on that line)."""
    from rollout_worker import metrics

    first = [True]

    def served(nbytes: int) -> None:
        metrics.PEER_BYTES_SERVED.inc(nbytes)
        if first[0]:
            first[0] = False
            log.info("served a first chunk to a peer", extra={"bytes": nbytes})

    return served


def _peer_rejected(url: str, metrics) -> None:
    metrics.PEER_CHUNK_REJECTED.inc()
    log.warning("a peer served a chunk that is not the trainer's; not asking it again", extra={"peer": url})


def needs_assets(model_dir: str) -> bool:
    """No model directory, or an absent or empty one: the model's assets come from the weight-server."""
    return not model_dir or not os.path.exists(model_dir) or (os.path.isdir(model_dir) and not os.listdir(model_dir))


async def _pull_assets(client, url: str, model_dir: str, timeout: float) -> None:
    """Wait for the first version (the trainer uploads the assets before it), then write them into model_dir."""
    from rlboost.weights.client import WeightServerError
    from rlboost.weights.signing import WeightsRejectedError
    from rollout_worker import metrics
    from rollout_worker.weights import transient_retries

    deadline = time.monotonic() + timeout
    try:
        await client.wait_for_version(0, timeout)
        async for attempt in transient_retries(deadline):  # the weight-server may restart meanwhile
            with attempt:
                written = await client.pull_assets(model_dir)
    except TimeoutError:
        raise StartupError(
            f"--weight-server {url}: no weight version within {timeout:.0f}s (--startup-timeout), "
            "so no model assets either; is the trainer running?"
        ) from None
    except WeightServerError as err:
        raise StartupError(f"--weight-server {url}: cannot pull the model's assets: {err}") from None
    except WeightsRejectedError as err:  # nothing was written: the engine is never built from them
        metrics.WEIGHT_REJECTED.labels(err.reason).inc()
        raise StartupError(
            f"--weight-server {url}: model assets refused, not signed by this job's trainer: {err.message}"
        ) from None
    if not any(path.name == "config.json" for path in written):
        raise StartupError(
            f"--weight-server {url} holds no model assets (config.json, tokenizer): its trainer uploaded none; "
            "give this worker --model-dir with the model instead"
        )
    log.info("model assets pulled", extra={"model_dir": model_dir, "assets": sorted(p.name for p in written)})


async def _start_beside_first_pull(engine, model_dir: str, puller, timeout: float, clock) -> int:
    """Load the engine from the model directory while the newest version is awaited and pulled, then apply it;
    returns that version. A new spot worker's model load and first download overlap instead of adding up (an
    engine whose start blocks the loop, as SGLang's does, simply runs them one after the other). `clock`: a
    StartupClock, which records the seconds of each."""
    loading = asyncio.create_task(clock.timed("engine", engine.start(model_dir)))
    pulling = asyncio.create_task(clock.timed("weights", puller.pull_first(timeout)))
    try:
        await asyncio.gather(loading, pulling)  # the first failure, of either, ends the wait at once
    except BaseException:
        for task in (loading, pulling):
            task.cancel()
        await asyncio.gather(loading, pulling, return_exceptions=True)
        raise
    pulled = pulling.result()
    await engine.update_weights(pulled.state, pulled.version, checksum=pulled.checksum)  # verified, as every update
    return pulled.version


def _pool_spec(args: WorkerOptions) -> PoolSpec:
    """The spec's pool this worker is one of: rollout.<pool>, or the spot variant `--variant` names."""
    if not args.variant:
        return getattr(args.spec.rollout, args.pool)
    if args.pool != "spot":
        raise SystemExit(f"{PROG}: --variant {args.variant!r}: variants are of the spot pool; add --pool spot")
    try:
        return args.spec.rollout.spot.variant_pool(args.variant)
    except KeyError as err:
        raise SystemExit(f"{PROG}: --variant: {err.args[0]}") from None


def _make_engine(name: str, capacity: int, args: WorkerOptions, pool: PoolSpec):
    from rollout_worker.engine import make_engine

    try:
        return make_engine(
            name, capacity=capacity, dtype=args.dtype, device=args.device, tensor_parallel=pool.tensor_parallel
        )
    except ValueError as err:
        raise SystemExit(f"{PROG}: --engine: {err}") from None


async def _subscribe_weights(args: WorkerOptions, session):
    """Pull and apply each version announced on rlboost.<ns>.<job>.weights."""
    import nats

    from rlboost.auth.nats import connect_options
    from rlboost.wire.events import WEIGHTS

    async def on_message(msg) -> None:
        try:
            event = WEIGHTS.decode(msg.data)
        except ValueError as err:
            log.warning("bad weights announcement ignored", extra={"error": str(err)[:200]})
            return
        session.schedule_update(event.version)

    try:
        from rlboost.durable import reconnect_quietly

        auth = connect_options(args.credentials_dir, "worker")
        nc = await nats.connect(
            args.nats_url,
            connect_timeout=5,
            max_reconnect_attempts=-1,
            allow_reconnect=True,
            reconnect_time_wait=0.5,
            **reconnect_quietly(log),
            **auth,
        )
    except Exception as err:
        raise StartupError(f"cannot connect to NATS at {args.nats_url}: {type(err).__name__}: {err}") from None
    await nc.subscribe(WEIGHTS.subject(args.namespace, args.job), cb=on_message)
    return nc


async def _subscribe_colocation(nc, args: WorkerOptions, session) -> None:
    """Follow the trainer's release / resume commands (colocation) and ack each one, MACed with this worker's
    own ack key from the manager (rlboost.auth.colocation_acks: the trainer refuses an ack it cannot check)."""
    from rlboost.auth.colocation_acks import sign
    from rlboost.wire.events import COLOCATION, COLOCATION_ACKS, COLOCATION_RELEASE, COLOCATION_RESUME, ColocationAck

    acks = COLOCATION_ACKS.subject(args.namespace, args.job)

    async def on_message(msg) -> None:
        try:
            cmd = COLOCATION.decode(msg.data)
        except ValueError as err:
            log.warning("bad colocation command ignored", extra={"error": str(err)[:200]})
            return
        if cmd.action not in (COLOCATION_RELEASE, COLOCATION_RESUME):
            log.warning("unknown colocation action ignored", extra={"action": cmd.action})
            return
        ack = ColocationAck(step=cmd.step, action=cmd.action, worker_id=args.worker_id, released=False)
        try:
            act = session.release if cmd.action == COLOCATION_RELEASE else session.resume
            report = await act(cmd.step)
            ack.nbytes, ack.seconds = report.nbytes, report.seconds
        except Exception as err:  # the trainer logs the failed ack; the worker keeps serving
            log.error("colocation command failed", extra={"action": cmd.action, "step": cmd.step, "error": str(err)})
            ack.ok, ack.error = False, f"{type(err).__name__}: {err}"
        ack.released, ack.weight_version = session.released, session.engine.weight_version
        await nc.publish(acks, COLOCATION_ACKS.encode(sign(ack, session.colocation_ack_key)))

    await nc.subscribe(COLOCATION.subject(args.namespace, args.job), cb=on_message)
    await nc.flush(timeout=5)  # subscribed before the worker registers: no command is missed after that
    log.info("colocated with the trainer: following release / resume commands", extra={"subject_acks": acks})


def _fill_in(args: WorkerOptions) -> None:
    """Check what the options model cannot (the model directory on disk) and name this process."""
    if needs_assets(args.model_dir) and not args.weight_server:
        _usage_error(
            f"--model-dir {args.model_dir!r}: a HF model directory (config.json and *.safetensors) is required "
            "without --weight-server (with one, the model's assets are pulled from it)"
        )
    if not needs_assets(args.model_dir) and not os.path.isfile(os.path.join(args.model_dir, "config.json")):
        _usage_error(f"--model-dir: {args.model_dir} has no config.json; point it at a HF model directory")
    args.node = args.node or socket.gethostname()
    args.worker_id = args.worker_id or f"{socket.gethostname()}-{os.getpid()}"


def _usage_error(message: str) -> None:
    print(f"{WorkerOptions.prog()}: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    args = parse_service_args(WorkerOptions, argv)
    _fill_in(args)
    setup_logging(PROG, args.log_level)
    if args.metrics_port:
        try:
            serve_http(args.metrics_port, host=args.host)
        except OSError as err:
            print(f"{PROG}: --metrics-port {args.metrics_port}: cannot listen on {args.host}: {err}", file=sys.stderr)
            return 1
    return asyncio.run(_amain(args))


if __name__ == "__main__":
    sys.exit(main())
