"""Queries scored against several example vectors at once (Qdrant's Explore API: the recommendation strategies
``best_score`` and ``sum_scores``, discovery and context search), scored exactly over every candidate point.

Source: Qdrant documentation, "Explore the data" (https://qdrant.tech/documentation/concepts/explore/): recommendation
strategies, Discovery API (target and context pairs, "Context search"); the formulas as Qdrant's segment code and
qdrant-client's local mode compute them. Each score is built from the raw similarity ``sim(x, e)`` of a candidate
``x`` to an example ``e``: the dot product for ``dot`` and for ``cosine`` (stored and example vectors unit-normalised),
minus the squared distance for ``l2``. With ``f(s) = s / (1 + |s|)`` (fast sigmoid) and ``g(s) = (f(s) + 1) / 2``:

* **best_score**: ``p = max_i sim(x, pos_i)``, ``n = max_j sim(x, neg_j)`` (-inf without examples); ``g(p)`` when
  ``p > n``, else ``-g(n)``;
* **sum_scores**: ``sum_i sim(x, pos_i) - sum_j sim(x, neg_j)``;
* **discover**: ``rank + g(sim(x, target))``, ``rank = sum over pairs of sign(sim(x, pos) - sim(x, neg))``;
* **context**: ``sum over pairs of f(min(sim(x, pos) - sim(x, neg) - eps, 0))`` (eps = 2**-23, f32's epsilon);
* **relevance_feedback** (Qdrant's naive feedback strategy, API reference ``RelevanceFeedbackInput``,
  ``NaiveFeedbackStrategy {a, b, c}``): ``a * sim(x, target) + sum over ordered pairs (i, j) of feedback examples
  with confidence s_i - s_j > 0 of (s_i - s_j)^b * c * (sim(x, e_i) - sim(x, e_j))``, ``s`` the examples' given
  relevance scores.

Higher is better for every kind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.collections.errors import InvalidCollectionRequest
from service.collections.metric import example_metric, normalised, similarity_matrix
from service.collections.schema import sparse_vec
from service.collections.stopping import check

EPSILON = np.float32(1.1920929e-7)
KINDS = ("best_score", "sum_scores", "discover", "context", "relevance_feedback")


def fast_sigmoid(s: np.ndarray) -> np.ndarray:
    """``s / (1 + |s|)``, elementwise (inf and NaN unchanged)."""
    with np.errstate(invalid="ignore"):
        out = s / (1.0 + np.abs(s))
    return np.where(np.isfinite(s), out, s)


def _g(s: np.ndarray) -> np.ndarray:
    return 0.5 * (fast_sigmoid(s) + 1.0)


@dataclass
class Scorer:
    """A multi-example query (module docstring): ``kind`` one of :data:`KINDS`; ``metric`` ``dot``, ``l2`` or
    ``sparse``; examples as lists: float32 ``(d,)`` rows prepared for the metric (unit-normalised for cosine), or
    :class:`~.schema.SparseVec`; ``pairs`` as ``(positive, negative)`` examples."""

    kind: str
    metric: str
    positive: list[Any] = field(default_factory=list)
    negative: list[Any] = field(default_factory=list)
    target: Any = None
    pairs: list[tuple[Any, Any]] = field(default_factory=list)
    #: relevance_feedback: the target's weight ``a`` and each pair's weight ``(s_i - s_j)^b * c``
    a: float = 1.0
    weights: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return 1  # one query (a search's batch of queries is one scorer)

    def sims(self, examples: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``(k, n)`` raw similarities of ``n`` candidates ``x`` (``(n, d)``) to ``k`` examples."""
        if len(examples) == 0:
            return np.zeros((0, len(x)), np.float32)
        return similarity_matrix(examples, x, self.metric).astype(np.float32)

    def scores(self, x: np.ndarray) -> np.ndarray:
        """float32 ``(n,)`` scores of the dense candidates ``x`` (``(n, d)``), higher is better."""
        return self.score_with(lambda e: self.sims(np.asarray(e)[None], x)[0], len(x))

    def score_with(self, sim: Callable[[Any], np.ndarray], n: int) -> np.ndarray:
        """float32 ``(n,)`` scores of ``n`` candidates given ``sim(example)``, their ``(n,)`` similarities to one
        example (dense rows or sparse vectors alike), by the formulas of the module docstring; ``n`` may be 0 (an
        empty ``(0,)`` answer)."""
        if self.kind in ("best_score", "sum_scores"):
            # shapes given, not inferred: ``(k, 0)`` with no candidate (an empty or fully filtered collection)
            pos = np.array([sim(e) for e in self.positive], np.float32).reshape(len(self.positive), n)
            neg = np.array([sim(e) for e in self.negative], np.float32).reshape(len(self.negative), n)
            if self.kind == "sum_scores":
                return (pos.sum(0) - neg.sum(0)).astype(np.float32)
            p = pos.max(0) if len(pos) else np.full(n, -np.inf, np.float32)
            q = neg.max(0) if len(neg) else np.full(n, -np.inf, np.float32)
            return np.where(p > q, _g(p), -_g(q)).astype(np.float32)
        if self.kind == "relevance_feedback":
            total = (self.a * sim(self.target)).astype(np.float32)
            for (pos, neg), w in zip(self.pairs, self.weights):
                total += np.float32(w) * (sim(pos) - sim(neg))
            return total
        total = np.zeros(n, np.float32)
        for pos, neg in self.pairs:
            diff = sim(pos) - sim(neg)
            if self.kind == "discover":
                total += np.sign(diff).astype(np.float32)
            else:
                total += fast_sigmoid(np.minimum(diff - EPSILON, 0.0)).astype(np.float32)
        if self.kind == "discover" and self.target is not None:
            total += _g(sim(self.target)).astype(np.float32)
        return total


