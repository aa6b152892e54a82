"""Bearer tokens and TLS on the rollout-manager's gRPC edge, both sides, from a job's credentials directory.

Client (worker, trainer, `rlboost local`'s status reads): a channel that sends `authorization: Bearer <token>`
of its role on every call, over TLS verified with the job CA when the directory holds `ca.crt`:

    auth = ClientAuth.for_role(credentials_dir, "worker")     # '' -> ClientAuth(): no token, plaintext
    async with auth.aio_channel("127.0.0.1:50051") as channel: ...

Server (the manager): `ServerAuth.from_dir(dir, METHOD_ROLES)` gives the interceptor that admits each method's
roles only (a call without a token: UNAUTHENTICATED; a valid token of another role: PERMISSION_DENIED, each
naming the token needed and where it comes from) and the server credentials (TLS when `tls-<service>.crt`
exists, else plaintext). With no credentials directory nothing is checked, as before.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from rlboost.auth.credentials import JobCredentials, token_file

METADATA_KEY = "authorization"  # gRPC metadata keys are lower case


def bearer(token: str) -> str:
    return f"Bearer {token}"


def token_from_bearer(value: str) -> str:
    """The token of an `authorization` value ('' when it is not `Bearer <token>`)."""
    return value[7:].strip() if value[:7].lower() == "bearer " else ""


def where_from(role: str) -> str:
    """Where a client of `role` gets its token: said in every refusal, so the fix is in the message."""
    return (
        f"the {role} token: the file {token_file(role)} of the job's credentials (--credentials-dir; "
        f"`rlboost local` makes <run dir>/credentials, Kubernetes mounts the <job>-credentials Secret)"
    )


# ---- client ------------------------------------------------------------------------------------------


class _Bearer:
    """Adds `authorization: Bearer <token>` to a call's metadata (works on plaintext and TLS channels)."""

    def __init__(self, token: str) -> None:
        self.header = (METADATA_KEY, bearer(token))

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self.header)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


# One class per call shape: a channel files each interceptor under the first shape it is an instance of.
class _BearerUnaryUnary(_Bearer, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._with_token(details), request)


class _BearerUnaryStream(_Bearer, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._with_token(details), request)


class _BearerStreamUnary(_Bearer, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._with_token(details), request_iterator)


class _BearerStreamStream(_Bearer, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._with_token(details), request_iterator)


_SHAPES = (_BearerUnaryUnary, _BearerUnaryStream, _BearerStreamUnary, _BearerStreamStream)


