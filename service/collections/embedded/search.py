"""Search helpers of an embedded collection: exact re-ranking of approximate candidates and turning FAISS results
into :class:`~..backend.Hit` lists."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from service.collections.arrays import sorted_unique
from service.collections.embedded.bound_index import BoundIndex
from service.collections.embedded.named import NamedIndexes, prepared
from service.collections.embedded.store import Store
from service.collections.filters import Filter, Ids, Not
from service.collections.ids import decode_id
from service.collections.index import QuantizationSearch, VectorIndex, exact_search
from service.collections.metric import higher_is_better
from service.collections.reads import FLOAT_JSON_BYTES, SPARSE_ENTRY_BYTES, Hit, ResponseBudget
from service.collections.schema import SparseVec
from service.collections.scorers import Scorer, top
from service.collections.stopping import check


def left_out(store: Store, where: Filter | None) -> tuple[Filter | None, np.ndarray]:
    """``(filter to search with, internal ids to drop from the hits)``. A filter that only leaves listed points out
    (``{"$not": {"$ids": [...]}}``: a query's own example points) becomes no filter and those points' ids, read by
    key: the search then asks for that many more hits and drops them, instead of selecting every other point through
    SQL (a scan of the collection). Any other filter is returned as it is, with nothing to drop."""
    if isinstance(where, Not) and isinstance(where.part, Ids):
        return None, store.matching_iids(where.part)
    return where, np.empty(0, np.int64)


Fetch = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # iids -> (iids found, their vectors)


def rerank(
    index: VectorIndex,
    fetch: Fetch,
    q: np.ndarray,
    top_k: int,
    allowed: np.ndarray | None,
    n: int,
    metric: str,
    ef: int | None = None,
    every: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` approximate candidates per query re-scored exactly with the stored vectors.

    Args:
        fetch: the stored vectors of some internal ids.
        q: float32 ``(nq, d)`` prepared queries.
        allowed: internal ids a filter admits (None: all).
        ef: an HNSW graph's search breadth (None: the index's).
        every: the candidates are the best codes of every allowed vector (:meth:`~..index.VectorIndex.search`).

    Returns:
        ``(scores, iids)``, each ``(nq, top_k)`` (NaN / -1 where fewer candidates exist).
    """
    _, cand = index.search(q, n, allowed, ef, every)
    ids, vecs = fetch(sorted_unique(cand[cand >= 0]))
    pos = {int(i): j for j, i in enumerate(ids)}
    D = np.full((len(q), top_k), np.nan, np.float32)
    I = np.full((len(q), top_k), -1, np.int64)
    for qi in range(len(q)):
        rows = [pos[int(i)] for i in cand[qi] if i >= 0 and int(i) in pos]
        if rows:
            s, top = exact_search(q[qi : qi + 1], vecs[rows], ids[rows], top_k, metric)
            D[qi, : top.shape[1]], I[qi, : top.shape[1]] = s[0], top[0]
    return D, I


def exact_scan(
    q: np.ndarray, chunks: Iterable[tuple[np.ndarray, np.ndarray]], k: int, metric: str, allowed: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """The exact ``k`` best of every stored vector (``chunks`` of ``(iids, vectors)``, those in ``allowed`` when
    given) for the prepared queries ``q``: each chunk's top ``k`` merged, so memory stays one chunk. Returns
    ``(scores, iids)`` ``(nq, <=k)``, best first, in :func:`~..index.exact_search`'s units."""
    best_d = np.zeros((len(q), 0), np.float32)
    best_i = np.zeros((len(q), 0), np.int64)
    hib = higher_is_better(metric)
    for ids, vecs in chunks:
        check()  # a chunk at a time: the scan stops with its request
        if allowed is not None:
            keep = np.isin(ids, allowed)
            ids, vecs = ids[keep], vecs[keep]
        d, i = exact_search(q, vecs, ids, k, metric)
        d, i = np.concatenate([best_d, d], 1), np.concatenate([best_i, i], 1)
        order = np.argsort(-d if hib else d, axis=1, kind="stable")[:, :k]
        best_d, best_i = np.take_along_axis(d, order, 1), np.take_along_axis(i, order, 1)
    return best_d, best_i


def dense_search(
    index: VectorIndex,
    fetch: Fetch,
    q: np.ndarray,
    top_k: int,
    k: int,
    allowed: np.ndarray | None,
    cap: int,
    scan: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]] | None = None,
    quantization: QuantizationSearch | None = None,
    ef: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, iids)`` of the ``k`` best points per prepared query ``q`` (float32 ``(nq, d)``) among ``allowed``
    (None: all). Exact over the allowed points' vectors when at most ``cap`` points are allowed (``top_k`` of them;
    in memory where the index holds them, scored in place: docs/performance.md, "Flat dense scan"; where it holds
    scalar-quantized codes, every allowed code scored and the best re-scored as below; else read from the store);
    exact when ``scan`` (the stored vectors, chunked: an exact search was asked for) is given or the index holds at
    most ``cap`` live vectors (as a Qdrant segment under its indexing threshold is searched without its HNSW
    graph), in memory where the index type holds its vectors uncompressed, else through ``scan``; otherwise the index
    restricted by an ``IDSelector``, its candidates re-scored exactly when the index is quantized and ``quantization``
    does not turn it off (:meth:`~..index.VectorIndex.rescore_candidates`); ``ef``: an HNSW graph's search breadth
    (None: the index's)."""
    if isinstance(q, Scorer):  # a multi-example query: every candidate scored (in memory where the index allows)
        found = index.held(allowed)
        chunks = [found] if found is not None else (scan() if scan is not None else [fetch(allowed)])
        if found is None and allowed is not None and scan is not None:
            chunks = ((i[np.isin(i, allowed)], v[np.isin(i, allowed)]) for i, v in chunks)
        s, i = top(q, chunks, k)
        return s[None], i[None]
    if allowed is not None and len(allowed) <= cap:
        if (found := index.exact_search(q, top_k, allowed)) is not None:
            return found
        if index.scores_every_code and not index.ignores_quantization(quantization):  # codes in RAM, not floats
            if (n := index.rescore_candidates(top_k, quantization)) is not None:
                return rerank(index, fetch, q, top_k, allowed, n, index.spec.metric, every=True)
            return index.search(q, top_k, allowed, every=True)
        ids, vecs = fetch(allowed)
        return exact_search(q, vecs, ids, top_k, index.spec.metric)
    if scan is not None or index.live <= cap:
        if (found := index.exact_search(q, k, allowed)) is not None:
            return found
        if scan is not None:
            return exact_scan(q, scan(), k, index.spec.metric, allowed)
    if (n := index.rescore_candidates(k, quantization)) is not None:
        return rerank(index, fetch, q, k, allowed, n, index.spec.metric, ef)
    return index.search(q, k, allowed, ef)


def nearest(
    store: Store,
    bound: BoundIndex | None,
    named: NamedIndexes,
    using: str | None,
    queries: Any,
    top_k: int,
    k: int,
    allowed: np.ndarray | None,
    cap: int,
    exact: bool,
    quantization: QuantizationSearch | None = None,
    ef: int | None = None,
) -> tuple[np.ndarray, np.ndarray, str]:
    """``(scores, iids, metric the scores are in)`` of the ``k`` best points per query by the vector ``using``
    (``bound``: the model-bound vector's index when that is the one searched, else None) among ``allowed`` (None: all). A sparse vector or a
    multivector is searched exactly (:meth:`.named.NamedIndexes.sparse_search`); a dense one by :func:`dense_search`
    (``cap``: its exact threshold; ``exact``, or ``quantization.ignore`` on a quantized index: every stored vector
    scored; ``quantization``: how a quantized index is searched; ``ef``: an HNSW graph's search breadth). A multi-example query
    (:class:`~..scorers.Scorer`) is scored higher-is-better whatever the metric (``dot``)."""
    if named.scanned(using):  # a sparse vector or a multivector: no FAISS index
        D, I = named.sparse_search(using, queries, k, allowed)
        return D, I, "dot" if isinstance(queries, Scorer) else named.metric(using)
    if bound is not None:
        index, q = bound.index, queries if isinstance(queries, Scorer) else bound.prepare(queries)
        dim = index.spec.dimension
        fetch = lambda iids: store.vectors_for(iids, dim)  # noqa: E731
        scan = lambda: store.iter_vectors(dim)  # noqa: E731
    else:
        index, q = named.indexes[using], prepared(queries, named.dense[using].spec.metric)
        fetch = lambda iids: named.fetch_dense(using, iids)  # noqa: E731
        scan = lambda: named.scan_dense(using)  # noqa: E731
    scored = isinstance(q, Scorer)
    exact = exact or index.ignores_quantization(quantization)
    D, I = dense_search(index, fetch, q, top_k, k, allowed, cap, scan if exact or scored else None, quantization, ef)
    return D, I, "dot" if scored else index.spec.metric


def assemble_hits(
    D: np.ndarray,
    I: np.ndarray,
    rows: dict[int, tuple[str, str | None, str | None]],
    top_k: int,
    score_threshold: float | None,
    metric: str,
) -> list[list[Hit]]:
    """One best-first list of at most ``top_k`` hits per query row of ``(D, I)``; ids missing from ``rows`` (deleted
    meanwhile) and scores past ``score_threshold`` (below it for similarities, above it for distances: the scores are
    in ``metric``) are left out;
    text and payload are those of ``rows`` (None where they were not read)."""
    out: list[list[Hit]] = []
    hib = higher_is_better(metric)
    for qi in range(len(D)):
        hits: list[Hit] = []
        for s, iid in zip(D[qi], I[qi]):
            iid = int(iid)
            if iid < 0 or iid not in rows:
                continue
            s = float(s)
            if score_threshold is not None and (s < score_threshold if hib else s > score_threshold):
                continue
            key, text, payload = rows[iid]
            hits.append(Hit(decode_id(key), s, text, json.loads(payload) if payload is not None else None))
            if len(hits) == top_k:
                break
        out.append(hits)
    return out


def point_dict(
    point_id: int | str,
    text: str | None,
    payload_json: str | None,
    vector: bytes | None,
    named: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A stored row as the API's point ``{id, text, payload[, vector][, vectors]}``: ``vector`` the model-bound
    vector when its bytes are given (and not empty: a collection without one stores none), ``vectors`` the point's
    named vectors asked for (``{name: list | {indices, values}}``) when ``named`` is given."""
    out: dict[str, Any] = {
        "id": point_id,
        "text": text,
        "payload": json.loads(payload_json) if payload_json is not None else None,
    }
    if vector:
        out["vector"] = np.frombuffer(vector, dtype=np.float32).tolist()
    if named is not None:
        out["vectors"] = {n: v.to_json() if isinstance(v, SparseVec) else v.tolist() for n, v in named.items()}
    return out


def points_of(named: NamedIndexes, rows: list[tuple], with_vector: Any) -> list[dict[str, Any]]:
    """Stored rows ``(id, iid, text, payload, vector bytes)`` as points (:func:`point_dict`): ``vector`` the
    model-bound vector and ``vectors`` the named others asked for by ``with_vector``
    (:meth:`.named.NamedIndexes.wanted`), read from ``named``."""
    want_bound, others = named.wanted(with_vector)
    vecs = named.vectors_of([r[1] for r in rows], others) if others else {}
    has_named = bool(named.dense or named.config.sparse)  # then "vectors" is always answered, maybe empty
    return [
        point_dict(pid, t, p, v if want_bound else None, vecs.get(iid, {}) if has_named else None)
        for pid, iid, t, p, v in rows
    ]


def budgeted_page(
    store: Store,
    named: NamedIndexes,
    rows: list[tuple],
    bound: int,
    others: list[str],
    budget: ResponseBudget,
    text: bool,
    payload: bool,
) -> list[tuple]:
    """The rows ``(key, iid, text, payload_json, vector_bytes)`` of a scroll page given as ``(key, iid, ...)``, read
    once their bytes are spent from ``budget``: first the vectors asked for (``bound``: the model-bound vector's
    dimension, 0 when not asked; ``others``: the named vectors asked for, counted by ``named.value_counts``), then the
    ids, texts and payloads (:meth:`.store.Store.rows_for`), each before it is read.

    Raises:
        ResponseTooLarge: from ``budget``, before any text, payload or vector is read.
    """
    iids = [r[1] for r in rows]
    if not iids:
        return []
    floats, entries = named.value_counts(iids, others) if others else (0, 0)
    budget.spend((floats + bound * len(iids)) * FLOAT_JSON_BYTES + entries * SPARSE_ENTRY_BYTES)
    got = store.rows_for(iids, text, payload, budget)
    vectors: dict[int, bytes] = {}
    if bound:
        ids, vecs = store.vectors_for(np.asarray(iids, dtype=np.int64), bound)
        vectors = {int(i): v.tobytes() for i, v in zip(ids, vecs)}
    return [(key, iid, got[iid][1], got[iid][2], vectors.get(iid)) for key, iid, *_ in rows if iid in got]