def top(scorer: Scorer, chunks, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best candidates of ``chunks`` (``(ids, vectors)`` pairs, each ``(c,)``/``(c, d)``) by
    ``scorer``: ``(scores, ids)``, each ``(<=k,)``, best first (ties by id)."""
    best_s = np.zeros(0, np.float32)
    best_i = np.zeros(0, np.int64)
    for ids, x in chunks:
        check()  # a chunk at a time: the scan stops with its request
        if len(ids) == 0:
            continue
        s = np.concatenate([best_s, scorer.scores(np.asarray(x, np.float32))])
        i = np.concatenate([best_i, np.asarray(ids, np.int64)])
        order = np.lexsort((i, -s))[:k]
        best_s, best_i = s[order], i[order]
    return best_s, best_i


def examples(raw: dict[str, Any], param: str, one: Callable[[Any, str], Any]) -> tuple[list, list, Any, list]:
    """A scorer query's examples, each read by ``one(value, path)``: ``(positive, negative, target or None,
    [(positive, negative)] pairs)``.

    Raises:
        InvalidCollectionRequest: a pair that is not ``[positive, negative]``, and what ``one`` raises.
    """
    pos = [one(x, f"{param}.positive[{i}]") for i, x in enumerate(raw.get("positive") or [])]
    neg = [one(x, f"{param}.negative[{i}]") for i, x in enumerate(raw.get("negative") or [])]
    target = one(raw["target"], f"{param}.target") if raw.get("target") is not None else None
    pairs = []
    for i, p in enumerate(raw.get("pairs") or []):
        if not isinstance(p, list) or len(p) != 2:
            raise InvalidCollectionRequest(f"{param}.pairs[{i}]: a pair is [positive, negative]", f"{param}.pairs")
        pairs.append((one(p[0], f"{param}.pairs[{i}][0]"), one(p[1], f"{param}.pairs[{i}][1]")))
    return pos, neg, target, pairs


def scorer_of(raw: dict[str, Any], metric: str, dimension: int, param: str) -> Scorer:
    """A :class:`Scorer` of the native query ``{"scorer": kind, "positive": [examples], "negative": [examples],
    "target": example, "pairs": [[positive, negative], ...]}``: on a dense vector of ``metric`` and ``dimension`` every
    example a vector (unit-normalised for cosine, as stored vectors are); on a sparse one (``metric`` ``sparse``) an
    ``{indices, values}``.

    Raises:
        InvalidCollectionRequest: an unknown kind or field, a malformed example (a vector of another dimension, not
            finite), no example (best_score/sum_scores need one, discover a target, context a pair).
    """
    kind = raw.get("scorer")
    if kind not in KINDS or set(raw) - {"scorer", "positive", "negative", "target", "pairs", "feedback", "a", "b", "c"}:
        raise InvalidCollectionRequest(
            f"{param}: a scorer query is {{scorer: {'|'.join(KINDS)}, positive, negative, "
            "target, pairs, feedback, a, b, c}",
            param,
        )

    def one(x: Any, at: str) -> Any:
        if metric == "sparse":
            if not isinstance(x, dict) or set(x) != {"indices", "values"}:
                raise InvalidCollectionRequest(f"{at}: a sparse example is {{indices, values}}", at)
            return sparse_vec(x["indices"], x["values"], at)
        try:
            a = np.asarray(x, dtype=np.float32)
        except (TypeError, ValueError):
            a = np.zeros(0, np.float32)
        if a.shape != (dimension,):
            raise InvalidCollectionRequest(f"{at}: a vector of dimension {dimension}", at, "wrong_dimension")
        if not np.all(np.isfinite(a)):
            raise InvalidCollectionRequest(f"{at}: vectors must be finite", at)
        return normalised(a[None], metric)[0]

    pos, neg, target, pairs = examples(raw, param, one)
    if (
        (kind in ("best_score", "sum_scores") and not pos + neg)
        or (kind == "context" and not pairs)
        or (kind in ("discover", "relevance_feedback") and target is None)
    ):
        raise InvalidCollectionRequest(f"{param}: the {kind} query needs its examples", param)
    m = example_metric(metric)
    if kind != "relevance_feedback":
        return Scorer(kind, m, pos, neg, target, pairs)
    coef = {k: raw.get(k, 1.0) for k in "abc"}
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in coef.values()):
        raise InvalidCollectionRequest(f"{param}: a, b and c must be finite numbers", param)
    items = []
    for i, f in enumerate(raw.get("feedback") or []):
        if not isinstance(f, list) or len(f) != 2 or isinstance(f[1], bool) or not isinstance(f[1], (int, float)):
            raise InvalidCollectionRequest(f"{param}.feedback[{i}]: an item is [example, score]", f"{param}.feedback")
        items.append((one(f[0], f"{param}.feedback[{i}][0]"), float(f[1])))
    ranked = [
        (items[i][0], items[j][0], items[i][1] - items[j][1])
        for i in range(len(items))
        for j in range(len(items))
        if i != j and items[i][1] - items[j][1] > 0.0
    ]
    weights = [float(conf ** coef["b"] * coef["c"]) for _, _, conf in ranked]
    return Scorer(kind, m, target=target, pairs=[(p, n) for p, n, _ in ranked], a=float(coef["a"]), weights=weights)
