"""Maximal Marginal Relevance: a nearest-neighbour search re-ranked for diversity (Carbonell & Goldstein, "The Use of
MMR, Diversity-Based Reranking for Reordering Documents and Producing Summaries", SIGIR 1998), as Qdrant serves it
(Qdrant API reference, "Query points": ``NearestQuery.mmr {diversity, candidates_limit}``; documentation "Search
relevance", "Maximal Marginal Relevance").

The search's best ``candidates_limit`` points (default: the search's ``top_k``) are fetched with their vectors; the
most relevant one is taken first, then repeatedly the candidate maximising ``lambda * sim(q, x) - (1 - lambda) *
max over taken y of sim(x, y)``, ``lambda = 1 - diversity`` (``diversity`` default 0.5), until ``top_k`` are taken.
``sim`` is the vector's raw similarity as Qdrant's segments compute it: the dot product (cosine: of unit vectors),
minus the squared Euclidean distance (``l2``), the dot product over shared indices (sparse vectors, no IDF), the sum
over query rows of their best row similarity (multivectors, MAX_SIM). Ties go to the later candidate in Qdrant's
candidate list order (its ``swap_remove`` and last-maximum rules), so that the same points come back. The hits keep
their search scores.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from service.collections.errors import InvalidCollectionRequest
from service.collections.metric import similarity_matrix
from service.collections.searching import Searcher
from service.collections.vectors import stored_vector


def similarity(x: Any, y: Any, metric: str, multivector: bool = False) -> float:
    """The raw similarity (module docstring) of two vectors of one named vector: lists of floats (dense), lists of
    rows (multivectors, ``multivector`` True) or ``{indices, values}`` (``metric`` ``sparse``)."""
    if metric == "sparse":
        ys = dict(zip(y["indices"], y["values"]))
        return float(sum(v * ys[i] for i, v in zip(x["indices"], x["values"]) if i in ys))
    a, b = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if not multivector:
        return float(similarity_matrix(a[None], b[None], metric)[0, 0])
    return float(similarity_matrix(a, b, metric).max(1).sum())


def _swap_remove(xs: list[int], i: int) -> int:
    x = xs[i]
    xs[i] = xs[-1]
    xs.pop()
    return x


def _last_argmax(values: list[float]) -> int:
    best = max(values)
    return max(i for i, v in enumerate(values) if v == best)


def select(query: Any, candidates: list[Any], metric: str, multivector: bool, lambda_: float, k: int) -> list[int]:
    """The positions in ``candidates`` (their vectors, the search's order) of the ``k`` points MMR takes, in the
    order taken (module docstring)."""
    if not candidates:
        return []
    rel = [similarity(query, x, metric, multivector) for x in candidates]
    pair = [[similarity(x, y, metric, multivector) for y in candidates] for x in candidates]
    pending = list(range(len(candidates)))
    taken = [_swap_remove(pending, _last_argmax([rel[i] for i in pending]))]
    while len(taken) < k and pending:
        scores = [lambda_ * rel[i] - (1.0 - lambda_) * max(pair[i][j] for j in taken) for i in pending]
        if all(np.isneginf(s) for s in scores):
            break
        taken.append(_swap_remove(pending, _last_argmax(scores)))
    return taken


def params(raw: Any, max_candidates: int, param: str) -> tuple[float, int | None]:
    """``(lambda, candidates_limit or None)`` of an ``{"diversity": 0..1, "candidates_limit": >= 1}`` object.

    Raises:
        InvalidCollectionRequest: another shape or value (a limit over ``max_candidates``).
    """
    raw = raw or {}
    div, n = raw.get("diversity"), raw.get("candidates_limit") if isinstance(raw, dict) else None
    if (
        not isinstance(raw, dict)
        or set(raw) - {"diversity", "candidates_limit"}
        or (div is not None and (isinstance(div, bool) or not isinstance(div, (int, float)) or not 0 <= div <= 1))
        or (n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= max_candidates))
    ):
        raise InvalidCollectionRequest(
            f"{param} is {{diversity: 0 to 1, candidates_limit: 1 to {max_candidates}}}", param
        )
    return 1.0 - (0.5 if div is None else float(div)), n


async def search(searcher: Searcher, name: str, spec: Any, raw: Any, param: str, budget: Any = None) -> list[Any]:
    """The hits of the search ``spec`` (a :class:`~.query_model.SearchQuery`: dense, multivector or sparse ``query`` on ``using``)
    re-ranked by MMR with the ``mmr`` object ``raw`` (module docstring), at most ``spec.top_k``, best first.

    Raises:
        InvalidCollectionRequest: bad ``raw``, a text query for a sparse vector; and what the search raises.
    """
    reads = searcher.reads
    lambda_, n = params(raw, reads.settings.max_top_k, param)
    c = await reads.collection(name)
    vname = spec.using if spec.using is not None else c.vectors.default_using()
    kind = c.vectors.kind_of(vname, f"{param}.using")
    dense = c.vectors.dense.get(vname)
    metric = "sparse" if kind == "sparse" else dense.spec.metric
    query = spec.query
    if isinstance(query, str) and dense is not None and dense.bound:
        query = (await searcher.embedding.embed(c, [query], role="query"))[0].tolist()
    elif not isinstance(query, list) and not (isinstance(query, dict) and "indices" in query):
        raise InvalidCollectionRequest(f"{param}: MMR needs a vector query (or a text for the model's vector)", param)
    wide = copy.copy(spec)
    wide.top_k = n or spec.top_k
    hits = (await searcher.search(name, [wide], param, budget=budget))[0]
    if not hits:
        return []
    ids = [h.id for h in hits]
    points = await reads.retrieve(name, ids, with_payload=False, with_vectors=[vname], with_text=False)
    bound = dense is not None and dense.bound
    vecs = {(type(p["id"]), p["id"]): stored_vector(p, bound, vname) for p in points}
    kept = [h for h in hits if vecs.get((type(h.id), h.id)) is not None]
    multi = bool(dense is not None and getattr(dense, "multivector", False))
    chosen = select(query, [vecs[(type(h.id), h.id)] for h in kept], metric, multi, lambda_, spec.top_k)
    return [kept[i] for i in chosen]
