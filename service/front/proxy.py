"""A reverse proxy from a front process to the core over its Unix socket: every request a front does not answer itself.

The request goes on as it came (method, raw path and query, headers but the hop-by-hop ones of RFC 9110 7.6.1, the
body streamed as it arrives); the core's answer comes back the same way (status, headers, body streamed), so the
core's middleware decides everything it decides in one process (API keys, body limits, time budgets, error
envelopes). A client that goes away closes the connection to the core, which then stops the request's work as it
does for a client of its own. ``/internal/`` paths are the fronts' own calls to the core and are refused here (404,
as an unknown path). Only when the core cannot be reached (starting, restarting) does the front answer itself: 503
``not_ready`` in the envelope of the path (``service.http.errors.shape_of``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx

from service.http.errors import APIError, ErrorShape, shape_of

log = logging.getLogger("service.front")

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: hop-by-hop headers (RFC 9110 7.6.1), not passed on; ``date`` and ``server`` are the front's own server's
DROPPED = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
_FROM_CORE_DROPPED = DROPPED | {b"date", b"server"}
INTERNAL_PREFIX = "/internal/"


class ClientGone(Exception):
    """The client disconnected while its body was being sent on."""


def core_client(socket_path: str) -> httpx.AsyncClient:
    """An HTTP client for the core at the Unix socket ``socket_path``: no pool bound (the core's queue bounds the
    work), no read timeout (the core's ``request_timeout_s`` bounds a request; snapshot downloads take as long as
    their data), 10 s to connect."""
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=socket_path),
        base_url="http://core",
        timeout=httpx.Timeout(None, connect=10.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256),
    )


def core_unreachable(exc: Exception) -> APIError:
    """The 503 a front answers when the core does not (starting, restarting, gone)."""
    return APIError(
        503,
        f"the core process is not answering ({type(exc).__name__}); it may be starting or restarting",
        code="not_ready",
        headers={"Retry-After": "1"},
    )


class Proxy:
    """The ASGI app passing a request to the core (module docstring). Args: the core's client (:func:`core_client`)
    and the error envelopes by path prefix (``service.http.errors.shape_of``)."""

    def __init__(self, client: Callable[[], httpx.AsyncClient], shapes: dict[str, ErrorShape]) -> None:
        self.client = client
        self.shapes = shapes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI call for an ``http`` scope (ASGI spec, "HTTP Connection Scope")."""
        if scope["path"].startswith(INTERNAL_PREFIX):
            await self._error(scope, receive, send, APIError(404, "Not Found", code="not_found"))
            return
        headers = [(k, v) for k, v in scope["headers"] if k not in DROPPED]
        has_body = any(k in (b"content-length", b"transfer-encoding") for k, _ in scope["headers"])
        raw = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        url = httpx.URL("http://core").copy_with(raw_path=raw + (b"?" + query if query else b""))
        body_done = asyncio.Event()

        async def body() -> AsyncIterator[bytes]:
            try:
                while True:
                    msg = await receive()
                    if msg["type"] == "http.disconnect":
                        raise ClientGone
                    if msg.get("body"):
                        yield msg["body"]
                    if not msg.get("more_body", False):
                        return
            finally:
                body_done.set()

        if not has_body:
            body_done.set()
        request = self.client().build_request(
            scope["method"], url, headers=headers, content=body() if has_body else None
        )
        forward = asyncio.ensure_future(self._forward(request, scope, receive, send))
        watcher = asyncio.ensure_future(_disconnected(receive, body_done))
        try:
            done, _ = await asyncio.wait({forward, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if forward not in done:  # the client went away: close the core's connection, which stops its work
            forward.cancel()
            with contextlib.suppress(asyncio.CancelledError, ClientGone):
                await forward
            return
        forward.result()

    async def _forward(self, request: httpx.Request, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            resp = await self.client().send(request, stream=True)
        except ClientGone:
            return
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
            await self._error(scope, receive, send, core_unreachable(e))
            return
        try:
            headers = [(k, v) for k, v in resp.headers.raw if k.lower() not in _FROM_CORE_DROPPED]
            await send({"type": "http.response.start", "status": resp.status_code, "headers": headers})
            async for chunk in resp.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await resp.aclose()

    async def _error(self, scope: Scope, receive: Receive, send: Send, err: APIError) -> None:
        await err.response(*shape_of(scope, self.shapes))(scope, receive, send)


async def _disconnected(receive: Receive, body_done: asyncio.Event) -> None:
    """Return when the client disconnects (after its body was passed on: until then the body reader receives)."""
    await body_done.wait()
    while (await receive())["type"] != "http.disconnect":
        pass
