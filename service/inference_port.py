"""The collections' inference port (:class:`service.collections.ports.InferencePort`) over the service's inference:
the embedder (its batchers), the model registry, the model control and the server-side sparse models.

Inference's exceptions that the port names become the port's, with the same messages (so the HTTP answers stay
the same): ``ModelNotReady``, ``ModelNotFound`` (its ``param`` kept), ``NoRerankerLoaded`` (:class:`RerankerNotLoaded`)
and ``QueueFull`` (:class:`InferenceOverloaded`). Other inference errors pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from service.collections import errors
from service.collections.ports import ActivationListener, ModelRef, ModelSpec, SparseModel
from service.inference import batch_errors, embedder, model_registry
from service.inference.embedder import Embedder
from service.inference.model_control import ModelControl
from service.inference.model_registry import LoadedModel
from service.inference.onnx_encoder import ModelInfo
from service.inference.reranker import NoRerankerLoaded, Reranker


def model_spec(info: ModelInfo) -> ModelSpec:
    """The port's :class:`ModelSpec` of a loaded model's :class:`ModelInfo`."""
    return ModelSpec(ModelRef(info.name, info.version, info.sha256), info.dimension)


@contextmanager
def translated() -> Iterator[None]:
    """Raise inference's errors that the port names as the port's (same message; ``param`` kept)."""
    try:
        yield
    except embedder.ModelNotReady as e:
        raise errors.ModelNotReady(str(e)) from e
    except NoRerankerLoaded as e:
        raise errors.RerankerNotLoaded(str(e), getattr(e, "param", "model")) from e
    except model_registry.ModelNotFound as e:
        raise errors.ModelNotFound(str(e), getattr(e, "param", "model")) from e
    except batch_errors.QueueFull as e:
        raise errors.InferenceOverloaded(str(e)) from e


class InferenceAdapter:
    """:class:`~service.collections.ports.InferencePort` over the service's inference.

    Args:
        embedder: returns the service's :class:`Embedder` (None while starting: :class:`ModelNotReady`).
        control: the :class:`ModelControl` (loads models; tells of activations).
        sparse_models: the server-side sparse models by name (``service.inference.sparse.open_sparse_models``).
    """

    def __init__(
        self, embedder: Callable[[], Embedder | None], control: ModelControl, sparse_models: Mapping[str, Any]
    ) -> None:
        self._embedder = embedder
        self.control = control
        self._sparse: Mapping[str, SparseModel] = dict(sparse_models)

    @property
    def sparse_models(self) -> Mapping[str, SparseModel]:
        """The server-side sparse models by name."""
        return self._sparse

    def _emb(self) -> Embedder:
        emb = self._embedder()
        if emb is None:
            raise errors.ModelNotReady("service is starting")
        return emb

    def _lm(self, model_id: str | None) -> LoadedModel:
        emb = self._emb()
        with translated():
            return emb.resolve(model_id)

    def active_model(self) -> ModelSpec:
        """The active embedding model (:meth:`InferencePort.active_model`)."""
        return model_spec(self._lm(None).info)

    def loaded(self, model_id: str) -> ModelSpec:
        """The loaded model ``name:version`` (:meth:`InferencePort.loaded`)."""
        return model_spec(self._lm(model_id).info)

    async def encode(self, model: ModelRef, texts: list[str], *, role: str, param: str = "points") -> np.ndarray:
        """``texts`` embedded by the exact ``model`` with its ``role`` prompt (:meth:`InferencePort.encode`)."""
        lm = self._lm(model.id)
        if lm.info.sha256 != model.sha256:
            raise errors.ModelNotFound(f"model {model.id!r} is loaded with another sha256 ({lm.info.sha256[:12]}...)")
        with translated():
            res = await self._emb().encode(texts, model=lm, param=param, prompt_role=role)
        return res.embeddings

    def _reranker(self) -> Reranker:
        return Reranker(self._emb().registry)

    def check_reranker(self, model: str | None, param: str) -> None:
        """Check the reranker ``model`` (:meth:`InferencePort.check_reranker`)."""
        reranker = self._reranker()
        with translated():
            reranker.resolve(model, param)

    async def rerank(self, query: str, texts: list[str], *, model: str | None, param: str) -> np.ndarray:
        """Raw scores of ``(query, texts[i])`` (:meth:`InferencePort.rerank`)."""
        reranker = self._reranker()
        with translated():
            return (await reranker.rerank(query, texts, model=model, param=param)).scores

    async def load(self, model: ModelRef) -> None:
        """Load ``model`` if it is not loaded (:meth:`InferencePort.load`)."""
        await self.control.load(model.name, model.version)

    def follow(self, on_activate: ActivationListener, in_use: Callable[[], set[tuple[str, str]]]) -> None:
        """Register ``on_activate`` and ``in_use`` with the model control (:meth:`InferencePort.follow`)."""

        async def listener(prev: ModelInfo | None, new: ModelInfo) -> None:
            await on_activate(model_spec(new))

        self.control.listeners.append(listener)
        self.control.in_use.append(in_use)
