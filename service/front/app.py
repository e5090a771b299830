"""The ASGI app of a front process: :func:`create_front_app`.

Per request:

* ``POST /v1/embeddings``, ``/embeddings``, ``/embed``, ``/`` (:data:`FAST_PATHS`): the core's own route functions
  (``service.http.inference.embeddings``: the same request models, input checks and response building), behind the
  same middleware (``service.http.middleware.ServiceMiddleware``: API keys, body limits and checks, time budget,
  metrics) and error handlers (``service.http.errors``), with a :class:`RemoteEmbedder` as their embedder: the texts
  and options go to the core's ``POST /internal/embed`` (``service.http.inference.internal``), the float32 rows come
  back as bytes, and the JSON (floats or base64) is written here;
* ``GET /ready`` while this front drains (after SIGTERM): 503 ``draining``, as the core's ``/ready`` answers it in one
  process;
* anything else: passed to the core unchanged (:class:`service.front.proxy.Proxy`), counted in this front's metrics
  as the route ``proxied``.

Which model answers is the core's (its active model when the request reached it), so a hot swap is atomic across
fronts. A front may hold the tokenizers of models the core ran (``front_tokenization``,
:class:`service.front.tokenizing.FrontTokenizers`): their token ids go with the texts and the core runs them only
for the model they were made for. With ``front_inference`` it also runs copies of the core's models itself, for
requests that resolve, in the core's published registry, to the very model it holds
(:class:`service.front.local_models.LocalModels`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI, Request, Response

from service.front.local_models import LocalModels
from service.front.proxy import Message, Proxy, Receive, Scope, Send, core_client, core_unreachable
from service.front.published import MODELS_FILE
from service.front.tokenizing import FrontTokenizers
from service.http.errors import APIError, install_error_handlers
from service.http.inference import embeddings, internal
from service.http.middleware import ServiceMiddleware, middleware_options
from service.http.qdrant import PREFIX as QDRANT_PREFIX
from service.http.qdrant import error_body as qdrant_error
from service.inference.batch_errors import BatcherClosed
from service.inference.embedder import Embedder, EmbedResult
from service.inference.onnx_encoder import ModelInfo
from service.metrics import Metrics
from service.settings import Settings

#: the routes a front answers itself (POST only; ``GET /`` is a liveness alias, passed on)
FAST_PATHS = frozenset({"/v1/embeddings", "/embeddings", "/embed", "/"})
#: the core's answer headers a front passes on with an error answer of ``POST /internal/embed``
_ERROR_HEADERS = frozenset({"content-type", "retry-after", "www-authenticate", "connection"})


class CoreAnswered(Exception):
    """The core answered an internal embedding call with an error: its status, body and headers, passed on as
    they are (the core's error envelope, its message and code)."""

    def __init__(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        super().__init__(f"core answered {status}")
        self.status, self.body, self.headers = status, body, headers


class RemoteEmbedder(Embedder):
    """An :class:`~service.inference.embedder.Embedder` whose :meth:`encode` is the core's: a front's embedding routes
    call it as the core's routes call the core's. Only ``encode`` is served here (the other routes of the embedder,
    ``/tokenize`` and ``/decode``, are passed to the core whole).

    With ``local`` (``front_inference``) a request whose model this front runs itself is embedded here, by the
    same :meth:`Embedder.encode` on the front's copy of the model the core would run (``service.front.local_models``).

    Args:
        client: the core's HTTP client (``service.front.proxy.core_client``).
        tokenizers: where the texts are tokenized before the call, when the front knows the model; None: never.
        local: the models this front runs itself; None: none.
    """

    def __init__(
        self, client: httpx.AsyncClient, tokenizers: FrontTokenizers | None = None, local: LocalModels | None = None
    ) -> None:
        super().__init__(registry=None)  # type: ignore[arg-type]  # the core resolves every name (or `local`)
        self.client = client
        self.tokenizers = tokenizers
        self.local = local
        self.headers = {"content-type": "application/json"}

    async def encode(self, texts: list[str], **options: Any) -> EmbedResult:
        """The core's ``Embedder.encode(texts, **options)`` (same options and result; ``model.dimension`` is the
        width of the rows returned).

        Raises:
            CoreAnswered: the core's error answer (any domain error of ``Embedder.encode``).
            APIError: 503 ``not_ready`` when the core cannot be reached.
            the domain errors of ``Embedder.encode`` when the request ran here (``local``).
        """
        if self.local is not None and (lm := self.local.get(options.get("model"))) is not None:
            try:
                return await Embedder.encode(self, texts, **{**options, "model": lm})
            except BatcherClosed:  # closed since it was resolved (the core unloaded it): the core answers
                pass
        tokens = await self.tokenizers.tokens(texts, options) if self.tokenizers is not None else None
        try:
            r = await self.client.post(
                internal.PATH, content=internal.encode_request(texts, options, tokens), headers=self.headers
            )
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
            raise core_unreachable(e) from e
        if r.status_code != 200:
            raise CoreAnswered(r.status_code, r.content, {k: v for k, v in r.headers.items() if k in _ERROR_HEADERS})
        rows = internal.decode_response(r.content, r.headers)
        if self.tokenizers is not None:
            # the artifact's directory, from the raw header: the core sends a path's UTF-8 bytes (not latin-1)
            where = next((v for k, v in r.headers.raw if k.lower() == internal.PATH_HEADER.encode()), b"")
            self.tokenizers.learn(
                options.get("model"), r.headers["x-model"], r.headers["x-model-sha256"], where.decode(errors="replace")
            )
        name, _, version = r.headers["x-model"].rpartition(":")
        info = ModelInfo(
            name=name,
            version=version,
            sha256=r.headers["x-model-sha256"],
            dimension=rows.shape[1],
            max_seq_length=int(r.headers[internal.MAX_SEQ]),
        )
        return EmbedResult(np.asarray(rows), info, int(r.headers[internal.TOKENS]))


class FrontApp:
    """The front's ASGI app (module docstring); ``state`` is its FastAPI app's (``settings``, ``embedder``,
    ``draining``), which ``service.supervisor.draining_server`` sets on SIGTERM."""

    def __init__(self, fast: FastAPI, middleware: ServiceMiddleware, proxy: Proxy, metrics: Metrics) -> None:
        self.fast, self.middleware, self.proxy, self.metrics = fast, middleware, proxy, metrics
        self.state = fast.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI application call (ASGI spec, "Applications"): ``lifespan`` to the FastAPI app (the core's client is
        opened and closed there), ``http`` as the module docstring says."""
        if scope["type"] == "lifespan":
            await self.fast(scope, receive, send)
        elif scope["type"] != "http":  # no websocket route exists
            await send({"type": "websocket.close", "code": 1000})
        elif scope["method"] == "POST" and scope["path"] in FAST_PATHS:
            await self.middleware(scope, receive, send)
        elif scope["path"] == "/ready" and self.state.draining:
            await self.middleware(scope, receive, send)
        else:
            await self._proxied(scope, receive, send)

    async def _proxied(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0, status = time.perf_counter(), {"code": 499}

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.proxy(scope, receive, counting_send)
        finally:
            self.metrics.requests.labels("proxied", scope["method"], str(status["code"])).inc()
            self.metrics.request_duration.labels("proxied", scope["method"]).observe(time.perf_counter() - t0)


def create_front_app(settings: Settings, core_socket: str) -> FrontApp:
    """A front's app for the core at the Unix socket ``core_socket``. Its metrics are a
    :class:`~service.metrics.Metrics` of its own (the supervisor runs fronts in prometheus_client's multiprocess
    mode, which the core's ``/metrics`` reads: ``service.front.metrics``)."""
    shapes = {QDRANT_PREFIX: qdrant_error}
    state: dict[str, httpx.AsyncClient] = {}
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["client"] = core_client(core_socket)
        tokenizers = FrontTokenizers(metrics) if settings.front_tokenization else None
        local = (
            LocalModels(settings, metrics, Path(core_socket).parent / MODELS_FILE) if settings.front_inference else None
        )
        if local is not None:
            local.start()
        app.state.embedder = RemoteEmbedder(state["client"], tokenizers, local)
        try:
            yield
        finally:
            app.state.embedder = None
            if local is not None:
                await local.close()
            await state["client"].aclose()
            if tokenizers is not None:
                tokenizers.close()

    fast = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    fast.state.settings = settings
    fast.state.embedder = None
    fast.state.draining = False
    install_error_handlers(fast, shapes)

    @fast.exception_handler(CoreAnswered)
    async def _core_answered(request: Request, exc: CoreAnswered) -> Response:
        return Response(exc.body, status_code=exc.status, headers=exc.headers)

    @fast.get("/ready", include_in_schema=False)
    async def _draining() -> Response:
        raise APIError(503, "draining: shutting down soon, still serving requests", code="draining")

    for route in embeddings.router.routes:
        if getattr(route, "path", None) in FAST_PATHS:
            fast.router.routes.append(route)
    middleware = ServiceMiddleware(fast, **middleware_options(settings, metrics, shapes))
    return FrontApp(fast, middleware, Proxy(lambda: state["client"], shapes), metrics)
