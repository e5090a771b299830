"""HTTP routes of the collections (Qdrant's names, OpenAI-shaped errors).

============================================  ==================================================
``PUT    /collections/{name}``                create ``{index, params, metric}`` (one model-bound vector), or
                                              ``{vectors: {name: {model | size, metric, index, params}},
                                              sparse_vectors: {name: {modifier}}}``
``GET    /collections``                       list ``{"collections": [info, ...]}``
``GET    /collections/{name}``                info: count, index (type, params, trained), dimension, model
``DELETE /collections/{name}``                delete it and its files
``PUT    /collections/{name}/points``         upsert ``{points: [{id, text, vector, vectors, payload}]}`` (durable
                                              on answer; ``vectors``: named ``{name: [float] | {indices, values}}``)
``POST   /collections/{name}/points/delete``  delete ``{ids: [...]}`` or ``{filter: {...}}``
``GET    /collections/{name}/points/{id}``    one point ``{id, text, payload}`` (``?with_vector=true``,
                                              ``?id_type=auto|int|string``; ids may contain ``/``)
``POST   /collections/{name}/points/scroll``  ``{filter, start, limit, with_vector}`` -> ``{points, next}``
``POST   /collections/{name}/points/count``   ``{filter}`` -> ``{count}``
``POST   /collections/{name}/search``         ``{query, using, top_k, filter, score_threshold, with_payload,
                                              with_text, rerank}`` (:mod:`.rerank_search`)
                                              -> ``[{id, score, text, payload}]``
``POST   /collections/{name}/search/batch``   ``{searches: [search, ...]}`` -> ``[[hit, ...], ...]``
============================================  ==================================================

``query`` is a text (embedded with the collection's model) or a vector of the
collection's dimension. Every read (the GETs and both searches) takes ``?consistency=strong|bounded|eventual``
and ``?after_sequence=`` (a write's ``sequence``), answering the consistency it got in ``X-Read-Consistency``
(:class:`~.backend.ReadConsistency`). Errors: 404 ``collection_not_found`` / ``point_not_found``,
409 ``collection_exists`` / ``model_unavailable``, 413 ``too_many_points``, 422
``invalid_value`` / ``invalid_filter`` / ``wrong_dimension``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Response
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
from starlette.convertors import PathConvertor, register_url_convertor

from service.collections import rerank_search
from service.collections.errors import InvalidCollectionRequest
from service.collections.index import index_kinds
from service.collections.payload_update import check_payload_values
from service.collections.query_model import Rerank, SearchQuery
from service.collections.service import CollectionService
from service.collections.vector_backend import Hit, ReadConsistency
from service.http.deps import WRITES, Consistency, Service
from service.http.kit import JSONRoute, json_response
from service.metrics import CollectionTimer, collection_timer

router = APIRouter(tags=["collections"], route_class=JSONRoute)


class _AnyPath(PathConvertor):
    """Starlette's ``path`` convertor, newlines included (its ``.*`` stops at one): every string id that an upsert
    accepted is addressable in a URL (``/points/a%0Ab``)."""

    regex = r"[\s\S]*"


register_url_convertor("anypath", _AnyPath())

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


class SearchRequest(BaseModel):
    """One search: ``query`` (a text, a dense vector or a sparse ``{indices, values}``) by the vector ``using``
    (default: the model-bound one, else the only dense one), ``top_k``, optional ``filter`` and ``score_threshold``;
    ``exact``: score every stored vector instead of searching the approximate index. ``mode``: ``dense`` (the
    model-bound vector), ``sparse`` (the sparse vector bound to ``qdrant/bm25``) or ``hybrid`` (a text searched by
    both, ``candidates`` hits each, fused by ``fusion``: ``rrf``, its constant ``rrf_k`` default 2 as Qdrant's, or
    ``dbsf``)."""

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
    rerank: rerank_search.RerankOptions | None = None  # rerank the hits' texts with a reranker (:mod:`.rerank_search`)

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
            rerank=None if r is None else Rerank(r.model, r.candidates, r.top_n),
        )


class SearchBatch(BaseModel):
    """Body of ``POST /collections/{name}/search/batch``."""

    model_config = ConfigDict(extra="forbid")
    searches: list[SearchRequest] = Field(min_length=1)


def _read(body: Any, svc: CollectionService, rc: ReadConsistency) -> Response:
    """A read's JSON answer, with the consistency it got in ``X-Read-Consistency``."""
    r = json_response(body)
    r.headers["X-Read-Consistency"] = svc.backend.applied(rc)
    return r


Timer = Annotated[CollectionTimer, Depends(collection_timer)]  # latency histograms by index type (service.metrics)


def _hit_json(h: Hit, with_payload: bool, with_text: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"id": h.id, "score": h.score}
    if with_text:
        d["text"] = h.text
    if with_payload:
        d["payload"] = h.payload
    return d


# --- collections -------------------------------------------------------------------------------------------------
@router.put("/collections/{name}", dependencies=WRITES)
async def create_collection(name: str, body: CreateCollection, svc: Service) -> Response:
    """Create a collection (its vectors: see :class:`CreateCollection`); answers its info."""
    dense = {
        n: {
            "bound": v.model,
            "size": v.size,
            "metric": v.metric,
            "index": v.index,
            "params": v.params,
            "multivector": v.multivector,
        }
        for n, v in (body.vectors or {}).items()
    }
    sparse = {n: {"modifier": v.modifier, "model": v.model} for n, v in (body.sparse_vectors or {}).items()}
    named = body.vectors is not None or body.sparse_vectors is not None
    c = await svc.create(name, body.index, body.params, body.metric, *((dense, sparse) if named else ()))
    return json_response(await svc.backend.run(c.info))


