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
from scipy import sparse

from service.collections.errors import InvalidCollectionRequest
from service.collections.metric import example_metric, normalised, similarity_matrix
from service.collections.searching import Searcher
from service.collections.stopping import check, for_collection
from service.collections.vectors import stored_vector


def similarity(x: Any, y: Any, metric: str, multivector: bool = False) -> float:
    """The raw similarity (module docstring) of two vectors of one named vector: lists of floats (dense), lists of
    rows (multivectors, ``multivector`` True) or ``{indices, values}`` (``metric`` ``sparse``)."""
    return float(gram([x, y], metric, multivector)[0, 1])


def _sparse_rows(vectors: list[Any]) -> sparse.csr_matrix:
    """The ``{indices, values}`` vectors as the rows of one CSR matrix over the indices they use."""
    idx = [np.asarray(v["indices"], np.int64) for v in vectors]
    used, cols = np.unique(np.concatenate(idx) if idx else np.zeros(0, np.int64), return_inverse=True)
    vals = np.concatenate([np.asarray(v["values"], np.float64) for v in vectors]) if vectors else np.zeros(0)
    ptr = np.concatenate([[0], np.cumsum([len(i) for i in idx])])
    return sparse.csr_matrix((vals, cols.reshape(-1), ptr), shape=(len(vectors), max(1, len(used))))


def gram(vectors: list[Any], metric: str, multivector: bool) -> np.ndarray:
    """``(n, n)`` float64 raw similarities ``G[i, j] = sim(vectors[i], vectors[j])`` (module docstring), computed
    with matrix products: dense rows at once; a multivector's rows against every row of the others, the best per
    other vector summed (MAX_SIM, not symmetric); sparse vectors as a sparse matrix product. Checks for a stop
    request (:func:`..stopping.check`) between multivectors."""
    if metric == "sparse":
        m = _sparse_rows(vectors)
        return np.asarray((m @ m.T).toarray(), np.float64)
    if not multivector:
        x = np.asarray(vectors, np.float64)
        return similarity_matrix(x, x, metric).astype(np.float64)
    rows = [np.asarray(v, np.float64).reshape(len(v), -1) for v in vectors]
    flat = normalised(np.concatenate(rows), metric)  # normalised once: then compared by the examples' metric
    starts = np.concatenate([[0], np.cumsum([len(r) for r in rows])[:-1]])
    out = np.empty((len(rows), len(rows)), np.float64)
    for i in range(len(rows)):
        check()
        s = similarity_matrix(flat[starts[i] : starts[i] + len(rows[i])], flat, example_metric(metric))
        out[i] = np.maximum.reduceat(s, starts, axis=1).sum(0)
    return out


def _swap_remove(xs: list[int], i: int) -> int:
    x = xs[i]
    xs[i] = xs[-1]
    xs.pop()
    return x


def _last_argmax(values: np.ndarray) -> int:
    return len(values) - 1 - int(np.argmax(values[::-1]))


def select(query: Any, candidates: list[Any], metric: str, multivector: bool, lambda_: float, k: int) -> list[int]:
    """The positions in ``candidates`` (their vectors, the search's order) of the ``k`` points MMR takes, in the
    order taken (module docstring). Blocking (one ``(n + 1)^2`` similarity matrix, then ``k`` vectorised steps):
    call it off the event loop; it stops at a stop request (:func:`..stopping.check`)."""
    if not candidates:
        return []
    g = gram([query, *candidates], metric, multivector)
    rel, pair = g[0, 1:], g[1:, 1:]
    pending = list(range(len(candidates)))
    taken = [_swap_remove(pending, _last_argmax(rel))]
    closest = pair[:, taken[0]].copy()  # each candidate's highest similarity to a taken one
    while len(taken) < k and pending:
        check()
        at = np.asarray(pending)
        scores = lambda_ * rel[at] - (1.0 - lambda_) * closest[at]
        if np.all(np.isneginf(scores)):
            break
        j = _swap_remove(pending, _last_argmax(scores))
        taken.append(j)
        np.maximum(closest, pair[:, j], out=closest)
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
    lambda_, n = params(raw, min(reads.settings.max_mmr_candidates, reads.settings.max_top_k), param)
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
    vectors = [vecs[(type(h.id), h.id)] for h in kept]
    chosen = await reads.backend.run(for_collection(c.name, select, query, vectors, metric, multi, lambda_, spec.top_k))
    return [kept[i] for i in chosen]
