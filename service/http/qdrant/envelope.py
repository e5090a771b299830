"""Qdrant's response envelope, its error shape, and what every Qdrant route shares.

Qdrant API reference (https://api.qdrant.tech/api-reference): every answer is ``{"result": ..., "status": "ok",
"time": <seconds>}``; an error is ``{"status": {"error": "<message>"}, "time": <seconds>}``. The statuses are this
service's (``service.http.errors.ERROR_TABLE``: 404 unknown collection or point, 409 exists, 413 too large, 422 invalid
value, 503 unavailable); only the body differs from the OpenAI-shaped errors of the other routes, rendered in one
place for every path under :data:`PREFIX` (``service.http.errors.shape_of``).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response

from service.collections.errors import InvalidCollectionRequest
from service.http.deps import WRITES, Service
from service.http.errors import APIError, elapsed_s
from service.http.kit import json_response

PREFIX = "/qdrant"  # the native collections API owns /collections/...; Qdrant clients take a URL path prefix
#: the Qdrant REST API version whose reference this surface follows (checked with qdrant-client 1.20); clients compare
#: it with their own version
API_VERSION = "1.20.0"

__all__ = ["API_VERSION", "PREFIX", "WRITES", "Service", "error_body", "ok", "unsupported", "update_result"]


def ok(request: Request, result: Any) -> Response:
    """Qdrant's success envelope ``{"result", "status": "ok", "time"}`` (``time``: seconds since the request came in)."""
    return json_response({"result": result, "status": "ok", "time": round(elapsed_s(request.scope), 6)})


#: Qdrant's error kinds as its messages begin (its storage errors' ``Display``: "Not found: ...", "Wrong input: ...")
_KINDS = {404: "Not found: ", 409: "Wrong input: ", 422: "Wrong input: ", 400: "Bad request: "}
#: Qdrant's wording of some errors, which clients match on (``Not existing vector name error: <name>``)
_WORDING = {"vector_not_found": "Not existing vector name error: "}


def error_body(err: APIError, elapsed: float) -> dict[str, Any]:
    """Qdrant's error body ``{"status": {"error": message}, "time": seconds}`` (a ``service.http.errors.ErrorShape``), the
    message prefixed as Qdrant's are by the error's kind (``Not found: Collection 'x' not found``)."""
    message = err.message
    if err.code == "collection_not_found":  # "Not found: Collection 'x' not found", as Qdrant words it
        message = message[:1].upper() + message[1:]
    message = _KINDS.get(err.status, "") + _WORDING.get(err.code or "", "") + message
    return {"status": {"error": message}, "time": round(elapsed, 6)}


def unsupported(what: str, param: str) -> InvalidCollectionRequest:
    """The 422 for a Qdrant feature this surface does not map (the message names it and says so)."""
    return InvalidCollectionRequest(f"{what} is not supported by this Qdrant-compatible API", param=param)


def update_result(sequence: int) -> dict[str, Any]:
    """Qdrant's ``UpdateResult``: the write is durable and searchable when answered (``wait`` is always true)."""
    return {"operation_id": sequence, "status": "completed"}
