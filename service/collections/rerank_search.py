"""Reranking inside a native search: ``POST /collections/{name}/search`` (and each search of ``/search/batch``) with
``rerank: {model, candidates, top_n}``.

The search runs as asked (``mode`` dense, sparse or hybrid; ``filter``, ``score_threshold`` and ``using`` apply to it)
for ``candidates`` hits (default 100, at most ``collections_max_top_k``), their stored texts are scored against the
query text by a loaded reranker (a cross-encoder artifact, ``task: "reranker"``) through that model's batcher, as
``POST /rerank`` scores its pairs (the same token budget, fairness, truncation to the model's ``max_seq_length``), and
the best ``top_n`` (default: the search's ``top_k``) come back ordered by the reranker's score, which becomes each
hit's ``score`` (the model's raw score, a logit: ``/rerank``'s ``raw_scores: true``; higher is better). Points
without stored text (upserted as vectors only) cannot be scored and are left out.

Errors (JSON, 4xx): the query must be a text (422 ``invalid_value`` naming ``query``: a reranker reads the query's
text); ``rerank.model`` unknown: 404 ``model_not_found``; an embedding model named: 422 ``not_a_reranker``; no model
named and no reranker loaded: 409 ``model_unavailable``; ``rerank.candidates`` above ``collections_max_top_k``: 422.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from service.collections.errors import InvalidCollectionRequest, ModelUnavailable
from service.collections.vector_backend import Hit, ReadConsistency
from service.inference.reranker import NoRerankerLoaded, Reranker


class RerankOptions(BaseModel):
    """A search's ``rerank``: ``model`` (a loaded reranker; default the first loaded), ``candidates`` (first-stage
    hits scored, default 100, at most ``collections_max_top_k``), ``top_n`` (hits answered, default ``top_k``)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    model: StrictStr | None = None
    candidates: StrictInt = Field(100, ge=1)
    top_n: StrictInt | None = Field(None, ge=1)


async def search(svc: Any, name: str, searches: Sequence[Any], param: str, rc: ReadConsistency) -> list[list[Hit]]:
    """:meth:`~.service.CollectionService.search` of ``searches``, those with a ``rerank`` reranked (module docstring).

    Args:
        svc: the :class:`~.service.CollectionService`. searches: the API's ``SearchRequest``\\ s. param: ``query``
            (one search) or ``searches`` (a batch), naming the field at fault. The reranker is reached through the
            service's embedder (its model registry), as the collections reach their embedding models.

    Raises:
        as :meth:`~.service.CollectionService.search`; InvalidCollectionRequest (a vector query, too many candidates),
        ModelUnavailable (no reranker loaded), ModelNotFound, WrongModelTask, ModelNotReady (starting), and
        :meth:`~service.inference.reranker.Reranker.rerank`'s errors (413, 429, 500, 503).
    """
    if all(getattr(s, "rerank", None) is None for s in searches):
        return await svc.search(name, searches, param, rc)
    reranker = Reranker(svc.embedder().registry)  # ModelNotReady (503) while the service starts
    pres = [f"{param}[{i}]." if param == "searches" else "" for i in range(len(searches))]
    firsts = [s if s.rerank is None else _first_stage(svc, s, reranker, pre) for s, pre in zip(searches, pres)]
    results = await svc.search(name, firsts, param, rc)
    for i, s in enumerate(searches):
        if s.rerank is not None:
            results[i] = await _rerank(s, results[i], reranker, pres[i])
    return results


def _first_stage(svc: Any, s: Any, reranker: Reranker, pre: str) -> Any:
    """The search ``s`` asking for its ``rerank.candidates`` hits, with their texts (its reranker checked first)."""
    if not isinstance(s.query, str):
        raise InvalidCollectionRequest(
            "a search with 'rerank' needs a text query (the reranker scores the query's text against each hit's)",
            f"{pre}query",
        )
    if s.rerank.candidates > svc.settings.max_top_k:
        raise InvalidCollectionRequest(
            f"rerank.candidates must be at most {svc.settings.max_top_k} (collections_max_top_k)",
            f"{pre}rerank.candidates",
        )
    try:
        reranker.resolve(s.rerank.model, f"{pre}rerank.model")
    except NoRerankerLoaded as e:
        raise ModelUnavailable(f"no reranker is loaded for {pre}rerank: {e}") from e
    return dataclasses.replace(s, top_k=s.rerank.candidates, with_text=True, rerank=None)


async def _rerank(s: Any, hits: list[Hit], reranker: Reranker, pre: str) -> list[Hit]:
    """The hits with text, scored by the reranker, best first, the first ``top_n``."""
    scored = [h for h in hits if h.text]
    if not scored:
        return []
    res = await reranker.rerank(s.query, [h.text for h in scored], model=s.rerank.model, param=f"{pre}candidates")
    order = sorted(range(len(scored)), key=lambda j: -float(res.scores[j]))[: s.rerank.top_n or s.top_k]
    return [dataclasses.replace(scored[j], score=float(res.scores[j])) for j in order]
