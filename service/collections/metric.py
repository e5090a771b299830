"""What a collection's metric (``cosine``, ``dot``, ``l2``; ``sparse`` for sparse vectors) means for the vectors and
scores around the index, in one place (FAISS's own metric mapping is :func:`.index.base.faiss_metric`'s):

* ``cosine`` compares directions: vectors are stored and queried as unit rows (:func:`normalised`), so a zero vector
  has none (:func:`requires_non_zero`) and the magnitude never matters;
* ``dot`` and ``l2`` use the vectors as given: their magnitude is bounded so float32 scores stay finite
  (:func:`norm_bounded`);
* ``l2`` scores are distances, lower is better (:func:`is_distance`, :func:`higher_is_better`); its raw similarity
  (:func:`similarity_matrix`) is the negated squared distance, and a sum of those (a multivector's MAX_SIM) is
  reported as the square root of its magnitude, as Qdrant reports it (:func:`max_sim_score`);
* normalisation runs in float64: float32 under/overflows on extreme but finite inputs (``[1e-30] * 384`` has a
  float32 norm of 0, ``[3e38] * 384`` one of inf), which silently turned such queries into all-zero scores;
* examples of a multi-example query, once :func:`normalised`, are compared by the dot product, or by the negated
  squared distance for ``l2`` (:func:`example_metric`).
"""

from __future__ import annotations

import numpy as np


def unit_rows(v: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm, computed in float64; all-zero rows stay zero. Returns float32 ``(n, d)``."""
    x = np.asarray(v, dtype=np.float64)
    scale = np.max(np.abs(x), axis=1, keepdims=True)  # pre-scaling keeps the squares in range
    scale = np.where(scale > 0, scale, 1.0)
    y = x / scale
    n = np.linalg.norm(y, axis=1, keepdims=True)
    return np.ascontiguousarray(y / np.where(n > 0, n, 1.0), dtype=np.float32)


def normalised(v: np.ndarray, metric: str) -> np.ndarray:
    """Rows ``(n, d)`` as stored and searched with ``metric``: unit rows (float32, :func:`unit_rows`) for
    cosine, ``v`` itself otherwise."""
    return unit_rows(v) if metric == "cosine" else v


def requires_non_zero(metric: str) -> bool:
    """Whether a zero vector is meaningless under ``metric`` (cosine: it has no direction)."""
    return metric == "cosine"


def norm_bounded(metric: str) -> bool:
    """Whether a vector's magnitude enters the scores under ``metric`` (dot, l2), and so must be bounded
    (:data:`.vectors.MAX_NORM`)."""
    return metric != "cosine"


def is_distance(metric: str) -> bool:
    """Whether scores under ``metric`` are distances (l2: lower is better)."""
    return metric == "l2"


def higher_is_better(metric: str) -> bool:
    """True for similarity scores (cosine, dot, sparse), False for distances (l2)."""
    return not is_distance(metric)


def example_metric(metric: str) -> str:
    """The metric the examples of a multi-example query are compared in once :func:`normalised`: ``sparse`` and
    ``l2`` as they are, ``dot`` for cosine and dot."""
    return metric if metric in ("sparse", "l2") else "dot"


def similarity_matrix(a: np.ndarray, b: np.ndarray, metric: str) -> np.ndarray:
    """``(n, m)`` raw similarities (higher is better) of the rows of ``a`` (``(n, d)``) to those of ``b``
    (``(m, d)``): the negated squared distance for l2, the dot product of the unit rows for cosine, the dot product
    for dot."""
    if is_distance(metric):
        d2 = (a**2).sum(1)[:, None] - 2 * a @ b.T + (b**2).sum(1)[None, :]
        return -np.maximum(d2, 0.0)
    if metric == "cosine":
        a, b = unit_rows(a), unit_rows(b)
    return a @ b.T


def max_sim_score(total: float, metric: str) -> float:
    """The reported score of a multivector's MAX_SIM ``total`` (a sum of raw similarities): itself, or for l2 the
    square root of its magnitude (Qdrant's report of a sum of negated squared distances)."""
    return abs(total) ** 0.5 if is_distance(metric) else total
