"""Reranking: ``POST /rerank`` (TEI's shape) and ``POST /v1/rerank`` = ``POST /v2/rerank`` (Cohere's and Jina's).

A request's (query, document) pairs are scored by a loaded reranker (:class:`service.inference.reranker.Reranker`) through its
batcher, as embeddings are: the same token budget and fairness across requests, ``request_timeout_s``, 413 for more
than ``max_client_batch_size`` documents (``too_many_inputs``) or ``max_request_tokens`` tokens, 429 ``queue_full``;
422 for bad input (an empty query, no documents, an empty document), 404 for an unknown model or when no reranker is
loaded, 422 ``not_a_reranker`` for an embedding model named here (and ``not_an_embedding_model`` for a reranker named
on the embedding routes).

* TEI (text-embeddings-inference OpenAPI, ``RerankRequest`` / ``Rank``): ``{query, texts, raw_scores=false,
  return_text=false, truncate, truncation_direction}`` -> ``[{index, score, text?}]``, best first; ``score`` is the
  sigmoid of the model's logit unless ``raw_scores``.
* Cohere (API reference, "Rerank" v1 and v2) and Jina (``/v1/rerank``): ``{model, query, documents, top_n,
  return_documents=false}`` (a document a string or ``{"text": ...}``) -> ``{id, results: [{index, relevance_score,
  document?: {text}}], meta: {api_version, billed_units}, model, usage: {total_tokens}}``, best first, at most
  ``top_n``; ``relevance_score`` is the sigmoid of the logit (in [0, 1], as Cohere's). ``max_tokens_per_doc`` (v2) is
  accepted; pairs are cut at the model's ``max_seq_length`` tokens whatever it says.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.http.errors import APIError
from service.http.inference.embeddings import model_headers
from service.http.inference.schemas import Sentence, TeiOptions
from service.http.kit import JSONRoute, check_client_batch, json_response, refuse_prompt_name
from service.inference.reranker import Reranker

router = APIRouter(route_class=JSONRoute)


def _document(v: Any) -> Any:
    """A document is a string or Cohere/Jina's ``{"text": str}``; anything else is left for validation to refuse."""
    return v["text"] if isinstance(v, dict) and set(v) == {"text"} else v


Document = Annotated[Sentence, BeforeValidator(_document)]


class TeiRerankRequest(TeiOptions):
    """``POST /rerank`` (TEI's ``RerankRequest``); ``truncate`` null means true, as for ``/embed``."""

    query: Sentence
    texts: Annotated[list[Sentence], Field(min_length=1)]
    raw_scores: bool = Field(False, strict=True)
    return_text: bool = Field(False, strict=True)
    model: str | None = None


class CohereRerankRequest(BaseModel):
    """``POST /v1/rerank`` and ``POST /v2/rerank`` (Cohere's rerank request; Jina's has the same fields)."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())
    model: str | None = None
    query: Sentence
    documents: Annotated[list[Document], Field(min_length=1)]
    top_n: int | None = Field(None, ge=1, strict=True)
    return_documents: bool = Field(False, strict=True)
    max_tokens_per_doc: int | None = Field(None, ge=1, strict=True)


class TeiRank(BaseModel):
    """One item of ``POST /rerank``'s answer (TEI's ``Rank``)."""

    index: int
    score: float
    text: str | None = None


class CohereResult(BaseModel):
    """One item of ``results`` (Cohere's ``RerankResponseResultsItem``); ``document`` only with ``return_documents``."""

    index: int
    relevance_score: float
    document: dict[str, str] | None = None


class CohereRerankResponse(BaseModel):
    """Cohere's ``RerankResponse`` (``id``, ``results``, ``meta``) with Jina's ``model`` and ``usage``."""

    id: str
    results: list[CohereResult]
    meta: dict[str, Any]
    model: str
    usage: dict[str, int]


_ERRORS = (400, 401, 404, 413, 415, 422, 429, 503)
#: the rows of :data:`service.http.openapi.OPERATIONS` for these routes
RERANK_OPERATIONS = {
    ("POST", "/rerank"): (200, list[TeiRank], _ERRORS),
    ("POST", "/v1/rerank"): (200, CohereRerankResponse, _ERRORS),
    ("POST", "/v2/rerank"): (200, CohereRerankResponse, _ERRORS),
}


def reranker_of(request: Request) -> Reranker:
    """``app.state.reranker``, or 503 while the service is not ready."""
    rr = getattr(request.app.state, "reranker", None)
    if rr is None:
        raise APIError(503, "service is starting", code="model_not_ready")
    return rr


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` in float64 (what ``CrossEncoder.predict`` applies to a one-logit model's output)."""
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


@router.post("/rerank")
async def tei_rerank(body: TeiRerankRequest, request: Request) -> Response:
    """TEI rerank: ``[{index, score, text?}]``, every text once, by score, best first (ties: request order)."""
    refuse_prompt_name(body.prompt_name)
    check_client_batch(len(body.texts), request.app.state.settings, "texts")
    res = await reranker_of(request).rerank(
        body.query,
        body.texts,
        model=body.model,
        truncate=body.truncate is not False,
        truncation_direction=body.truncation_direction,
        param="texts",
    )
    scores = res.scores.astype(np.float64) if body.raw_scores else sigmoid(res.scores)
    order = np.argsort(-scores, kind="stable")
    out = [{"index": int(i), "score": float(scores[i])} for i in order]
    if body.return_text:
        for item in out:
            item["text"] = body.texts[item["index"]]
    return json_response(out, headers=model_headers(res.model))


@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def cohere_rerank(body: CohereRerankRequest, request: Request) -> Response:
    """Cohere/Jina rerank: ``{id, results: [{index, relevance_score, document?}], meta, model, usage}``, best first,
    the first ``top_n`` (all by default)."""
    check_client_batch(len(body.documents), request.app.state.settings, "documents")
    res = await reranker_of(request).rerank(body.query, body.documents, model=body.model, param="documents")
    scores = sigmoid(res.scores)
    order = np.argsort(-scores, kind="stable")[: body.top_n]
    results: list[dict[str, Any]] = [{"index": int(i), "relevance_score": float(scores[i])} for i in order]
    if body.return_documents:
        for r in results:
            r["document"] = {"text": body.documents[r["index"]]}
    version = "2" if request.url.path.endswith("/v2/rerank") else "1"
    meta = {"api_version": {"version": version}, "billed_units": {"search_units": 1}}
    usage = {"total_tokens": res.prompt_tokens}
    body_out = {"id": str(uuid.uuid4()), "results": results, "meta": meta, "model": res.model.name, "usage": usage}
    return json_response(body_out, headers=model_headers(res.model))
