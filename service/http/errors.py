"""API errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Every 4xx/5xx answer of the service uses this body, so clients (the OpenAI SDKs
included) can parse it. Core code raises domain exceptions; :data:`ERROR_TABLE` maps each to its answer in one
place. Routes raise :class:`APIError` for what only HTTP knows (auth, request shape); the handlers installed by
:func:`install_error_handlers` render both.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.collections import errors as col
from service.collections.stopping import WorkStopped
from service.inference.batch_errors import BatcherClosed, BatchFailed, InputTooLong, QueueFull, RequestTooLarge
from service.inference.embedder import InvalidInput, ModelNotReady
from service.inference.model_registry import ModelNotFound
from service.inference.onnx_reranker import WrongModelTask
from service.inference.prompts import PromptNotFound

log = logging.getLogger("service.http.errors")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "payload_too_large_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class APIError(Exception):
    """An error answered to the client with ``status`` and an OpenAI-shaped JSON body.

    Args:
        status: HTTP status code (4xx for client errors, 5xx for ours).
        message: human-readable explanation of what is wrong.
        param: the request field at fault, if any (e.g. ``"input"``).
        code: a stable machine-readable code (e.g. ``"input_too_long"``).
        type: error type; defaults from ``status``.
        headers: extra response headers (e.g. ``Retry-After``).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body ``{"error": {...}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, shape: ErrorShape | None = None, elapsed: float = 0.0) -> JSONResponse:
        """This error as a response: the OpenAI-shaped :meth:`body`, or ``shape(self, elapsed)`` (another API's
        error envelope, see :func:`shape_of`; ``elapsed``: seconds since the request came in)."""
        body = self.body() if shape is None else shape(self, elapsed)
        return JSONResponse(body, status_code=self.status, headers=self.headers)


#: renders an error in another API's envelope: (error, seconds since the request came in) -> JSON body
ErrorShape = Callable[[APIError, float], dict[str, Any]]
#: key of ``scope["state"]`` holding ``time.perf_counter()`` when the middleware took the request
STARTED_AT = "started_at"


def elapsed_s(scope: Any) -> float:
    """Seconds since the middleware took the request of ``scope`` (0.0 when unknown)."""
    started = (scope.get("state") or {}).get(STARTED_AT)
    return time.perf_counter() - started if started is not None else 0.0


def shape_of(scope: Any, shapes: dict[str, ErrorShape] | None) -> tuple[ErrorShape | None, float]:
    """The error envelope of a request: the shape registered for the path prefix it is under (``/qdrant`` ->
    Qdrant's), else None (OpenAI's), with the seconds elapsed since the request came in."""
    path = scope.get("path", "")
    for prefix, shape in (shapes or {}).items():
        if path == prefix or path.startswith(prefix + "/"):
            return shape, elapsed_s(scope)
    return None, 0.0


