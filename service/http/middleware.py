"""One pure-ASGI middleware in front of every route: metrics, API keys, payload limit.

Order per HTTP request:

1. API key: with ``api_keys`` configured, every path except ``/health``, ``/ready``, ``/metrics``
   and the console's static files (``GET /console/...``) needs ``Authorization: Bearer <key>`` or Qdrant's
   ``api-key: <key>`` header (else 401 ``invalid_api_key``);
2. payload limit: ``Content-Length`` above ``max_payload_bytes`` (``qdrant_max_payload_bytes`` under ``/qdrant/``,
   Qdrant's own request limit) → 413 at once; a body
   that turns out larger while being read (chunked uploads) → 413 as well (a collection snapshot upload, a
   multipart file, skips 2-4: it streams to the app);
3. body rules, one place for every route: a body sent with a non-JSON ``Content-Type`` → 415; a JSON
   ``\\uXXXX`` escape that leaves an unpaired UTF-16 surrogate (valid JSON, but not Unicode text: no tokenizer
   or database can take it) → 422 ``invalid_text``;
4. the app, with the already-read body replayed to it, under a time budget (``request_timeout_s``; not for
   ``/admin`` nor the collection snapshot routes that take as long as the data, :data:`UNTIMED_ROUTES`: creating,
   recovering, uploading, downloading): past it the app is cancelled and, if nothing was sent yet, 503
   ``request_timeout`` answers (for a
   route that writes data, saying that the write may have been applied and that retrying is safe); a
   client that disconnects has its app task cancelled at once (status ``499`` in the metrics). Cancelling drops
   the request's queued inputs from the batcher (a batch already running finishes, nothing more of it runs);

5. ``embed_requests_total`` and ``embed_request_duration_seconds`` recorded with the
   route template (unknown paths as ``other``) and the final status.

With ``replica`` set (setting ``replica_header``), every response carries ``X-Replica: <replica>``.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from service.http.errors import STARTED_AT, APIError, ErrorShape, shape_of
from service.metrics import Metrics
from service.settings import Settings

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
#: liveness aliases that TEI serves (its ``GET /`` and SageMaker's ``GET /ping``): open to GET only, since
#: ``POST /`` is TEI's embed route and needs a key
OPEN_GETS = frozenset({"/", "/ping"})
CONSOLE = "/console"  # the console's static files hold no data (the page sends the user's key to the API)
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
WRITE_FLAG = "writes_data"  # set in scope["state"] by routes that change stored data (service.http.kit.mark_write)
WRITE_MAY_HAVE_APPLIED = (
    ", but a write may already have been applied: retrying it is safe (upserts and deletes are idempotent)"
)


# a JSON string escape: an escaped backslash (skipped, so "\\\\ud800" is text, not an escape) or \uXXXX
_ESCAPE = re.compile(rb"\\\\|\\u([0-9a-fA-F]{4})")
# what every surrogate escape (\uD800-\uDFFF) holds: a body without it has none to check
_SURROGATE_LIKE = re.compile(rb"\\u[dD][89a-fA-F]")


def unpaired_surrogate(body: bytes) -> str | None:
    """The first ``\\uXXXX`` escape in a JSON body that decodes to an unpaired UTF-16 surrogate, else None.

    ``json.loads`` accepts ``"\\udcff"`` and yields a ``str`` that cannot be encoded as UTF-8; every text the
    service passes on (tokenizer, SQLite, responses) must be encodable, so such bodies are refused up front.
    """
    if _SURROGATE_LIKE.search(body) is None:  # one scan in C; the loop below only for bodies that may hold one
        return None
    pending_high: str | None = None
    last_end = -1
    for m in _ESCAPE.finditer(body):
        hexa = m.group(1)
        code = int(hexa, 16) if hexa else None
        adjacent = m.start() == last_end
        if pending_high is not None and not (adjacent and code is not None and 0xDC00 <= code <= 0xDFFF):
            return pending_high
        if code is not None and 0xDC00 <= code <= 0xDFFF and pending_high is None:
            return f"\\u{hexa.decode()}"
        pending_high = f"\\u{hexa.decode()}" if code is not None and 0xD800 <= code <= 0xDBFF else None
        last_end = m.end()
    return pending_high


def _once(message: Message, receive: Receive) -> Receive:
    """A receive that yields ``message`` first, then defers to ``receive``."""
    pending = [message]

    async def _receive() -> Message:
        return pending.pop() if pending else await receive()

    return _receive


def _route(method: str, template: str) -> tuple[str, re.Pattern[str]]:
    """``(method, regex)`` matching the paths of a route template (``{param}``: one path segment, as Starlette's
    default convertor)."""
    parts = re.split(r"(\{[^}]+\})", template)
    return method, re.compile("".join("[^/]+" if p.startswith("{") else re.escape(p) for p in parts) + r"\Z")


_SNAPSHOT = "/collections/{name}/snapshots"
#: the routes that take as long as their data, with no time budget: a collection snapshot's creation, download,
#: recovery and upload, on the native API and under ``/qdrant`` (``service.http.native.snapshots``,
#: ``service.http.qdrant.snapshots``). Matched as templates, method and path together: a collection or alias
#: whose name holds ``snapshots`` gets no exemption for its other routes
UNTIMED_ROUTES = tuple(
    _route(method, prefix + _SNAPSHOT + tail)
    for prefix in ("", "/qdrant")
    for method, tail in (("POST", ""), ("GET", "/{snapshot_name}"), ("PUT", "/recover"), ("POST", "/upload"))
)
_UPLOADS = tuple(_route("POST", prefix + _SNAPSHOT + "/upload") for prefix in ("", "/qdrant"))


def _matches(method: str, path: str, routes: tuple[tuple[str, re.Pattern[str]], ...]) -> bool:
    return any(method == m and rx.match(path) for m, rx in routes)


def untimed(method: str, path: str) -> bool:
    """Whether a request has no time budget: under ``/admin`` (model loads, re-embeddings) or one of
    :data:`UNTIMED_ROUTES`."""
    return path == "/admin" or path.startswith("/admin/") or _matches(method, path, UNTIMED_ROUTES)


def _streamed(scope: Scope) -> bool:
    """A collection snapshot upload (``POST .../snapshots/upload``): its body, a file as large as a collection, goes to
    the app unread, unbounded and with no time budget (the route streams it to disk and checks it)."""
    return _matches(scope.get("method", ""), str(scope.get("path", "")), _UPLOADS)


def bearer_token(authorization: bytes) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None (other scheme, empty)."""
    scheme, _, token = authorization.partition(b" ")
    token = token.strip()
    return token if scheme.lower() == b"bearer" and token else None


