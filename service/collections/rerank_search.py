"""Reranking inside a native search: ``POST /collections/{name}/search`` (and each search of ``/search/batch``) with
``rerank: {model, candidates, top_n, weight}``.

The search runs as asked (``mode`` dense, sparse or hybrid; ``filter``, ``score_threshold`` and ``using`` apply to it)
for ``candidates`` hits (default 100, at most ``collections_max_top_k``), their stored texts are scored against the
query text by a loaded reranker (a cross-encoder artifact, ``task: "reranker"``) through that model's batcher, as
``POST /rerank`` scores its pairs (the same token budget, fairness, truncation to the model's ``max_seq_length``), and
the best ``top_n`` (default: the search's ``top_k``) come back ordered by the reranker's score, which becomes each
hit's ``score`` (the model's raw score, a logit: ``/rerank``'s ``raw_scores: true``; higher is better). Points
without stored text (upserted as vectors only) cannot be scored and are left out.

``weight`` (alpha in [0, 1], default 1) fuses the two stages instead (:func:`fused`): each hit scores
``alpha * mm(rerank) + (1 - alpha) * mm(first stage)``, ``mm`` the min-max normalisation over the scored candidates
(the convex combination of min-max normalised scores of Bruch, Gai & Ingber, "An Analysis of Fusion Functions for
Hybrid Retrieval", ACM TOIS 2023, arXiv:2210.11934, section 4; min-max after Lee, SIGIR 1997), the hits ordered by
it (ties: the first stage's order). Alpha 1 answers the reranker's raw score, as without ``weight``; alpha 0 keeps the
first stage's order. The answered ``score`` is the fused one, in [0, 1].

Errors (JSON, 4xx): the query must be a text (422 ``invalid_value`` naming ``query``: a reranker reads the query's
text); ``rerank.model`` unknown: 404 ``model_not_found``; an embedding model named: 422 ``not_a_reranker``; no model
named and no reranker loaded: 409 ``model_unavailable``; ``rerank.candidates`` above ``collections_max_top_k``: 422.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from service.collections.errors import InvalidCollectionRequest, ModelUnavailable, RerankerNotLoaded
from service.collections.ports import InferencePort
from service.collections.searching import Searcher
from service.collections.vector_backend import Hit, ReadConsistency


async def search(
    searcher: Searcher, name: str, searches: Sequence[Any], param: str, rc: ReadConsistency
) -> list[list[Hit]]:
    """:meth:`~.service.CollectionService.search` of ``searches``, those with a ``rerank`` reranked (module docstring).

    Args:
        searcher: the collections' :class:`~.searching.Searcher` (its inference port scores the pairs).
            searches: :class:`~.query_model.SearchQuery`\\ s. param: ``query`` (one search) or ``searches`` (a batch),
            naming the field at fault.

    Raises:
        as :meth:`~.service.CollectionService.search`; InvalidCollectionRequest (a vector query, too many candidates),
        ModelUnavailable (no reranker loaded), ModelNotFound, WrongModelTask, ModelNotReady (starting), and
        :meth:`~.ports.InferencePort.rerank`'s errors (413, 429, 500, 503).
    """
    if all(getattr(s, "rerank", None) is None for s in searches):
        return await searcher.search(name, searches, param, rc)
    reranker = searcher.embedding.inference  # ModelNotReady (503) while the service starts
    pres = [f"{param}[{i}]." if param == "searches" else "" for i in range(len(searches))]
    firsts = [
        s if s.rerank is None else _first_stage(searcher.reads.settings.max_top_k, s, reranker, pre)
        for s, pre in zip(searches, pres)
    ]
    results = await searcher.search(name, firsts, param, rc)
    for i, s in enumerate(searches):
        if s.rerank is not None:
            async with searcher.rerank_turns.gate(name):  # one collection's reranks never fill the reranker's queue
                results[i] = await _rerank(s, results[i], reranker, pres[i])
    return results


def _first_stage(max_top_k: int, s: Any, reranker: InferencePort, pre: str) -> Any:
    """The search ``s`` asking for its ``rerank.candidates`` hits, with their texts (its reranker checked first)."""
    if not isinstance(s.query, str):
        raise InvalidCollectionRequest(
            "a search with 'rerank' needs a text query (the reranker scores the query's text against each hit's)",
            f"{pre}query",
        )
    if s.rerank.candidates > max_top_k:
        raise InvalidCollectionRequest(
            f"rerank.candidates must be at most {max_top_k} (collections_max_top_k)",
            f"{pre}rerank.candidates",
        )
    try:
        reranker.check_reranker(s.rerank.model, f"{pre}rerank.model")
    except RerankerNotLoaded as e:
        raise ModelUnavailable(f"no reranker is loaded for {pre}rerank: {e}") from e
    return dataclasses.replace(s, top_k=s.rerank.candidates, with_text=True, rerank=None)


async def _rerank(s: Any, hits: list[Hit], reranker: InferencePort, pre: str) -> list[Hit]:
    """The hits with text, scored by the reranker, best first, the first ``top_n``."""
    scored = [h for h in hits if h.text]
    if not scored:
        return []
    scores = await reranker.rerank(s.query, [h.text for h in scored], model=s.rerank.model, param=f"{pre}candidates")
    final = fused([float(x) for x in scores], [h.score for h in scored], s.rerank.weight)
    order = sorted(range(len(scored)), key=lambda j: -final[j])[: s.rerank.top_n or s.top_k]
    return [dataclasses.replace(scored[j], score=final[j]) for j in order]


def min_max(scores: Sequence[float]) -> list[float]:
    """``(s - min) / (max - min)`` of each score, in [0, 1] (Lee, "Analyses of multiple evidence combination", SIGIR
    1997); every score 0 when they are all equal (or there are none)."""
    lo, hi = min(scores, default=0.0), max(scores, default=0.0)
    return [(x - lo) / (hi - lo) if hi > lo else 0.0 for x in scores]


def fused(rerank: Sequence[float], first: Sequence[float], weight: float) -> list[float]:
    """Each candidate's final score: the reranker's raw score for ``weight`` 1, else ``weight * min_max(rerank) +
    (1 - weight) * min_max(first)`` (Bruch et al., arXiv:2210.11934, the convex combination "TM2C2" of min-max
    normalised scores).

    Args:
        rerank: the reranker's raw scores of the candidates (higher is better).
        first: the first stage's scores of the same candidates, in its order (best first). A first stage whose
            first score is below its last (a distance: l2) is negated, so higher is better for both.
        weight: alpha in [0, 1].
    """
    if weight >= 1.0:
        return list(rerank)
    sign = -1.0 if first and first[0] < first[-1] else 1.0
    r, f = min_max(rerank), min_max([sign * x for x in first])
    return [weight * a + (1.0 - weight) * b for a, b in zip(r, f)]
