"""``hnsw_sq``: an HNSW graph over int8 scalar-quantized codes (FAISS ``IndexHNSWSQ`` with ``QT_8bit`` behind an
``IndexIDMap2``): the graph of :mod:`.hnsw` (same params, same tombstones and rebuilds) whose nodes hold ``d``-byte
codes instead of float32 vectors, the candidates re-scored exactly from the stored originals (:mod:`.flat_sq` says
how the codes are trained and rescored). Until the collection holds ``min_train_points`` vectors the index is a plain
``IndexHNSWFlat``; the write that reaches it trains the codes and builds the quantized graph over the vectors held
(about ``min_train_points`` of them: a bounded cost, once).
"""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np

from service.collections.index.base import IndexSpec, faiss_metric, flat_vectors, id_map, reject_unknown
from service.collections.index.flat_sq import SQ_TRAINING, normalize_sq, sq_training, trained_sq
from service.collections.index.hnsw import HNSW_DEFAULTS, HNSWType


class HNSWSQType(HNSWType):
    """Params: those of ``hnsw`` (``M``, ``ef_construction``, ``ef_search``, ``rebuild_fraction``) and those of
    ``flat_sq`` (``quantization``, ``min_train_points``, ``train_sample``)."""

    name = "hnsw_sq"
    trains_on_add = True

    def normalize_params(self, params: dict[str, Any], dimension: int) -> dict[str, Any]:
        """HNSW SQ: the HNSW params as :meth:`.hnsw.HNSWType.normalize_params` checks them, the rest as
        :func:`.flat_sq.normalize_sq` does.

        Raises:
            IndexConfigError: an unknown param or a value out of range.
        """
        reject_unknown(self.name, params, {*HNSW_DEFAULTS, "quantization", *SQ_TRAINING})
        graph = super().normalize_params({k: v for k, v in params.items() if k in HNSW_DEFAULTS}, dimension)
        return {**graph, **normalize_sq(self.name, params)}

    def train_sample_size(self, spec: IndexSpec, live_count: int) -> int | None:
        """HNSW SQ: :func:`.flat_sq.sq_training`."""
        return sq_training(spec, live_count)

    def create_trained(self, spec: IndexSpec, sample: np.ndarray) -> faiss.Index:
        """HNSW SQ: an ``IndexHNSWSQ`` (``QT_8bit``; ``M``, ``efConstruction``, ``efSearch`` from params) with its
        codes' ranges trained on ``sample`` (:func:`.flat_sq.trained_sq`), behind an ``IndexIDMap2``."""
        p = spec.params
        inner = faiss.IndexHNSWSQ(spec.dimension, faiss.ScalarQuantizer.QT_8bit, p["M"], faiss_metric(spec.metric))
        inner.hnsw.efConstruction = p["ef_construction"]
        inner.hnsw.efSearch = p["ef_search"]
        return id_map(spec, trained_sq(spec, inner, sample))

    def is_trained(self, spec: IndexSpec, index: faiss.Index) -> bool:
        """HNSW SQ: True once the graph holds codes, False for the ``IndexHNSWFlat`` fallback."""
        return isinstance(faiss.downcast_index(index.index), faiss.IndexHNSWSQ)

    def rescore_defaults(self, spec: IndexSpec, index: faiss.Index) -> tuple[bool, float] | None:
        """HNSW SQ, once trained: rescored, oversampling 1 (Qdrant's defaults); None for the fallback."""
        return (True, 1.0) if self.is_trained(spec, index) else None

    def held_vectors(self, spec: IndexSpec, index: faiss.Index) -> np.ndarray | None:
        """HNSW SQ: the fallback graph's float32 storage; None once trained (only codes are held)."""
        if self.is_trained(spec, index):
            return None
        return flat_vectors(faiss.downcast_index(index.index).storage, spec.dimension)