def key_matches(token: bytes | None, keys: list[bytes]) -> bool:
    """Constant-time membership of ``token`` in ``keys``."""
    return token is not None and any(hmac.compare_digest(token, k) for k in keys)


def _is_json(content_type: bytes) -> bool:
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


def middleware_options(settings: Settings, metrics: Metrics, shapes: dict[str, ErrorShape]) -> dict[str, Any]:
    """:class:`ServiceMiddleware`'s keyword arguments from the service's settings: the accepted API keys (the
    ordinary and the admin ones, none when ``api_keys`` is empty), the payload limits, the time budget, the
    ``X-Replica`` value (the host name when ``replica_header``), and ``shapes``, the error envelopes by prefix."""
    return {
        "metrics": metrics,
        "api_keys": settings.api_keys + settings.admin_api_keys if settings.api_keys else [],
        "max_payload_bytes": settings.max_payload_bytes,
        "qdrant_max_payload_bytes": settings.qdrant_max_payload_bytes,
        "request_timeout_s": settings.request_timeout_s,
        "replica": socket.gethostname() if settings.replica_header else None,
        "error_shapes": shapes,
    }


class ServiceMiddleware:
    """ASGI middleware. Args: the app, :class:`Metrics`, accepted API keys, payload limit in bytes, time budget of a
    request in seconds, the ``X-Replica`` value (None: no header), and the error envelopes by path prefix
    (``service.http.errors.shape_of``; default: OpenAI's everywhere)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        api_keys: list[str],
        max_payload_bytes: int,
        qdrant_max_payload_bytes: int | None = None,
        request_timeout_s: float = 60.0,
        replica: str | None = None,
        error_shapes: dict[str, ErrorShape] | None = None,
    ) -> None:
        self.app = app
        self.error_shapes = error_shapes
        self.replica = [(b"x-replica", replica.encode())] if replica else []
        self.metrics = metrics
        self.api_keys = [k.encode() for k in api_keys]
        self.max_payload_bytes = max_payload_bytes
        self.qdrant_max_payload_bytes = qdrant_max_payload_bytes or max_payload_bytes
        self.request_timeout_s = request_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI application call (ASGI spec, "Applications"): an ``http`` scope goes through the steps of the
        module docstring; any other scope (``lifespan``, ``websocket``) passes straight to the app."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        scope.setdefault("state", {})[STARTED_AT] = t0  # responses in another API's envelope report their time
        status = {"code": 500}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                if self.replica:
                    message = {**message, "headers": [*message.get("headers", []), *self.replica]}
            await send(message)

        try:
            err = self._check_auth(scope)
            body = b""
            if err is None and _streamed(scope):
                await self.app(scope, receive, send_wrapper)
                return
            if err is None and scope["method"] in _BODY_METHODS:
                err, receive, body = await self._read_body(scope, receive)
                err = err or self._check_body(scope, body)
            if err is not None:
                await err.response(*shape_of(scope, self.error_shapes))(scope, receive, send_wrapper)
            else:
                await self._run_app(scope, receive, send_wrapper, body, status)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or ("other" if scope.get("path") not in OPEN_PATHS else scope["path"])
            method = scope.get("method", "")
            self.metrics.requests.labels(path, method, str(status["code"])).inc()
            self.metrics.request_duration.labels(path, method).observe(time.perf_counter() - t0)

    async def _run_app(self, scope: Scope, receive: Receive, send: Send, body: bytes, status: dict) -> None:
        """Run the app with the body replayed, cancelled on client disconnect or past the time budget."""
        if scope["method"] not in _BODY_METHODS:
            receive = _once({"type": "http.request", "body": b"", "more_body": False}, receive)
        disconnected = asyncio.Event()
        first = await receive()  # the (replayed) body message: the app gets it, the watcher owns the rest

        async def app_receive() -> Message:
            nonlocal first
            if first is not None:
                msg, first = first, None
                return msg
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def watch() -> None:
            while True:
                if (await receive())["type"] == "http.disconnect":
                    disconnected.set()
                    return

        started = {"yes": False}

        async def tracking_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                started["yes"] = True
            await send(message)

        app_task = asyncio.ensure_future(self.app(scope, app_receive, tracking_send))
        watcher = asyncio.ensure_future(watch())
        timeout = None if untimed(scope["method"], str(scope.get("path", ""))) else self.request_timeout_s
        try:
            done, _ = await asyncio.wait({app_task, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if app_task in done:
            app_task.result()
            return
        app_task.cancel()
        try:
            await app_task
        except asyncio.CancelledError:
            pass
        if watcher in done:  # the client went away: nobody to answer
            status["code"] = 499
            return
        if not started["yes"]:
            write = bool(scope.get("state", {}).get(WRITE_FLAG))
            await APIError(
                503,
                f"request took longer than request_timeout_s={self.request_timeout_s:g} s; it was stopped"
                + (WRITE_MAY_HAVE_APPLIED if write else ""),
                code="request_timeout",
                headers={"Retry-After": "1"},
            ).response(*shape_of(scope, self.error_shapes))(scope, app_receive, send)

    def _check_auth(self, scope: Scope) -> APIError | None:
        path = scope.get("path", "")
        if not self.api_keys or path in OPEN_PATHS or scope.get("method") == "OPTIONS":
            return None
        if path in OPEN_GETS and scope.get("method") == "GET":
            return None
        if (path == CONSOLE or path.startswith(CONSOLE + "/")) and scope.get("method") in ("GET", "HEAD"):
            return None
        auth, api_key = b"", b""
        for k, v in scope.get("headers", []):
            if k == b"authorization":
                auth = v
            elif k == b"api-key":  # Qdrant's header (qdrant-client's api_key=)
                api_key = v.strip()
        if key_matches(bearer_token(auth), self.api_keys) or key_matches(api_key or None, self.api_keys):
            return None
        msg = "missing API key: send 'Authorization: Bearer <key>'" if not (auth or api_key) else "invalid API key"
        return APIError(401, msg, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def _read_body(self, scope: Scope, receive: Receive) -> tuple[APIError | None, Receive, bytes]:
        """Read the whole body (within the limit); returns ``(error, replaying receive, body)``."""
        qdrant = scope.get("path", "").startswith("/qdrant/")
        limit = self.qdrant_max_payload_bytes if qdrant else self.max_payload_bytes
        for k, v in scope.get("headers", []):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    return APIError(400, "invalid Content-Length header", code="invalid_request"), receive, b""
                if n > limit:
                    return self._too_large(n, qdrant=qdrant), receive, b""
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
                return self._too_large(size, at_least=True, qdrant=qdrant), receive, b""
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

        return None, replay_receive, b"".join(chunks)

    @staticmethod
    def _check_body(scope: Scope, body: bytes) -> APIError | None:
        if not body:
            return None
        ctype = next((v for k, v in scope.get("headers", []) if k == b"content-type"), None)
        if ctype is not None and not _is_json(ctype):
            return APIError(
                415,
                f"unsupported Content-Type {ctype.decode('latin-1')!r}: send the body as 'application/json'",
                code="unsupported_media_type",
            )
        bad = unpaired_surrogate(body)
        if bad is not None:
            return APIError(
                422,
                f"the body contains the escape {bad}, an unpaired UTF-16 surrogate: text must be valid Unicode",
                code="invalid_text",
            )
        return None

    def _too_large(self, n: int, at_least: bool = False, qdrant: bool = False) -> APIError:
        what = f"more than {n - 1}" if at_least else str(n)
        limit, name = (
            (self.qdrant_max_payload_bytes, "qdrant_max_payload_bytes")
            if qdrant
            else (self.max_payload_bytes, "max_payload_bytes")
        )
        return APIError(
            413, f"request body is {what} bytes; the limit is {limit} bytes ({name})", code="payload_too_large"
        )
