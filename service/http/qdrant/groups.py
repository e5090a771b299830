"""Grouped search through Qdrant's API: the universal query's hits grouped by a payload value.

Qdrant API reference (https://api.qdrant.tech/api-reference), "Search": ``POST /collections/{collection_name}/points/
query/groups`` (``QueryGroupsRequest``) -> ``{groups: [{id, hits, lookup}]}``: the best ``limit`` groups (default
10), each of at most ``group_size`` hits (default 3), groups ordered by their best hit; ``id`` is the value at the
payload key ``group_by`` (dotted keys reach into objects). As in Qdrant, only string and integer values group a point;
an array groups it under each of its string or integer elements; a point without such a value is left out.

The query is one of the universal query's (:mod:`.query`: vector, point id, ``Document``, ``nearest``,
``recommend``, with ``prefetch``: fusion or re-scoring, every prefetch's limit raised to ``collections_max_top_k``),
with its ``filter``, ``score_threshold``, ``with_payload`` and ``with_vector``. The groups are formed
from the best hits of the native search, asked again with four times as many hits until ``limit`` groups are full or
the hits run out, and at most ``collections_max_top_k`` hits: past that, groups may be fewer or smaller than a full
scan would make. ``with_lookup`` attaches to each group the point of another collection whose id is the group's
value (:func:`_lookups`). Refused with 422: a query without ``query``, ``limit * group_size`` over
``collections_max_top_k``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Request, Response

from service.collections.errors import InvalidCollectionRequest
from service.collections.query_model import QueryNode
from service.collections.service import CollectionService
from service.http.kit import JSONRoute
from service.http.qdrant.envelope import PREFIX, Service, ok, unsupported
from service.http.qdrant.ids import canonical_id
from service.http.qdrant.models import QueryGroupsRequest
from service.http.qdrant.query import DEFAULT_LIMIT, Spec, on_current_model, plan
from service.http.qdrant.reads import fetch, points_by_id
from service.http.qdrant.results import record, scored, values_at
from service.http.qdrant.vectors import shown

router = APIRouter(prefix=PREFIX, tags=["qdrant"], route_class=JSONRoute)
DEFAULT_GROUP_SIZE = 3
GROWTH = 4  # each new search asks for this many times the hits of the one before


def group(hits: list[Any], key: str, limit: int, size: int) -> dict[int | str, list[Any]]:
    """The first ``limit`` groups of ``hits`` (best first) by their string and integer values at ``key``
    (:func:`~.results.values_at`), each of its first ``size``."""
    groups: dict[int | str, list[Any]] = {}
    for h in hits:
        for v in (v for rank, v in values_at(h.payload, key) if rank):
            if v in groups:
                if len(groups[v]) < size:
                    groups[v].append(h)
            elif len(groups) < limit:
                groups[v] = [h]
    return groups


def _widened(node: QueryNode, top_k: int, cap: int) -> QueryNode:
    """``node`` asking for ``top_k`` hits with their payloads, every prefetch below it for ``cap`` (as Qdrant and
    qdrant-client's local mode raise a grouped query's prefetch limits: the groups come from the fused or re-scored
    hits of everything the prefetches can find)."""
    kids = [_widened(p, cap, cap) for p in node.prefetch]
    return replace(node, search=replace(node.search, top_k=top_k, with_payload=True), prefetch=kids)


async def _grouped(svc: CollectionService, name: str, spec: Spec, key: str, limit: int, size: int) -> dict:
    cap = svc.settings.max_top_k
    top_k = min(cap, 2 * limit * size)
    while True:
        if spec.node is not None:  # a query with prefetches
            hits = await svc.query(name, _widened(spec.node, top_k, cap))
        else:
            search = replace(spec.search, top_k=top_k, with_payload=True)
            hits = (await svc.search(name, [search], "query"))[0]
        groups = group(hits, key, limit, size)
        full = len(groups) == limit and all(len(g) == size for g in groups.values())
        if full or len(hits) < top_k or top_k == cap:
            return groups
        top_k = min(cap, top_k * GROWTH)


@router.post("/collections/{collection_name}/points/query/groups")
async def query_groups(collection_name: str, body: QueryGroupsRequest, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/query/groups`` -> ``{groups}`` (module
    docstring). Errors: as for a universal query; 422 as the module docstring says."""
    if body.offset is not None:
        raise InvalidCollectionRequest("offset is not a field of a groups query", "offset")
    if body.query is None:
        raise unsupported("a groups query without a query", "query")
    limit, size = body.limit or DEFAULT_LIMIT, body.group_size or DEFAULT_GROUP_SIZE
    if limit * size > svc.settings.max_top_k:
        raise InvalidCollectionRequest(
            f"limit * group_size must be at most {svc.settings.max_top_k} (collections_max_top_k)", "group_size"
        )

    async def attempt() -> tuple[dict, list[Spec | None]]:
        spec = await plan(svc, collection_name, body.model_copy(update={"limit": limit * size}), "")
        assert spec is not None  # a query is given
        return await _grouped(svc, collection_name, spec, body.group_by, limit, size), [spec]

    groups = await on_current_model(svc, collection_name, attempt)
    budget = svc.response_budget()  # the response's hits (each search had its own), then their vectors
    hits = [h for g in groups.values() for h in g]
    budget.spend_hits(hits if body.with_payload else [replace(h, payload=None) for h in hits])
    ids = [h.id for h in hits]
    points = await points_by_id(svc, collection_name, ids, body.with_vector, budget) if body.with_vector else {}
    cfg = (await svc.collection(collection_name)).vectors
    lookups = await _lookups(svc, body.with_lookup, list(groups)) if body.with_lookup is not None else {}
    return ok(
        request,
        {
            "groups": [
                {
                    "id": v,
                    "hits": [
                        scored(h, body.with_payload, shown(points.get((type(h.id), h.id)), body.with_vector, cfg))
                        for h in hits
                    ],
                    "lookup": lookups.get((type(v), v)),
                }
                for v, hits in groups.items()
            ]
        },
    )


