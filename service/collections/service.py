"""The collections' write and search policy, between the HTTP routes and :class:`~.collection.Collection`.

* **Embedding**: texts are embedded with the exact model (name, version, sha256) that embedded the collection,
  through the service's embedder (its batcher), in chunks of ``embed_chunk``, with that model's document or query
  prompt, if it has one (:meth:`CollectionService.embed`).
* **Dual writes while re-embedding**: while a :class:`~.reembed.Shadow` is attached, an upsert's texts are
  embedded by both models and written to both (``Collection.upsert`` checks both under its write lock).
* **Retries on a model change**: a re-embedding may swap the collection's model between embedding and writing
  (or searching); the collection then raises :class:`~.errors.ModelChanged` and the operation is redone with the
  new model, up to :data:`~.errors.RETRIES` times.
* **Search planning**: text queries are embedded together, vector queries are checked (dimension, magnitude),
  filters parsed; searches that differ only in their query run as multi-query backend calls of at most
  :data:`HITS_PER_CALL` hits each.

Everything here raises the domain exceptions of :mod:`.errors` (mapped to HTTP in ``service.http.errors``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import numpy as np

from service.collections import searching
from service.collections.errors import (
    RETRIES,
    CollectionNotFound,
    InvalidCollectionRequest,
    ModelChanged,
    ModelNotFound,
    ModelUnavailable,
    PointNotFound,
    ReembeddingInProgress,
    TooManyItems,
)
from service.collections.filters import Filter, FilterError, parse_filter
from service.collections.payload_update import (
    check_payload_sizes,
    delete_payload_keys,
    delete_vectors,
    set_payload,
    update_vectors,
)
from service.collections.ports import InferencePort, ModelRef, ModelSpec, SparseModel
from service.collections.schema import VectorsConfig, new_vectors_config, point_vectors
from service.collections.searching import SearchSpec
from service.collections.sparse_inputs import sparse_from_texts, sparse_model
from service.collections.vector_backend import (
    CollectionHandle,
    Hit,
    ReadConsistency,
    ResponseBudget,
    VectorBackend,
    check_name,
    single_config,
)
from service.collections.vectors import given_vectors


class CollectionService:
    """Create, write, read and search collections with the policy of the module docstring.

    Args:
        backend: where the collections live (:mod:`.vector_backend`).
        inference: the embedding models, server-side sparse models and rerankers (:class:`~.ports.InferencePort`).
    """

    def __init__(self, backend: VectorBackend, inference: InferencePort) -> None:
        self.backend = backend
        self.inference = inference
        #: awaited with each collection recovered from a snapshot (:func:`.snapshots.recover`)
        self.on_recover: list[Callable[[CollectionHandle], Awaitable[None]]] = []

    @property
    def sparse_models(self) -> Mapping[str, SparseModel]:
        """The server-side sparse models by name (:attr:`.ports.InferencePort.sparse_models`)."""
        return self.inference.sparse_models

    @property
    def settings(self) -> Any:
        """The backend's :class:`~.backend.CollectionSettings` (the ``collections_*`` settings)."""
        return self.backend.settings

    def parse_filter(self, raw: Any, param: str, vectors: VectorsConfig | None = None) -> Filter | None:
        """The filter tree of a request's ``filter`` field (None: no filter); ``vectors``: the collection's, which
        ``$has_vector`` may name.

        Raises:
            InvalidCollectionRequest: ``invalid_filter``, naming ``param``.
        """
        try:
            kinds = (
                None
                if vectors is None
                else {
                    **{n: "bound" if v.bound else "dense" for n, v in vectors.dense.items()},
                    **dict.fromkeys(vectors.sparse, "sparse"),
                }
            )
            return parse_filter(raw, self.settings.max_filter_values, kinds) if raw is not None else None
        except FilterError as e:
            raise InvalidCollectionRequest(
                str(e).replace("filter", param, 1), param=param, code="invalid_filter"
            ) from e

    def response_budget(self) -> ResponseBudget:
        """A new :class:`~.backend.ResponseBudget` of ``collections_max_response_bytes``: one per request, passed to
        each of its searches and reads (:meth:`search`, :meth:`query`, :meth:`scroll`)."""
        return ResponseBudget(self.settings.max_response_bytes)

    def read_consistency(self, level: str | None = None, after: int | None = None) -> ReadConsistency:
        """A read's consistency: ``level`` (default: ``collections_read_consistency``) and an optional write's
        sequence to read after (see :class:`~.backend.ReadConsistency`)."""
        return ReadConsistency(level or self.settings.read_consistency, after)

    def active_model(self) -> ModelSpec:
        """The active embedding model (new collections are bound to it).

        Raises:
            ModelNotReady: the service is starting.
        """
        return self.inference.active_model()

    async def collection(self, name: str) -> CollectionHandle:
        """The collection ``name``, looked up on a backend thread (a shared backend may read its registry).

        Raises:
            CollectionNotFound, BackendUnavailable.
        """
        return await self.backend.run(self.backend.get, name)

    async def info(self, name: str, consistency: ReadConsistency | None = None) -> dict[str, Any]:
        """``GET /collections/{name}``'s body (read on a backend thread: on Milvus it counts the points, at
        ``consistency``, default :meth:`read_consistency`)."""
        c = await self.collection(name)
        return await self.backend.run(c.info, consistency or self.read_consistency())

    async def infos(self, consistency: ReadConsistency | None = None) -> list[dict[str, Any]]:
        """Every collection's info, sorted by name, read concurrently on the backend's threads (one deleted
        meanwhile is left out)."""
        rc = consistency or self.read_consistency()
        results = await asyncio.gather(
            *(self.backend.run(c.info, rc) for c in self.backend.list()), return_exceptions=True
        )
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, CollectionNotFound):
                raise r
        return [r for r in results if not isinstance(r, BaseException)]

    async def embed(self, c: CollectionHandle, texts: list[str], model: dict | None = None, *, role: str) -> np.ndarray:
        """``texts`` embedded by ``model`` (default: the collection's), float32 ``(n, d)``, with its prompt for ``role``:
        ``"document"`` (points' texts) or ``"query"`` (search texts), if any (:meth:`.ports.InferencePort.encode`).

        Raises:
            ModelUnavailable: that exact model (name, version, sha256) is not loaded. ModelNotReady: the service is
            starting.
        """
        want = ModelRef.from_dict(model or c.model)
        try:
            loaded = self.inference.loaded(want.id).ref
        except ModelNotFound as e:  # ModelNotReady (the service is starting) is a 503, as it is
            raise ModelUnavailable(
                f"collection {c.name!r} needs {want.id} (sha256 {want.sha256[:12]}...), which is not loaded"
            ) from e
        if loaded.sha256 != want.sha256:
            raise ModelUnavailable(
                f"loaded {want.id} has sha256 {loaded.sha256[:12]}..., the collection needs {want.sha256[:12]}..."
            )
        chunk = self.settings.embed_chunk
        parts = [
            await self.inference.encode(want, texts[i : i + chunk], role=role) for i in range(0, len(texts), chunk)
        ]
        return np.concatenate(parts).astype(np.float32, copy=False)

    async def create(
        self,
        name: str,
        index: str = "flat",
        params: dict[str, Any] | None = None,
        metric: str = "cosine",
        dense: dict[str, dict[str, Any]] | None = None,
        sparse: dict[str, dict[str, Any]] | None = None,
    ) -> CollectionHandle:
        """A new collection. Without ``dense`` and ``sparse``: one unnamed vector bound to the active model, indexed
        by ``index`` (``params``) with ``metric``. Else the named vectors given (:func:`.schema.new_vectors_config`:
        ``dense`` ``{name: {bound, size, metric, index, params}}``, ``sparse`` ``{name: {modifier, model}}``), a
        model-bound one bound to the active model.

        Raises:
            InvalidCollectionRequest, CollectionExists (see :meth:`VectorBackend.create`).
        """
        active = self.active_model()
        model = active.ref.to_dict()
        if dense is None and sparse is None:
            config = single_config(name, index, params, metric, model, active.dimension)
        else:
            check_name(name)
            config = new_vectors_config(dense or {}, sparse or {}, model, active.dimension, tuple(self.sparse_models))
        return await self.backend.create(name, config)

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
        """Embed and upsert points; returns ``(distinct ids written, sequence)`` once durable and searchable.

        Args:
            vectors: per point, a vector the client made (the collection's dimension; the client vouches that the
                collection's model made it, e.g. through ``/v1/embeddings``), stored instead of embedding its text;
                None (or a None entry): the text is embedded. A point given as a vector may have an empty text; such
                a point cannot follow a model switch (the re-embedding fails, naming it) nor be written while one
                runs.
            vectors_model: the model the given vectors were made by (stored vectors written back); a write under
                any other model raises ModelChanged at once, so that the caller reads them again.
            named: per point, its vectors other than the model-bound one, ``{name: [float] | {indices, values} |
                {text, model}}`` (client-supplied dense and sparse vectors of the collection, checked here; a sparse
                one given as ``{text, model}`` is made here by that server-side sparse model).
            fill_sparse: also make each sparse vector bound to a server-side model (``qdrant/bm25``) from the
                point's text, where the point does not give it (the native API; Qdrant's gives what it names).

        Raises:
            CollectionNotFound, TooManyItems, ModelUnavailable, ModelChanged (after :data:`~.errors.RETRIES` attempts);
            InvalidCollectionRequest: a given vector of the wrong dimension, not finite, or zero for cosine;
            ReembeddingInProgress: a point without text while the collection is being re-embedded.
        """
        c = await self.collection(name)
        cap = self.settings.max_points_per_request
        if len(ids) > cap:
            raise TooManyItems(f"{len(ids)} points in one request; the maximum is {cap}", "points", "too_many_points")
        self._check_payload_sizes(payloads)
        given = {i: v for i, v in enumerate(vectors or []) if v is not None}
        named = await sparse_from_texts(self.sparse_models, c, texts, named, fill_sparse)
        extra = point_vectors(c.vectors, named) if named and any(named) else None
        if c.model is None:  # no model-bound vector: nothing to embed
            if given:
                raise InvalidCollectionRequest(f"collection {name!r} has no unnamed vector", "vector")
            seq = await self.backend.run(c.upsert, ids, texts, payloads, None, named=extra)
            return len(set(ids)), seq
        if missing := [i for i, t in enumerate(texts) if not t and i not in given]:
            raise InvalidCollectionRequest(
                f"points[{missing[0]}] has no text and no 'vector': collection {name!r} embeds its model-bound vector "
                "from the text",
                f"points[{missing[0]}]",
            )
        for attempt in range(RETRIES):
            model, smodel = dict(c.model), c.reembed_model
            if vectors_model is not None and vectors_model != model:
                raise ModelChanged(f"collection {name!r} switched model since its vectors were read")
            vecs = await self._point_vectors(c, texts, given, model)
            if smodel and not all(texts):
                raise ReembeddingInProgress(
                    f"collection {name!r} is being re-embedded with {smodel['name']}:{smodel['version']}: a point "
                    "given as a vector without text cannot be written until it completes (send its text)"
                )
            svectors = await self.embed(c, texts, smodel, role="document") if smodel else None
            try:
                seq = await self.backend.run(
                    c.upsert,
                    ids,
                    texts,
                    payloads,
                    vecs,
                    model=model,
                    shadow_model=smodel,
                    shadow_vectors=svectors,
                    named=extra,
                )
                return len(set(ids)), seq  # a repeated id is written once (the last occurrence wins)
            except ModelChanged as e:
                if attempt == RETRIES - 1:
                    raise ModelChanged(f"collection {name!r} changed model during the write; retry ({e})") from e
        raise AssertionError("unreachable")

    async def _point_vectors(
        self, c: CollectionHandle, texts: list[str], given: dict[int, Sequence[float]], model: dict[str, Any]
    ) -> np.ndarray:
        """float32 ``(n, d)``: the client's vectors where given (checked), the texts embedded by ``model`` elsewhere."""
        out, rest = given_vectors(given, len(texts), c.spec, c.name)
        if rest:
            out[rest] = await self.embed(c, [texts[i] for i in rest], model, role="document")
        return out

    async def scroll(
        self,
        name: str,
        start: int | str | None,
        limit: int,
        raw_filter: Any,
        with_vector: bool | list[str] = False,
        budget: ResponseBudget | None = None,
        with_text: bool = True,
        with_payload: bool = True,
    ) -> tuple[list[dict[str, Any]], int | str | None]:
        """A page of points in id order (see :meth:`CollectionHandle.scroll`: ``with_vector`` True or the names of
        the vectors wanted; ``with_text``/``with_payload`` False leave those out): ``(points, next start)``, the next
        start None on the last page. ``limit``: 1 to ``max_top_k``. ``budget``: the request's, which the points spend
        before their texts, payloads and vectors are read (the next page's first point too; None: bounded by ``limit``).

        Raises:
            CollectionNotFound, InvalidCollectionRequest (bad filter or limit), ResponseTooLarge (over ``budget``).
        """
        if not 1 <= limit <= self.settings.max_top_k:
            raise InvalidCollectionRequest(f"limit must be between 1 and {self.settings.max_top_k}", "limit")
        c = await self.collection(name)
        where = self.parse_filter(raw_filter, "filter", c.vectors)
        rows = await self.backend.run(c.scroll, start, limit + 1, where, with_vector, budget, with_text, with_payload)
        return rows[:limit], (rows[limit]["id"] if len(rows) > limit else None)

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
        :func:`.payload_update.set_payload`.

        Raises:
            CollectionNotFound, InvalidCollectionRequest (bad filter, payload too large), ReembeddingInProgress.
        """
        return await set_payload(self, name, ids, raw_filter, payload, merge, key)

    async def delete_payload(self, name: str, ids: list[int | str] | None, raw_filter: Any, keys: list[str]) -> int:
        """Remove ``keys`` (dotted: nested) from the payload of the points among ``ids`` or matching the filter;
        returns the last write's sequence (0 when no point matched): :func:`.payload_update.delete_payload_keys`.

        Raises:
            CollectionNotFound, InvalidCollectionRequest (bad filter), ReembeddingInProgress.
        """
        return await delete_payload_keys(self, name, ids, raw_filter, keys)

    async def update_vectors(self, name: str, updates: dict[Any, tuple[str | None, Any, dict[str, Any]]]) -> int:
        """Set some vectors of the stored points among ``updates``' ids, keeping their others
        (:func:`.payload_update.update_vectors`); returns the last write's sequence.

        Raises:
            CollectionNotFound, InvalidCollectionRequest (a bad vector), ReembeddingInProgress.
        """
        return await update_vectors(self, name, updates)

    async def delete_vectors(self, name: str, ids: list[int | str] | None, raw_filter: Any, names: list[str]) -> int:
        """Remove the named vectors ``names`` from the points among ``ids`` or matching the filter
        (:func:`.payload_update.delete_vectors`); returns the last write's sequence (0 when no point matched).

        Raises:
            CollectionNotFound, InvalidCollectionRequest (an unknown or the model-bound vector, a bad filter).
        """
        return await delete_vectors(self, name, ids, raw_filter, names)

    async def count(self, name: str, raw_filter: Any) -> int:
        """How many points match the filter (None: all), counted exactly.

        Raises:
            CollectionNotFound, InvalidCollectionRequest (bad filter).
        """
        c = await self.collection(name)
        return await self.backend.run(c.count_matching, self.parse_filter(raw_filter, "filter", c.vectors))

    def sparse_model(self, name: str, param: str) -> Any:
        """The server-side sparse model ``name`` (:func:`.sparse_inputs.sparse_model`)."""
        return sparse_model(self.sparse_models, name, param)

    def _check_payload_sizes(self, payloads: list[dict[str, Any] | None]) -> None:
        check_payload_sizes(payloads, self.settings.max_payload_bytes)

    async def delete_points(self, name: str, ids: list[int | str] | None, raw_filter: Any) -> tuple[int, int]:
        """Delete by ids or by filter; returns ``(deleted, sequence)`` once durable.

        Raises:
            CollectionNotFound, InvalidCollectionRequest (bad filter).
        """
        c = await self.collection(name)
        where = self.parse_filter(raw_filter, "filter", c.vectors)
        return await self.backend.run(c.delete, ids, where)

    async def get_point(
        self,
        name: str,
        candidates: Sequence[int | str],
        with_vector: bool,
        consistency: ReadConsistency | None = None,
    ) -> dict[str, Any]:
        """The first point found among ``candidates`` (one id read as an integer, then as a string), read at
        ``consistency`` (default :meth:`read_consistency`).

        Raises:
            CollectionNotFound, PointNotFound.
        """
        c = await self.collection(name)
        rc = consistency or self.read_consistency()
        for pid in candidates:
            p = await self.backend.run(c.get, pid, with_vector, rc)
            if p is not None:
                return p
        shown = candidates[-1] if candidates else ""
        raise PointNotFound(f"point {str(shown)!r} not found in collection {name!r}")

    async def search(
        self,
        name: str,
        searches: Sequence[SearchSpec],
        param: str,
        consistency: ReadConsistency | None = None,
        budget: ResponseBudget | None = None,
    ) -> list[list[Hit]]:
        """One list of hits per search, best first, read at ``consistency`` (default :meth:`read_consistency`):
        :func:`.searching.search` (each search by its ``using`` vector, default the collection's default one).
        ``param``: ``query`` (one search) or ``searches`` (a batch), used to name the field at fault. ``budget``: the
        request's (:meth:`response_budget`), shared with its other searches and reads; None: one for these searches.

        Raises:
            CollectionNotFound, TooManyItems, InvalidCollectionRequest, ModelUnavailable, ModelChanged;
            ResponseTooLarge: the hits exceed the budget (checked as they are gathered).
        """
        return await searching.search(self, name, searches, param, consistency or self.read_consistency(), budget)

    async def query(
        self,
        name: str,
        node: searching.QueryNode,
        consistency: ReadConsistency | None = None,
        budget: ResponseBudget | None = None,
    ) -> list[Hit]:
        """The hits of a query with prefetches and fusion (:func:`.searching.query`), best first; ``budget``: as for
        :meth:`search`.

        Raises:
            as :meth:`search`; InvalidCollectionRequest: prefetches nested too deep, an unknown fusion.
        """
        return await searching.query(self, name, node, consistency or self.read_consistency(), budget=budget)
