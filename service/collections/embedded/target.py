"""The embedded backend's re-embedding target (:class:`~..backend.ReembedTarget`): target vectors in the collection's
SQLite file (:class:`~.store.ShadowTable`), the switch done by :meth:`Collection.complete_reembed
<.collection.Collection.complete_reembed>` under the collection's locks. One process owns an embedded collection,
so the claim on a re-embedding is this object's own (``renew`` fails only once it was abandoned)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from service.collections.embedded.store import ShadowTable, Store
from service.collections.errors import InvalidCollectionRequest
from service.collections.index import IndexConfigError, IndexSpec, get_type, normalize_params
from service.collections.metric import normalised


class ReembeddedCollection(Protocol):
    """What a re-embedding target uses of its collection (:class:`~.collection.Collection`)."""

    name: str
    store: Store

    @property
    def spec(self) -> IndexSpec | None:
        """The model-bound vector's index spec."""

    @property
    def count(self) -> int:
        """Live points."""

    def complete_reembed(self, target: EmbeddedTarget) -> bool:
        """Switch to ``target``'s vectors under the collection's locks (False while points still lack one)."""

    def detach_reembed(self, target: EmbeddedTarget) -> None:
        """Stop writing ``target``'s vectors."""


class EmbeddedTarget:
    """A re-embedding of ``collection`` towards ``model`` (see :class:`~..backend.ReembedTarget`).

    Args:
        collection: the :class:`~.collection.Collection`.
        model: target ``{name, version, sha256}``.
        dimension: the target model's embedding width.

    Raises:
        InvalidCollectionRequest: the collection's index params do not fit ``dimension`` (e.g. ivf_pq ``m``).
    """

    def __init__(self, collection: ReembeddedCollection, model: dict[str, Any], dimension: int) -> None:
        self.collection = collection
        self.model = dict(model)
        self.dimension = dimension
        spec = collection.spec
        try:
            params = normalize_params(spec.kind, get_type(spec.kind).user_params(spec.params), dimension)
        except IndexConfigError as e:
            raise InvalidCollectionRequest(f"cannot re-embed {collection.name!r} at dimension {dimension}: {e}") from e
        self.spec = IndexSpec(spec.kind, spec.metric, params, dimension)
        self.table = ShadowTable(collection.store.db_path, dimension)
        self.abandoned = False
        self.status: dict[str, Any] = {
            "state": "running",
            "target_model": dict(model),
            "dimension": dimension,
            "done": 0,
            "total": collection.count,
            "rate_per_s": None,
            "started_at": time.time(),
            "finished_at": None,
            "error": None,
        }

    def prepare(self) -> None:
        """Create or resume the target table; ``status['done']`` counts the points already re-embedded."""
        self.status["done"] = self.table.prepare(self.model)

    def pending(self, cursor: int | None, limit: int) -> tuple[list[tuple[int, str]], int | None]:
        """Live points without a target vector after internal id ``cursor``: ``([(iid, text)], next cursor)``."""
        rows = self.table.pending(cursor or 0, limit)
        return rows, (rows[-1][0] if rows else cursor)

    def write(self, refs: Sequence[int], vectors: np.ndarray) -> None:
        """Store target vectors, float32 ``(n, dimension)`` (normalised here for cosine), for internal ids ``refs``."""
        v = np.ascontiguousarray(vectors, dtype=np.float32)
        if v.ndim == 2 and v.shape[1] == self.dimension:
            v = normalised(v, self.spec.metric)
        self.table.write(np.asarray(refs, dtype=np.int64), v)

    def complete(self) -> bool:
        """Switch the collection to the target vectors (False while points still lack one)."""
        return self.collection.complete_reembed(self)

    def publish_status(self) -> None:
        """Nothing to do: the collection's info reads this object's ``status`` (one process)."""

    def renew(self) -> bool:
        """True until abandoned (one process owns an embedded collection)."""
        return not self.abandoned

    def abandon(self, drop: bool) -> None:
        """Detach from the collection; ``drop`` also deletes the target vectors (else a restart resumes them)."""
        self.abandoned = True
        self.collection.detach_reembed(self)
        if drop:
            self.table.drop()
        self.table.close()
