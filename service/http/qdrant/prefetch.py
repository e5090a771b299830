"""Qdrant's ``prefetch`` and fusion queries (Qdrant API reference, "Query points"; Qdrant documentation, "Hybrid
Queries"), translated onto the collections core's query tree (:class:`~service.collections.searching.QueryNode`):

* a ``prefetch`` (one or a list, nested) is a sub-query with its own ``query``, ``using``, ``filter``, ``params``,
  ``score_threshold`` and ``limit`` (default 10); filters propagate down (a prefetch sees its own and every
  enclosing filter);
* the enclosing ``query`` then either fuses the prefetches' hits, ``{"fusion": "rrf" | "dbsf"}`` or ``{"rrf": {k,
  weights}}`` (:mod:`service.collections.fusion`), or re-scores them with a vector, ``Document``, sparse vector or
  point id on its own ``using`` vector;
* ``{"formula": Expression, "defaults": {...}}`` (Qdrant documentation, "Hybrid and Multi-Stage Queries": "Score
  boosting") re-scores every point of the prefetches with the expression (:mod:`service.collections.formula`;
  its conditions translated by :func:`.filters.translate`);
* a query (or prefetch) without ``query`` pages through its points in id order, each scoring 1 (with prefetches:
  the points they found), as Qdrant does;
* ``lookup_from`` reads the point ids of its query from another collection (:func:`..query._query_vector`);
* refused with 422: a fusion or formula without prefetches, the other query kinds.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from service.collections.errors import InvalidCollectionRequest
from service.collections.formula import FormulaSpec, map_conditions
from service.collections.fusion import FUSIONS
from service.collections.query_model import QueryNode, SearchQuery
from service.http.qdrant import search_params
from service.http.qdrant.filters import translate
from service.http.qdrant.models import Prefetch

QueryVector = Callable[[Any, str, str | None, Any], Awaitable[tuple[Any, list, dict | None]]]
DEFAULT_PREFETCH_LIMIT = 10


def _fusion(q: Any, param: str) -> tuple[str, int | None, list[float] | None] | None:
    """``(method, k, weights)`` of a fusion query, None for any other query."""
    if not isinstance(q, dict):
        return None
    if set(q) == {"fusion"}:
        if q["fusion"] not in FUSIONS:
            raise InvalidCollectionRequest(f"{param}.fusion must be one of {list(FUSIONS)}", f"{param}.fusion")
        return q["fusion"], None, None
    if set(q) == {"rrf"}:
        rrf = q["rrf"] or {}
        k, weights = rrf.get("k"), rrf.get("weights")
        if set(rrf) - {"k", "weights"} or (k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1)):
            raise InvalidCollectionRequest(f"{param}.rrf is {{k: integer >= 1, weights: [number]}}", f"{param}.rrf")
        if weights is not None and not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights):
            raise InvalidCollectionRequest(f"{param}.rrf.weights must be numbers", f"{param}.rrf.weights")
        return "rrf", k, weights
    return None


def _formula(q: Any, param: str) -> FormulaSpec | None:
    """The core's formula (:mod:`service.collections.formula`) of a ``{"formula": Expression, "defaults": {...}}``
    query (Qdrant API reference, "Query points": ``FormulaQuery``), its conditions translated into the core's filter
    grammar (:func:`.filters.translate`); None for any other query."""
    if not isinstance(q, dict) or "formula" not in q:
        return None
    if not set(q) <= {"formula", "defaults"}:
        raise InvalidCollectionRequest(f"{param}: a formula query is {{formula, defaults}}", param)

    def condition(c: dict[str, Any], at: str) -> Any:
        where = translate({"must": [c]}, at)
        return 1.0 if where is None else {"filter": where}  # a condition every point matches scores 1

    return FormulaSpec(map_conditions(q["formula"], condition, f"{param}.formula"), q.get("defaults") or {}, param)


async def build(
    r: Any, param: str, query_vector: QueryVector, limit: int, with_payload: bool, models: list[dict | None]
) -> QueryNode:
    """The query tree of a ``QueryRequest`` or ``Prefetch`` ``r`` (its prefetches below it); ``query_vector(query,
    param, using, lookup_from)`` makes a native query of a Qdrant one (``(query, excluded ids, model)``); the models it read or
    embedded with are appended to ``models`` (the caller retries when the collection switched meanwhile).

    Raises:
        InvalidCollectionRequest: see the module docstring.
    """
    given = r.prefetch if isinstance(r.prefetch, list) else [r.prefetch] if r.prefetch is not None else []
    children = [
        await build(p, f"{param}prefetch[{i}].", query_vector, p.limit or DEFAULT_PREFETCH_LIMIT, with_payload, models)
        for i, p in enumerate(given)
    ]
    where = translate(r.filter, f"{param}filter")
    exact, q = search_params.exact(r.params), search_params.quantization(r.params, param)
    ef = search_params.hnsw_ef(r.params, param)
    fusion = _fusion(r.query, f"{param}query")
    if fusion is not None:
        if not children:
            raise InvalidCollectionRequest(f"{param}query: a fusion needs prefetches", f"{param}query")
        search = SearchQuery(
            None, limit, where, r.score_threshold, with_payload, False, r.using, exact, quantization=q, hnsw_ef=ef
        )
        return QueryNode(search, children, *fusion)
    spec = _formula(r.query, f"{param}query")
    if spec is not None or r.query is None:  # a formula re-scores the prefetches' points; no query: a scroll
        if spec is not None and not children:
            raise InvalidCollectionRequest(f"{param}query: a formula needs prefetches", f"{param}query")
        search = SearchQuery(
            None, limit, where, r.score_threshold, with_payload, False, r.using, exact, quantization=q, hnsw_ef=ef
        )
        return QueryNode(search, children, formula=spec)
    vec, excluded, model = await query_vector(r.query, f"{param}query", r.using, r.lookup_from)
    models.append(model)
    if excluded:
        nots = {"$not": {"$ids": excluded}}
        where = {"$and": [where, nots]} if where else nots
    search = SearchQuery(
        vec, limit, where, r.score_threshold, with_payload, False, r.using, exact, quantization=q, hnsw_ef=ef
    )
    return QueryNode(search, children)


__all__ = ["Prefetch", "build"]
