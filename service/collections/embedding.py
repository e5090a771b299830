"""The collections' embedding policy: texts are embedded with the exact model (name, version, sha256) that embedded
the collection, through the inference port (its batchers), in chunks of ``collections_embed_chunk``, with that
model's document or query prompt, if it has one; client-given vectors are checked and kept in place of embedding."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from service.collections.errors import ModelNotFound, ModelUnavailable
from service.collections.ports import InferencePort, ModelRef, ModelSpec, SparseModel
from service.collections.sparse_inputs import sparse_model
from service.collections.vector_backend import CollectionHandle, CollectionSettings
from service.collections.vectors import given_vectors

OFF_LOOP_POINTS = 64  # at least this many given vectors are converted and checked off the event loop


class Embedding:
    """Embeds the collections' texts through ``inference`` (:class:`~.ports.InferencePort`) with ``settings``'
    ``embed_chunk``."""

    def __init__(self, inference: InferencePort, settings: CollectionSettings) -> None:
        self.inference = inference
        self.settings = settings

    @property
    def sparse_models(self) -> Mapping[str, SparseModel]:
        """The server-side sparse models by name (:attr:`.ports.InferencePort.sparse_models`)."""
        return self.inference.sparse_models

    def sparse_model(self, name: str, param: str) -> SparseModel:
        """The server-side sparse model ``name`` (:func:`.sparse_inputs.sparse_model`).

        Raises:
            InvalidCollectionRequest: no such model (``model_mismatch``).
        """
        return sparse_model(self.sparse_models, name, param)

    def active_model(self) -> ModelSpec:
        """The active embedding model (new collections are bound to it).

        Raises:
            ModelNotReady: the service is starting.
        """
        return self.inference.active_model()

    async def embed(self, c: CollectionHandle, texts: list[str], model: dict | None = None, *, role: str) -> np.ndarray:
        """``texts`` embedded by ``model`` (default: the collection's), float32 ``(n, d)``, with its prompt for ``role``:
        ``"document"`` (points' texts) or ``"query"`` (search texts), if any (:meth:`.ports.InferencePort.encode`).

        Raises:
            ModelUnavailable: that exact model (name, version, sha256) is not loaded. ModelNotReady: the service is
            starting.
        """
        want = ModelRef.from_dict(model or c.model)
        try:
            loaded = self.inference.loaded(want.id).ref
        except ModelNotFound as e:  # ModelNotReady (the service is starting) is a 503, as it is
            raise ModelUnavailable(
                f"collection {c.name!r} needs {want.id} (sha256 {want.sha256[:12]}...), which is not loaded"
            ) from e
        if loaded.sha256 != want.sha256:
            raise ModelUnavailable(
                f"loaded {want.id} has sha256 {loaded.sha256[:12]}..., the collection needs {want.sha256[:12]}..."
            )
        chunk = self.settings.embed_chunk
        parts = [
            await self.inference.encode(want, texts[i : i + chunk], role=role) for i in range(0, len(texts), chunk)
        ]
        return np.concatenate(parts).astype(np.float32, copy=False)

    async def point_vectors(
        self, c: CollectionHandle, texts: list[str], given: dict[int, Sequence[float]], model: dict[str, Any]
    ) -> np.ndarray:
        """float32 ``(n, d)``: the client's vectors where given (checked), the texts embedded by ``model`` elsewhere.

        Raises:
            InvalidCollectionRequest: a given vector of the wrong dimension, not finite, or zero for cosine; and what
                :meth:`embed` raises.
        """
        args = (given, len(texts), c.spec, c.name)
        big = len(given) >= OFF_LOOP_POINTS  # many vectors: converted and checked on a worker thread
        out, rest = await asyncio.to_thread(given_vectors, *args) if big else given_vectors(*args)
        if rest:
            out[rest] = await self.embed(c, [texts[i] for i in rest], model, role="document")
        return out
