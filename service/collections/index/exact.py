"""Brute-force search over stored vectors: narrow filters and the re-scoring of approximate candidates."""

from __future__ import annotations

import numpy as np

from service.collections.metric import is_distance


def exact_search(
    queries: np.ndarray, vectors: np.ndarray, ids: np.ndarray, k: int, metric: str
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force top ``k`` of ``queries`` (``(nq, d)``) over ``vectors`` (``(n, d)``) with ``ids`` (``(n,)``).

    Returns ``(scores, ids)`` shaped ``(nq, min(k, n))``, best first, in the same
    units as :meth:`VectorIndex.search` (Euclidean distances computed from the differences, as FAISS's flat
    L2 search does for few queries).
    """
    nq = len(queries)
    if len(ids) == 0:
        return np.zeros((nq, 0), np.float32), np.zeros((nq, 0), np.int64)
    k = min(k, len(ids))
    if is_distance(metric):
        d2 = (queries**2).sum(1)[:, None] - 2 * queries @ vectors.T + (vectors**2).sum(1)[None, :]
        score = -np.maximum(d2, 0)
    else:
        score = queries @ vectors.T
    part = np.argpartition(-score, k - 1, axis=1)[:, :k] if k < len(ids) else np.tile(np.arange(len(ids)), (nq, 1))
    ps = np.take_along_axis(score, part, 1)
    order = np.argsort(-ps, axis=1, kind="stable")
    top = np.take_along_axis(part, order, 1)
    s = np.take_along_axis(score, top, 1).astype(np.float32)
    if is_distance(metric):  # the expansion above cancels for near points: the chosen ones' distances from differences
        s = np.stack([np.linalg.norm(vectors[top[i]] - queries[i], axis=1) for i in range(nq)]).astype(np.float32)
        order = np.argsort(s, axis=1, kind="stable")
        s, top = np.take_along_axis(s, order, 1), np.take_along_axis(top, order, 1)
    return s, ids[top]
