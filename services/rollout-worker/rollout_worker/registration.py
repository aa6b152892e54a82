"""Registering a stream with the rollout-manager, and what one registration hands the next.

Register says who this worker is (id, pool, node, capacity, engine, the weight version it holds) and proves it:
the session token of the last Registered (a reconnect is this worker) and the identity proof, re-read from
--identity-token-file at each Register (the kubelet rotates a projected token in place). It also reports the
responses held for a manager that restarted (held.py), which the manager owns from then on. Registered gives the
stream's timings, a new session token and, to reserved workers, the key their colocation acks are MACed with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import grpc

from rlboost.options.worker import WorkerOptions
from rlboost.rollout.v1 import rollout_pb2 as pb
from rlboost.wire.rollout_io import Pool, WorkerRegistration
from rlboost.wire.rollout_proto import held_to_pb, registration_to_pb
from rollout_worker import metrics
from rollout_worker.engine.base import Engine
from rollout_worker.errors import IdentityProofUnreadableError, ManagerUnreachableError, NotConnectedError, describe
from rollout_worker.held import HeldResponses

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 10.0  # wait this long for Registered after sending Register
REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)  # the worker's credentials


class Registration:
    """This worker's Register, and what the manager's last Registered gave it (kept across streams)."""

    def __init__(self, options: WorkerOptions, engine: Engine, held: HeldResponses) -> None:
        self.options, self.engine, self.held = options, engine, held
        self.session_token = ""  # from the manager's Registered: proves a reconnect is this worker
        self.colocation_ack_key = ""  # from Registered (reserved workers): MACs its colocation acks as its own

    async def register(self, call: grpc.aio.StreamStreamCall) -> pb.Registered:
        """Send Register and wait for Registered (both bounded); NotConnectedError when that fails (worth retrying),
        ManagerUnreachableError when the manager refuses this worker's credentials (retrying cannot help)."""
        register = self._message()
        held = self.held.report(time.monotonic())
        register.held.extend(held_to_pb(h) for h in held)
        try:  # the write is bounded too: a connection half set up (the manager restarting) must not hang it
            await asyncio.wait_for(call.write(pb.WorkerMessage(register=register)), REGISTER_TIMEOUT_S)
            first = await asyncio.wait_for(call.read(), REGISTER_TIMEOUT_S)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, TimeoutError) as err:
            call.cancel()
            log.debug("registration failed; retrying", extra={"error": describe(err)})
            if isinstance(err, grpc.aio.AioRpcError) and err.code() in REFUSED:
                raise ManagerUnreachableError(f"rollout-manager at {self.options.manager}: {describe(err)}") from None
            raise NotConnectedError(describe(err)) from None
        if first is grpc.aio.EOF or first.WhichOneof("body") != "registered":
            call.cancel()
            raise NotConnectedError("the manager did not answer Register with Registered")
        self.session_token = first.registered.session_token
        self.colocation_ack_key = first.registered.colocation_ack_key
        if held:
            self.held.clear()  # the manager owns them now
            metrics.HELD_REPORTED.inc(len(held))
            log.info(
                "reported held responses", extra={"responses": len(held), "tokens": sum(len(h.token_ids) for h in held)}
            )
        return first.registered

    def _message(self) -> pb.Register:
        o, engine = self.options, self.engine
        reg = WorkerRegistration(o.worker_id, Pool(o.pool), o.node, engine.capacity, engine.weight_version, engine.name)
        register = registration_to_pb(reg)
        register.session_token = self.session_token
        register.identity_proof = self.identity_proof()
        return register

    def identity_proof(self) -> str:
        """The proof of who this worker is (rlboost.auth.worker_identity), read afresh: a rotated token counts."""
        return read_identity_proof(self.options.identity_token_file)


def read_identity_proof(path: str) -> str:
    """--identity-token-file's proof ('' without one); IdentityProofUnreadableError naming the flag."""
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as err:
        raise IdentityProofUnreadableError(
            f"--identity-token-file {path}: cannot read it ({err.strerror}); on Kubernetes it is the pod's "
            "projected service-account token, locally `rlboost local` writes it"
        ) from None