def _loc_to_param(loc: tuple[Any, ...]) -> str | None:
    """``("body", "query", "list[float]", 0)`` -> ``"query.0"``: the location prefix and pydantic's union-member
    tags dropped (a field may itself be called ``query`` or ``path``)."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    parts = [str(p) for p in parts if not (isinstance(p, str) and ("[" in p or p.startswith("constrained-")))]
    return ".".join(parts) or None


def _too_long(e: InputTooLong) -> APIError:
    model = f" for model {e.model}" if getattr(e, "model", None) else ""
    count = f"{'at least ' if e.at_least else ''}{e.n_tokens}"
    param = getattr(e, "param", "input")
    return APIError(
        413,
        f"{param}[{e.index}] has {count} tokens, more than the maximum of {e.max_tokens}{model}; "
        "shorten it or send truncate=true",
        param=param,
        code="input_too_long",
    )


#: domain exception -> its HTTP answer: the one place core errors become HTTP
ERROR_TABLE: dict[type[Exception], Callable[[Any], APIError]] = {
    ModelNotFound: lambda e: APIError(404, str(e), param=getattr(e, "param", "model"), code="model_not_found"),
    ModelNotReady: lambda e: APIError(503, str(e), code="model_not_ready"),
    InvalidInput: lambda e: APIError(422, str(e), param=e.param, code="invalid_value"),
    PromptNotFound: lambda e: APIError(422, str(e), param=e.param, code="invalid_value"),
    WrongModelTask: lambda e: APIError(422, str(e), param=e.param, code=e.code),
    InputTooLong: _too_long,
    RequestTooLarge: lambda e: APIError(413, str(e), param=e.param, code="request_too_large"),
    QueueFull: lambda e: APIError(
        429, f"server busy: {e}; retry later", code="queue_full", headers={"Retry-After": "1"}
    ),
    BatchFailed: lambda e: APIError(500, str(e), code="inference_failed", type="server_error"),
    BatcherClosed: lambda e: APIError(503, str(e), code="shutting_down"),
    col.CollectionsNotReady: lambda e: APIError(503, str(e), code="not_ready"),
    col.CollectionNotFound: lambda e: APIError(404, str(e), param=e.param, code="collection_not_found"),
    col.CollectionExists: lambda e: APIError(409, str(e), param=e.param, code="collection_exists"),
    col.InvalidCollectionRequest: lambda e: APIError(422, str(e), param=e.param, code=e.code),
    col.TooManyItems: lambda e: APIError(413, str(e), param=e.param, code=e.code),
    col.ResponseTooLarge: lambda e: APIError(413, str(e), code="response_too_large"),
    col.AliasNotFound: lambda e: APIError(404, str(e), param=e.param, code="alias_not_found"),
    col.SnapshotNotFound: lambda e: APIError(404, str(e), param=e.param, code="snapshot_not_found"),
    col.PointNotFound: lambda e: APIError(404, str(e), param=e.param, code="point_not_found"),
    col.BackendUnavailable: lambda e: APIError(
        503, str(e), code="backend_unavailable", headers={"Retry-After": str(max(1, round(e.retry_after_s)))}
    ),
    col.ModelUnavailable: lambda e: APIError(409, str(e), code="model_unavailable"),
    col.ReembeddingInProgress: lambda e: APIError(409, str(e), code="reembedding_in_progress"),
    col.ModelChanged: lambda e: APIError(503, str(e), code="model_changed", headers={"Retry-After": "1"}),
    WorkStopped: lambda e: APIError(503, str(e), code="request_timeout", headers={"Retry-After": "1"}),
    # the inference port's errors (service.collections.ports), answered as the inference errors they stand for
    col.ModelNotFound: lambda e: APIError(404, str(e), param=e.param, code="model_not_found"),
    col.ModelNotReady: lambda e: APIError(503, str(e), code="model_not_ready"),
    col.InferenceOverloaded: lambda e: APIError(
        429, f"server busy: {e}; retry later", code="queue_full", headers={"Retry-After": "1"}
    ),
}


def to_api_error(exc: Exception) -> APIError | None:
    """The HTTP answer :data:`ERROR_TABLE` gives ``exc`` (by its class or a base class), or None."""
    for cls in type(exc).__mro__:
        if cls in ERROR_TABLE:
            return ERROR_TABLE[cls](exc)
    return None


def install_error_handlers(app: FastAPI, shapes: dict[str, ErrorShape] | None = None) -> None:
    """Render :class:`APIError`, the domain exceptions of :data:`ERROR_TABLE`, validation errors (422), HTTP
    errors and any unexpected error (500) as JSON: OpenAI's shape, or under a path prefix of ``shapes`` that
    prefix's envelope (:func:`shape_of`; the statuses are the same)."""

    def render(request: Request, err: APIError) -> JSONResponse:
        return err.response(*shape_of(request.scope, shapes))

    async def _domain(request: Request, exc: Exception) -> JSONResponse:
        return render(request, to_api_error(exc))

    for cls in ERROR_TABLE:
        app.add_exception_handler(cls, _domain)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return render(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
        msgs = "; ".join(f"{_loc_to_param(tuple(e.get('loc', ()))) or 'body'}: {e.get('msg')}" for e in errs[:5])
        return render(
            request, APIError(422, msgs, param=_loc_to_param(tuple(first.get("loc", ()))), code="invalid_value")
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, (ValueError, RecursionError)):
            # FastAPI's "error parsing the body": invalid UTF-8 (UnicodeDecodeError), JSON nested past the parser's
            # recursion limit, or another ValueError of the parser; a JSON syntax error is already a 422
            cause = exc.__cause__
            if isinstance(cause, UnicodeDecodeError):
                reason = "is not valid UTF-8"
            elif isinstance(cause, RecursionError):
                reason = "is nested too deep"
            else:  # e.g. an integer literal past Python's int-string digit limit
                reason = f"could not be read: {cause}"
            return render(request, APIError(422, f"the JSON body {reason}", code="invalid_value"))
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return render(request, APIError(exc.status_code, str(exc.detail), code=code, headers=dict(exc.headers or {})))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # the client gets an id to quote; the exception text (paths, internals) stays in the server log. Starlette
        # raises the exception on to the server after this answer, and uvicorn then closes the connection: the
        # answer says so (RFC 9112, 9.6), so that a client opens a new connection for its next request
        error_id = uuid.uuid4().hex[:12]
        log.error("error %s on %s %s", error_id, request.method, request.url.path, exc_info=exc)
        err = APIError(
            500,
            f"internal error (id {error_id}); see the server log",
            type="server_error",
            headers={"Connection": "close"},
        )
        return render(request, err)
