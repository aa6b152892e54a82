"""Who may call what on the manager, and which stream owns a worker id.

Roles (tokens from the job's credentials, checked by rlboost.auth.grpc_auth's interceptor): the worker stream
(Connect) needs the worker token, the trainer's Rollout the trainer token, GetStatus an observer or trainer
token, an env-runner's Attach stream the env-runner token.

Every worker shares the worker role's token (a Deployment's replicas cannot get per-pod secrets), so the token
alone does not say which worker is calling. The manager binds each worker id to a session it issued: the first
stream for an id gets a fresh random session token in Registered; a later stream claiming the same id while
that worker is live (its stream open, its lease not expired) must present it, or is refused (ALREADY_EXISTS),
so a client cannot end or take over a live worker's stream by asserting its id. A worker reconnecting after a
network blip presents its token and replaces its old stream, as before; an id whose worker is gone (stream
ended, or silent past its lease) may be claimed afresh, which is how a restarted worker process rejoins.
"""

from __future__ import annotations

import hmac
import secrets

_SERVICE = "/rlboost.rollout.v1.RolloutManager/"
METHOD_ROLES: dict[str, tuple[str, ...]] = {
    _SERVICE + "Connect": ("worker",),
    _SERVICE + "Rollout": ("trainer",),
    _SERVICE + "GetStatus": ("observer", "trainer"),
    "/rlboost.rollout.v1.EpisodeRunners/Attach": ("env-runner",),  # agentic episodes (episode_edge.py)
}


class SessionRefused(Exception):  # noqa: N818 (a refusal, not a fault)
    """A stream claimed the id of a live worker without that worker's session token."""


class WorkerSessions:
    """The session token issued to each live worker id (forgotten when its stream ends: the id is free then)."""

    def __init__(self) -> None:
        self._tokens: dict[str, str] = {}

    def admit(self, worker_id: str, presented: str, live: bool) -> str:
        """The session token for a stream claiming `worker_id`; raises SessionRefused when the id is live and
        `presented` is not its token. The same worker keeps its token; a fresh claim gets a new one."""
        held = self._tokens.get(worker_id)
        if held is not None and presented and hmac.compare_digest(presented.encode(), held.encode()):
            return held
        if live:
            raise SessionRefused(
                f"register.worker_id: worker {worker_id!r} is connected on another stream; a reconnect must present "
                "the session_token its Registered gave (a second worker needs its own --worker-id)"
            )
        token = self._tokens[worker_id] = secrets.token_urlsafe(24)
        return token

    def end(self, worker_id: str) -> None:
        """The id's stream ended: anyone holding the worker token may claim it again."""
        self._tokens.pop(worker_id, None)
