"""``hnsw``: ``IndexHNSWFlat`` behind an ``IndexIDMap2`` (Malkov & Yashunin, arXiv:1603.09320).

HNSW cannot remove vectors, so a deleted or replaced id becomes a *tombstone*: it stays in the graph, is excluded
from results by an ``IDSelector``, and the index is rebuilt from the stored vectors once tombstones exceed
``rebuild_fraction`` of the graph.
"""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np

from service.collections.index.base import (
    IndexConfigError,
    IndexSpec,
    IndexType,
    faiss_metric,
    flat_vectors,
    id_map,
    int_param,
    reject_unknown,
)

HNSW_DEFAULTS = {"M": 32, "ef_construction": 100, "ef_search": 64, "rebuild_fraction": 0.2}
#: the widest search breadth taken: an index's ``ef_search`` and a search's own (Qdrant's ``hnsw_ef``)
MAX_EF = 4096


class HNSWType(IndexType):
    """Params: ``M`` (4..256), ``ef_construction`` (8..4096), ``ef_search`` (1..4096), ``rebuild_fraction``
    (0.01..1, the tombstone share that triggers a rebuild)."""

    name = "hnsw"
    removes_in_place = False

    def normalize_params(self, params: dict[str, Any], dimension: int) -> dict[str, Any]:
        """HNSW: :data:`HNSW_DEFAULTS` filled in; ``M``, ``ef_construction``, ``ef_search`` and
        ``rebuild_fraction`` range-checked (ranges in the class docstring; ``dimension`` is not used).

        Raises:
            IndexConfigError: an unknown param, a non-integer or out-of-range value.
        """
        reject_unknown(self.name, params, set(HNSW_DEFAULTS))
        out = {**HNSW_DEFAULTS, **params}
        int_param(out, "M", 4, 256)
        int_param(out, "ef_construction", 8, 4096)
        int_param(out, "ef_search", 1, MAX_EF)
        rf = out["rebuild_fraction"]
        if isinstance(rf, bool) or not isinstance(rf, (int, float)) or not 0.01 <= rf <= 1.0:
            raise IndexConfigError(f"params.rebuild_fraction must be a number in [0.01, 1], got {rf!r}")
        out["rebuild_fraction"] = float(rf)
        return out

    def create(self, spec: IndexSpec) -> faiss.Index:
        """HNSW: an empty ``IndexHNSWFlat`` with ``M``, ``efConstruction`` and ``efSearch`` from params, behind
        an ``IndexIDMap2``."""
        inner = faiss.IndexHNSWFlat(spec.dimension, spec.params["M"], faiss_metric(spec.metric))
        inner.hnsw.efConstruction = spec.params["ef_construction"]
        inner.hnsw.efSearch = spec.params["ef_search"]
        return id_map(spec, inner)

    def search_params(
        self, spec: IndexSpec, index: faiss.Index, k: int, ef: int | None = None, admitted: float = 1.0
    ) -> faiss.SearchParameters:
        """HNSW: ``SearchParametersHNSW`` with ``efSearch = max(ef, k)``, ``ef`` the search's (Qdrant's
        ``hnsw_ef``) or else ``params["ef_search"]``; ``admitted`` is not used (FAISS's filtered HNSW search walks
        the graph until it holds ``efSearch`` admitted candidates)."""
        params = faiss.SearchParametersHNSW()
        params.efSearch = max(ef if ef is not None else spec.params["ef_search"], k)
        return params

    def held_vectors(self, spec: IndexSpec, index: faiss.Index) -> np.ndarray:
        """HNSW: the graph's flat storage (``IndexHNSWFlat.storage``), in the id map's order."""
        return flat_vectors(faiss.downcast_index(index.index).storage, spec.dimension)

    def rebuild_due(self, spec: IndexSpec, ntotal: int, n_tombstones: int) -> bool:
        """HNSW: due once tombstones exceed ``rebuild_fraction`` of the ``ntotal`` vectors in the graph."""
        return n_tombstones > 0 and n_tombstones > spec.params["rebuild_fraction"] * max(ntotal, 1)
