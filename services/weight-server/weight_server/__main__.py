"""Run the weight-server: `python -m weight_server --port P --data-dir D --token-file T --nats-url U ...`.

Flags (each also RLBOOST_<FLAG>): the fields of `rlboost.options.weight_server.WeightServerOptions`, the
shared service flags (--config, --namespace, --job, --nats-url, --host, --log-level) plus --port, --data-dir,
--token-file (or RLBOOST_TOKEN), --read-token-file, --chunk-bytes (default: the job spec's
weightSync.chunkBytes). With --credentials-dir the job's role tokens replace --token-file/--read-token-file
(access.py: reads need a worker, trainer or observer token, uploads the trainer's) and it serves https when the
directory holds tls-weight-server.crt. One process, uvicorn run programmatically.
A bad data dir, a port in use, a missing token or an unreachable NATS exits non-zero with one clear line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from rlboost.auth.nats import connect_options
from rlboost.observability import IDLE_TIMEOUT_S, LoopWatchdog, setup_logging
from rlboost.options.base import parse_service_args
from rlboost.options.weight_server import WeightServerOptions

log = logging.getLogger("weight_server")


class StartupError(Exception):
    """A configuration problem reported as one line before exiting."""


def read_token(path: str, flag: str) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as err:
        raise StartupError(f"{flag} {path}: cannot read it ({err.strerror})") from None
    if not token:
        raise StartupError(f"{flag} {path}: the file is empty; put the token in it")
    return token


def upload_token(args: WeightServerOptions) -> str:
    if args.token_file:
        return read_token(args.token_file, "--token-file")
    token = os.environ.get("RLBOOST_TOKEN", "").strip()
    if not token:
        raise StartupError("no upload token: pass --token-file FILE or set RLBOOST_TOKEN")
    return token


def _access(args: WeightServerOptions):
    """The job's role tokens with --credentials-dir; else --token-file (or RLBOOST_TOKEN) and --read-token-file."""
    from rlboost.auth.credentials import CredentialsError

    from .access import Access

    if args.credentials_dir:
        try:
            return Access.from_credentials(args.credentials_dir)
        except CredentialsError as err:
            raise StartupError(f"--credentials-dir: {err}") from None
    reader = read_token(args.read_token_file, "--read-token-file") if args.read_token_file else None
    return Access.tokens(upload_token(args), reader)


def _identities(args: WeightServerOptions):
    """The check of a worker's identity proof on the peer routes (the job's worker-identity items), or None
    without credentials (the directory is then open to the read token)."""
    if not args.credentials_dir:
        return None
    from rlboost.auth.credentials import CredentialsError
    from rlboost.auth.worker_identity import WorkerIdentityVerifier

    try:
        return WorkerIdentityVerifier.from_credentials(args.credentials_dir, args.job)
    except CredentialsError as err:
        raise StartupError(f"--credentials-dir: {err}") from None


def tls_files(credentials_dir: str) -> dict[str, str]:
    """uvicorn's TLS options when the credentials hold the weight-server's certificate (Kubernetes), else none."""
    directory = Path(credentials_dir) if credentials_dir else None
    if directory is None or not (directory / "tls-weight-server.crt").is_file():
        return {}
    return {
        "ssl_certfile": str(directory / "tls-weight-server.crt"),
        "ssl_keyfile": str(directory / "tls-weight-server.key"),
    }


def check_data_dir(path: str) -> Path:
    """The data dir exists (created if needed) and is writable."""
    root = Path(path)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise StartupError(f"--data-dir {path}: not a writable directory ({err.strerror or err})") from None
    return root


def bind(host: str, port: int) -> socket.socket:
    """Bind the listening socket ourselves so a port in use is one clear line, not a uvicorn traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, not the default 0: asyncio turns Nagle off (TCP_NODELAY) only on accepted sockets whose proto says
    # TCP. Without it every keep-alive request after a connection's first waited ~40 ms (the response's body write
    # held back by Nagle until the client's delayed ACK of its headers): a manifest fetch, a peer query, a 401.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise StartupError(f"--host {host} --port {port}: cannot listen ({err.strerror or err})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def serve(args: WeightServerOptions) -> None:
    import uvicorn  # lazy: only the running server needs it

    from .announce import AnnounceError, Announcer
    from .app import create_app
    from .deadlines import header_deadline_protocol
    from .memory import bound_arenas
    from .store import VersionStore

    bound_arenas()  # before uvicorn's threads: their arenas bound the memory reads can hold (issue 31)
    access = _access(args)
    chunk = args.chunk_bytes or args.spec.weight_sync.chunk_bytes
    root = check_data_dir(args.data_dir)
    sock = bind(args.host, args.port)
    announcer = None
    if not args.no_nats:
        announcer = Announcer(
            args.nats_url, args.namespace, args.job, connect_options(args.credentials_dir, "weight-server")
        )
        try:
            await announcer.connect_within(args.nats_wait)
        except AnnounceError as err:
            raise StartupError(f"--nats-url: {err}") from None
    store = VersionStore(root, int(chunk), args.spec.weight_sync.retain_versions, args.compacted_cache_bytes)
    watchdog = LoopWatchdog(max_lag_s=5.0)  # compaction and file reads run in threads: the loop only awaits
    watchdog.start()
    identities = _identities(args)
    app = create_app(
        store, access, announcer=announcer, watchdog=watchdog, identities=identities, body_timeout_s=args.body_timeout
    )
    slow = app.state.metrics.slow_closed.labels("header").inc
    config = uvicorn.Config(
        app,
        http=header_deadline_protocol(args.header_timeout, slow),  # half-sent requests cannot hold connections
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=int(IDLE_TIMEOUT_S),
        **tls_files(args.credentials_dir),
    )
    server = uvicorn.Server(config)
    log.info("weight-server listening", extra={"host": args.host, "port": args.port, "data_dir": str(root)})
    try:
        await server.serve(sockets=[sock])
    finally:
        if announcer is not None:
            await announcer.close()
        log.info("weight-server stopped")


def main(argv: list[str] | None = None) -> int:
    args = parse_service_args(WeightServerOptions, argv)
    setup_logging("weight-server", args.log_level)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it; this makes that a clean exit 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        asyncio.run(serve(args))
    except StartupError as err:
        print(f"weight-server: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
