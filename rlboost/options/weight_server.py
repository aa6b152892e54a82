"""The weight-server's options, and the pure rendering of them for one deployment."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from rlboost.options.base import LOOPBACK, Port, ServiceOptions, Site

WEIGHT_SERVER_PORT = 8600


class WeightServerOptions(ServiceOptions):
    """The weight-server: versions of the policy's weights over HTTP (FastAPI)."""

    SERVICE: ClassVar[str] = "weight-server"
    MODULE: ClassVar[str] = "weight_server"

    port: Port = Field(WEIGHT_SERVER_PORT, description="HTTP port.")
    data_dir: str = Field("./weights-data", min_length=1, description="Where the versions live.")
    token_file: str = Field(
        "",
        description="Without --credentials-dir (a weight-server run alone): file holding the upload token "
        "('' = the RLBOOST_TOKEN variable). With it, the job's trainer token uploads.",
    )
    read_token_file: str = Field(
        "", description="Without --credentials-dir: file holding a token that reads must present ('' = open reads)."
    )
    chunk_bytes: int | None = Field(
        None, ge=1, le=1 << 30, description="Payload chunk size in bytes (unset: the job spec's weightSync.chunkBytes)."
    )
    compacted_cache_bytes: int = Field(
        2 << 30,
        ge=0,
        le=1 << 50,
        description="Bytes of compacted deltas kept on disk; least recently used are evicted past it, and a "
        "compacted delta larger than it is not built (its chain is served). 0 = no compacted deltas.",
    )
    # issue 31: slow clients cannot hold connections (weight_server.deadlines)
    header_timeout: float = Field(
        10.0, gt=0, le=3600, description="Seconds a connection has to send a whole request header; then closed."
    )
    body_timeout: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Seconds a request body may go without a byte while the server waits for it; then 408.",
    )
    no_nats: bool = Field(False, description="Do not announce versions on NATS (tests, debugging).")
    nats_wait: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="Seconds to keep trying to reach NATS at start-up (it may start after us, or its name may not "
        "resolve yet), with back-off, before giving up.",
    )


DEFAULT_WEIGHT_SERVER_URL = f"http://{LOOPBACK}:{WEIGHT_SERVER_PORT}"  # what a trainer uses when told nothing


def weight_server_options(site: Site, port: int, data_dir: Path | str) -> WeightServerOptions:
    return WeightServerOptions(**site.common(), port=port, data_dir=str(data_dir))