@dataclass(frozen=True)
class ClientAuth:
    """What a client presents: its role's token ('' = none) and the job CA to verify the server with (None =
    plaintext)."""

    token: str = ""
    ca: bytes | None = field(default=None, repr=False)

    @classmethod
    def for_role(cls, credentials_dir: str | Path, role: str) -> ClientAuth:
        """`role`'s token and the CA from the directory; '' (no credentials) gives an anonymous client."""
        if not credentials_dir:
            return cls()
        creds = JobCredentials(Path(credentials_dir))
        return cls(token=creds.token(role), ca=creds.ca())

    def aio_channel(self, target: str, options: list[tuple[str, object]] | None = None) -> grpc.aio.Channel:
        interceptors = [shape(self.token) for shape in _SHAPES] if self.token else None
        if self.ca is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=self.ca)
            return grpc.aio.secure_channel(target, creds, options=options, interceptors=interceptors)
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata, for a blocking (grpc.Channel) client that passes it per call."""
        return ((METADATA_KEY, bearer(self.token)),) if self.token else ()

    def channel(self, target: str, options: list[tuple[str, object]] | None = None) -> grpc.Channel:
        """A blocking channel (scripts, tests); pass `metadata()` to each call."""
        if self.ca is not None:
            return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=self.ca), options)
        return grpc.insecure_channel(target, options)


# ---- server ------------------------------------------------------------------------------------------


class RoleInterceptor(grpc.aio.ServerInterceptor):
    """Admits a call only with the token of a role allowed on its method (`method_roles`: full method name ->
    roles). A method not in the map is refused to everyone: a new RPC must be given its roles on purpose."""

    def __init__(self, tokens: Mapping[str, str], method_roles: Mapping[str, tuple[str, ...]]) -> None:
        self.tokens = {role: tok.encode() for role, tok in tokens.items()}
        self.method_roles = method_roles

    def role_of(self, metadata: tuple[tuple[str, str | bytes], ...] | None) -> str | None:
        """The role whose token the call presents (constant-time compares), or None."""
        given = next((str(v) for k, v in metadata or () if k == METADATA_KEY), "")
        presented = token_from_bearer(given).encode()
        if not presented:
            return None
        matches = [role for role, tok in self.tokens.items() if hmac.compare_digest(presented, tok)]
        return matches[0] if matches else None

    def refusal(self, method: str, role: str | None) -> tuple[grpc.StatusCode, str] | None:
        allowed = self.method_roles.get(method, ())
        if role is not None and role in allowed:
            return None
        short = method.rsplit("/", 1)[-1]
        need = " or ".join(allowed) or "no client"
        if not allowed:
            return grpc.StatusCode.PERMISSION_DENIED, f"{short}: no role may call this method"
        if role is None:
            return (
                grpc.StatusCode.UNAUTHENTICATED,
                f"{short} needs 'authorization: Bearer <token>' metadata with the {need} token; "
                f"a {allowed[0]} client uses {where_from(allowed[0])}",
            )
        return (
            grpc.StatusCode.PERMISSION_DENIED,
            f"{short}: the {role} token may not call it; it needs the {need} token ({where_from(allowed[0])})",
        )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:  # unknown method: gRPC answers UNIMPLEMENTED
            return handler
        refused = self.refusal(details.method, self.role_of(details.invocation_metadata))
        return handler if refused is None else _refusing(handler, *refused)


def _refusing(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that ends the call with `code` before reading a request."""
    if handler.response_streaming:

        async def refuse_stream(_request, context):
            await context.abort(code, message)
            yield  # an async generator, as a streaming handler must be

        behaviour, make = (
            refuse_stream,
            (
                grpc.stream_stream_rpc_method_handler
                if handler.request_streaming
                else grpc.unary_stream_rpc_method_handler
            ),
        )
    else:

        async def refuse(_request, context):
            await context.abort(code, message)

        behaviour, make = (
            refuse,
            (
                grpc.stream_unary_rpc_method_handler
                if handler.request_streaming
                else grpc.unary_unary_rpc_method_handler
            ),
        )
    return make(
        behaviour,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


@dataclass(frozen=True)
class ServerAuth:
    """A server's interceptors and port credentials; `ServerAuth()` is open and plaintext (no credentials dir)."""

    interceptor: RoleInterceptor | None = None
    tls: tuple[bytes, bytes] | None = field(default=None, repr=False)  # (certificate chain, private key) PEM

    @classmethod
    def from_dir(cls, credentials_dir: str | Path, service: str, method_roles: Mapping[str, tuple[str, ...]]):
        if not credentials_dir:
            return cls()
        creds = JobCredentials(Path(credentials_dir))
        needed = sorted({role for roles in method_roles.values() for role in roles})
        tokens = {role: creds.token(role) for role in needed}  # a missing one: CredentialsError naming its file
        tls = creds.tls(service)
        return cls(RoleInterceptor(tokens, method_roles), (tls[1], tls[2]) if tls else None)

    @property
    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        return [self.interceptor] if self.interceptor is not None else []

    def add_port(self, server: grpc.aio.Server, address: str) -> int:
        """Bind `address` with TLS when this server has a certificate, else plaintext; the bound port (0: failed)."""
        if self.tls is None:
            return server.add_insecure_port(address)
        cert, key = self.tls
        return server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
