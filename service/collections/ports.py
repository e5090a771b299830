"""What the collections need from inference, as a port the application wires (the core never imports inference).

* :class:`ModelRef`: the exact identity of an embedding model (name, version, sha256), as collections persist it.
* :class:`ModelSpec`: a loaded embedding model: its reference and its full dimension.
* :class:`SparseModel`: a server-side sparse model (e.g. ``qdrant/bm25``), which makes sparse vectors from texts.
* :class:`InferencePort`: embedding texts with an exact model and a prompt role, the active model, the server-side
  sparse models, reranking, and following the active model (re-embedding).

An implementation raises the port's errors of :mod:`.errors` (:class:`~.errors.ModelNotReady`,
:class:`~.errors.ModelNotFound`, :class:`~.errors.RerankerNotLoaded`, :class:`~.errors.InferenceOverloaded`) where
it names these conditions; any other inference error (an input too long, a failed batch...) passes through unchanged
to the HTTP layer, which maps it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class ModelRef:
    """An embedding model's exact identity: ``name``, ``version`` and the ``sha256`` of its artifact."""

    name: str
    version: str
    sha256: str

    @property
    def id(self) -> str:
        """``name:version``, the id models are loaded and looked up by."""
        return f"{self.name}:{self.version}"

    def to_dict(self) -> dict[str, str]:
        """The form collections persist and answer in JSON: ``{"name", "version", "sha256"}`` (in that order)."""
        return {"name": self.name, "version": self.version, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelRef:
        """The reference of a persisted ``{"name", "version", "sha256"}`` (other keys ignored).

        Raises:
            KeyError: a key is missing.
        """
        return cls(d["name"], d["version"], d["sha256"])


@dataclass(frozen=True)
class ModelSpec:
    """A loaded embedding model: its :class:`ModelRef` and its full ``dimension``."""

    ref: ModelRef
    dimension: int


class SparseModel(Protocol):
    """A server-side sparse model: texts to sparse vectors ``{"indices": [int], "values": [float]}`` (CPU work: call
    it on a worker thread)."""

    def documents(self, texts: list[str]) -> list[dict[str, Any]]:
        """The sparse vectors of stored texts (points), in order."""
        ...

    def document_arrays(self, texts: list[str]) -> tuple[Any, Any, Any]:
        """The same vectors packed: indices uint32 ``(total,)`` (strictly increasing within each vector), values
        float32 ``(total,)``, offsets int64 ``(n + 1,)`` (text ``i``'s vector is ``[offsets[i]:offsets[i + 1]]``)."""
        ...

    def query(self, text: str) -> dict[str, Any]:
        """The sparse vector of a query text."""
        ...


#: awaited with the new active model whenever another model becomes active
ActivationListener = Callable[[ModelSpec], Awaitable[None]]


class InferencePort(Protocol):
    """The inference the collections use (the application wires an adapter over its models)."""

    @property
    def sparse_models(self) -> Mapping[str, SparseModel]:
        """The server-side sparse models by name."""
        ...

    def active_model(self) -> ModelSpec:
        """The active embedding model.

        Raises:
            ModelNotReady: the service is starting (no model loaded yet).
        """
        ...

    def loaded(self, model_id: str) -> ModelSpec:
        """The loaded embedding model ``name:version`` (its sha256 may differ from a stored reference's).

        Raises:
            ModelNotReady: the service is starting. ModelNotFound: no such model is loaded.
        """
        ...

    async def encode(self, model: ModelRef, texts: list[str], *, role: str, param: str = "points") -> np.ndarray:
        """``texts`` embedded by the loaded ``model``, float32 ``(n, dimension)``, each with the model's prompt for
        ``role`` (``"document"`` or ``"query"``) if it has one; ``param`` names the request field in input errors.

        Raises:
            ModelNotReady, ModelNotFound (the exact model is not loaded), InferenceOverloaded (the queue is full),
            and inference's input errors unchanged.
        """
        ...

    def check_reranker(self, model: str | None, param: str) -> None:
        """Check that the reranker ``model`` (None: the first loaded) can be used; ``param`` names the field.

        Raises:
            ModelNotReady, RerankerNotLoaded (none named, none loaded), ModelNotFound (an unknown model), and
            inference's error for a model that is not a reranker, unchanged.
        """
        ...

    async def rerank(self, query: str, texts: list[str], *, model: str | None, param: str) -> np.ndarray:
        """The reranker's raw scores (logits) of ``(query, texts[i])``, float32 ``(n,)``, in order; the pairs are
        truncated to the model's maximum sequence length.

        Raises:
            as :meth:`check_reranker`; InferenceOverloaded; inference's input errors unchanged.
        """
        ...

    async def load(self, model: ModelRef) -> None:
        """Load ``model`` (``name:version``) if it is not loaded.

        Raises:
            any load failure (the caller treats it as best effort).
        """
        ...

    def follow(self, on_activate: ActivationListener, in_use: Callable[[], set[tuple[str, str]]]) -> None:
        """Call ``on_activate`` whenever another model becomes active, and keep loaded the models ``in_use`` returns
        (``{(user, model id)}`` pairs) as long as it returns them."""
        ...
