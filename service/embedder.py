"""The in-process embedding interface: what routes and ``service.collections`` call.

``app.state.embedder`` is an :class:`Embedder`. Stable interface::

    result = await app.state.embedder.embed(texts, model=None)
    result.embeddings   # np.float32, shape (len(texts), dimension), rows L2-normalised
    result.model        # ModelInfo: .name .version .sha256 .dimension (.max_seq_length)
    result.prompt_tokens  # int, tokens after truncation, special tokens included

Errors are :class:`service.errors.APIError` (already in the HTTP shape, so a
route may let them propagate): 404 ``model_not_found``, 413 ``input_too_long``,
422 ``invalid_value``, 429 ``queue_full`` (with ``Retry-After``), 500
``inference_failed``, 503 ``shutting_down`` / ``model_not_ready``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from artifact_contract import postprocess

from .backend import ModelInfo
from .batcher import BatcherClosed, BatchFailed, InputTooLong, QueueFull
from .errors import APIError
from .registry import LoadedModel, ModelNotFound, ModelRegistry


@dataclass
class EmbedResult:
    """Embeddings of a list of texts.

    ``embeddings``: float32 ``(n, d)`` with ``d`` = ``dimensions`` if asked, else
    ``model.dimension``; L2-normalised unless ``normalize=False`` was asked of :meth:`Embedder.encode`.
    """

    embeddings: np.ndarray
    model: ModelInfo
    prompt_tokens: int


class Embedder:
    """Embeds texts with a loaded model through its batcher (never blocks the event loop)."""

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    def resolve(self, model: str | None, param: str = "model") -> LoadedModel:
        """The loaded model a request names (None: the active one).

        Raises:
            APIError: 404 ``model_not_found``; 503 ``model_not_ready`` when none is loaded.
        """
        try:
            return self.registry.get(model)
        except ModelNotFound as e:
            if model is None or model == "":
                raise APIError(503, "no model is loaded yet", code="model_not_ready") from e
            raise APIError(404, str(e), param=param, code="model_not_found") from e

    async def embed(self, texts: list[str], *, model: str | None = None) -> EmbedResult:
        """L2-normalised embeddings of ``texts`` (truncated to the model's max_seq_length).

        Args:
            texts: non-empty list of strings.
            model: a loaded model's ``name`` or ``name:version``; None for the active model.

        Raises:
            APIError: see the module docstring.
        """
        return await self.encode(texts, model=model)

    async def encode(
        self,
        texts: list[str],
        *,
        model: str | None | LoadedModel = None,
        truncate: bool = True,
        normalize: bool = True,
        dimensions: int | None = None,
        param: str = "input",
    ) -> EmbedResult:
        """Like :meth:`embed` with the request options of the HTTP API.

        Args:
            truncate: cut inputs to ``max_seq_length`` tokens; if False, an over-long input is a 413.
            normalize: L2-normalise rows (``dimensions`` always renormalises).
            dimensions: keep the first ``dimensions`` columns, in ``[1, dimension]``.
            param: the request field named in errors about the inputs.

        Raises:
            APIError: see the module docstring.
        """
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise APIError(422, "texts must be a non-empty list of strings", param=param, code="invalid_value")
        lm = model if isinstance(model, LoadedModel) else self.resolve(model)
        dim = lm.info.dimension
        if dimensions is not None and not 1 <= dimensions <= dim:
            raise APIError(
                422,
                f"dimensions must be between 1 and {dim} for model {lm.info.name}, got {dimensions}",
                param="dimensions",
                code="invalid_value",
            )
        try:
            res = await lm.batcher.submit(texts, truncate=truncate)
        except QueueFull as e:
            raise APIError(
                429, f"server busy: {e}; retry later", code="queue_full", headers={"Retry-After": "1"}
            ) from e
        except InputTooLong as e:
            raise APIError(
                413,
                f"{param}[{e.index}] has {'at least ' if e.at_least else ''}{e.n_tokens} tokens, "
                f"more than the maximum of {e.max_tokens} "
                f"for model {lm.info.name}; shorten it or send truncate=true",
                param=param,
                code="input_too_long",
            ) from e
        except BatchFailed as e:
            raise APIError(500, str(e), code="inference_failed", type="server_error") from e
        except BatcherClosed as e:
            raise APIError(503, str(e), code="shutting_down") from e
        emb = postprocess(res.pooled, normalize=normalize, dimensions=dimensions)
        return EmbedResult(emb, lm.info, res.prompt_tokens)
