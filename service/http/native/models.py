"""Request bodies of the native collections API (:mod:`.collections` has the routes), validated by pydantic and
compiled to the core's query model (:class:`~service.collections.query_model.SearchQuery`) for a search."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from service.collections.index import MAX_HNSW_EF, index_kinds
from service.collections.payload_checks import check_payload_values
from service.collections.query_model import QuantizationSearch, Rerank, SearchQuery

IndexKind = Literal[index_kinds()]  # the registered index types, listed in the OpenAPI schema
FiniteFloat = Annotated[float, Field(allow_inf_nan=False, strict=True)]  # a number: not true/false, not a string
PointId = Annotated[StrictInt, Field(ge=0, le=2**64 - 1)] | Annotated[StrictStr, Field(min_length=1, max_length=512)]


class DenseVectorIn(BaseModel):
    """One named dense vector of a new collection: ``model: true`` binds it to the active model (the service embeds
    each point's text; ``size`` is the model's), else it is client-supplied (``size`` required, vectors sent in each
    point's ``vectors``); ``multivector: true``: a matrix of ``size``-float rows per point, searched by MAX_SIM
    (:class:`~.schema.DenseVector`; client-supplied, no index)."""

    model_config = ConfigDict(extra="forbid")
    model: StrictBool = False
    size: Annotated[StrictInt, Field(ge=1, le=65536)] | None = None
    metric: Literal["cosine", "dot", "l2"] = "cosine"
    index: IndexKind = "flat"
    params: dict[str, Any] | None = None
    multivector: StrictBool = False


class SparseVectorIn(BaseModel):
    """One named sparse vector of a new collection: ``modifier: idf`` weights query terms by their IDF over the
    collection (Qdrant's ``SparseVectorParams.modifier``); ``model: qdrant/bm25`` makes it here from each point's
    text (and a text query's), as fastembed's ``Bm25`` does (with ``modifier: idf``, BM25 scores)."""

    model_config = ConfigDict(extra="forbid")
    modifier: Literal["none", "idf"] = "none"
    model: Literal["qdrant/bm25"] | None = None


class CreateCollection(BaseModel):
    """Body of ``PUT /collections/{name}``: one unnamed vector bound to the active model (``index``, ``params``,
    ``metric``), or the named ``vectors`` and ``sparse_vectors`` given (then ``index``/``params``/``metric`` are
    those of each vector)."""

    model_config = ConfigDict(extra="forbid")
    index: IndexKind = "flat"
    params: dict[str, Any] | None = None
    metric: Literal["cosine", "dot", "l2"] = "cosine"
    vectors: dict[StrictStr, DenseVectorIn] | None = None
    sparse_vectors: dict[StrictStr, SparseVectorIn] | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> CreateCollection:
        named = self.vectors is not None or self.sparse_vectors is not None
        if named and self.model_fields_set & {"index", "params", "metric"}:
            raise ValueError("with 'vectors' or 'sparse_vectors', give index, params and metric per vector")
        return self


class SparseIn(BaseModel):
    """A sparse vector: ``indices`` (unsigned 32-bit, unique) and their ``values``."""

    model_config = ConfigDict(extra="forbid")
    indices: list[StrictInt]
    values: list[FiniteFloat]


class PointIn(BaseModel):
    """One point to upsert: ``id`` (unsigned int or string), ``text`` (embedded here) and/or ``vector`` (made by the
    collection's model elsewhere, e.g. ``/v1/embeddings``: stored as given, the text kept for re-embedding; a point
    without text cannot follow a model switch), optional JSON-object ``payload``."""

    model_config = ConfigDict(extra="forbid")
    id: PointId
    text: Annotated[StrictStr, Field(min_length=1)] | None = None
    vector: Annotated[list[FiniteFloat], Field(min_length=1)] | None = None
    vectors: (
        dict[StrictStr, Annotated[list[FiniteFloat], Field(min_length=1)] | list[list[FiniteFloat]] | SparseIn] | None
    ) = None
    payload: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _text_or_vector(self) -> PointIn:
        if self.text is None and self.vector is None and not self.vectors:
            raise ValueError("give 'text' (embedded here), 'vector' (made by the collection's model) or 'vectors'")
        return self

    @field_validator("payload")
    @classmethod
    def _plain_json(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            check_payload_values(v)
        return v


class UpsertPoints(BaseModel):
    """Body of ``PUT /collections/{name}/points``."""

    model_config = ConfigDict(extra="forbid")
    points: list[PointIn] = Field(min_length=1)


class DeletePoints(BaseModel):
    """Body of ``POST /collections/{name}/points/delete``: exactly one of ``ids`` and ``filter``."""

    model_config = ConfigDict(extra="forbid")
    ids: list[PointId] | None = None
    filter: Any = None

    @model_validator(mode="after")
    def _one(self) -> DeletePoints:
        if (self.ids is None) == (self.filter is None):
            raise ValueError("give exactly one of 'ids' and 'filter'")
        return self


class ScrollRequest(BaseModel):
    """Body of ``POST /collections/{name}/points/scroll``: a page of points in id order (their stored JSON text,
    byte order: string ids first), from ``start`` (inclusive; the previous page's ``next``)."""

    model_config = ConfigDict(extra="forbid")
    filter: Any = None
    start: PointId | None = None
    limit: StrictInt = Field(10, ge=1)
    with_vector: StrictBool | list[StrictStr] = False


class CountRequest(BaseModel):
    """Body of ``POST /collections/{name}/points/count``."""

    model_config = ConfigDict(extra="forbid")
    filter: Any = None


class RerankOptions(BaseModel):
    """A search's ``rerank``: ``model`` (a loaded reranker; default the first loaded), ``candidates`` (first-stage
    hits scored, default 100, at most ``collections_max_top_k``), ``top_n`` (hits answered, default ``top_k``),
    ``weight`` (alpha in [0, 1], default 1: the reranker's score alone; else fused with the first stage's,
    :func:`service.collections.rerank_search.fused`)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    model: StrictStr | None = None
    candidates: StrictInt = Field(100, ge=1)
    top_n: StrictInt | None = Field(None, ge=1)
    weight: FiniteFloat = Field(1.0, ge=0.0, le=1.0)


class QuantizationIn(BaseModel):
    """How a quantized index (``flat_sq``, ``hnsw_sq``; IVF-PQ's codes too) is searched, as Qdrant's
    ``QuantizationSearchParams``: ``ignore`` (score the stored originals, exactly), ``rescore`` (re-score the
    candidates with the originals; default: the index's, true for ``*_sq``), ``oversampling`` (candidates per result,
    >= 1; default: the index's, 1 for ``*_sq``). No effect on an index that is not quantized (yet)."""

    model_config = ConfigDict(extra="forbid")
    ignore: StrictBool = False
    rescore: StrictBool | None = None
    oversampling: Annotated[FiniteFloat, Field(ge=1, le=1000)] | None = None


class SearchRequest(BaseModel):
    """One search: ``query`` (a text, a dense vector or a sparse ``{indices, values}``) by the vector ``using``
    (default: the model-bound one, else the only dense one), ``top_k``, optional ``filter`` and ``score_threshold``;
    ``exact``: score every stored vector instead of searching the approximate index. ``mode``: ``dense`` (the
    model-bound vector), ``sparse`` (the sparse vector bound to ``qdrant/bm25``) or ``hybrid`` (a text searched by
    both, ``candidates`` hits each, fused by ``fusion``: ``rrf``, its constant ``rrf_k`` default 2 as Qdrant's, or
    ``dbsf``). ``quantization``: how a quantized index is searched (:class:`QuantizationIn`). ``hnsw_ef``: an HNSW
    index's search breadth for this search (at least ``top_k``; default: the index's ``ef_search``), as Qdrant's
    ``params.hnsw_ef``."""

    model_config = ConfigDict(extra="forbid")
    query: (
        Annotated[StrictStr, Field(min_length=1)]
        | Annotated[list[FiniteFloat], Field(min_length=1)]
        | SparseIn
        | Annotated[list[list[FiniteFloat]], Field(min_length=1)]
    )  # the last: a multivector's rows
    using: StrictStr | None = None
    mode: Literal["dense", "sparse", "hybrid"] | None = None
    fusion: Literal["rrf", "dbsf"] = "rrf"
    rrf_k: StrictInt | None = Field(None, ge=1)
    candidates: StrictInt = Field(100, ge=1)
    exact: StrictBool = False
    top_k: StrictInt = Field(10, ge=1)
    filter: Any = None
    score_threshold: FiniteFloat | None = None
    with_payload: StrictBool = True
    with_text: StrictBool = True
    rerank: RerankOptions | None = None  # rerank the hits' texts with a reranker (:mod:`.rerank_search`)
    quantization: QuantizationIn | None = None
    hnsw_ef: StrictInt | None = Field(None, ge=1, le=MAX_HNSW_EF)

    def compiled(self) -> SearchQuery:
        """The core's query (:class:`~service.collections.query_model.SearchQuery`) of this search."""
        r = self.rerank
        return SearchQuery(
            query=self.query.model_dump() if isinstance(self.query, SparseIn) else self.query,
            top_k=self.top_k,
            filter=self.filter,
            score_threshold=self.score_threshold,
            with_payload=self.with_payload,
            with_text=self.with_text,
            using=self.using,
            exact=self.exact,
            mode=self.mode,
            fusion=self.fusion,
            rrf_k=self.rrf_k,
            candidates=self.candidates,
            rerank=None if r is None else Rerank(r.model, r.candidates, r.top_n, r.weight),
            quantization=None if (q := self.quantization) is None else QuantizationSearch(**q.model_dump()),
            hnsw_ef=self.hnsw_ef,
        )


class SearchBatch(BaseModel):
    """Body of ``POST /collections/{name}/search/batch``."""

    model_config = ConfigDict(extra="forbid")
    searches: list[SearchRequest] = Field(min_length=1)
