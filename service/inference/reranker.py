"""The in-process rerank interface the rerank routes call (``app.state.reranker``), as
:class:`~service.inference.embedder.Embedder` is for embeddings: a request's (query, document) pairs go through the loaded
reranker's batcher (:mod:`service.inference.onnx_reranker`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.inference.batch_errors import InputTooLong, RequestTooLarge
from service.inference.embedder import InvalidInput
from service.inference.model_registry import LoadedModel, ModelNotFound, ModelRegistry
from service.inference.onnx_encoder import ModelInfo
from service.inference.onnx_reranker import WrongModelTask


class NoRerankerLoaded(ModelNotFound):
    """A rerank request named no model and no reranker is loaded (a 404 ``model_not_found``, as an unknown model)."""

    def __init__(self, available: list[str], param: str = "model") -> None:
        super().__init__("<reranker>", available)
        self.args = ("no reranker is loaded (start with --rerank-models NAME or POST /admin/models/NAME/load)",)
        self.param = param


@dataclass
class RerankResult:
    """Raw scores ``(n,)`` float32 of the documents in request order, the model, and the pairs' tokens in all."""

    scores: np.ndarray
    model: ModelInfo
    prompt_tokens: int


class Reranker:
    """Scores (query, document) pairs with a loaded reranker through its batcher (never blocks the event loop)."""

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    def resolve(self, model: str | None, param: str = "model") -> LoadedModel:
        """The loaded reranker a request names; None or ``""``: the first reranker loaded (in load order).

        Raises:
            ModelNotFound: nothing loaded answers to ``model`` (404); NoRerankerLoaded, when none is named, if no
                reranker is loaded (404 as well).
            WrongModelTask: ``model`` is an embedding model (422 ``not_a_reranker``).
        """
        if not model:
            for lm in self.registry.all():
                if lm.is_reranker:
                    return lm
            raise NoRerankerLoaded([m.info.name for m in self.registry.all()], param)
        try:
            lm = self.registry.get(model)
        except ModelNotFound as e:
            e.param = param
            raise
        if not lm.is_reranker:
            raise WrongModelTask(lm.info.name, "embedding", "reranker", param)
        return lm

    async def rerank(
        self,
        query: str,
        documents: list[str],
        *,
        model: str | None = None,
        truncate: bool = True,
        truncation_direction: str = "right",
        param: str = "documents",
    ) -> RerankResult:
        """Raw scores of ``(query, documents[i])`` (TEI ``/rerank``, Cohere/Jina ``/v1/rerank``, ``/v2/rerank``).

        Args:
            query: non-empty string. documents: non-empty list of non-empty strings.
            truncate: cut each pair to ``max_seq_length`` tokens (longest side first); False: an over-long pair is a
                413 ``input_too_long`` naming ``param[i]``.
            truncation_direction: ``"right"`` keeps the start of what is cut, ``"left"`` its end.

        Raises:
            InvalidInput (422), ModelNotFound (404), WrongModelTask (422), InputTooLong / RequestTooLarge (413),
            QueueFull (429), BatchFailed (500), BatcherClosed (503).
        """
        if not isinstance(query, str) or not query:
            raise InvalidInput("query must be a non-empty string", "query")
        if not isinstance(documents, list) or not documents or not all(isinstance(t, str) and t for t in documents):
            raise InvalidInput(f"{param} must be a non-empty list of non-empty strings", param)
        lm = self.resolve(model)
        try:
            res = await lm.batcher.submit(
                [(query, d) for d in documents], truncate=truncate, direction=truncation_direction
            )
        except (InputTooLong, RequestTooLarge) as e:
            e.param = param
            raise
        return RerankResult(np.asarray(res.pooled[:, 0], np.float32), lm.info, res.prompt_tokens)
