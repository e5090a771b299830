"""The part of an upsert that reads the collection without changing it, done before the write takes the write mutex:
the vectors checked and normalised as stored, and each index's :meth:`~..index.VectorIndex.plan_add` (an IVF index's
list assignment, a graph search per vector). Concurrent writes then do this side by side; under the mutex only the
commit and the index updates remain (docs/performance.md, "1M documents with an ivf_sq dense index").

A staged write is made for the collection's parts as they were (its vectors config, model-bound index and named
indexes); under the mutex :meth:`StagedWrite.holds_for` says whether it still applies, else the write stages again
there (as every write did before).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.collections.embedded.bound_index import BoundIndex
from service.collections.embedded.named import NamedIndexes
from service.collections.index import VectorIndex
from service.collections.schema import VectorsConfig


@dataclass
class StagedWrite:
    """An upsert's vectors as written and its index plans.

    Attributes:
        vectors: the model-bound vectors of the request it was made from (identity is what :meth:`holds_for` checks).
        vecs: those vectors prepared (float32 ``(n, dimension)``, in write order), None without a model-bound index.
        extra: the named vectors prepared (:meth:`~.named.NamedIndexes.prepare`), None without any.
        bound_plan: the model-bound index's plan for ``vecs``.
        named_plans: per named dense vector, its index's plan (:meth:`~.named.NamedIndexes.plans`).
    """

    config: VectorsConfig
    index: VectorIndex | None
    named: NamedIndexes
    vectors: Any
    vecs: np.ndarray | None = None
    extra: list[dict[str, Any]] | None = None
    bound_plan: object | None = None
    named_plans: dict[str, object] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        config: VectorsConfig,
        bound: BoundIndex,
        named: NamedIndexes,
        vectors: Any,
        named_rows: list[dict[str, Any]] | None,
        order: np.ndarray,
        plan: bool = True,
    ) -> StagedWrite:
        """Stage a write of ``vectors`` (model-bound, per point; None without) and ``named_rows`` (per point, checked
        named vectors; None without), both taken in ``order`` (the points kept, in write order).

        Args:
            plan: also make the index plans (False under the mutex: the add does that work itself anyway).

        Raises:
            ValueError: a model-bound vector of the wrong shape; InvalidCollectionRequest: a named vector the
            collection no longer has.
        """
        out = cls(config, bound.index, named, vectors)
        if config.bound is not None and config.bound.spec is not None:
            out.vecs = bound.prepare(vectors)[order]
        if named_rows:
            out.extra = named.prepare([named_rows[i] for i in order])
        if plan:
            if out.index is not None and out.vecs is not None:
                out.bound_plan = out.index.plan_add(out.vecs)
            out.named_plans = named.plans(out.extra or [])
        return out

    def holds_for(self, config: VectorsConfig, bound: BoundIndex, named: NamedIndexes, vectors: Any) -> bool:
        """Whether this staging still applies: the same request vectors and the collection's parts unchanged."""
        return self.vectors is vectors and self.config is config and self.index is bound.index and self.named is named
