"""The distance matrix of a sample of points: Qdrant's "Distance matrix" API (Qdrant API reference, "Search matrix
pairs" and "Search matrix offsets"; documentation "Explore the data", "Distance Matrix"), computed by the core.

``sample`` points holding the vector ``using`` and matching the filter are drawn uniformly
(:func:`.ordering.sample_ids`) and put in Qdrant's point order (integer ids numerically, then strings); each is then
the query of a search, with its stored vector, for its ``limit`` nearest among the other sampled points (the filter
still applying), scored as any search of that vector is. Fewer than two sampled points give an empty matrix.
"""

from __future__ import annotations

import json
from typing import Any

from service.collections.errors import InvalidCollectionRequest, ResponseTooLarge
from service.collections.ordering import sample_ids
from service.collections.query_model import SearchQuery
from service.collections.reads import HIT_OVERHEAD_BYTES, ResponseBudget
from service.collections.searching import Searcher
from service.collections.vectors import stored_vector


def _point_order(i: int | str) -> tuple[int, int | str]:
    return (1, i) if isinstance(i, str) else (0, i)


def _check_size(ids: list[int | str], limit: int, budget: ResponseBudget) -> None:
    """Refuse, before any search, a matrix whose hits cannot fit ``budget``: each of the ``n`` sampled points has
    ``min(limit, n - 1)`` neighbours, each hit at least its id and :data:`~.reads.HIT_OVERHEAD_BYTES`.

    Raises:
        ResponseTooLarge: that lower bound exceeds what ``budget`` has left.
    """
    if len(ids) < 2:
        return
    per_hit = HIT_OVERHEAD_BYTES + min(len(json.dumps(i)) for i in ids)
    need = len(ids) * min(limit, len(ids) - 1) * per_hit
    if need > budget.limit - budget.used:
        raise ResponseTooLarge(
            f"a matrix of {len(ids)} points with {min(limit, len(ids) - 1)} neighbours each holds at least {need} "
            f"bytes, over the {budget.limit - budget.used} left (collections_max_response_bytes): lower sample or "
            "limit"
        )


def _largest_hit(ids: list[int | str]) -> int:
    """The most bytes one hit without text or payload spends (:meth:`.reads.ResponseBudget.spend_point`)."""
    return HIT_OVERHEAD_BYTES + max(len(json.dumps(i).encode()) for i in ids)


async def distance_matrix(
    searcher: Searcher,
    name: str,
    sample: int,
    limit: int,
    raw_filter: Any = None,
    using: str | None = None,
    budget: Any = None,
) -> tuple[list[int | str], list[list[Any]]]:
    """``(ids, hits)``: the sampled point ids in point order, and for each its ``limit`` nearest other sampled points
    (``Hit`` s, best first). A matrix whose hits cannot fit the response (``budget``, or one of
    ``collections_max_response_bytes``) is refused once the points are sampled, before any search.

    Raises:
        CollectionNotFound; InvalidCollectionRequest: ``sample`` below 2 or over ``collections_max_filter_values``,
            ``limit`` below 1 or over ``collections_max_top_k``, an unknown vector, a bad filter.
        ResponseTooLarge: the matrix cannot fit the response (checked before the searches).
    """
    reads = searcher.reads
    cap = min(reads.settings.max_filter_values, reads.settings.max_top_k)
    if not 2 <= sample <= cap:
        raise InvalidCollectionRequest(f"sample must be between 2 and {cap}", "sample")
    if not 1 <= limit <= reads.settings.max_top_k:
        raise InvalidCollectionRequest(f"limit must be between 1 and {reads.settings.max_top_k}", "limit")
    c = await reads.collection(name)
    vname = using if using is not None else c.vectors.default_using()
    if vname is None:
        raise InvalidCollectionRequest("the collection has several vectors: name one with using", "using")
    c.vectors.kind_of(vname, "using")
    has = {"$has_vector": vname}
    ids = sorted(
        await sample_ids(reads, name, sample, {"$and": [raw_filter, has]} if raw_filter else has), key=_point_order
    )
    if len(ids) < 2:
        return [], []
    points = await reads.retrieve(name, ids, with_payload=False, with_vectors=[vname], with_text=False)
    dense = c.vectors.dense.get(vname)
    vec = {(type(p["id"]), p["id"]): stored_vector(p, bool(dense and dense.bound), vname) for p in points}
    ids = [i for i in ids if vec.get((type(i), i)) is not None]
    budget = budget or ResponseBudget(reads.settings.max_response_bytes)  # one for the whole matrix
    _check_size(ids, limit, budget)
    # one filter for every search (the sampled points), one more neighbour each, the point itself dropped after:
    # the searches differ only in their vectors, so the backend answers them as batches (a filter of the others per
    # point made n filters of n - 1 ids, each search its own backend call: seconds at 1,000 points)
    within = {"$ids": ids}
    where = {"$and": [raw_filter, within]} if raw_filter else within
    searches = [SearchQuery(vec[(type(i), i)], min(limit + 1, len(ids)), where, None, False, False, vname) for i in ids]
    scratch = ResponseBudget(budget.limit - budget.used + len(ids) * _largest_hit(ids))  # the dropped hits too
    step, hits = reads.settings.max_batch_searches, []
    for k in range(0, len(searches), step):
        found = await searcher.search(name, searches[k : k + step], "searches", budget=scratch)
        for i, row in zip(ids[k : k + step], found):
            kept = [h for h in row if (type(h.id), h.id) != (type(i), i)][:limit]
            budget.spend_hits(kept)
            hits.append(kept)
    return ids, hits
