"""Qdrant's gRPC API as a translation layer over this service's ``/qdrant`` REST surface.

Qdrant serves the same operations over REST (port 6333) and gRPC (port 6334; the ``qdrant.Points``,
``qdrant.Collections`` and ``qdrant.Qdrant`` services of Qdrant's protobuf definitions, https://github.com/qdrant/qdrant
``lib/api/src/grpc/proto``), and qdrant-client speaks gRPC when asked to (``prefer_grpc=True``). Here each gRPC call
is converted to the REST request that means the same (qdrant-client's own converters, ``GrpcToRest``, which its
clients use to translate the other way), sent to the app in-process through ASGI (the same routes, validation, API
keys, limits, metrics and error table: nothing is answered that REST would not answer), and the REST answer converted
back (``RestToGrpc``). The servicers (:mod:`.grpc_points`, :mod:`.grpc_collections`) are that translation only.

Errors: the HTTP status of the REST answer becomes a gRPC status (:data:`STATUS`), its Qdrant error text the
details. API keys: the metadata ``api-key`` (qdrant-client's) or ``authorization: Bearer <key>``, checked before
the request is read (``service.http.qdrant.grpc_server.Guard``) and again by the same middleware as HTTP. Calls the
REST surface does not serve answer ``UNIMPLEMENTED``.

Nothing that grows with a message runs on the event loop: the servicers hand the bridge a function making the REST
body (the conversion of a 60 MB upsert takes seconds), which runs with the JSON encoding on a worker thread, and a
large answer is decoded there too (:data:`THREAD_BYTES`).

Listens on ``qdrant_grpc_port`` (0: off, the default) of ``host`` (loopback by default, as the HTTP port).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from typing import Any
from urllib.parse import quote

import grpc
import httpx
from pydantic import BaseModel

from service.http.qdrant.envelope import PREFIX

log = logging.getLogger("service.http.qdrant.grpc")

#: the gRPC status of each HTTP status this service answers (others: INTERNAL for 5xx, INVALID_ARGUMENT for 4xx)
STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    409: grpc.StatusCode.ALREADY_EXISTS,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
_FORWARDED = ("api-key", "authorization")
#: messages and answers larger than this (bytes) are parsed, converted and decoded on a worker thread
THREAD_BYTES = 64 * 1024


_SCALARS = frozenset({int, float, str, bool, type(None)})  # JSON values as they are


def dump(x: Any) -> Any:
    """A REST model (qdrant-client's pydantic models), or dicts/lists of them, as the JSON a REST client sends
    (aliases, enums as values, unset optional fields left out; ``None`` inside payloads kept)."""
    if isinstance(x, BaseModel):
        return x.model_dump(mode="json", by_alias=True, exclude_none=True)
    if isinstance(x, dict):
        return {k: dump(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        if set(map(type, x)) <= _SCALARS:  # a vector, say: its 1,600 floats checked at C speed, not one call each
            return list(x)
        return [dump(v) for v in x]
    if isinstance(x, enum.Enum):
        return x.value
    return x


def _json(x: Any) -> bytes:
    return json.dumps(x, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def encode(body: Any) -> bytes:
    """The JSON text of a REST body (:func:`dump`; ``body`` may be a function making it), encoded as httpx's
    ``json=`` encodes it (UTF-8, compact, no NaN).

    The lists of a body object (an upsert's ``points``, a batch's ``operations``) are encoded an item at a time:
    the standard library's encoder holds the GIL for the whole of one call (about 4 s for the 30 MB of 1,024
    vectors of 1,600 floats on a loaded 2-core machine), which would stop the event loop even from a worker thread;
    between two items the loop gets its turn. The text is the same as one call's.

    Raises:
        ValueError: a NaN or an infinity (not JSON).
    """
    x = dump(body() if callable(body) else body)
    if not isinstance(x, dict):
        return _json(x)
    fields = []
    for k, v in x.items():
        fields.append(_json(k) + b":" + (b"[" + b",".join(map(_json, v)) + b"]" if isinstance(v, list) else _json(v)))
    return b"{" + b",".join(fields) + b"}"


def path(template: str, *names: str) -> str:
    """A REST path under :data:`~.envelope.PREFIX` with ``names`` (collection names, keys) percent-quoted into it."""
    return PREFIX + template.format(*(quote(n, safe="") for n in names))


#: a REST body: JSON values (REST models of qdrant-client included), or a function of no argument making them
Body = Any


class Bridge:
    """Sends a gRPC call's REST equivalent to the app in-process and returns the answer's ``(result, time)``.

    Args:
        app: the service's ASGI app (its lifespan already running).
    """

    def __init__(self, app: Any) -> None:
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, raise_app_exceptions=False, client=("127.0.0.1", 0)),
            base_url="http://grpc.local",
            timeout=None,
        )

    async def call(
        self, context: grpc.aio.ServicerContext, method: str, url: str, body: Body = None
    ) -> tuple[Any, float]:
        """``(result, time)`` of the REST call ``method url`` with JSON ``body`` (:meth:`send`); an answer over
        :data:`THREAD_BYTES` is decoded on a worker thread."""
        r = await self.send(context, method, url, body)
        data = await asyncio.to_thread(r.json) if len(r.content) > THREAD_BYTES else r.json()
        return data.get("result"), float(data.get("time") or 0.0)

    async def send(self, context: grpc.aio.ServicerContext, method: str, url: str, body: Body = None) -> httpx.Response:
        """The answer of the REST call ``method url`` with JSON ``body``, the caller's API-key metadata forwarded as
        headers. ``body``: the JSON body, or a function making it from the gRPC message (it runs with the JSON
        encoding on a worker thread).

        Raises:
            grpc.aio.AbortError: (through ``context.abort``) the REST call answered an error: its status mapped by
                :data:`STATUS`, its message as the details.
            ValueError: ``body`` cannot be made from the message (a converter's refusal; a NaN).
        """
        headers = {k: v for k, v in context.invocation_metadata() or () if k in _FORWARDED and isinstance(v, str)}
        content = None
        if body is not None:
            content = await asyncio.to_thread(encode, body) if callable(body) else encode(body)
            headers["content-type"] = "application/json"
        r = await self.client.request(method, url, content=content, headers=headers)
        if r.status_code >= 400:
            try:
                message = r.json()["status"]["error"]
            except Exception:
                message = r.text or f"HTTP {r.status_code}"
            default = grpc.StatusCode.INTERNAL if r.status_code >= 500 else grpc.StatusCode.INVALID_ARGUMENT
            await context.abort(STATUS.get(r.status_code, default), message)
        return r

    async def close(self) -> None:
        """Close the in-process HTTP client."""
        await self.client.aclose()
