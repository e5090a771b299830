"""Search through Qdrant's API: the universal query and the legacy search, translated onto
``CollectionService.search`` (and ``scroll`` for a query without one).

Qdrant API reference (https://api.qdrant.tech/api-reference), section "Points"/"Search":

* ``POST /collections/{collection_name}/points/query`` and ``.../points/query/batch``: ``query`` is a dense vector,
  a sparse vector ``{indices, values}``, a point id (its stored vector of the ``using`` vector; the point itself is
  left out of the hits, as in Qdrant), a ``Document`` ``{text, model}`` (embedded here by the collection's model,
  for its model-bound vector; another model is 422 ``model_mismatch``), ``{"nearest": one of those}``, or an Explore
  query on a dense vector: ``{"recommend": {positive, negative, strategy}}``, ``{"discover": {target, context}}``,
  ``{"context": [pairs]}`` (:mod:`.explore`; the example points are left out of the hits); no ``query`` pages through
  the points in id order (score 1, as Qdrant scores them). ``using`` names the vector searched (default: the
  model-bound one, else the only dense one); ``filter``, ``limit`` (default 10), ``offset``, ``score_threshold``,
  ``with_payload`` (default false), ``with_vector``. ``prefetch`` with a fusion (``{"fusion": "rrf" | "dbsf"}``,
  ``{"rrf": {k, weights}}``) or a re-scoring query: :mod:`.prefetch`. ``lookup_from: {collection, vector}`` reads
  the point ids of a query (and of its examples) from that collection's vector (default: ``using``; they are then
  not left out of the hits). ``{"order_by": ...}`` and ``{"sample": "random"}``: :mod:`.ordered`. ``{"formula":
  ..., "defaults": ...}`` (score boosting; needs prefetches): :mod:`.prefetch`. ``{"relevance_feedback": ...}``:
  :mod:`.explore`. ``{"nearest": ..., "mmr": {diversity, candidates_limit}}`` (not in a prefetch):
  :mod:`service.collections.mmr`.
* ``POST .../points/search`` and ``.../points/search/batch`` (legacy): ``vector`` (floats, ``{name, vector}`` or a
  ``NamedSparseVector``), with the same options; ``limit`` required.

``params``: :mod:`.search_params` (``exact: true`` scores every stored vector; ``quantization`` says how a
quantized index is searched; the rest is accepted with no effect). ``offset + limit`` is at most ``collections_max_top_k``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import TypeAdapter, ValidationError

from service.collections import mmr, recommend
from service.collections.errors import RETRIES, InvalidCollectionRequest, ModelChanged, PointNotFound
from service.collections.query_model import QueryNode, SearchQuery
from service.collections.service import CollectionService
from service.collections.vector_backend import ResponseBudget
from service.http.kit import JSONRoute
from service.http.qdrant import explore, ordered, prefetch, search_params
from service.http.qdrant.envelope import PREFIX, Service, ok, unsupported
from service.http.qdrant.filters import translate
from service.http.qdrant.ids import QdrantId
from service.http.qdrant.models import (
    Document,
    LookupLocation,
    NamedSparseVector,
    NamedVector,
    QueryBatch,
    QueryRequest,
    SearchBatch,
    SparseVector,
)
from service.http.qdrant.models import SearchRequest as LegacySearch
from service.http.qdrant.points import check_model, no_shard_key
from service.http.qdrant.reads import fetch, points_by_id
from service.http.qdrant.results import record, scored
from service.http.qdrant.vectors import all_vectors, shown

router = APIRouter(prefix=PREFIX, tags=["qdrant"], route_class=JSONRoute)
T = TypeVar("T")
DEFAULT_LIMIT = 10


_POINT_ID = TypeAdapter(QdrantId)


@dataclass
class Spec:
    """One search of the core (its query model's :class:`~service.collections.query_model.SearchQuery`) and how to
    show its hits: skip ``offset``, select payload and vector as Qdrant's ``with_payload``/``with_vector`` ask."""

    search: SearchQuery
    offset: int
    payload_sel: Any
    vector_sel: Any
    #: the collection's model (a copy) when its query vector was read or made here, else None
    model: dict[str, Any] | None = None
    #: a query with prefetches (run by ``CollectionService.query``), else None
    node: QueryNode | None = None
    #: the ``mmr`` object of a nearest query re-ranked for diversity (:mod:`service.collections.mmr`), else None
    mmr: Any = None


def _spec(
    query: Any,
    top_k: int,
    where: Any,
    threshold: float | None,
    offset: int,
    payload: Any,
    vector: Any,
    using: str | None = None,
    params: dict[str, Any] | None = None,
    param: str = "",
) -> Spec:
    search = SearchQuery(
        query=query,
        top_k=top_k,
        filter=where,
        score_threshold=threshold,
        with_payload=bool(payload),
        with_text=False,
        using=using,
        exact=search_params.exact(params),
        quantization=search_params.quantization(params, param),
        hnsw_ef=search_params.hnsw_ef(params, param),
    )
    return Spec(search, offset, payload, vector)


async def _query_vector(
    svc: CollectionService,
    name: str,
    q: Any,
    param: str,
    using: str | None = None,
    lookup: LookupLocation | None = None,
) -> tuple[Any, list, dict | None]:
    """The native query (text, dense vector or sparse ``{indices, values}``) of a Qdrant query on the vector
    ``using`` (None: the default one), the ids of the points it names (to leave out: those of the searched
    collection), and the collection's model when the vector was read or made here (else None): a model switch before
    the search makes such a vector stale, and :func:`_queries` runs the query again. Point ids are looked up where
    ``lookup`` (Qdrant's ``lookup_from``) says."""
    if isinstance(q, SparseVector):
        return q.model_dump(), [], None
    if isinstance(q, dict):
        if set(q) == {"recommend"}:
            return await explore.recommend(svc, name, q["recommend"], f"{param}.recommend", using, lookup)
        if set(q) == {"discover"}:
            return await explore.discover(svc, name, q["discover"], f"{param}.discover", using, lookup)
        if set(q) == {"context"}:
            return await explore.context(svc, name, q["context"], f"{param}.context", using, lookup)
        if set(q) == {"relevance_feedback"}:
            raw, at = q["relevance_feedback"], f"{param}.relevance_feedback"
            return await explore.relevance_feedback(svc, name, raw, at, using, lookup)
        if set(q) != {"nearest"}:
            raise unsupported(f"the query {sorted(q)}", param)
        q = q["nearest"]
        param = f"{param}.nearest"
        try:  # what QueryRequest's own fields do for a top-level query
            if isinstance(q, dict):  # {"nearest": Document | SparseVector}
                q = SparseVector.model_validate(q) if "indices" in q else Document.model_validate(q)
            elif isinstance(q, (int, str)):  # {"nearest": point id}: validated and canonicalised
                q = _POINT_ID.validate_python(q)
        except ValidationError as e:
            raise InvalidCollectionRequest(f"{param}: {e.errors()[0]['msg']}", param=param) from None
    if isinstance(q, Document) and q.model in svc.sparse_models:  # qdrant/bm25: the query made by that model
        if q.options:
            raise unsupported("Document.options", f"{param}.options")
        return {"text": q.text, "model": q.model}, [], None
    if isinstance(q, Document):
        return check_model(q, (await svc.collection(name)).model, name, param), [], None
    if isinstance(q, SparseVector):
        return q.model_dump(), [], None
    if isinstance(q, (int, str)):  # a point id (QdrantId canonicalised it)
        src, src_using = recommend.source(name, using, explore.lookup_of(lookup))
        c = await svc.collection(src)
        vname = recommend.vector_name(c.vectors, src_using, param)
        model = c.model and dict(c.model)  # the stored vector read below is this model's
        points = await fetch(svc, src, [q], True)
        if not points:
            raise PointNotFound(f"No point with id {q} found" + (f" in {src!r}" if lookup else ""))
        if (vec := all_vectors(points[0], c.vectors).get(vname)) is None:
            raise InvalidCollectionRequest(f"point {q} has no vector {vname!r}", param=param)
        return (vec, [], None) if lookup is not None else (vec, [q], model)
    if isinstance(q, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in q):
        return [float(x) for x in q], [], None
    if isinstance(q, list) and q and all(isinstance(r, list) for r in q):  # a multivector query (checked by the core)
        return q, [], None
    raise InvalidCollectionRequest(
        "query must be a vector, a point id, a Document, {nearest: ...} or {recommend: ...}", param=param
    )


def _top_k(svc: CollectionService, limit: int, offset: int, param: str) -> int:
    cap = svc.settings.max_top_k
    if limit + offset > cap:
        raise InvalidCollectionRequest(f"offset + limit must be at most {cap} (collections_max_top_k)", param=param)
    return limit + offset


async def plan(svc: CollectionService, name: str, r: QueryRequest, param: str) -> Spec | None:
    """The native search of one query (None: no ``query``, a scroll)."""
    no_shard_key(r)
    if r.prefetch is not None:
        offset = r.offset or 0
        top_k, models = _top_k(svc, r.limit or DEFAULT_LIMIT, offset, f"{param}limit"), []

        async def qv(q: Any, at: str, using: str | None, lookup: Any) -> tuple[Any, list, dict | None]:
            return await _query_vector(svc, name, q, at, using, lookup)

        spec = _spec(None, top_k, None, r.score_threshold, offset, r.with_payload, r.with_vector, r.using)
        spec.node = await prefetch.build(r, param, qv, top_k, bool(r.with_payload), models)
        spec.model = next((m for m in models if m is not None), None)
        return spec
    where = translate(r.filter, f"{param}filter")
    if r.query is None:
        return None
    q, diversity = r.query, None
    if isinstance(q, dict) and set(q) == {"nearest", "mmr"}:  # a nearest query re-ranked by MMR
        q, diversity = {"nearest": q["nearest"]}, q["mmr"]
    query, excluded, model = await _query_vector(svc, name, q, f"{param}query", r.using, r.lookup_from)
    limit, offset = r.limit or DEFAULT_LIMIT, r.offset or 0
    top_k = _top_k(svc, limit, offset, f"{param}limit")
    if excluded:  # alone, a search for that many more hits on either backend (embedded: search.left_out)
        nots = {"$not": {"$ids": excluded}}
        where = {"$and": [where, nots]} if where else nots
    spec = _spec(
        query, top_k, where, r.score_threshold, offset, r.with_payload, r.with_vector, r.using, r.params, param
    )
    spec.model, spec.mmr = model, diversity
    return spec


async def _run(
    svc: CollectionService, name: str, specs: list[Spec], param: str, budget: ResponseBudget | None = None
) -> list[list[dict[str, Any]]]:
    """Run the searches in one service call; hits as ``ScoredPoint``, vectors read back when asked. Every search and
    every read of the hits' vectors spends ``budget`` (the request's; None: a new one).

    Raises:
        ResponseTooLarge: the hits (with their payloads and vectors) exceed the budget; and what the searches raise.
    """
    budget = budget or svc.response_budget()
    plain = [s for s in specs if s.node is None and s.mmr is None]
    found = iter(await svc.search(name, [s.search for s in plain], param, budget=budget) if plain else [])
    results = [
        await svc.query(name, s.node, budget=budget)
        if s.node is not None
        else await mmr.search(svc.searcher, name, s.search, s.mmr, f"{param}.mmr", budget)
        if s.mmr is not None
        else next(found)
        for s in specs
    ]
    cfg = (await svc.collection(name)).vectors
    out = []
    for s, hits in zip(specs, results):
        hits = hits[s.offset :]
        points = await points_by_id(svc, name, [h.id for h in hits], s.vector_sel, budget) if s.vector_sel else {}
        out.append([scored(h, s.payload_sel, shown(points.get((type(h.id), h.id)), s.vector_sel, cfg)) for h in hits])
    return out


async def _scroll_query(
    svc: CollectionService, name: str, r: QueryRequest, budget: ResponseBudget | None = None
) -> list[dict[str, Any]]:
    limit, offset = r.limit or DEFAULT_LIMIT, r.offset or 0
    n = _top_k(svc, limit, offset, "limit")
    points, _ = await svc.scroll(
        name, None, n, translate(r.filter), r.with_vector or False, budget, False, bool(r.with_payload)
    )
    cfg = (await svc.collection(name)).vectors
    return [{**record(p, r.with_payload, r.with_vector, cfg), "version": 0, "score": 1.0} for p in points[offset:]]


async def on_current_model(
    svc: CollectionService, name: str, attempt: Callable[[], Awaitable[tuple[T, list[Spec | None]]]]
) -> T:
    """The result of ``attempt`` (it plans and runs searches: ``(result, their specs)``), run again when the
    collection switched models (a re-embedding completed) between reading or making a spec's query vector here
    (its ``model``) and the search, up to :data:`RETRIES` times.

    Raises:
        ModelChanged: it switched every time.
    """
    for _ in range(RETRIES):
        out, specs = await attempt()
        models = [s.model for s in specs if s is not None and s.model is not None]
        if not models:
            return out
        now = (await svc.collection(name)).model
        if all(m == now for m in models):
            return out
    raise ModelChanged(f"collection {name!r} changed model {RETRIES} times during the query; retry")


async def _unplanned(
    svc: CollectionService, name: str, r: QueryRequest, param: str, budget: ResponseBudget
) -> list[dict[str, Any]]:
    """The hits of a query that is no search: ``order_by`` or ``sample`` (:mod:`.ordered`), or none (a scroll)."""
    if ordered.kind(r.query) is None:
        return await _scroll_query(svc, name, r, budget)

    async def qv(q: Any, at: str, using: str | None, lookup: Any) -> tuple[Any, list, dict | None]:
        return await _query_vector(svc, name, q, at, using, lookup)

    async def build(p: Any, at: str) -> QueryNode:
        return await prefetch.build(p, at, qv, p.limit or prefetch.DEFAULT_PREFETCH_LIMIT, False, [])

    limit = r.limit or DEFAULT_LIMIT
    _top_k(svc, limit, r.offset or 0, f"{param}limit")
    return await ordered.query(svc, name, r, param, build, budget, limit)


async def _queries(svc: CollectionService, name: str, reqs: list[QueryRequest], batch: bool) -> list[list[dict]]:
    """The hits of each query (:func:`on_current_model`)."""

    async def attempt() -> tuple[list[list[dict]], list[Spec | None]]:
        params = [f"searches[{i}]." if batch else "" for i in range(len(reqs))]
        plans = [None if ordered.kind(r.query) else await plan(svc, name, r, at) for r, at in zip(reqs, params)]
        budget = svc.response_budget()  # one for the request's searches, scrolls and vectors
        found = iter(
            await _run(svc, name, [p for p in plans if p is not None], "searches" if batch else "query", budget)
        )
        return [
            next(found) if p is not None else await _unplanned(svc, name, r, at, budget)
            for p, r, at in zip(plans, reqs, params)
        ], plans

    return await on_current_model(svc, name, attempt)


@router.post("/collections/{collection_name}/points/query")
async def query_points(collection_name: str, body: QueryRequest, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/query`` -> ``{points: [ScoredPoint]}``.
    Errors: 404 collection (or the query's point), 409 (the collection's model is not loaded), 422."""
    return ok(request, {"points": (await _queries(svc, collection_name, [body], False))[0]})


@router.post("/collections/{collection_name}/points/query/batch")
async def query_batch(collection_name: str, body: QueryBatch, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/query/batch`` -> ``[{points}]``, one per
    query, in order. Errors: as for one query; 413 more than ``collections_max_batch_searches``."""
    results = await _queries(svc, collection_name, body.searches, True)
    return ok(request, [{"points": r} for r in results])


def _legacy(svc: CollectionService, r: LegacySearch, param: str) -> Spec:
    no_shard_key(r)
    named = isinstance(r.vector, (NamedVector, NamedSparseVector))
    vec = r.vector.vector if named else r.vector
    vec = vec.model_dump() if isinstance(vec, SparseVector) else vec
    offset = r.offset or 0
    top_k, where = _top_k(svc, r.limit, offset, f"{param}limit"), translate(r.filter, f"{param}filter")
    return _spec(
        vec,
        top_k,
        where,
        r.score_threshold,
        offset,
        r.with_payload,
        r.with_vector,
        r.vector.name if named else None,
        r.params,
        param,
    )


@router.post("/collections/{collection_name}/points/search")
async def search_points(collection_name: str, body: LegacySearch, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/search`` (legacy) -> ``[ScoredPoint]``.
    Errors: 404, 422 (a vector of the wrong dimension: ``wrong_dimension``)."""
    return ok(request, (await _run(svc, collection_name, [_legacy(svc, body, "")], "query"))[0])


@router.post("/collections/{collection_name}/points/search/batch")
async def search_batch(collection_name: str, body: SearchBatch, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/search/batch`` (legacy) ->
    ``[[ScoredPoint]]``, one list per search. Errors: as for one search; 413 too many searches."""
    specs = [_legacy(svc, r, f"searches[{i}].") for i, r in enumerate(body.searches)]
    return ok(request, await _run(svc, collection_name, specs, "searches"))
