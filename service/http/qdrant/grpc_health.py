"""gRPC's standard health service, ``grpc.health.v1.Health/Check`` (gRPC's "Health Checking Protocol",
https://github.com/grpc/grpc/blob/master/doc/health-checking.md; ``grpc/health/v1/health.proto``), which Qdrant also
serves on its gRPC port, open without an API key.

The two messages are built here from their definition (a private descriptor pool): grpcio ships no generated health
module, and ``grpcio-health-checking`` (which does) requires, in its release for the grpcio installed, a protobuf
older than 6 (the service runs protobuf 7), while its later releases require a later grpcio. ``Check`` answers ``SERVING`` for the server as a whole (``service: ""``) and for each Qdrant
service it serves, ``NOT_SERVING`` while the service drains before shutting down, and ``NOT_FOUND`` (a gRPC status)
for any other service name, as the protocol says. ``Watch`` is not served (``UNIMPLEMENTED``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SERVICE = "grpc.health.v1.Health"
#: the service names ``Check`` knows (``""``: the server as a whole)
SERVICES = frozenset({"", "qdrant.Qdrant", "qdrant.Points", "qdrant.Collections"})
SERVING, NOT_SERVING = 1, 2  # HealthCheckResponse.ServingStatus values


def _messages() -> tuple[Any, Any]:
    """The ``HealthCheckRequest`` and ``HealthCheckResponse`` message classes of ``grpc/health/v1/health.proto``."""
    f = descriptor_pb2.FileDescriptorProto(name="grpc/health/v1/health.proto", package="grpc.health.v1")
    f.syntax = "proto3"
    field = descriptor_pb2.FieldDescriptorProto
    req = f.message_type.add(name="HealthCheckRequest")
    req.field.add(name="service", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    resp = f.message_type.add(name="HealthCheckResponse")
    status = resp.enum_type.add(name="ServingStatus")
    for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
        status.value.add(name=name, number=number)
    resp.field.add(
        name="status",
        number=1,
        type=field.TYPE_ENUM,
        label=field.LABEL_OPTIONAL,
        type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return tuple(  # type: ignore[return-value]
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"grpc.health.v1.{n}"))
        for n in ("HealthCheckRequest", "HealthCheckResponse")
    )


HealthCheckRequest, HealthCheckResponse = _messages()


def health_handler(serving: Callable[[], bool]) -> grpc.GenericRpcHandler:
    """The ``grpc.health.v1.Health`` service (module docstring); ``serving()`` says whether the service is serving
    (False while it drains)."""

    async def check(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.service not in SERVICES:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return HealthCheckResponse(status=SERVING if serving() else NOT_SERVING)

    handler = grpc.unary_unary_rpc_method_handler(
        check,
        request_deserializer=HealthCheckRequest.FromString,
        response_serializer=HealthCheckResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(SERVICE, {"Check": handler})
