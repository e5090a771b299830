"""One pure-ASGI middleware in front of every route: metrics, API keys, payload limit.

Order per HTTP request:

1. API key: with ``api_keys`` configured, every path except ``/health``, ``/ready``
   and ``/metrics`` needs ``Authorization: Bearer <key>`` (else 401 ``invalid_api_key``);
2. payload limit: ``Content-Length`` above ``max_payload_bytes`` → 413 at once; a body
   that turns out larger while being read (chunked uploads) → 413 as well;
3. the app, with the already-read body replayed to it;
4. ``embed_requests_total`` and ``embed_request_duration_seconds`` recorded with the
   route template (unknown paths as ``other``) and the final status.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import APIError
from .metrics import Metrics

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class _TooLarge(Exception):
    pass


class ServiceMiddleware:
    """ASGI middleware. Args: the app, :class:`Metrics`, accepted API keys, payload limit in bytes."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, api_keys: list[str], max_payload_bytes: int) -> None:
        self.app = app
        self.metrics = metrics
        self.api_keys = [k.encode() for k in api_keys]
        self.max_payload_bytes = max_payload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            err = self._check_auth(scope)
            if err is None and scope["method"] in _BODY_METHODS:
                err, receive = await self._read_body(scope, receive)
            if err is not None:
                await err.response()(scope, receive, send_wrapper)
            else:
                await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or ("other" if scope.get("path") not in OPEN_PATHS else scope["path"])
            method = scope.get("method", "")
            self.metrics.requests.labels(path, method, str(status["code"])).inc()
            self.metrics.request_duration.labels(path, method).observe(time.perf_counter() - t0)

    def _check_auth(self, scope: Scope) -> APIError | None:
        if not self.api_keys or scope.get("path") in OPEN_PATHS or scope.get("method") == "OPTIONS":
            return None
        auth = b""
        for k, v in scope.get("headers", []):
            if k == b"authorization":
                auth = v
                break
        scheme, _, token = auth.partition(b" ")
        token = token.strip()
        if scheme.lower() == b"bearer" and token and any(hmac.compare_digest(token, k) for k in self.api_keys):
            return None
        msg = "missing API key: send 'Authorization: Bearer <key>'" if not auth else "invalid API key"
        return APIError(401, msg, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def _read_body(self, scope: Scope, receive: Receive) -> tuple[APIError | None, Receive]:
        limit = self.max_payload_bytes
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    return APIError(400, "invalid Content-Length header", code="invalid_request"), receive
                if n > limit:
                    return self._too_large(n), receive
                break
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                body_msgs = [msg]
                break
            if msg["type"] != "http.request":
                continue
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                return self._too_large(size, at_least=True), receive
            chunks.append(chunk)
            if not msg.get("more_body", False):
                body_msgs = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
                break
        replay = iter(body_msgs)

        async def replay_receive() -> Message:
            try:
                return next(replay)
            except StopIteration:
                return await receive()

        return None, replay_receive

    def _too_large(self, n: int, at_least: bool = False) -> APIError:
        what = f"more than {n - 1}" if at_least else str(n)
        return APIError(
            413,
            f"request body is {what} bytes; the limit is {self.max_payload_bytes} bytes (max_payload_bytes)",
            code="payload_too_large",
        )
