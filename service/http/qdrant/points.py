"""Points through Qdrant's API, translated onto ``CollectionService`` (its upsert, delete, scroll and count).

Qdrant API reference (https://api.qdrant.tech/api-reference), section "Points":

* ``PUT /collections/{collection_name}/points``: upsert a ``PointsList`` or ``PointsBatch``; a point's ``vector``
  holds its named vectors (:func:`.vectors.point_parts`). The model-bound vector given as a ``Document`` ``{text,
  model}`` is embedded here by the collection's model (``model`` must name it: its name or ``name:version``; another
  is 422 ``model_mismatch``) and its text kept, so it follows a model switch; given as floats it is stored as given,
  without text: the client vouches that the collection's model made it (e.g. through ``/v1/embeddings``); such a
  point cannot be re-embedded (a model switch then fails, naming the cause). A point of a collection with a
  model-bound vector must carry it. Client-supplied dense vectors are floats, sparse ones ``{indices, values}``;
  a point may lack any of them.
* ``PUT .../points/vectors`` (update some vectors of points, keeping the others) and ``POST
  .../points/vectors/delete`` (remove named vectors; not the model-bound one), as read-modify-writes;
* ``POST /collections/{collection_name}/points`` (retrieve by ids), ``GET .../points/{id}``;
* ``POST .../points/delete`` (``points`` ids or ``filter``);
* ``POST .../points/payload`` (merge into the payload), ``PUT .../points/payload`` (replace it),
  ``POST .../points/payload/delete`` (remove keys; a dotted key removes a key of a nested object, array paths
  ``a[]`` are refused) and ``POST .../points/payload/clear`` (empty it), by ids or filter: the points are read and
  written back with their vectors and texts (not atomic with concurrent writes to the same points);
* ``POST .../points/scroll``: pages in the order of the stored ids (their JSON text, byte order: UUIDs, as strings,
  before integers; integers in decimal-text order, ``10`` before ``9``), ``offset`` the first id of a page;
* ``POST .../points/count`` (always exact).

Writes answer once durable and searchable (``wait`` is always true). ``shard_key`` must be absent.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from service.collections.conditions import parse_path, payload_names
from service.collections.errors import InvalidCollectionRequest, PointNotFound
from service.collections.service import CollectionService
from service.http.kit import JSONRoute
from service.http.qdrant import ordered
from service.http.qdrant.envelope import PREFIX, WRITES, Service, ok, unsupported, update_result
from service.http.qdrant.filters import ALWAYS, translate
from service.http.qdrant.ids import path_id
from service.http.qdrant.models import (
    CountRequest,
    DeletePayload,
    DeletePoints,
    DeleteVectors,
    Document,
    PointRequest,
    ScrollRequest,
    SetPayload,
    UpdateVectors,
    UpsertPoints,
)
from service.http.qdrant.ordered import parse_order_by
from service.http.qdrant.reads import fetch
from service.http.qdrant.results import record
from service.http.qdrant.vectors import point_parts

router = APIRouter(prefix=PREFIX, tags=["qdrant"], route_class=JSONRoute)
DEFAULT_SCROLL_LIMIT = 10


def check_model(doc: Document, model: dict[str, Any], collection: str, param: str) -> str:
    """The text of a ``Document`` whose ``model`` names the collection's model (its name, or ``name:version``).

    Raises:
        InvalidCollectionRequest: ``model_mismatch``, naming both models.
    """
    if doc.options:
        raise unsupported("Document.options", f"{param}.options")
    if doc.model not in (model["name"], f"{model['name']}:{model['version']}"):
        raise InvalidCollectionRequest(
            f"{param}.model is {doc.model!r}, but collection {collection!r} is embedded by "
            f"{model['name']}:{model['version']}: name that model (documents are embedded by the collection's model)",
            param=f"{param}.model",
            code="model_mismatch",
        )
    return doc.text


def exactly_one(body: Any, a: str, b: str) -> None:
    """Raises the 422 unless exactly one of the fields ``a`` and ``b`` of ``body`` is given."""
    if (getattr(body, a) is None) == (getattr(body, b) is None):
        raise InvalidCollectionRequest(f"give exactly one of {a!r} and {b!r}", param=a)


def no_shard_key(body: Any) -> None:
    """Raises the 422 for a ``shard_key`` (a Qdrant cluster's custom sharding)."""
    if getattr(body, "shard_key", None) is not None:
        raise unsupported("shard_key", "shard_key")


def _keys(points: list[dict[str, Any]]) -> set[tuple[type, Any]]:
    return {(type(p["id"]), p["id"]) for p in points}


async def _conditional(svc: CollectionService, name: str, rows: list[tuple], mode: str | None, raw: Any) -> list[tuple]:
    """The rows an upsert writes under Qdrant's ``update_mode`` (``insert_only``: points not stored yet;
    ``update_only``: stored ones) and ``update_filter`` (a stored point is replaced only when it matches; new points
    are written). Read just before the write, not under its lock: a concurrent write to the same point in between
    is not seen."""
    where = translate(raw, "update_filter")
    if mode in (None, "upsert") and where is None:
        return rows
    ids = [r[0] for r in rows]
    stored = _keys(await fetch(svc, name, ids, False))
    passing = stored if where is None else _keys(await fetch(svc, name, ids, False, where))

    def kept(pid: Any) -> bool:
        k = (type(pid), pid)
        return (k in passing and mode != "insert_only") if k in stored else mode != "update_only"

    return [r for r in rows if kept(r[0])]


async def upsert(svc: CollectionService, collection_name: str, body: UpsertPoints) -> int:
    """Upsert a ``PointsList`` or ``PointsBatch`` (under ``update_mode``/``update_filter``: :func:`_conditional`);
    returns the write's sequence (0 when nothing was written). Errors: as the route's."""
    no_shard_key(body)
    exactly_one(body, "points", "batch")
    if body.points is not None:
        rows = [(p.id, p.vector, p.payload) for p in body.points]
    else:
        b = body.batch
        by_name = b.vectors if isinstance(b.vectors, dict) else {"": b.vectors}
        if any(len(v) != len(b.ids) for v in by_name.values()) or (b.payloads and len(b.payloads) != len(b.ids)):
            raise InvalidCollectionRequest("batch: one vector of each name (and one payload) per id", "batch")
        per_point = [{n: vs[i] for n, vs in by_name.items()} for i in range(len(b.ids))]
        if not isinstance(b.vectors, dict):
            per_point = [p[""] for p in per_point]
        rows = [(pid, v, b.payloads[i] if b.payloads else None) for i, (pid, v) in enumerate(zip(b.ids, per_point))]
    c = await svc.collection(collection_name)
    if not (rows := await _conditional(svc, collection_name, rows, body.update_mode, body.update_filter)):
        return 0
    texts: list[str] = []
    vectors: list[list[float] | None] = []
    named: list[dict[str, Any]] = []
    field = "points[{}].vector" if body.points is not None else "batch.vectors[{}]"  # the request's own field
    cfg, model = c.vectors, c.model  # once, not per point
    for i, (_, v, _) in enumerate(rows):
        text, vec, other = point_parts(v, cfg, model, check_model, collection_name, field.format(i))
        texts.append(text)
        vectors.append(vec)
        named.append(other)
    _, seq = await svc.upsert(collection_name, [r[0] for r in rows], texts, [r[2] for r in rows], vectors, named=named)
    return seq


@router.put("/collections/{collection_name}/points", dependencies=WRITES)
async def upsert_points(collection_name: str, body: UpsertPoints, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``PUT /collections/{collection_name}/points`` -> ``UpdateResult``. Errors: 404, 409
    (the collection's model is not loaded), 413 too many points, 422 (module docstring)."""
    return ok(request, update_result(await upsert(svc, collection_name, body)))


@router.post("/collections/{collection_name}/points")
async def retrieve_points(collection_name: str, body: PointRequest, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points`` -> ``[Record]`` (the ids found, in the
    order asked). Errors: 404 collection."""
    no_shard_key(body)
    points = await fetch(
        svc, collection_name, body.ids, body.with_vector, None, svc.response_budget(), bool(body.with_payload)
    )
    cfg = (await svc.collection(collection_name)).vectors
    return ok(request, [record(p, body.with_payload, body.with_vector, cfg) for p in points])


@router.get("/collections/{collection_name}/points/{point_id}")
async def get_point(collection_name: str, point_id: str, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``GET /collections/{collection_name}/points/{id}`` -> ``Record`` with payload and
    vector. Errors: 404 collection or point, 422 an id that is neither an unsigned integer nor a UUID."""
    try:
        pid = path_id(point_id)
    except ValueError as e:
        raise InvalidCollectionRequest(str(e), param="id") from e
    points = await fetch(svc, collection_name, [pid], True)
    if not points:
        raise PointNotFound(f"No point with id {pid} found")
    return ok(request, record(points[0], True, True, (await svc.collection(collection_name)).vectors))


def _selected(body: Any) -> tuple[list[int | str] | None, Any]:
    """``(ids, None)`` or ``(None, native filter)`` of a body selecting points by ``points`` or ``filter``."""
    no_shard_key(body)
    exactly_one(body, "points", "filter")
    return (body.points, None) if body.points is not None else (None, translate(body.filter) or ALWAYS)


async def delete(svc: CollectionService, name: str, body: DeletePoints) -> int:
    """Delete the selected points; returns the write's sequence."""
    return (await svc.delete_points(name, *_selected(body)))[1]


async def set_payload(svc: CollectionService, name: str, body: SetPayload, merge: bool = True) -> int:
    """Merge ``body.payload`` into (``merge``; at the path ``body.key`` when given) or put it in place of the selected
    points' payloads."""
    ids, where = _selected(body)
    return await svc.set_payload(name, ids, where, body.payload, merge, body.key)


async def overwrite_payload(svc: CollectionService, name: str, body: SetPayload) -> int:
    """Put ``body.payload`` in place of the selected points' payloads."""
    return await set_payload(svc, name, body, merge=False)


async def delete_payload(svc: CollectionService, name: str, body: DeletePayload) -> int:
    """Remove ``body.keys`` from the selected points' payloads (422: an array path, an empty key part)."""
    for i, key in enumerate(body.keys):
        path, names = parse_path(key), payload_names(key)
        if names is None or (path is None and "[" in key):
            raise unsupported("an array path in a payload key", f"keys[{i}]")
        if path is None and not all(names):  # a quoted "" is the empty key; a..b has an empty part
            raise InvalidCollectionRequest(f"keys[{i}] {key!r} has an empty part", param=f"keys[{i}]")
    ids, where = _selected(body)
    return await svc.delete_payload(name, ids, where, body.keys)


async def clear_payload(svc: CollectionService, name: str, body: DeletePoints) -> int:
    """Empty the selected points' payloads."""
    ids, where = _selected(body)
    return await svc.set_payload(name, ids, where, {}, merge=False)


@router.post("/collections/{collection_name}/points/delete", dependencies=WRITES)
async def delete_points(collection_name: str, body: DeletePoints, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/delete`` (``points`` or ``filter``) ->
    ``UpdateResult``. Errors: 404, 422."""
    return ok(request, update_result(await delete(svc, collection_name, body)))


@router.post("/collections/{collection_name}/points/payload", dependencies=WRITES)
async def set_payload_route(collection_name: str, body: SetPayload, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/payload`` (set: merge the given keys into
    each point's payload) -> ``UpdateResult``. Errors: 404, 409 (during a re-embedding, a point without text), 422."""
    return ok(request, update_result(await set_payload(svc, collection_name, body)))


@router.put("/collections/{collection_name}/points/payload", dependencies=WRITES)
async def overwrite_payload_route(collection_name: str, body: SetPayload, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``PUT /collections/{collection_name}/points/payload`` (overwrite: replace each point's
    payload) -> ``UpdateResult``. Errors: as for set."""
    return ok(request, update_result(await overwrite_payload(svc, collection_name, body)))


@router.post("/collections/{collection_name}/points/payload/delete", dependencies=WRITES)
async def delete_payload_route(collection_name: str, body: DeletePayload, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/payload/delete`` (remove ``keys`` from each
    point's payload) -> ``UpdateResult``. Errors: 404, 409 (as for set), 422 (an array path, an empty key part)."""
    return ok(request, update_result(await delete_payload(svc, collection_name, body)))


@router.post("/collections/{collection_name}/points/payload/clear", dependencies=WRITES)
async def clear_payload_route(collection_name: str, body: DeletePoints, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/payload/clear`` (a ``PointsSelector``:
    empty each point's payload) -> ``UpdateResult``. Errors: as for overwrite."""
    return ok(request, update_result(await clear_payload(svc, collection_name, body)))


async def update_vectors(svc: CollectionService, name: str, body: UpdateVectors) -> int:
    """Set the given vectors of each listed point, keeping its others; every point must exist (404 otherwise); with
    ``update_filter``, only the points matching it are changed (read just before the write, as for an upsert)."""
    no_shard_key(body)
    where = translate(body.update_filter, "update_filter")
    c = await svc.collection(name)
    updates = {}
    for i, p in enumerate(body.points):
        text, vec, named = point_parts(p.vector, c.vectors, c.model, check_model, name, f"points[{i}].vector")
        updates[p.id] = (text or None, vec, named)
    found = {p["id"] for p in await fetch(svc, name, list(updates), False)}
    if missing := [i for i in updates if i not in found]:
        raise PointNotFound(f"No point with id {missing[0]} found")
    if where is not None:
        passing = {p["id"] for p in await fetch(svc, name, list(updates), False, where)}
        if not (updates := {k: v for k, v in updates.items() if k in passing}):
            return 0
    return await svc.update_vectors(name, updates)


async def delete_vectors(svc: CollectionService, name: str, body: DeleteVectors) -> int:
    """Remove the named vectors ``body.vector`` from the selected points."""
    return await svc.delete_vectors(name, *_selected(body), body.vector)


@router.put("/collections/{collection_name}/points/vectors", dependencies=WRITES)
async def update_vectors_route(collection_name: str, body: UpdateVectors, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``PUT /collections/{collection_name}/points/vectors`` (update vectors: the given ones
    replace the point's, the others stay) -> ``UpdateResult``. Errors: 404 collection or point, 422."""
    return ok(request, update_result(await update_vectors(svc, collection_name, body)))


@router.post("/collections/{collection_name}/points/vectors/delete", dependencies=WRITES)
async def delete_vectors_route(collection_name: str, body: DeleteVectors, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/vectors/delete`` (``points`` or
    ``filter``, and the ``vector`` names) -> ``UpdateResult``. Errors: 404, 422 (an unknown or model-bound vector)."""
    return ok(request, update_result(await delete_vectors(svc, collection_name, body)))


@router.post("/collections/{collection_name}/points/scroll")
async def scroll_points(collection_name: str, body: ScrollRequest, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/scroll`` -> ``{points: [Record],
    next_page_offset}`` (module docstring: the order; with ``order_by``: :mod:`.ordered`); any ``limit``, read in pages
    of ``collections_max_top_k`` and bounded by the response budget (413 ``response_too_large``). Errors: 404, 422."""
    no_shard_key(body)
    limit = body.limit or DEFAULT_SCROLL_LIMIT
    if body.order_by is not None:
        if body.offset is not None:
            raise InvalidCollectionRequest("offset is not supported with order_by (use order_by.start_from)", "offset")
        ob = parse_order_by(body.order_by)
        found = await ordered.records(
            svc,
            collection_name,
            ob,
            limit,
            translate(body.filter),
            body.with_payload,
            body.with_vector,
            svc.response_budget(),
        )
        return ok(request, {"points": found, "next_page_offset": None})
    budget, where, points, nxt = svc.response_budget(), translate(body.filter), [], body.offset
    while True:  # pages of the core's at most collections_max_top_k; Qdrant caps a scroll by the response only
        page, nxt = await svc.scroll(
            collection_name,
            nxt,
            min(limit - len(points), svc.settings.max_top_k),
            where,
            body.with_vector,
            budget,
            False,
            bool(body.with_payload),
        )
        points += page
        if nxt is None or len(points) >= limit:
            break
    cfg = (await svc.collection(collection_name)).vectors
    return ok(
        request,
        {"points": [record(p, body.with_payload, body.with_vector, cfg) for p in points], "next_page_offset": nxt},
    )


@router.post("/collections/{collection_name}/points/count")
async def count_points(collection_name: str, body: CountRequest, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/count`` -> ``{count}`` (exact).
    Errors: 404, 422."""
    no_shard_key(body)
    return ok(request, {"count": await svc.count(collection_name, translate(body.filter))})
