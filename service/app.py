"""FastAPI application factory: :func:`create_app`.

Lifespan: load and warm up the persisted active model (``<data_dir>/active_model.json``,
see ``service.inference.model_control``) or else ``settings.default_model`` (a failure aborts start-up
with the loader's message), then open the collections backend (``collections_backend``; the routes are mounted here, so a broken
faiss install is an import error at start, not silently missing routes), then mark the app ready. A backend that
is unavailable at start (Milvus not up yet, or still recovering: ``BackendUnavailable``) does not fail the start: the
service serves (``/health``, embeddings; collection routes 503 ``not_ready``), ``/ready`` answers 503 and the
backend is opened again in the background until it answers; any other error still aborts the start. At
shutdown: not ready, collections closed, batchers drained. The web console's static files
(``service/http/console/``) are served at ``/console/``.

``app.state`` holds ``settings`` (:class:`Settings`), ``metrics`` (:class:`Metrics`),
``registry`` (:class:`ModelRegistry`), ``model_control`` (:class:`ModelControl`),
``reembedder`` (``service.collections.reembed.Reembedder`` or None), ``embedder`` (:class:`Embedder`, see
``service.inference.embedder`` for its stable interface), ``collection_service``
(``service.collections.CollectionService`` once started, else None) and ``ready`` (bool).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline

from service.collections import CollectionService, VectorBackend, open_backend
from service.collections.errors import BackendUnavailable
from service.collections.reembed import Reembedder
from service.http import meta
from service.http.errors import install_error_handlers
from service.http.inference import admin, embeddings, rerank, similarity
from service.http.middleware import ServiceMiddleware, middleware_options
from service.http.native import aliases as alias_api
from service.http.native import collections as collections_api
from service.http.native import snapshots as snapshot_api
from service.http.native import vectors as vector_api
from service.http.openapi import document
from service.http.qdrant import PREFIX as QDRANT_PREFIX
from service.http.qdrant import ROUTERS as QDRANT_ROUTERS
from service.http.qdrant import error_body as qdrant_error
from service.http.qdrant.openapi import QdrantError
from service.inference.embedder import Embedder
from service.inference.model_control import ModelControl
from service.inference.model_registry import ModelRegistry
from service.inference.reranker import Reranker
from service.inference.sparse import open_sparse_models
from service.inference_port import InferenceAdapter
from service.metrics import Metrics, open_collections
from service.settings import Settings
from service.tasks import cancel_and_wait

log = logging.getLogger("service")
CONSOLE_DIR = Path(__file__).resolve().parent / "http" / "console"  # static HTML + JS + CSS (package data)


async def _close_quietly(backend: VectorBackend) -> None:
    try:
        await backend.close()
    except Exception:
        log.exception("closing collections failed")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service app (nothing is loaded until the lifespan starts).

    Raises (at start-up, from the lifespan):
        service.inference.onnx_encoder.ModelLoadError: the default model is missing, invalid or fails its canary.
    """
    settings = settings or Settings()
    metrics = Metrics()
    registry = ModelRegistry(metrics)
    control = ModelControl(settings, registry, metrics)

    opened: dict[str, Any] = {}  # the collections backend and re-embedder once opened (closed at shutdown)

    async def open_collections_now(app: FastAPI) -> None:
        """Open the collections backend and the re-embedder, then mark the app ready.

        Raises:
            BackendUnavailable: the vector store cannot be reached or is not ready (nothing is left open).
        """
        backend = open_backend(settings)
        try:
            await backend.start()
        except BaseException:
            await _close_quietly(backend)
            raise
        opened["backend"] = backend
        inference = InferenceAdapter(lambda: app.state.embedder, control, open_sparse_models(settings))
        app.state.collection_service = CollectionService(backend, inference)
        # collections follow the active model
        reembedder = opened["reembedder"] = Reembedder(inference, backend)
        await reembedder.start()
        app.state.collection_service.on_recover.append(reembedder.adopt)  # recovered from a snapshot
        app.state.reembedder = reembedder
        app.state.ready = True
        log.info(
            "ready: model %s, limits %s", registry.active.info.id, settings.limits(registry.active.model.providers)
        )

    async def open_collections_later(app: FastAPI) -> None:
        """Retry :func:`open_collections_now` (after 1 s, doubling to 10 s) until it succeeds."""
        delay = 1.0
        while True:
            await asyncio.sleep(delay)
            try:
                await open_collections_now(app)
                return
            except BackendUnavailable as e:
                log.info("collections: the vector store is still unavailable (%s); retrying", e)
            except Exception:
                log.exception("collections: opening failed; retrying")
            delay = min(2 * delay, 10.0)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.ready = False
        app.state.collection_service = None
        await control.startup()  # the persisted active version, else settings.default_model
        app.state.embedder = Embedder(registry)
        app.state.reranker = Reranker(registry)  # the rerank routes' interface (rerank_models, or loaded by /admin)
        later = grpc = None
        try:
            try:
                await open_collections_now(app)
            except BackendUnavailable as e:  # a vector store not up yet (or recovering): serve, not ready, retry
                log.warning("collections: the vector store is unavailable (%s); not ready until it answers", e)
                later = asyncio.create_task(open_collections_later(app), name="collections-open")
            if settings.qdrant_grpc_port:  # Qdrant's gRPC API, translated onto the /qdrant routes of this app
                from service.http.qdrant.grpc_server import start_server

                grpc = await start_server(app, settings.host, settings.qdrant_grpc_port)
            yield
        finally:
            app.state.ready = False
            if grpc is not None:
                await grpc[0].stop(grace=settings.graceful_timeout_s)
                await grpc[1].close()
            await cancel_and_wait(later)
            await control.close()
            if "reembedder" in opened:
                try:
                    await opened["reembedder"].close()
                except Exception:
                    log.exception("stopping re-embedding failed")
            if "backend" in opened:
                await _close_quietly(opened["backend"])
            await registry.close()

    # /docs and /redoc load Swagger UI / ReDoc from the fastapi-offline package: they work air-gapped (no CDN)
    app = FastAPIOffline(title="redundancy-embed", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.registry = registry
    app.state.model_control = control
    app.state.reembedder = None
    app.state.collection_service = None
    app.state.embedder = None
    app.state.reranker = None
    app.state.ready = False
    app.state.draining = False
    metrics.watch_collections(lambda: open_collections(app.state))  # embed_collection_* gauges, read at scrape time
    shapes = {QDRANT_PREFIX: qdrant_error}  # errors under /qdrant in Qdrant's envelope, everywhere else OpenAI's
    install_error_handlers(app, shapes)
    for router in (
        embeddings.router,
        rerank.router,
        similarity.router,
        meta.router,
        admin.router,
        collections_api.router,
        snapshot_api.router,
        alias_api.router,
        vector_api.router,
    ):
        app.include_router(document(router))
    for router in QDRANT_ROUTERS:  # the Qdrant-compatible surface over the same collections (service.http.qdrant)
        app.include_router(document(router, QdrantError))
    # the web console at /console/: static files calling the JSON API above (no build step, no CDN)
    app.mount("/console", StaticFiles(directory=CONSOLE_DIR, html=True), name="console")
    # with auth on, admin keys are accepted everywhere; /admin itself checks for an admin key (service.http.inference.admin)
    app.add_middleware(ServiceMiddleware, **middleware_options(settings, metrics, shapes))
    return app
