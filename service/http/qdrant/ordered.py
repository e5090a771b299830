"""Qdrant's ordered and sampled reads (Qdrant API reference: "Scroll points" with ``order_by``; "Query points" with
``{"order_by": key | {key, direction, start_from}}`` or ``{"sample": "random"}``), translated onto the core's
:mod:`service.collections.ordering`.

* A scroll with ``order_by`` returns the first ``limit`` entries, each a ``Record`` with its ``order_value``, and no
  ``next_page_offset`` (Qdrant pages an ordered scroll by ``start_from``; ``offset`` with ``order_by`` is 422).
* A query ``order_by`` does the same over the points matching ``filter`` (with ``prefetch``: over the points its
  prefetches found), skipping ``offset`` entries; each hit scores 1 (as qdrant-client's local mode scores them) and
  carries its ``order_value``.
* A query ``sample: random`` returns ``limit`` points drawn uniformly (``offset`` does not change how many, as in
  Qdrant), score 1.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from service.collections.errors import InvalidCollectionRequest
from service.collections.ordering import OrderBy, ordered_ids, parse_order_by, sample_ids
from service.collections.query_model import QueryNode
from service.collections.service import CollectionService
from service.collections.vector_backend import ResponseBudget
from service.http.qdrant.filters import translate
from service.http.qdrant.reads import fetch
from service.http.qdrant.results import record

#: ``(prefetch, param) -> the prefetch's query tree`` (the caller's: it knows how to make query vectors)
BuildPrefetch = Callable[[Any, str], Awaitable[QueryNode]]


def kind(query: Any) -> str | None:
    """``"order_by"`` or ``"sample"`` for those queries, else None."""
    if isinstance(query, dict) and len(query) == 1 and next(iter(query)) in ("order_by", "sample"):
        return next(iter(query))
    return None


async def records(
    svc: CollectionService,
    name: str,
    ob: OrderBy,
    limit: int,
    where: Any,
    with_payload: Any,
    with_vector: Any,
    budget: ResponseBudget | None,
    skip: int = 0,
) -> list[dict[str, Any]]:
    """The first ``limit`` entries in ``ob``'s order of the points matching ``where`` (native), after ``skip``, as
    ``Record`` s with ``order_value`` (a point once per distinct value it holds)."""
    entries = (await ordered_ids(svc, name, ob, skip + limit, where))[skip:]
    points = await fetch(svc, name, [i for i, _ in entries], with_vector or False, None, budget, bool(with_payload))
    by_id = {(type(p["id"]), p["id"]): p for p in points}
    cfg = (await svc.collection(name)).vectors
    return [
        {**record(by_id[(type(i), i)], with_payload, with_vector, cfg), "order_value": v}
        for i, v in entries
        if (type(i), i) in by_id
    ]


async def query(
    svc: CollectionService,
    name: str,
    r: Any,
    param: str,
    build: BuildPrefetch,
    budget: ResponseBudget | None,
    limit: int,
) -> list[dict[str, Any]]:
    """The hits of a query ``r`` whose ``query`` is an ``order_by`` or ``sample`` (module docstring).

    Raises:
        InvalidCollectionRequest: a bad order_by or sample; and what the prefetches' searches raise.
    """
    where = translate(r.filter, f"{param}filter")
    given = r.prefetch if isinstance(r.prefetch, list) else [r.prefetch] if r.prefetch is not None else []
    if given:  # over the points the prefetches found (each prefetch its own search, as in Qdrant)
        ids: dict[Any, None] = {}
        for i, p in enumerate(given):
            node = await build(p, f"{param}prefetch[{i}].")
            if where:  # the query's filter holds in its prefetches (and below them), as in Qdrant
                f = node.search.filter
                node.search = replace(node.search, filter={"$and": [f, where]} if f else where)
            ids.update((h.id, None) for h in await svc.query(name, node, budget=budget))
        if not ids:
            return []
        within = {"$ids": list(ids)}
        where = {"$and": [where, within]} if where else within
    offset, what = r.offset or 0, kind(r.query)
    if what == "order_by":
        ob = parse_order_by(r.query["order_by"], f"{param}query.order_by")
        found = await records(svc, name, ob, limit, where, r.with_payload, r.with_vector, budget, offset)
        return [{**p, "version": 0, "score": 1.0} for p in found]
    if r.query["sample"] != "random":
        raise InvalidCollectionRequest(f"{param}query.sample must be 'random'", f"{param}query.sample")
    ids = await sample_ids(svc, name, limit, where)
    points = await fetch(svc, name, ids, r.with_vector or False, None, budget, bool(r.with_payload))
    cfg = (await svc.collection(name)).vectors
    return [{**record(p, r.with_payload, r.with_vector, cfg), "version": 0, "score": 1.0} for p in points]
