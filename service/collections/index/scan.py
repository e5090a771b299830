"""Exhaustive search of a flat index's float32 vectors by NumPy matrix products, answering as FAISS's flat search
does.

FAISS's ``IndexFlat`` answers a query batch under ``nq * d < distance_compute_blas_threshold`` (128,000 in FAISS
1.15), and every search with an ``IDSelector``, one vector at a time on one OpenMP thread (``fvec_inner_product`` /
``fvec_L2sqr``, ``faiss/utils/distances.cpp``); one BLAS matrix-vector product reads the same memory on every core
(1M x 384, one query, 2 cores, alone: FAISS 125 ms, NumPy 61.5 ms; docs/performance.md, "Flat dense scan"). The
matrix product rounds differently, so it only picks candidates: every row whose NumPy score is within the
worst-case rounding error of both computations (``gamma_d = d u / (1 - d u)`` of ``|q| |x|``, Higham, *Accuracy
and Stability of Numerical Algorithms*, 2nd ed., section 3.1) of the k-th best; FAISS's own kernels
(``fvec_inner_products_by_idx``, ``fvec_L2sqr_by_idx``) score those, and FAISS's heap rule picks and orders them
(:func:`faiss_order`). The answer is FAISS's: the same scores bit for bit, the same rows, in the same order (for
``k >= 100`` FAISS selects with a reservoir whose choice among rows tied at the k-th score is its own: there the
tied rows may differ, never the scores). Larger batches, which FAISS answers by BLAS products of its own (other
roundings), get the same answer as small ones.

Scores are FAISS's raw ones: inner products, or squared L2 distances (the caller takes the root). Rows are
positions in the flat storage; the caller maps them to ids.
"""

from __future__ import annotations

import faiss
import numpy as np

#: float32 unit roundoff
_U = 2.0**-24
#: scores a chunk of the scan holds (float32): 16 MiB, whatever the batch
CHUNK_SCORES = 1 << 22
#: batches of at most this many queries are scanned by one BLAS matrix-vector product per query: OpenBLAS's matrix
#: product of 2 queries took 3x the time of two matrix-vector products at 1M x 384, from 4 queries on it was faster
#: (docs/performance.md, "Flat dense scan")
GEMV_MAX_QUERIES = 2
#: a value no score reaches: FAISS's fill for missing results (``-FLT_MAX`` for inner product, ``FLT_MAX`` for L2)
FLT_MAX = float(np.finfo(np.float32).max)


def sq_norms(vectors: np.ndarray, rows: int = 65536) -> np.ndarray:
    """Squared L2 norms of ``vectors`` (float32 ``(n, d)``) as float32 ``(n,)``, read ``rows`` at a time (no temporary
    the size of ``vectors``)."""
    out = np.empty(len(vectors), np.float32)
    for a in range(0, len(vectors), rows):
        blk = vectors[a : a + rows]
        np.einsum("ij,ij->i", blk, blk, out=out[a : a + rows])
    return out


def _slack(queries: np.ndarray, max_sq: float, l2: bool) -> np.ndarray:
    """Per query, twice the worst-case gap between a NumPy score and FAISS's for the same row (float64 ``(nq,)``)."""
    d = queries.shape[1] + 8  # the products, the norms' sum and the few additions around them
    gamma = d * _U / (1 - d * _U)
    m = np.sqrt(max(max_sq, 0.0) * (1 + gamma))
    qn = np.sqrt(np.einsum("ij,ij->i", queries, queries, dtype=np.float64))
    err = gamma * ((m + qn) ** 2 if l2 else m * qn)  # each computation's error against the true value
    return 4 * err + 1e-30  # both computations, the k-th's and the row's: 2 x 2


def _chosen(key: np.ndarray, k: int, l2: bool) -> np.ndarray:
    """Which of one query's candidates (``key``: lower is better, in position order) FAISS's heap keeps for ``k``
    results (``faiss/utils/Heap.h``: a row enters only when strictly better than the heap's worst, and evicts the
    worst, among equal scores the one with the lowest position for inner products, the highest for L2). Those
    better than the k-th score all stay; of the rows tied with it, L2 keeps the lowest positions; inner product
    admits tied rows while fewer than ``k`` rows at least as good have come, then each later better row evicts the
    earliest admitted tied row."""
    if len(key) <= k:
        return np.ones(len(key), bool)
    v = np.partition(key, k - 1)[k - 1]
    better, tied = key < v, key == v
    g = int(better.sum())
    if l2:
        return better | (tied & (np.cumsum(tied) <= k - g))
    seen = np.cumsum(better | tied)  # rows at least as good as the k-th, so far
    admitted = tied & (seen <= k)
    evicted = g - int((better & (seen <= k)).sum())  # better rows arriving once the heap holds k such rows
    admitted[np.flatnonzero(admitted)[:evicted]] = False
    return better | admitted


