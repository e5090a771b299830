"""The Qdrant gRPC server: Qdrant's ``qdrant.Points``, ``qdrant.Collections`` and ``qdrant.Qdrant`` services
(:mod:`.grpc_points`, :mod:`.grpc_collections`) on one port, translating onto the app's ``/qdrant`` routes
(:mod:`.grpc_bridge`), and gRPC's standard health service (:mod:`.grpc_health`).

Every call passes :class:`Guard` first: with API keys configured, a call without a valid key (metadata ``api-key``,
or ``authorization: Bearer <key>``) is refused ``UNAUTHENTICATED`` before its message is parsed, except the health
checks (:data:`OPEN_METHODS`, as Qdrant exempts them); a message that is not valid protobuf is ``INVALID_ARGUMENT``;
a large message is parsed on a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable
from typing import Any

import grpc
from qdrant_client.grpc import collections_service_pb2_grpc, points_service_pb2_grpc, qdrant_pb2_grpc

from service.http.middleware import bearer_token, key_matches
from service.http.qdrant.grpc_bridge import THREAD_BYTES, Bridge
from service.http.qdrant.grpc_collections import Collections, Health
from service.http.qdrant.grpc_health import health_handler
from service.http.qdrant.grpc_points import Points

log = logging.getLogger("service.http.qdrant.grpc")

#: methods open without an API key: the health checks (Qdrant's own exemptions)
OPEN_METHODS = frozenset({"/qdrant.Qdrant/HealthCheck", "/grpc.health.v1.Health/Check"})
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def _refusal(status: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    """A handler answering ``status`` at once; the request arrives as bytes and is never parsed."""

    async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> None:
        await context.abort(status, message)

    return grpc.unary_unary_rpc_method_handler(refuse)


class Guard(grpc.aio.ServerInterceptor):
    """In front of every call (module docstring): the API key, checked on the call's metadata before anything else;
    the request parsed by the guard itself (``INVALID_ARGUMENT`` when it is not the method's message, on a worker
    thread past :data:`~.grpc_bridge.THREAD_BYTES`); errors inside a translation: a request the converters cannot
    read (``ValueError``: a required ``oneof`` unset, say) answers ``INVALID_ARGUMENT`` with its message, anything
    else ``INTERNAL`` with an error id only (the details go to the server log), as a 500 does over HTTP.

    Args:
        api_keys: the keys accepted (empty: no key needed), as the HTTP middleware accepts them.
    """

    def __init__(self, api_keys: Iterable[str] = ()) -> None:
        self.api_keys = [k.encode() for k in api_keys]

    def key_problem(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
        """Why a call with ``metadata`` is refused (the HTTP middleware's messages), or None."""
        if not self.api_keys:
            return None
        auth, api_key = b"", b""
        for k, v in metadata or ():
            value = v.encode() if isinstance(v, str) else v
            if k == "authorization":
                auth = value
            elif k == "api-key":
                api_key = value.strip()
        if key_matches(bearer_token(auth), self.api_keys) or key_matches(api_key or None, self.api_keys):
            return None
        return "missing API key: send 'Authorization: Bearer <key>'" if not (auth or api_key) else "invalid API key"

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        """The handler of ``details.method``: a refusal without a valid key, else its unary-unary behaviour guarded
        (class docstring)."""
        if details.method not in OPEN_METHODS:
            problem = self.key_problem(details.invocation_metadata)
            if problem is not None:
                return _refusal(grpc.StatusCode.UNAUTHENTICATED, problem)
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner, parse = handler.unary_unary, handler.request_deserializer

        async def guarded(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            try:
                if parse is None:
                    request = raw
                elif len(raw) > THREAD_BYTES:
                    request = await asyncio.to_thread(parse, raw)
                else:
                    request = parse(raw)
            except Exception as e:  # protobuf's DecodeError (truncated, a wrong wire type, bad UTF-8): its text only
                message = f"Wrong input: the request is not a valid {details.method} message ({e})"
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
            try:
                return await inner(request, context)
            except grpc.aio.AbortError:
                raise
            except ValueError as e:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Wrong input: {e}")
            except Exception:
                eid = uuid.uuid4().hex[:12]
                log.exception("gRPC %s failed (error id %s)", details.method, eid)
                await context.abort(grpc.StatusCode.INTERNAL, f"internal error (id {eid}); see the server log")

        return grpc.unary_unary_rpc_method_handler(guarded, response_serializer=handler.response_serializer)


async def start_server(app: Any, host: str, port: int) -> tuple[grpc.aio.Server, Bridge]:
    """Start Qdrant's gRPC services on ``host:port``, translating onto ``app`` (whose ``state.settings`` holds the
    API keys); returns the server and its bridge (stop the one, close the other).

    Raises:
        RuntimeError: the port cannot be bound.
    """
    settings = app.state.settings
    # with auth on, admin keys are accepted everywhere (as the HTTP middleware is given them by service.app)
    keys = settings.api_keys + settings.admin_api_keys if settings.api_keys else []
    bridge = Bridge(app)
    server = grpc.aio.server(
        interceptors=[Guard(keys)], options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    )
    points_service_pb2_grpc.add_PointsServicer_to_server(Points(bridge), server)
    collections_service_pb2_grpc.add_CollectionsServicer_to_server(Collections(bridge), server)
    qdrant_pb2_grpc.add_QdrantServicer_to_server(Health(), server)
    server.add_generic_rpc_handlers((health_handler(lambda: not getattr(app.state, "draining", False)),))
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise RuntimeError(f"cannot bind the Qdrant gRPC port {host}:{port}")
    await server.start()
    log.info("Qdrant gRPC API on %s:%d", host, port)
    return server, bridge
