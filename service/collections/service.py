"""The collections' policy between the HTTP routes and the backend's collections, composed of one part per concern:

* :class:`~.point_reads.PointReads` (which this extends): lookups, infos, filters, scrolls, counts, points by id;
* :class:`~.embedding.Embedding`: texts embedded with the collection's exact model through the inference port;
* :class:`~.writes.PointWrites`: upserts (dual writes while re-embedding, retries on a model change) and deletes;
* :class:`~.payload_update.PayloadUpdates`: payload and vector updates of stored points;
* :class:`~.searching.Searcher`: search planning, queries with prefetches, fusion and formulas;
* :class:`~.snapshots.Recovery`: collections recovered from snapshots.

Everything here raises the domain exceptions of :mod:`.errors` (mapped to HTTP in ``service.http.errors``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from service.collections import searching
from service.collections.embedding import Embedding
from service.collections.index_change import with_indexes
from service.collections.payload_indexes import payload_index
from service.collections.payload_update import PayloadUpdates
from service.collections.point_reads import PointReads
from service.collections.ports import InferencePort, ModelSpec, SparseModel
from service.collections.query_model import SearchQuery
from service.collections.schema import new_vectors_config
from service.collections.searching import Searcher
from service.collections.snapshots import Recovery
from service.collections.vector_backend import (
    CollectionHandle,
    Hit,
    ReadConsistency,
    ResponseBudget,
    VectorBackend,
    check_name,
    single_config,
)
from service.collections.vector_names import with_vector, without_vector
from service.collections.writes import PointWrites


class CollectionService(PointReads):
    """Create, write, read and search collections with the policy of the module docstring.

    Args:
        backend: where the collections live (:mod:`.vector_backend`).
        inference: the embedding models, server-side sparse models and rerankers (:class:`~.ports.InferencePort`).
    """

    def __init__(self, backend: VectorBackend, inference: InferencePort) -> None:
        super().__init__(backend)
        self.inference = inference
        self.embedding = Embedding(inference, backend.settings)
        self.writes = PointWrites(self, self.embedding)
        self.payloads = PayloadUpdates(self, self.writes)
        self.searcher = Searcher(self, self.embedding)
        self.recovery = Recovery(backend, inference)

    @property
    def on_recover(self) -> list[Callable[[CollectionHandle], Awaitable[None]]]:
        """Awaited with each collection recovered from a snapshot (:attr:`.snapshots.Recovery.listeners`)."""
        return self.recovery.listeners

    @property
    def sparse_models(self) -> Mapping[str, SparseModel]:
        """The server-side sparse models by name (:attr:`.ports.InferencePort.sparse_models`)."""
        return self.embedding.sparse_models

    def sparse_model(self, name: str, param: str) -> SparseModel:
        """The server-side sparse model ``name`` (:meth:`.embedding.Embedding.sparse_model`)."""
        return self.embedding.sparse_model(name, param)

    def active_model(self) -> ModelSpec:
        """The active embedding model (new collections are bound to it).

        Raises:
            ModelNotReady: the service is starting.
        """
        return self.embedding.active_model()

    async def embed(self, c: CollectionHandle, texts: list[str], model: dict | None = None, *, role: str) -> np.ndarray:
        """``texts`` embedded by ``model`` (default: the collection's) for ``role``: :meth:`.embedding.Embedding.embed`."""
        return await self.embedding.embed(c, texts, model, role=role)

    async def create(
        self,
        name: str,
        index: str = "flat",
        params: dict[str, Any] | None = None,
        metric: str = "cosine",
        dense: dict[str, dict[str, Any]] | None = None,
        sparse: dict[str, dict[str, Any]] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> CollectionHandle:
        """A new collection. Without ``dense`` and ``sparse``: one unnamed vector bound to the active model, indexed
        by ``index`` (``params``) with ``metric``. Else the named vectors given (:func:`.schema.new_vectors_config`:
        ``dense`` ``{name: {bound, size, metric, index, params}}``, ``sparse`` ``{name: {modifier, model}}``), a
        model-bound one bound to the active model, and the client's ``metadata`` kept with them.

        Raises:
            InvalidCollectionRequest, CollectionExists (see :meth:`VectorBackend.create`).
        """
        active = self.active_model()
        model = active.ref.to_dict()
        if dense is None and sparse is None:
            config = single_config(name, index, params, metric, model, active.dimension)
        else:
            check_name(name)
            models = tuple(self.sparse_models)
            config = new_vectors_config(dense or {}, sparse or {}, model, active.dimension, models, metadata)
        return await self.backend.create(name, config)

    async def create_vector_name(
        self, collection: str, name: str, dense: dict[str, Any] | None = None, sparse: dict[str, Any] | None = None
    ) -> None:
        """Add the vector ``name`` (:func:`.vector_names.with_vector`) to ``collection``; durable when it returns.

        Raises:
            CollectionNotFound; InvalidCollectionRequest (:func:`.vector_names.with_vector`, or ``unsupported`` on the
            milvus backend).
        """
        models = tuple(self.sparse_models)
        await self.backend.update_vectors(collection, lambda cfg: with_vector(cfg, name, dense, sparse, models))

    async def change_indexes(self, collection: str, indexes: dict[str, tuple[str, dict[str, Any]]]) -> None:
        """Give the dense vectors named in ``indexes`` another index ``(kind, params)``
        (:func:`.index_change.with_indexes`): the config is durable when it returns and the index is rebuilt from the
        stored vectors in the background, searches answering from the old one meanwhile (the embedded backend's
        ``info()['rebuilding']`` names the vectors not rebuilt yet).

        Raises:
            CollectionNotFound; InvalidCollectionRequest (:func:`.index_change.with_indexes`, or ``unsupported`` on
            the milvus backend); ReembeddingInProgress: the model-bound vector's, during a re-embedding.
        """
        await self.backend.update_vectors(collection, lambda cfg: with_indexes(cfg, indexes))

    async def delete_vector_name(self, collection: str, name: str) -> None:
        """Delete the vector ``name`` (:func:`.vector_names.without_vector`) and its values from ``collection``;
        durable when it returns.

        Raises:
            CollectionNotFound; InvalidCollectionRequest (:func:`.vector_names.without_vector`, or ``unsupported`` on
            the milvus backend).
        """
        await self.backend.update_vectors(collection, lambda cfg: without_vector(cfg, name))

    async def create_payload_index(self, collection: str, key: Any, schema: Any) -> None:
        """Index payload ``key`` of ``collection`` by ``schema`` (Qdrant's ``field_schema``:
        :func:`.payload_indexes.payload_index`), replacing another index of the key; built and durable when it
        returns (:meth:`~.vector_backend.CollectionHandle.create_payload_index`).

        Raises:
            CollectionNotFound; InvalidCollectionRequest (a bad key or schema).
        """
        index = payload_index(key, schema)
        c = await self.collection(collection)
        await self.backend.run(c.create_payload_index, index)

    async def delete_payload_index(self, collection: str, key: str) -> bool:
        """Drop the index of payload ``key`` of ``collection``; False when it had none.

        Raises:
            CollectionNotFound.
        """
        c = await self.collection(collection)
        return await self.backend.run(c.delete_payload_index, key)

    async def upsert(
        self,
        name: str,
        ids: list[int | str],
        texts: list[str],
        payloads: list[dict[str, Any] | None],
        vectors: Sequence[Sequence[float] | None] | None = None,
        vectors_model: dict[str, Any] | None = None,
        named: Sequence[dict[str, Any] | None] | None = None,
        fill_sparse: bool = False,
    ) -> tuple[int, int]:
        """Embed and upsert points; returns ``(distinct ids written, sequence)`` once durable and searchable:
        :meth:`.writes.PointWrites.upsert` (its arguments and errors)."""
        return await self.writes.upsert(name, ids, texts, payloads, vectors, vectors_model, named, fill_sparse)

    async def delete_points(self, name: str, ids: list[int | str] | None, raw_filter: Any) -> tuple[int, int]:
        """Delete by ids or by filter; returns ``(deleted, sequence)`` once durable.

        Raises:
            CollectionNotFound, InvalidCollectionRequest (bad filter).
        """
        return await self.writes.delete_points(name, ids, raw_filter)

    async def set_payload(
        self,
        name: str,
        ids: list[int | str] | None,
        raw_filter: Any,
        payload: dict[str, Any],
        merge: bool,
        key: str | None = None,
    ) -> int:
        """Merge ``payload`` into (``merge``; at the path ``key`` when given) or put it in place of the payload of
        the points among ``ids`` or matching the filter; returns the last write's sequence (0 when no point matched):
        :meth:`.payload_update.PayloadUpdates.set_payload`.

        Raises:
            CollectionNotFound, InvalidCollectionRequest (bad filter, payload too large), ReembeddingInProgress.
        """
        return await self.payloads.set_payload(name, ids, raw_filter, payload, merge, key)

    async def delete_payload(self, name: str, ids: list[int | str] | None, raw_filter: Any, keys: list[str]) -> int:
        """Remove ``keys`` (dotted: nested) from the payload of the points among ``ids`` or matching the filter;
        returns the last write's sequence (0 when no point matched):
        :meth:`.payload_update.PayloadUpdates.delete_payload_keys`.

        Raises:
            CollectionNotFound, InvalidCollectionRequest (bad filter), ReembeddingInProgress.
        """
        return await self.payloads.delete_payload_keys(name, ids, raw_filter, keys)

    async def update_vectors(self, name: str, updates: dict[Any, tuple[str | None, Any, dict[str, Any]]]) -> int:
        """Set some vectors of the stored points among ``updates``' ids, keeping their others
        (:meth:`.payload_update.PayloadUpdates.update_vectors`); returns the last write's sequence.

        Raises:
            CollectionNotFound, InvalidCollectionRequest (a bad vector), ReembeddingInProgress.
        """
        return await self.payloads.update_vectors(name, updates)

    async def delete_vectors(self, name: str, ids: list[int | str] | None, raw_filter: Any, names: list[str]) -> int:
        """Remove the named vectors ``names`` from the points among ``ids`` or matching the filter
        (:meth:`.payload_update.PayloadUpdates.delete_vectors`); returns the last write's sequence (0 when no point
        matched).

        Raises:
            CollectionNotFound, InvalidCollectionRequest (an unknown or the model-bound vector, a bad filter).
        """
        return await self.payloads.delete_vectors(name, ids, raw_filter, names)

    async def search(
        self,
        name: str,
        searches: Sequence[SearchQuery],
        param: str,
        consistency: ReadConsistency | None = None,
        budget: ResponseBudget | None = None,
    ) -> list[list[Hit]]:
        """One list of hits per search, best first, read at ``consistency`` (default :meth:`read_consistency`):
        :meth:`.searching.Searcher.search` (each search by its ``using`` vector, default the collection's default
        one). ``param``: ``query`` (one search) or ``searches`` (a batch), used to name the field at fault.
        ``budget``: the request's (:meth:`response_budget`), shared with its other searches and reads; None: one for
        these searches.

        Raises:
            CollectionNotFound, TooManyItems, InvalidCollectionRequest, ModelUnavailable, ModelChanged;
            ResponseTooLarge: the hits exceed the budget (checked as they are gathered).
        """
        return await self.searcher.search(name, searches, param, consistency, budget)

    async def query(
        self,
        name: str,
        node: searching.QueryNode,
        consistency: ReadConsistency | None = None,
        budget: ResponseBudget | None = None,
    ) -> list[Hit]:
        """The hits of a query with prefetches and fusion (:meth:`.searching.Searcher.query`), best first;
        ``budget``: as for :meth:`search`.

        Raises:
            as :meth:`search`; InvalidCollectionRequest: prefetches nested too deep, an unknown fusion.
        """
        return await self.searcher.query(name, node, consistency, budget=budget)
