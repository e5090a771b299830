"""Collection indexes: one interface (:class:`IndexType`), one module per type, a registry, and the generic
:class:`VectorIndex` that holds a collection's FAISS index.

Types: ``flat`` (exact), ``hnsw`` (graph, tombstoned deletes), ``ivf_pq`` (trained product quantisation with an
exact fallback until trained), ``flat_sq`` and ``hnsw_sq`` (int8 scalar quantization, flat or under an HNSW graph,
candidates re-scored from the stored originals; exact until trained). See ``registry.py`` to add one.
"""

from service.collections.index.base import (
    METRICS,
    IndexConfigError,
    IndexSpec,
    IndexType,
    QuantizationSearch,
    faiss_metric,
)
from service.collections.index.exact import exact_search
from service.collections.index.hnsw import MAX_EF as MAX_HNSW_EF
from service.collections.index.registry import get_type, index_kinds, normalize_params, register
from service.collections.index.snapshot_file import read_snapshot, write_snapshot
from service.collections.index.vector_index import VectorIndex

__all__ = [
    "MAX_HNSW_EF",
    "METRICS",
    "IndexConfigError",
    "IndexSpec",
    "IndexType",
    "QuantizationSearch",
    "VectorIndex",
    "exact_search",
    "faiss_metric",
    "get_type",
    "index_kinds",
    "normalize_params",
    "read_snapshot",
    "register",
    "write_snapshot",
]
