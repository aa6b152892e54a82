"""The nats-server configuration of one job (pure): one user per role, each allowed only its job's subjects.

`render_nats_config(passwords, namespace, job, ...)` returns the text of a nats-server configuration file
(JSON, which nats-server's configuration format is a superset of). A client without a user and password is
refused (no `no_auth_user`), and each user may publish and subscribe only to what its role does:

| topic (`rlboost.<ns>.<job>.<topic>`) | published by  | subscribed by      |
|--------------------------------------|---------------|--------------------|
| weights                              | weight-server | worker, observer   |
| nodes (preemption notices)           | operator      | manager (it answers: the ack) |
| steps, done (step reports, the end)  | trainer       | operator, observer |
| colocation (release/resume commands) | trainer       | worker             |
| colocation-acks                      | worker        | trainer            |
| suspend (checkpoint, then stop)      | operator      | trainer (it answers: SuspendReply) |

The operator also keeps the newest step report and `done` in the JetStream stream `STATUS_STREAM`, so it alone
gets the JetStream API rights of that stream (and `_INBOX.>` for the API's replies). The trainer publishes step
reports and `done` acknowledged by that stream (rlboost.durable): it subscribes to its own inbox prefix for the
acknowledgements, nothing else of JetStream.

`rlboost local` writes this file from `<run dir>/credentials`; on Kubernetes the operator renders it into the
job's NATS config Secret, with TLS.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from rlboost.auth.credentials import NATS_USERS, JobCredentials
from rlboost.wire.events import (
    COLOCATION,
    COLOCATION_ACKS,
    DONE,
    NODES,
    STATUS_STREAM,
    STEPS,
    SUSPEND,
    TRAINER_INBOX,
    WEIGHTS,
    Topic,
)

PUBLISHERS: dict[Topic, tuple[str, ...]] = {
    WEIGHTS: ("weight-server",),
    NODES: ("operator",),
    STEPS: ("trainer",),
    DONE: ("trainer",),
    COLOCATION: ("trainer",),
    COLOCATION_ACKS: ("worker",),
    SUSPEND: ("operator",),
}
SUBSCRIBERS: dict[Topic, tuple[str, ...]] = {
    WEIGHTS: ("worker", "observer"),
    NODES: ("manager",),
    STEPS: ("operator", "observer"),
    DONE: ("operator", "observer"),
    COLOCATION: ("worker",),
    COLOCATION_ACKS: ("trainer",),
    SUSPEND: ("trainer",),
}
# The JetStream API of the status stream only (create/update/info it, make and drop its consumers), and the flow
# control replies of an ordered consumer; the API answers on the client's inbox.
JETSTREAM_PUBLISH = (
    "$JS.API.INFO",
    f"$JS.API.STREAM.*.{STATUS_STREAM}",
    f"$JS.API.CONSUMER.*.{STATUS_STREAM}",
    f"$JS.API.CONSUMER.*.{STATUS_STREAM}.>",
    f"$JS.API.STREAM.MSG.GET.{STATUS_STREAM}",  # `rlboost local` reads the stream by sequence number
    "$JS.FC.>",
)
JETSTREAM_SUBSCRIBE = ("_INBOX.>",)
JETSTREAM_USERS = ("operator",)
# The trainer publishes step reports and `done` to the status stream and waits for its acknowledgement
# (rlboost.durable), which comes to an inbox of its own prefix only.
ACK_INBOXES = {"trainer": TRAINER_INBOX}
# Users that answer requests (nats-server's allow_responses: a reply to the requester's inbox only, once): the
# manager acknowledges the operator's preemption notices, which the operator re-sends until acknowledged; the
# trainer answers the operator's suspend requests.
RESPONDERS = ("manager", "trainer")


@dataclass(frozen=True)
class NatsTls:
    """Paths, as the server sees them, of its certificate and key and of the job CA."""

    cert_file: str
    key_file: str
    ca_file: str


def permissions(namespace: str, job: str) -> dict[str, dict[str, list[str]]]:
    """Each user's allowed subjects: {"publish": [...], "subscribe": [...]}."""
    out: dict[str, dict[str, list[str]]] = {u: {"publish": [], "subscribe": []} for u in NATS_USERS}
    for table, right in ((PUBLISHERS, "publish"), (SUBSCRIBERS, "subscribe")):
        for topic, users in table.items():
            for user in users:
                out[user][right].append(topic.subject(namespace, job))
    for user in JETSTREAM_USERS:
        out[user]["publish"].extend(JETSTREAM_PUBLISH)
        out[user]["subscribe"].extend(JETSTREAM_SUBSCRIBE)
    for user, inbox in ACK_INBOXES.items():
        out[user]["subscribe"].append(f"{inbox}.>")
    return out


def _rule(allowed: list[str]) -> dict[str, list[str]]:
    # An empty allow list would mean "no restriction" to nats-server: deny everything instead.
    return {"allow": allowed} if allowed else {"deny": [">"]}


def render_nats_config(
    passwords: Mapping[str, str],
    namespace: str,
    job: str,
    *,
    listen: str,
    store_dir: str,
    tls: NatsTls | None = None,
    monitor_port: int | None = None,
) -> str:
    """The configuration file's text; `passwords` maps every user of NATS_USERS to its password."""
    missing = [u for u in NATS_USERS if not passwords.get(u)]
    if missing:
        raise ValueError(f"NATS passwords missing for users {missing}: regenerate the job's credentials")
    users = [
        {
            "user": user,
            "password": passwords[user],
            "permissions": {
                "publish": _rule(rights["publish"]),
                "subscribe": _rule(rights["subscribe"]),
                **({"allow_responses": True} if user in RESPONDERS else {}),
            },
        }
        for user, rights in permissions(namespace, job).items()
    ]
    config: dict[str, object] = {
        "listen": listen,
        "jetstream": {"store_dir": store_dir},
        "authorization": {"users": users},
    }
    if tls is not None:
        config["tls"] = {"cert_file": tls.cert_file, "key_file": tls.key_file, "ca_file": tls.ca_file, "timeout": 5}
    if monitor_port is not None:
        config["http_port"] = monitor_port
    return json.dumps(config, indent=2) + "\n"


def passwords_of(credentials: JobCredentials) -> dict[str, str]:
    """Every NATS user's password from a credentials directory."""
    return {user: credentials.nats_password(user) for user in NATS_USERS}