def faiss_order(scores: np.ndarray, rows: np.ndarray, k: int, l2: bool) -> tuple[np.ndarray, np.ndarray]:
    """FAISS's top ``k`` of candidate ``scores`` (float32 ``(nq, m)``, FAISS's kernels' values) at positions
    ``rows`` (int64 ``(nq, m)``, ascending in each row where not -1; -1: no candidate), as its heap selects them
    (:func:`_chosen`) and orders them (best first; ties: inner product from the higher position down, L2 from the
    lower up). Returns ``(scores, rows)`` ``(nq, k)``, padded with ``-FLT_MAX`` / ``FLT_MAX`` and -1 as FAISS pads.
    For ``k >= 100`` FAISS selects with a reservoir instead, whose choice among rows tied at the k-th score is its
    own: the rows may differ there, never the scores."""
    nq = len(rows)
    out_s = np.full((nq, k), FLT_MAX if l2 else -FLT_MAX, np.float32)
    out_r = np.full((nq, k), -1, np.int64)
    for i in range(nq):
        valid = rows[i] >= 0
        key = scores[i][valid] if l2 else -scores[i][valid]
        pos = rows[i][valid]
        keep = _chosen(key, k, l2)
        key, pos = key[keep], pos[keep]
        order = np.lexsort((pos if l2 else -pos, key))
        out_s[i, : len(order)] = key[order] if l2 else -key[order]
        out_r[i, : len(order)] = pos[order]
    return out_s, out_r


def kernel_scores(queries: np.ndarray, vectors: np.ndarray, rows: np.ndarray, l2: bool) -> np.ndarray:
    """FAISS's per-vector scores (``fvec_inner_products_by_idx`` / ``fvec_L2sqr_by_idx``) of each query (float32
    ``(nq, d)``) against the rows ``rows[i]`` (int64 ``(nq, m)``, -1: none, scored ``-inf`` / ``inf``) of
    ``vectors`` (float32 ``(n, d)``, read in place). Returns float32 ``(nq, m)``."""
    nq, m = rows.shape
    out = np.empty((nq, m), np.float32)
    if m == 0 or nq == 0:
        return out
    q = np.ascontiguousarray(queries, dtype=np.float32)
    r = np.ascontiguousarray(rows, dtype=np.int64)
    fn = faiss.fvec_L2sqr_by_idx if l2 else faiss.fvec_inner_products_by_idx
    fn(faiss.swig_ptr(out), faiss.swig_ptr(q), faiss.swig_ptr(vectors), faiss.swig_ptr(r), q.shape[1], nq, m)
    return out


def rows_top_k(
    queries: np.ndarray, vectors: np.ndarray, rows: np.ndarray, k: int, l2: bool
) -> tuple[np.ndarray, np.ndarray]:
    """FAISS's flat search of ``queries`` (float32 ``(nq, d)``) restricted to the positions ``rows`` (int64, sorted,
    unique) of ``vectors``, as with an ``IDSelector``: each allowed row scored by FAISS's kernel in place (no copy
    of the rows), a query at a time. Returns ``(scores, rows)`` ``(nq, k)`` as :func:`faiss_order`."""
    one = np.ascontiguousarray(rows, dtype=np.int64)[None]
    found = [faiss_order(kernel_scores(queries[i : i + 1], vectors, one, l2), one, k, l2) for i in range(len(queries))]
    if not found:
        return faiss_order(np.zeros((0, 0), np.float32), np.zeros((0, 0), np.int64), k, l2)
    return np.concatenate([f[0] for f in found]), np.concatenate([f[1] for f in found])


