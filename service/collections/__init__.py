"""Persistent nearest-neighbour collections behind one backend interface.

Layers, top down:

* :mod:`.service`: :class:`CollectionService`, the policy the HTTP routes call, composed of :mod:`.point_reads` (lookups,
  scrolls, points by id), :mod:`.embedding` (texts embedded with the collection's exact model), :mod:`.writes`
  (upserts: dual writes while re-embedding, retries on a model change), :mod:`.payload_update` and :mod:`.searching`
  (search planning, queries with prefetches, fusion, :mod:`.formula`).
* :mod:`.ports`: what the collections need from inference (:class:`~.ports.InferencePort`), wired by the app.
* :mod:`.reembed`: collections follow the active model (background re-embedding, then an atomic switch).
* :mod:`.vector_names`: a named vector added to or deleted from a collection.
* :mod:`.snapshots`: collection snapshots (backups), a backend's optional capability, and recovery from them.
* :mod:`.reads`: what a read returns and is bounded by (hits, read consistency, the response budget).
* :mod:`.vector_backend`: the interface every backend implements (collections, points, re-embedding targets) and
  :func:`open_backend`.
* :mod:`.embedded`: the default backend, SQLite (the truth) + FAISS in this process; :mod:`.milvus`: a Milvus server
  or cluster shared by several replicas.
* :mod:`.index`: the index types (flat, HNSW, IVF-PQ), one module each, their params and registry.
* :mod:`.filters`: the payload filter grammar (``{"key": value}``, ``{"key": {"$in": [...]}}``, nested keys).
* :mod:`.vectors`: query and point vector checks and normalisation.
* :mod:`.errors`: the domain exceptions (mapped to HTTP once, in ``service.http.errors``).

The app's lifespan opens the backend with :func:`open_backend`, starts it and puts a :class:`CollectionService` on
``app.state.collection_service``.
"""

from __future__ import annotations

from typing import Any

from service.collections.filters import FilterError, parse_filter
from service.collections.index import IndexSpec
from service.collections.service import CollectionService
from service.collections.vector_backend import CollectionHandle, CollectionSettings, Hit, VectorBackend

__all__ = [
    "CollectionHandle",
    "CollectionService",
    "CollectionSettings",
    "FilterError",
    "Hit",
    "IndexSpec",
    "VectorBackend",
    "open_backend",
    "parse_filter",
]


BACKENDS = ("embedded", "milvus")


def open_backend(settings: Any) -> VectorBackend:
    """The backend named by ``settings.collections_backend`` (not started).

    Raises:
        ValueError: unknown backend name.
        ImportError: the milvus backend without its extra (``pip install 'redundancy-embed[milvus]'``).
    """
    name = settings.collections_backend
    if name == "embedded":
        from service.collections.embedded import EmbeddedBackend

        return EmbeddedBackend.from_settings(settings)
    if name == "milvus":
        from service.collections.milvus import MilvusBackend

        return MilvusBackend.from_settings(settings)
    raise ValueError(f"collections_backend must be one of {BACKENDS}, got {name!r}")
