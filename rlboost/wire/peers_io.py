"""Wire models of peer weight fan-out: a worker's registration, a puller's question, the sources it is given.

Routes on the weight-server (JSON; reads need the same token as a payload read, and, with the job's credentials,
the worker's identity proof in HEADER_IDENTITY for the worker id the call names):
PUT /v1/peers/{worker_id} (PeerRegistration: register, heartbeat, report the payloads held),
DELETE /v1/peers/{worker_id} (leave), POST /v1/sources (SourcesRequest -> SourceList), POST /v1/stalled
(StalledPeer: a peer that sent nothing is not offered again until it heartbeats).
A peer serves the payloads it holds at the weight-server's own payload routes (GET /v1<payload_path>, Range).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

# The worker's identity proof (rlboost.auth.worker_identity: what it registers with the manager with), on every peer
# route: an entry, a departure and a question are accepted only from the worker whose id they name.
HEADER_IDENTITY = "X-Rlboost-Identity"
WORKER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$"
TOPOLOGY_PATTERN = r"^[A-Za-z0-9._-]{0,63}$"  # a Kubernetes label value ('' = unknown)
PAYLOAD_PATH_PATTERN = r"^/(versions|compacted)/[0-9a-z/]{1,80}/payload$"
MAX_HOLDS = 64
PayloadPath = Annotated[str, Field(pattern=PAYLOAD_PATH_PATTERN)]


class PeerRegistration(BaseModel):
    """A worker that serves the weight payloads it holds to other workers."""

    url: str = Field(pattern=r"^https?://[^\s/]+$", max_length=300, description="Base URL its peer server answers at.")
    zone: str = Field("", pattern=TOPOLOGY_PATTERN, description="Its zone (topology.kubernetes.io/zone; '' unknown).")
    region: str = Field("", pattern=TOPOLOGY_PATTERN, description="Its region (topology.kubernetes.io/region).")
    holds: list[PayloadPath] = Field(
        default_factory=list, max_length=MAX_HOLDS, description="Payload paths it holds whole and verified."
    )


class SourcesRequest(BaseModel):
    """A puller asking where to fetch one payload from."""

    worker: str = Field(pattern=WORKER_ID_PATTERN, description="The puller's worker id (as registered).")
    path: str = Field(pattern=PAYLOAD_PATH_PATTERN, description="The payload's path (Manifest.payload_path).")


class StalledPeer(BaseModel):
    """A puller reporting a peer that sent no byte within its peer timeout, or could not be reached."""

    worker: str = Field(pattern=WORKER_ID_PATTERN, description="The reporting puller's worker id (as registered).")
    peer: str = Field(pattern=WORKER_ID_PATTERN, description="The stalled peer's worker id (Source.worker).")


class Source(BaseModel):
    """One place to fetch a payload's chunks from."""

    url: str = Field(description="Base URL ('' = the weight-server itself).")
    worker: str = Field("", description="The peer's worker id ('' = the weight-server).")
    tier: Literal["zone", "region", "server"] = Field(description="Where it is relative to the puller.")
    complete: bool = Field(True, description="False: the peer is still pulling it (it serves chunks as they arrive).")


class SourceList(BaseModel):
    """Sources for one payload, best first; the weight-server always last."""

    sources: list[Source] = Field(description="Peers in the puller's zone, then region, then the weight-server.")
    relay: bool = Field(False, description="The puller is its region's relay: it pulls across the region boundary.")