def scan_top_k(
    queries: np.ndarray,
    vectors: np.ndarray,
    k: int,
    l2: bool,
    norms: np.ndarray,
    drop: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """FAISS's flat search of ``queries`` (float32 ``(nq, d)``) over ``vectors`` (float32 ``(n, d)``, read in
    chunks of at most :data:`CHUNK_SCORES` scores, never copied), ``k`` results each.

    Args:
        l2: squared L2 distances (else inner products).
        norms: the rows' squared norms (float32 ``(n,)``, :func:`sq_norms`): the L2 scores' expansion and the
            rounding bound.
        drop: rows that may not be returned (bool ``(n,)``); None: none.

    Returns:
        ``(scores, rows)`` ``(nq, k)``, as :func:`faiss_order`.
    """
    nq, n = len(queries), len(vectors)
    if n == 0 or nq == 0:
        return faiss_order(np.zeros((nq, 0), np.float32), np.zeros((nq, 0), np.int64), k, l2)
    q = np.ascontiguousarray(queries, dtype=np.float32)
    slack = _slack(q, float(norms.max()), l2).astype(np.float32)[:, None]
    step = max(1024, CHUNK_SCORES // nq)
    got_q, got_r, got_key = [], [], []
    for a in range(0, n, step):
        blk = vectors[a : a + step]
        if nq <= GEMV_MAX_QUERIES:  # a matrix-vector product per query
            key = np.empty((nq, len(blk)), np.float32)
            for i in range(nq):
                np.matmul(blk, q[i], out=key[i])
        else:
            key = q @ blk.T  # (nq, c): one BLAS matrix product over the chunk, in place
        if l2:
            key *= -2
            key += norms[a : a + step]  # |x|^2 - 2 q.x: the squared distance less |q|^2
        else:
            np.negative(key, out=key)  # lower is better, as for distances
        if drop is not None:
            np.copyto(key, np.inf, where=drop[a : a + step])
        c = key.shape[1]
        kth = np.partition(key, k - 1, axis=1)[:, k - 1 : k] if c > k else key.max(axis=1, keepdims=True)
        qi, col = np.nonzero((key <= kth + slack) & (key < np.inf))
        got_q.append(qi)
        got_r.append(col + a)
        got_key.append(key[qi, col])
    qi, rows, key = np.concatenate(got_q), np.concatenate(got_r), np.concatenate(got_key)
    order = np.lexsort((rows, qi))
    qi, rows, key = qi[order], rows[order], key[order]
    counts = np.bincount(qi, minlength=nq)
    m = int(counts.max()) if len(counts) else 0
    slot = np.arange(len(qi)) - np.repeat(np.cumsum(counts) - counts, counts)
    cand = np.full((nq, m), -1, np.int64)
    cand_key = np.full((nq, m), np.inf, np.float32)
    cand[qi, slot], cand_key[qi, slot] = rows, key
    if m > k:  # the candidates near the global k-th best: those the chunks' thresholds kept beyond it go
        kth = np.partition(cand_key, k - 1, axis=1)[:, k - 1 : k]
        cand[cand_key > kth + slack] = -1
    return faiss_order(kernel_scores(q, vectors, cand, l2), cand, k, l2)


class ScanState:
    """What scanning one index's held vectors reuses between searches, kept in step with its writes by the owner
    (:class:`~.vector_index.VectorIndex`): the rows' squared norms (float32, 4 bytes a row, extended on
    :meth:`added`, compacted on :meth:`removed`, computed at the first scan after a :meth:`reset`) and whether the
    id map is sorted (ids are assigned in increasing order, so it usually is: positions of ids are then found by
    binary search, else through a cached ``argsort``). Concurrent readers may fill a cache at once: each fills it
    with the same value."""

    def __init__(self) -> None:
        self._norms: np.ndarray | None = None
        self._order: tuple[int, np.ndarray | None] | None = None  # (rows it is for, argsort or None: sorted)

    def reset(self) -> None:
        """Forget everything (the index was replaced)."""
        self._norms, self._order = None, None

    def added(self, vectors: np.ndarray) -> None:
        """``vectors`` (float32 ``(n, d)``) were appended to the held rows (and their ids to the id map)."""
        if self._norms is not None:
            self._norms = np.concatenate([self._norms, sq_norms(vectors)])
        self._order = None

    @property
    def has_norms(self) -> bool:
        """Whether the norms are cached (a removal must then say which rows went, :meth:`removed`)."""
        return self._norms is not None

    def removed(self, keep: np.ndarray) -> None:
        """The held rows were compacted to those where ``keep`` (bool, one per row before) is True, in order."""
        if self._norms is not None:
            self._norms = self._norms[keep] if len(keep) == len(self._norms) else None
        self._order = None

    def norms(self, vectors: np.ndarray) -> np.ndarray:
        """The squared norms of the held ``vectors`` (float32 ``(n,)``)."""
        norms = self._norms
        if norms is None or len(norms) != len(vectors):
            norms = self._norms = sq_norms(vectors)
        return norms

    def rows_of(self, ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
        """Positions (int64, sorted, unique) in the id map ``ids`` (int64 ``(n,)``) of those of ``wanted`` present."""
        if len(ids) == 0:
            return np.zeros(0, np.int64)
        order = self._order
        if order is None or order[0] != len(ids):
            order = self._order = (len(ids), None if bool(np.all(ids[1:] > ids[:-1])) else np.argsort(ids))
        sorter = order[1]
        wanted = np.sort(np.asarray(wanted, dtype=np.int64))  # sorted keys: the binary searches stay in cache
        at = np.searchsorted(ids, wanted, sorter=sorter)
        at = np.minimum(at, len(ids) - 1)
        pos = at if sorter is None else sorter[at]
        pos = np.sort(pos[ids[pos] == wanted])  # already sorted when both are: a pass
        return pos[np.concatenate(([True], pos[1:] != pos[:-1]))] if len(pos) else pos
