"""Fusion of several ranked hit lists into one (hybrid retrieval: dense and sparse results of the same query).

* **RRF**, Reciprocal Rank Fusion (Cormack, Clarke & Büttcher, "Reciprocal Rank Fusion outperforms Condorcet and
  individual Rank Learning Methods", SIGIR 2009): a point scores ``sum_lists w / (rank + w * (k - 1))`` over the lists
  it appears in (``rank`` 1-based, weight ``w`` default 1), i.e. ``1 / (rank + k - 1)`` unweighted. With Qdrant's
  default ``k = 2`` the first of a list scores 1/2; this is Qdrant's formula (Qdrant documentation, "Hybrid Queries":
  ``fusion: rrf``, ``rrf: {k, weights}``), checked against qdrant-client's ``reciprocal_rank_fusion``.
* **DBSF**, Distribution-Based Score Fusion (Qdrant documentation, "Hybrid Queries": ``fusion: dbsf``; after
  Sakharov's "Distribution-Based Score Fusion"): each list's scores are normalised to ``(s - (mean - 3 sd)) / (6 sd)``
  (sample standard deviation; a list of one, or of equal scores, scores 0.5) and summed per point.

Ties keep the order in which points first appear (list by list), as the reference implementations do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from service.collections.reads import Hit

FUSIONS = ("rrf", "dbsf")
DEFAULT_RRF_K = 2  # Qdrant's default ranking constant


def rrf(
    lists: Sequence[Sequence[Hit]], limit: int, k: int = DEFAULT_RRF_K, weights: Sequence[float] | None = None
) -> list[Hit]:
    """The ``limit`` best points by Reciprocal Rank Fusion of ``lists`` (each best first); hits carry the fused score
    and the first list's text and payload of each point.

    Raises:
        ValueError: ``weights`` not one per list.
    """
    if weights is not None and len(weights) != len(lists):
        raise ValueError("rrf weights: one per prefetch")
    scores: dict[tuple[type, int | str], float] = {}
    first: dict[tuple[type, int | str], Hit] = {}
    for li, hits in enumerate(lists):
        w = 1.0 if weights is None else float(weights[li])
        for pos, h in enumerate(hits):
            key = (type(h.id), h.id)
            s = 0.0 if w <= 0 else 1.0 / ((pos + 1.0) / w + k - 1.0)
            scores[key] = scores.get(key, 0.0) + s
            first.setdefault(key, h)
    return _ranked(scores, first, limit)


def dbsf(lists: Sequence[Sequence[Hit]], limit: int) -> list[Hit]:
    """The ``limit`` best points by Distribution-Based Score Fusion of ``lists`` (each best first)."""
    scores: dict[tuple[type, int | str], float] = {}
    first: dict[tuple[type, int | str], Hit] = {}
    for hits in lists:
        if not hits:
            continue
        vals = [h.score for h in hits]
        mean = sum(vals) / len(vals)
        sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
        for h in hits:
            key = (type(h.id), h.id)
            s = 0.5 if sd == 0 else (h.score - (mean - 3 * sd)) / (6 * sd)
            scores[key] = scores.get(key, 0.0) + s
            first.setdefault(key, h)
    return _ranked(scores, first, limit)


def _ranked(scores: dict, first: dict, limit: int) -> list[Hit]:
    order = sorted(scores, key=lambda key: scores[key], reverse=True)[:limit]  # stable: ties in first-seen order
    return [Hit(first[key].id, scores[key], first[key].text, first[key].payload) for key in order]


def fuse(
    method: str,
    lists: Sequence[Sequence[Hit]],
    limit: int,
    k: int | None = None,
    weights: Sequence[float] | None = None,
) -> list[Hit]:
    """``rrf`` or ``dbsf`` of ``lists``.

    Raises:
        ValueError: an unknown method, or RRF weights that are not one per list.
    """
    if method == "rrf":
        return rrf(lists, limit, DEFAULT_RRF_K if k is None else k, weights)
    if method == "dbsf":
        return dbsf(lists, limit)
    raise ValueError(f"fusion must be one of {FUSIONS}, got {method!r}")