@router.get("/collections")
async def list_collections(svc: Service, rc: Consistency) -> Response:
    """``{"collections": [info, ...]}`` sorted by name (counts read at ``consistency``)."""
    return _read({"collections": await svc.infos(rc)}, svc, rc)


@router.get("/collections/{name}")
async def get_collection(name: str, svc: Service, rc: Consistency) -> Response:
    """Count (read at ``consistency``), index type/params/trained, dimension, metric, model (name, version,
    sha256), sequence."""
    return _read(await svc.info(name, rc), svc, rc)


@router.delete("/collections/{name}", dependencies=WRITES)
async def delete_collection(name: str, svc: Service) -> Response:
    """Delete the collection and its files."""
    await svc.backend.delete(name)
    return json_response({"deleted": True, "name": name})


# --- points ---------------------------------------------------------------------------------------------------------
@router.put("/collections/{name}/points", dependencies=WRITES)
async def upsert_points(name: str, body: UpsertPoints, svc: Service, timed: Timer) -> Response:
    """Embed and upsert points; answers once the write is durable (SQLite commit, fsynced) and searchable."""
    pts = body.points
    with timed("upsert", name):
        named = [
            {k: v.model_dump() if isinstance(v, SparseIn) else v for k, v in (p.vectors or {}).items()} for p in pts
        ]
        n, seq = await svc.upsert(
            name,
            [p.id for p in pts],
            [p.text or "" for p in pts],
            [p.payload for p in pts],
            [p.vector for p in pts],
            named=named,
            fill_sparse=True,
        )
    return json_response({"status": "completed", "upserted": n, "sequence": seq})


@router.post("/collections/{name}/points/delete", dependencies=WRITES)
async def delete_points(name: str, body: DeletePoints, svc: Service) -> Response:
    """Delete points by ``ids`` or by ``filter``; answers ``{deleted, sequence}`` once durable."""
    n, seq = await svc.delete_points(name, body.ids, body.filter)
    return json_response({"status": "completed", "deleted": n, "sequence": seq})


@router.get("/collections/{name}/points/{point_id:anypath}")
async def get_point(
    name: str,
    point_id: str,
    svc: Service,
    rc: Consistency,
    with_vector: bool = False,
    id_type: Literal["auto", "int", "string"] = "auto",
) -> Response:
    """One point. Any string id is addressable (``/`` included: the rest of the path is the id). With
    ``id_type=auto`` an id in canonical decimal form (``7``, not ``007``) is looked up as an unsigned integer
    first, then as a string; ``id_type=string`` or ``int`` picks one (a string id ``"7"`` beside an integer 7)."""
    canonical = point_id.isascii() and point_id.isdigit() and str(int(point_id)) == point_id
    if id_type == "int" and not canonical:
        raise InvalidCollectionRequest(f"{point_id!r} is not an unsigned integer id", param="id")
    candidates: list[int | str] = {
        "auto": [int(point_id), point_id] if canonical else [point_id],
        "int": [int(point_id)] if canonical else [],
        "string": [point_id],
    }[id_type]
    return _read(await svc.get_point(name, candidates, with_vector, rc), svc, rc)


@router.post("/collections/{name}/points/scroll")
async def scroll_points(name: str, body: ScrollRequest, svc: Service) -> Response:
    """``{points: [{id, text, payload[, vector]}], next}``: up to ``limit`` points matching ``filter`` in id order from
    ``start``; ``next`` starts the next page (null on the last)."""
    points, nxt = await svc.scroll(name, body.start, body.limit, body.filter, body.with_vector)
    return json_response({"points": points, "next": nxt})


@router.post("/collections/{name}/points/count")
async def count_points(name: str, body: CountRequest, svc: Service) -> Response:
    """``{count}``: the points matching ``filter`` (all without one), counted exactly."""
    return json_response({"count": await svc.count(name, body.filter)})


# --- search -------------------------------------------------------------------------------------------------------
@router.post("/collections/{name}/search")
async def search(name: str, body: SearchRequest, svc: Service, timed: Timer, rc: Consistency) -> Response:
    """``[{id, score, text, payload}]``, best first: the top_k points (among those matching the filter), read at
    ``consistency``."""
    with timed("search", name):
        hits = (await rerank_search.search(svc, name, [body.compiled()], "query", rc))[0]
    return _read([_hit_json(h, body.with_payload, body.with_text) for h in hits], svc, rc)


@router.post("/collections/{name}/search/batch")
async def search_batch(name: str, body: SearchBatch, svc: Service, timed: Timer, rc: Consistency) -> Response:
    """One result list per search, in order, all read at ``consistency``."""
    with timed("search_batch", name):
        results = await rerank_search.search(svc, name, [s.compiled() for s in body.searches], "searches", rc)
    return _read(
        [[_hit_json(h, s.with_payload, s.with_text) for h in hits] for s, hits in zip(body.searches, results)], svc, rc
    )
