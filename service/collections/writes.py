"""Writes of points: upserts (embedding with the collection's exact model, dual writes while re-embedding, retries on
a model change) and deletes.

* **Dual writes while re-embedding**: while a :class:`~.reembed.Shadow` is attached, an upsert's texts are
  embedded by both models and written to both (``Collection.upsert`` checks both under its write lock).
* **Retries on a model change**: a re-embedding may swap the collection's model between embedding and writing; the
  collection then raises :class:`~.errors.ModelChanged` and the write is redone with the new model, up to
  :data:`~.errors.RETRIES` times.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from service.collections.embedding import OFF_LOOP_POINTS, Embedding
from service.collections.errors import (
    RETRIES,
    InvalidCollectionRequest,
    ModelChanged,
    ReembeddingInProgress,
    TooManyItems,
)
from service.collections.payload_checks import check_payload_sizes
from service.collections.point_reads import PointReads
from service.collections.schema import point_vectors
from service.collections.sparse_inputs import sparse_from_texts
from service.collections.vector_backend import CollectionSettings


class PointWrites:
    """Upserts and deletes of points, reading collections through ``reads`` and embedding through ``embedding``."""

    def __init__(self, reads: PointReads, embedding: Embedding) -> None:
        self.reads = reads
        self.embedding = embedding

    @property
    def settings(self) -> CollectionSettings:
        """The ``collections_*`` settings."""
        return self.reads.settings

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
        c = await self.reads.collection(name)
        cap = self.settings.max_points_per_request
        if len(ids) > cap:
            raise TooManyItems(f"{len(ids)} points in one request; the maximum is {cap}", "points", "too_many_points")
        check_payload_sizes(payloads, self.settings.max_payload_bytes)
        given = {i: v for i, v in enumerate(vectors or []) if v is not None}
        named = await sparse_from_texts(self.embedding.sparse_models, c, texts, named, fill_sparse)
        extra = None
        if named and any(named):  # checks of many vectors run on a worker thread: the event loop serves meanwhile
            big = len(named) >= OFF_LOOP_POINTS
            extra = await asyncio.to_thread(point_vectors, c.vectors, named) if big else point_vectors(c.vectors, named)
        if c.model is None:  # no model-bound vector: nothing to embed
            if given:
                raise InvalidCollectionRequest(f"collection {name!r} has no unnamed vector", "vector")
            seq = await self.reads.backend.run(c.upsert, ids, texts, payloads, None, named=extra)
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
            vecs = await self.embedding.point_vectors(c, texts, given, model)
            if smodel and not all(texts):
                raise ReembeddingInProgress(
                    f"collection {name!r} is being re-embedded with {smodel['name']}:{smodel['version']}: a point "
                    "given as a vector without text cannot be written until it completes (send its text)"
                )
            svectors = await self.embedding.embed(c, texts, smodel, role="document") if smodel else None
            try:
                seq = await self.reads.backend.run(
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

    async def delete_points(self, name: str, ids: list[int | str] | None, raw_filter: Any) -> tuple[int, int]:
        """Delete by ids or by filter; returns ``(deleted, sequence)`` once durable.

        Raises:
            CollectionNotFound, InvalidCollectionRequest (bad filter).
        """
        c = await self.reads.collection(name)
        where = self.reads.parse_filter(raw_filter, "filter", c.vectors)
        return await self.reads.backend.run(c.delete, ids, where)
