"""The in-process embedding interface: what routes and ``service.collections`` call.

``app.state.embedder`` is an :class:`Embedder`. Stable interface::

    result = await app.state.embedder.encode(texts, model=None)
    result.embeddings   # np.float32, shape (len(texts), dimension), rows L2-normalised
    result.model        # ModelInfo: .name .version .sha256 .dimension (.max_seq_length)
    result.prompt_tokens  # int, tokens after truncation, special tokens included

Prompts (:mod:`service.inference.prompts`): ``encode(..., prompt_name=)`` (TEI's, strict) or ``prompt_role=`` (``query`` /
``document``: NIM's ``input_type`` and the collections, lenient) prepends the model's prompt to every text before
tokenisation; naming neither applies the model's ``default_prompt_name``, if any.

Errors are domain exceptions (``service.http.errors.ERROR_TABLE`` maps each to its HTTP answer once):
:class:`~service.inference.model_registry.ModelNotFound` (404), :class:`ModelNotReady` (503), :class:`InvalidInput` (422),
:class:`~service.inference.batch_errors.InputTooLong` (413), :class:`~service.inference.batch_errors.RequestTooLarge` (413),
:class:`~service.inference.batch_errors.QueueFull` (429),
:class:`~service.inference.batch_errors.BatchFailed` (500), :class:`~service.inference.batch_errors.BatcherClosed` (503),
:class:`~service.inference.onnx_reranker.WrongModelTask` (422: a reranker named for embeddings),
:class:`~service.inference.prompts.PromptNotFound` (422: a ``prompt_name`` the model does not define). Each carries the
request field it concerns in ``param``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from artifact_contract import postprocess
from service.inference.batch_errors import InputTooLong, RequestTooLarge
from service.inference.model_registry import LoadedModel, ModelNotFound, ModelRegistry, WrongModelTask
from service.inference.onnx_encoder import ModelInfo
from service.inference.prompts import prompt_prefix, with_prefix


class ModelNotReady(RuntimeError):
    """No model is loaded yet (start-up)."""


class InvalidInput(ValueError):
    """A request value the embedder cannot take; ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class TokenIds:
    """Token ids a front process made for a request's texts (``service.front.tokenizing``): with the tokenizer of the
    model ``model`` (``name:version``) whose ONNX file has ``sha256``, the model's prompt prepended, cut as the
    request's ``truncate`` and ``truncation_direction`` ask; ``ids[i]`` int64 of shape ``(len_i,)``.
    :meth:`Embedder.encode` uses them only when the model that runs the request is that model."""

    model: str
    sha256: str
    ids: list[np.ndarray]


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
            ModelNotFound: ``model`` is not loaded (``param`` set). ModelNotReady: none is loaded.
        """
        try:
            return self.registry.get(model)
        except ModelNotFound as e:
            if model is None or model == "":
                raise ModelNotReady("no model is loaded yet") from e
            e.param = param
            raise

    async def encode(
        self,
        texts: list[str],
        *,
        model: str | None | LoadedModel = None,
        truncate: bool = True,
        truncation_direction: str = "right",
        normalize: bool = True,
        dimensions: int | None = None,
        param: str = "input",
        prompt_name: str | None = None,
        prompt_role: str | None = None,
        token_ids: TokenIds | None = None,
    ) -> EmbedResult:
        """Embeddings of ``texts`` with the request options of the HTTP API.

        Args:
            texts: non-empty list of strings.
            model: a loaded model's ``name`` or ``name:version`` (or the :class:`LoadedModel`); None: the active one.
            truncate: cut inputs to ``max_seq_length`` tokens; if False, an over-long input is a 413. More than
                ``max_request_tokens`` tokens in all (after truncation) is a 413 as well.
            truncation_direction: ``"right"`` keeps an over-long input's start, ``"left"`` its end (TEI's field).
            normalize: L2-normalise rows (``dimensions`` always renormalises).
            dimensions: keep the first ``dimensions`` columns, in ``[1, dimension]``.
            param: the request field named in errors about the inputs.
            prompt_name, prompt_role: the prompt prepended to every text (:meth:`prompt`); token counts, truncation
                and ``max_request_tokens`` include it.
            token_ids: the texts' token ids made by a front (:class:`TokenIds`); used when they were made for the
                model that runs the request (its ``name:version`` and sha256) and fit it (one list per text, ids in
                its vocabulary, none longer than ``max_seq_length`` when truncating), else the texts are tokenized
                here (after a hot swap, a front's ids for the previous model are never run by the new one).

        Raises:
            see the module docstring.
        """
        _check_texts(texts, param)
        lm = model if isinstance(model, LoadedModel) else self.resolve(model)
        if lm.is_reranker:
            raise WrongModelTask(lm.info.name, "reranker", "embedding")
        texts = with_prefix(self.prompt(lm, name=prompt_name, role=prompt_role), texts)
        dim = lm.info.dimension
        if dimensions is not None and not 1 <= dimensions <= dim:
            raise InvalidInput(
                f"dimensions must be between 1 and {dim} for model {lm.info.name}, got {dimensions}", "dimensions"
            )
        try:
            ids = _usable(token_ids, lm, len(texts), truncate)
            res = await lm.batcher.submit(texts, truncate=truncate, direction=truncation_direction, ids=ids)
        except InputTooLong as e:
            e.param, e.model = param, lm.info.name
            raise
        except RequestTooLarge as e:
            e.param = param
            raise
        emb = postprocess(res.pooled, normalize=normalize, dimensions=dimensions)
        return EmbedResult(emb, lm.info, res.prompt_tokens)

    def prompt(self, model: str | None | LoadedModel, *, name: str | None = None, role: str | None = None) -> str:
        """The text prepended to each input for the model ``model`` (a name, None: the active one, or the
        :class:`LoadedModel`): the prompt ``name`` (TEI's ``prompt_name``), else the prompt of ``role`` (``query``,
        ``document``) if the model has one, else its ``default_prompt_name`` prompt when neither is given; ``""``
        for none (:func:`service.inference.prompts.prompt_prefix`).

        Raises:
            PromptNotFound: ``name`` is not one of the model's prompts (param ``prompt_name``).
            ModelNotFound, ModelNotReady: as :meth:`resolve`.
        """
        lm = model if isinstance(model, LoadedModel) else self.resolve(model)
        return prompt_prefix(lm.model.manifest, lm.info.id, name=name, role=role)

    async def tokens(
        self,
        texts: list[str],
        *,
        model: str | None | LoadedModel = None,
        add_special_tokens: bool = True,
        param: str = "inputs",
    ) -> tuple[list, ModelInfo]:
        """The model's tokenization of each text, untruncated: ``tokenizers.Encoding`` objects (``ids``, ``tokens``,
        character ``offsets``, ``special_tokens_mask``) and the model's identity (TEI's ``/tokenize``). No prompt is
        added here: a caller that wants one prepends :meth:`prompt` itself (its offsets then count it).

        Raises:
            InvalidInput, ModelNotFound, ModelNotReady, BatcherClosed, RequestTooLarge (``max_request_tokens``).
        """
        _check_texts(texts, param)
        lm = model if isinstance(model, LoadedModel) else self.resolve(model)
        try:
            return await lm.batcher.encodings(texts, add_special_tokens), lm.info
        except RequestTooLarge as e:
            e.param = param
            raise

    async def decode(
        self, ids: list[list[int]], *, model: str | None = None, skip_special_tokens: bool = True, param: str = "ids"
    ) -> tuple[list[str], ModelInfo]:
        """The text of each token-id list (TEI's ``/decode``) and the model's identity.

        Raises:
            InvalidInput: an id at or above the model's vocabulary size (the tokenizer would drop it silently).
            ModelNotFound, ModelNotReady, BatcherClosed.
        """
        lm = self.resolve(model)
        vocab = lm.model.vocab_size
        for i, row in enumerate(ids):  # ids >= 0 by the request's schema; max() runs in C
            if row and (bad := max(row)) >= vocab:
                raise InvalidInput(
                    f"{param}[{i}] holds token id {bad}, outside the vocabulary (0 to {vocab - 1})", param
                )
        return await lm.batcher.decode(ids, skip_special_tokens), lm.info


def _usable(token_ids: TokenIds | None, lm: LoadedModel, n: int, truncate: bool) -> list[np.ndarray] | None:
    """``token_ids.ids`` when they were made for ``lm`` and fit it (:meth:`Embedder.encode`), else None."""
    if token_ids is None or token_ids.model != lm.info.id or token_ids.sha256 != lm.info.sha256:
        return None
    ids = token_ids.ids
    if len(ids) != n or any(len(x) == 0 for x in ids):
        return None
    flat = np.concatenate(ids)
    if flat.min() < 0 or flat.max() >= lm.model.vocab_size:
        return None
    if truncate and max(len(x) for x in ids) > lm.info.max_seq_length:
        return None
    return ids


def _check_texts(texts: list[str], param: str) -> None:
    """Raises InvalidInput unless ``texts`` is a non-empty list of strings."""
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InvalidInput("texts must be a non-empty list of strings", param)
