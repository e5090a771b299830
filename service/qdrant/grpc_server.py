"""The Qdrant gRPC server: Qdrant's ``qdrant.Points``, ``qdrant.Collections`` and ``qdrant.Qdrant`` services
(:mod:`.grpc_points`, :mod:`.grpc_collections`) on one port, translating onto the app's ``/qdrant`` routes
(:mod:`.grpc_bridge`)."""

from __future__ import annotations

import logging
from typing import Any

import grpc
from qdrant_client.grpc import collections_service_pb2_grpc, points_service_pb2_grpc, qdrant_pb2_grpc

from .grpc_bridge import Bridge
from .grpc_collections import Collections, Health
from .grpc_points import Points

log = logging.getLogger("service.qdrant.grpc")


async def start_server(app: Any, host: str, port: int) -> tuple[grpc.aio.Server, Bridge]:
    """Start Qdrant's gRPC services on ``host:port``, translating onto ``app``; returns the server and its bridge
    (stop the one, close the other).

    Raises:
        RuntimeError: the port cannot be bound.
    """
    bridge = Bridge(app)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    points_service_pb2_grpc.add_PointsServicer_to_server(Points(bridge), server)
    collections_service_pb2_grpc.add_CollectionsServicer_to_server(Collections(bridge), server)
    qdrant_pb2_grpc.add_QdrantServicer_to_server(Health(bridge), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise RuntimeError(f"cannot bind the Qdrant gRPC port {host}:{port}")
    await server.start()
    log.info("Qdrant gRPC API on %s:%d", host, port)
    return server, bridge
