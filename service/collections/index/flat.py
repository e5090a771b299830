"""``flat``: exact search (``IndexFlatIP`` / ``IndexFlatL2`` behind an ``IndexIDMap2``); ids removed in place."""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np

from service.collections.index.base import IndexConfigError, IndexSpec, IndexType, faiss_metric, flat_vectors, id_map


def flat_index(spec: IndexSpec) -> faiss.Index:
    """An empty exact index with ids for ``spec``'s dimension and metric."""
    return id_map(spec, faiss.IndexFlat(spec.dimension, faiss_metric(spec.metric)))


class FlatType(IndexType):
    """Exact nearest neighbours; no params."""

    name = "flat"

    def normalize_params(self, params: dict[str, Any], dimension: int) -> dict[str, Any]:
        """Flat: always ``{}``; raises :class:`IndexConfigError` if any param is given."""
        if params:
            raise IndexConfigError(f"params: flat takes no params, got {sorted(params)}")
        return {}

    def create(self, spec: IndexSpec) -> faiss.Index:
        """Flat: an empty ``IndexFlat`` (inner product or L2) behind an ``IndexIDMap2``."""
        return flat_index(spec)

    def held_vectors(self, spec: IndexSpec, index: faiss.Index) -> np.ndarray:
        """Flat: the index's own vectors, in the id map's order."""
        return flat_vectors(index.index, spec.dimension)
