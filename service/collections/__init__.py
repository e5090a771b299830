"""Persistent nearest-neighbour collections: SQLite is the truth, FAISS is derived.

Layers, bottom up:

* :mod:`.filters`: the payload filter grammar (``{"key": value}``, ``{"key": {"$in": [...]}}``).
* :mod:`.store`: one SQLite file per collection (ids, texts, payloads, vectors, sequence numbers).
* :mod:`.index`: FAISS flat / HNSW / IVF-PQ with deletion, filtered search, atomic snapshots.
* :mod:`.collection`: a store plus its index, with the locking that keeps searches consistent.
* :mod:`.manager`: every collection under ``<data_dir>/collections/`` and background upkeep.
* :mod:`.api`: the HTTP routes (Qdrant's names).

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

__all__ = [
    "Collection",
    "CollectionManager",
    "CollectionSettings",
    "FilterError",
    "Hit",
    "IndexSpec",
    "VectorIndex",
    "parse_filter",
    "setup_collections",
]


def setup_collections(app: Any, settings: Any) -> CollectionManager:
    """The (not yet started) manager of ``<settings.data_dir>/collections/``, stored on ``app.state.collections``.

    Tuning comes from the service settings' ``collections_*`` fields (:class:`CollectionSettings`). The routes
    (:data:`.api.router`) are mounted by ``service.app.create_app``.
    """
    manager = CollectionManager(Path(settings.data_dir) / "collections", CollectionSettings(settings), app=app)
    app.state.collections = manager
    return manager
