"""Vector checks and arithmetic shared by the collection, its re-embedding and its queries (one place); what a metric
asks of a vector is :mod:`.metric`'s."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.collections.errors import InvalidCollectionRequest
from service.collections.metric import norm_bounded, requires_non_zero

#: largest query-vector norm for ``dot`` and ``l2``: scores and squared distances then stay finite in float32
#: against unit-scale points (``MAX_NORM**2`` is below float32's 3.4e38)
MAX_NORM = 1e18


def query_problem(v: np.ndarray, metric: str) -> str | None:
    """Why a query vector ``(d,)`` cannot be searched with ``metric``, or None when it can."""
    if not np.all(np.isfinite(v)):
        return "query vector must be finite"
    if requires_non_zero(metric) and not np.any(v):
        return "query vector must be non-zero for cosine"
    if norm_bounded(metric) and float(np.linalg.norm(np.asarray(v, dtype=np.float64))) > MAX_NORM:
        return f"query vector norm must be at most {MAX_NORM:g} for {metric} (float32 scores would overflow)"
    return None


def average_vector(positive: np.ndarray, negative: np.ndarray) -> np.ndarray:
    """The query of a recommendation by Qdrant's ``average_vector`` strategy (Qdrant documentation, "Explore the data":
    Recommendation API): ``avg(positive)`` without negatives, else ``avg(positive) + (avg(positive) - avg(negative))``.

    Args:
        positive: ``(p, d)``, ``p >= 1`` examples to move towards.
        negative: ``(n, d)``, ``n >= 0`` examples to move away from.

    Returns:
        float32 ``(d,)``, computed in float64 (an overflow shows as a non-finite value, which :func:`query_problem`
        refuses).
    """
    avg = np.asarray(positive, dtype=np.float64).mean(axis=0)
    if len(negative):
        avg = 2 * avg - np.asarray(negative, dtype=np.float64).mean(axis=0)
    with np.errstate(over="ignore"):
        return avg.astype(np.float32)


def given_vectors(given: dict[int, Any], n: int, spec: Any, collection: str) -> tuple[np.ndarray, list[int]]:
    """float32 ``(n, d)`` holding the client's vectors ``given`` (by position among an upsert's ``n`` points) of a
    collection whose model-bound vector has the index ``spec`` (dimension, metric), and the positions left to embed.

    Raises:
        InvalidCollectionRequest: a given vector of the wrong dimension (``wrong_dimension``), not finite, or zero
            for cosine.
    """
    d = spec.dimension
    out = np.empty((n, d), dtype=np.float32)
    pos = list(given)
    try:  # all at once (one conversion, the checks vectorised); a bad one is then found one by one below
        x = np.asarray([given[i] for i in pos], dtype=np.float32)
    except (TypeError, ValueError):
        x = np.zeros(0, np.float32)
    if pos and x.shape == (len(pos), d) and _rows_ok(x, spec.metric):
        out[pos] = x
        pos = []
    for i in pos:
        x = np.asarray(given[i], dtype=np.float32)
        if x.shape != (d,):
            raise InvalidCollectionRequest(
                f"vector has dimension {x.size}; collection {collection!r} has {d}",
                f"points[{i}].vector",
                "wrong_dimension",
            )
        if (problem := query_problem(x, spec.metric)) is not None:
            raise InvalidCollectionRequest(problem.replace("query vector", "vector"), f"points[{i}].vector")
        out[i] = x
    return out, [i for i in range(n) if i not in given]


def _rows_ok(x: np.ndarray, metric: str) -> bool:
    """Whether :func:`query_problem` finds no problem in any row of ``x`` ``(m, d)`` (vectorised)."""
    if not np.isfinite(x).all():
        return False
    if requires_non_zero(metric) and not x.any(axis=1).all():
        return False
    return not (norm_bounded(metric) and float(np.linalg.norm(x.astype(np.float64), axis=1).max()) > MAX_NORM)


def stored_vector(point: dict[str, Any], bound: bool, name: str) -> Any:
    """The value of the vector ``name`` in a stored point as the core reads it (``{id, text, payload, vector,
    vectors}``): ``vector`` for the model-bound one (``bound``), ``vectors[name]`` for the others; None if absent."""
    return point.get("vector") if bound else (point.get("vectors") or {}).get(name)
