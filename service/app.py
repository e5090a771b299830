"""FastAPI application factory: :func:`create_app`.

Lifespan: load and warm up ``settings.default_model`` (a failure aborts start-up
with the loader's message), then start ``service.collections`` if that package
is present, then mark the app ready. At shutdown: not ready, collections closed,
batchers drained.

``app.state`` holds ``settings`` (:class:`Settings`), ``metrics`` (:class:`Metrics`),
``registry`` (:class:`ModelRegistry`), ``embedder`` (:class:`Embedder`, see
``service.embedder`` for its stable interface), ``collections`` (the collections
manager or None) and ``ready`` (bool).
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI

from .embedder import Embedder
from .errors import install_error_handlers
from .metrics import Metrics
from .middleware import ServiceMiddleware
from .registry import ModelRegistry, load_model
from .routes import embeddings, meta, similarity
from .settings import Settings

log = logging.getLogger("service")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service app (nothing is loaded until the lifespan starts).

    Raises (at start-up, from the lifespan):
        service.backend.ModelLoadError: the default model is missing, invalid or fails its canary.
    """
    settings = settings or Settings()
    metrics = Metrics()
    registry = ModelRegistry(metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.ready = False
        app.state.collections = None
        registry.add(await load_model(settings, metrics, settings.default_model), activate=True)
        app.state.embedder = Embedder(registry)
        try:
            from service.collections import setup_collections  # another package; optional
        except ImportError:
            setup_collections = None
        manager = None
        try:
            if setup_collections is not None:
                manager = setup_collections(app, settings)
                await manager.start()
                app.state.collections = manager
            app.state.ready = True
            log.info("ready: model %s, limits %s", registry.active.info.id, settings.limits())
            yield
        finally:
            app.state.ready = False
            if manager is not None:
                try:
                    await manager.close()
                except Exception:
                    log.exception("closing collections failed")
            await registry.close()

    app = FastAPI(title="redundancy-embed", version="0.1.0", lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.registry = registry
    app.state.embedder = None
    app.state.ready = False
    install_error_handlers(app)
    app.include_router(embeddings.router)
    app.include_router(similarity.router)
    app.include_router(meta.router)
    app.add_middleware(
        ServiceMiddleware, metrics=metrics, api_keys=settings.api_keys, max_payload_bytes=settings.max_payload_bytes
    )
    return app
