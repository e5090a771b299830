"""Persistent nearest-neighbour collections: SQLite is the truth, FAISS is derived.

Layers, bottom up:

* :mod:`.filters`: the payload filter grammar (``{"key": value}``, ``{"key": {"$in": [...]}}``).
* :mod:`.store`: one SQLite file per collection (ids, texts, payloads, vectors, sequence numbers).
* :mod:`.index`: one interface for index types, one module per type (flat, HNSW, IVF-PQ), their registry, and
  the generic FAISS index with deletion, filtered search and atomic snapshots.
* :mod:`.collection`: a store plus its index, with the locking that keeps searches consistent.
* :mod:`.manager`: every collection under ``<data_dir>/collections/`` and background upkeep.
* :mod:`.reembed`: re-embedding into a shadow when the active model changes, then an atomic swap.
* :mod:`.service`: the write and search policy (embedding, dual writes while re-embedding, retries).
* :mod:`.api`: the HTTP schemas and routes only (Qdrant's names).
* :mod:`.errors`: the domain exceptions (mapped to HTTP once, in ``service.errors``).

The service mounts :data:`.api.router` in ``create_app``, calls :func:`setup_collections` in its lifespan,
then ``await manager.start()`` and, at shutdown, ``await manager.close()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .collection import Collection, Hit
from .filters import FilterError, parse_filter
from .index import IndexSpec, VectorIndex
from .manager import CollectionManager, CollectionSettings
from .service import CollectionService

__all__ = [
    "Collection",
    "CollectionManager",
    "CollectionService",
    "CollectionSettings",
    "FilterError",
    "Hit",
    "IndexSpec",
    "VectorIndex",
    "parse_filter",
    "setup_collections",
]


def setup_collections(settings: Any) -> CollectionManager:
    """The (not yet started) manager of ``<settings.data_dir>/collections/``.

    Tuning comes from the service settings' ``collections_*`` fields (:class:`CollectionSettings`). The routes
    (:data:`.api.router`) are mounted by ``service.app.create_app``; they reach the collections through the
    :class:`CollectionService` the app's lifespan puts on ``app.state.collection_service`` once started.
    """
    return CollectionManager(Path(settings.data_dir) / "collections", CollectionSettings(settings))
