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

The request bodies are :mod:`.models`'s. ``query`` is a text (embedded with the collection's model) or a vector of
the collection's dimension. Every read (the GETs and both searches) takes ``?consistency=strong|bounded|eventual``
and ``?after_sequence=`` (a write's ``sequence``), answering the consistency it got in ``X-Read-Consistency``
(:class:`~.backend.ReadConsistency`). Errors: 404 ``collection_not_found`` / ``point_not_found``,
409 ``collection_exists`` / ``model_unavailable``, 413 ``too_many_points``, 422
``invalid_value`` / ``invalid_filter`` / ``wrong_dimension``.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Response
from starlette.convertors import PathConvertor, register_url_convertor

from service.collections import rerank_search
from service.collections.errors import InvalidCollectionRequest
from service.collections.reads import Hit, ReadConsistency
from service.collections.service import CollectionService
from service.http.deps import WRITES, Consistency, Service, Timer
from service.http.kit import JSONRoute, json_response
from service.http.native.models import (
    CountRequest,
    CreateCollection,
    DeletePoints,
    ScrollRequest,
    SearchBatch,
    SearchRequest,
    SparseIn,
    UpsertPoints,
)

router = APIRouter(tags=["collections"], route_class=JSONRoute)


class _AnyPath(PathConvertor):
    """Starlette's ``path`` convertor, newlines included (its ``.*`` stops at one): every string id that an upsert
    accepted is addressable in a URL (``/points/a%0Ab``)."""

    regex = r"[\s\S]*"


register_url_convertor("anypath", _AnyPath())


def _read(body: Any, svc: CollectionService, rc: ReadConsistency) -> Response:
    """A read's JSON answer, with the consistency it got in ``X-Read-Consistency``."""
    r = json_response(body)
    r.headers["X-Read-Consistency"] = svc.backend.applied(rc)
    return r


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
        hits = (await rerank_search.search(svc.searcher, name, [body.compiled()], "query", rc))[0]
    return _read([_hit_json(h, body.with_payload, body.with_text) for h in hits], svc, rc)


@router.post("/collections/{name}/search/batch")
async def search_batch(name: str, body: SearchBatch, svc: Service, timed: Timer, rc: Consistency) -> Response:
    """One result list per search, in order, all read at ``consistency``."""
    with timed("search_batch", name):
        results = await rerank_search.search(svc.searcher, name, [s.compiled() for s in body.searches], "searches", rc)
    return _read(
        [[_hit_json(h, s.with_payload, s.with_text) for h in hits] for s, hits in zip(body.searches, results)], svc, rc
    )
