"""The Qdrant gRPC server: Qdrant's ``qdrant.Points``, ``qdrant.Collections`` and ``qdrant.Qdrant`` services
(:mod:`.grpc_points`, :mod:`.grpc_collections`) on one port, translating onto the app's ``/qdrant`` routes
(:mod:`.grpc_bridge`)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import grpc
from qdrant_client.grpc import collections_service_pb2_grpc, points_service_pb2_grpc, qdrant_pb2_grpc

from service.http.qdrant.grpc_bridge import Bridge
from service.http.qdrant.grpc_collections import Collections, Health
from service.http.qdrant.grpc_points import Points

log = logging.getLogger("service.http.qdrant.grpc")


class Guard(grpc.aio.ServerInterceptor):
    """Errors inside a translation: a request the converters cannot read (``ValueError``: a required ``oneof``
    unset, say) answers ``INVALID_ARGUMENT`` with its message; anything else ``INTERNAL`` with an error id only (the
    details go to the server log), as a 500 does over HTTP."""

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        """The handler of ``details.method``, its unary-unary behaviour guarded (module docstring)."""
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        inner = handler.unary_unary

        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
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

        return grpc.unary_unary_rpc_method_handler(
            guarded, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


async def start_server(app: Any, host: str, port: int) -> tuple[grpc.aio.Server, Bridge]:
    """Start Qdrant's gRPC services on ``host:port``, translating onto ``app``; returns the server and its bridge
    (stop the one, close the other).

    Raises:
        RuntimeError: the port cannot be bound.
    """
    bridge = Bridge(app)
    server = grpc.aio.server(interceptors=[Guard()], options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    points_service_pb2_grpc.add_PointsServicer_to_server(Points(bridge), server)
    collections_service_pb2_grpc.add_CollectionsServicer_to_server(Collections(bridge), server)
    qdrant_pb2_grpc.add_QdrantServicer_to_server(Health(bridge), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise RuntimeError(f"cannot bind the Qdrant gRPC port {host}:{port}")
    await server.start()
    log.info("Qdrant gRPC API on %s:%d", host, port)
    return server, bridge