async def _lookups(svc: CollectionService, raw: Any, values: list[Any]) -> dict[tuple[type, Any], Any]:
    """Qdrant's ``with_lookup`` (a collection name, or ``{collection, with_payload, with_vectors}``): for each group
    value that is a point id (an unsigned integer or a UUID), the ``Record`` of that point in the lookup collection
    (payload by default, no vectors), keyed by ``(type(value), value)``; values naming no point have none.

    Raises:
        InvalidCollectionRequest: a malformed ``with_lookup``. CollectionNotFound: no such lookup collection.
    """
    wl = {"collection": raw} if isinstance(raw, str) else raw
    if (
        not isinstance(wl, dict)
        or not isinstance(wl.get("collection"), str)
        or set(wl) - {"collection", "with_payload", "with_vectors"}
    ):
        raise InvalidCollectionRequest(
            "with_lookup must be a collection name or {collection, with_payload, with_vectors}", "with_lookup"
        )
    payload = True if wl.get("with_payload") is None else wl["with_payload"]
    vectors = wl.get("with_vectors") or False
    ids: dict[Any, Any] = {}
    for v in values:
        try:
            ids[(type(v), v)] = canonical_id(v) if isinstance(v, str) else v
        except ValueError:
            continue  # not a point id: no lookup
    ids = {k: i for k, i in ids.items() if isinstance(i, str) or (isinstance(i, int) and i >= 0)}
    found = {(type(p["id"]), p["id"]): p for p in await fetch(svc, wl["collection"], list(ids.values()), vectors)}
    cfg = (await svc.collection(wl["collection"])).vectors
    return {k: record(found[(type(i), i)], payload, vectors, cfg) for k, i in ids.items() if (type(i), i) in found}
