"""Multi-example queries (:mod:`.scorers`: ``best_score``, ``sum_scores``, ``discover``, ``context``) on a
multivector, whose points and examples are matrices compared by MAX_SIM, as qdrant-client's local mode scores them
(its ``multi_distances``: ``MultiRecoQuery``, ``MultiDiscoveryQuery``, ``MultiContextQuery``): the similarity of a
candidate to an example is the raw MAX_SIM total (:func:`max_sim_totals`: over the example's rows, the best raw
similarity to the candidate's rows; dot of unit rows for cosine, dot, minus the squared distance for l2), and the
scores are :mod:`.scorers`' formulas of those. ``relevance_feedback`` is not offered on a multivector (local mode
scores its examples as single vectors).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.collections.errors import InvalidCollectionRequest
from service.collections.metric import example_metric, is_distance, normalised
from service.collections.scorers import Scorer, examples

KINDS = ("best_score", "sum_scores", "discover", "context")


def max_sim_totals(example: np.ndarray, matrices: list[np.ndarray], metric: str) -> np.ndarray:
    """float32 ``(n,)`` raw MAX_SIM totals of the query or example rows ``example`` (``(m, d)``, prepared: unit rows
    for cosine) against each stored matrix of ``matrices`` (each ``(m_i, d)``, as stored): the sum over the rows of
    ``example`` of their best similarity to the matrix's rows (dot; minus the squared distance for l2)."""
    out = np.zeros(len(matrices), np.float32)
    for j, m in enumerate(matrices):
        sim = -((example[:, None, :] - m[None, :, :]) ** 2).sum(-1) if is_distance(metric) else example @ m.T
        out[j] = sim.max(1).sum()
    return out


def multi_scorer_of(raw: dict[str, Any], metric: str, dimension: int, param: str) -> Scorer:
    """A :class:`~.scorers.Scorer` of the native query ``{"scorer": kind, "positive": [matrices], "negative":
    [matrices], "target": matrix, "pairs": [[positive, negative], ...]}`` on a multivector of ``metric`` with rows of
    ``dimension`` floats; every example float32 ``(m, dimension)``, unit rows for cosine (as queries are prepared).

    Raises:
        InvalidCollectionRequest: an unknown kind or field, ``relevance_feedback`` (``unsupported``), an example
            that is no matrix of finite rows of ``dimension`` floats (``wrong_dimension``), no example (best_score and
            sum_scores need one, discover a target, context a pair).
    """
    kind = raw.get("scorer")
    if kind == "relevance_feedback":
        raise InvalidCollectionRequest("relevance_feedback on a multivector is not supported", param, "unsupported")
    if kind not in KINDS or set(raw) - {"scorer", "positive", "negative", "target", "pairs"}:
        raise InvalidCollectionRequest(
            f"{param}: a scorer query on a multivector is {{scorer: {'|'.join(KINDS)}, positive, negative, target, "
            "pairs}",
            param,
        )

    def one(x: Any, at: str) -> np.ndarray:
        try:
            a = np.asarray(x, dtype=np.float32)
        except (TypeError, ValueError):
            a = np.zeros(0, np.float32)
        if a.ndim != 2 or a.shape[1:] != (dimension,) or not len(a) or not np.all(np.isfinite(a)):
            raise InvalidCollectionRequest(
                f"{at}: a matrix of finite rows of {dimension} floats", at, "wrong_dimension"
            )
        return normalised(a, metric)

    pos, neg, target, pairs = examples(raw, param, one)
    if (kind in ("best_score", "sum_scores") and not pos + neg) or (kind == "context" and not pairs):
        raise InvalidCollectionRequest(f"{param}: the {kind} query needs its examples", param)
    if kind == "discover" and target is None:
        raise InvalidCollectionRequest(f"{param}: the discover query needs its target", param)
    return Scorer(kind, example_metric(metric), pos, neg, target, pairs)
