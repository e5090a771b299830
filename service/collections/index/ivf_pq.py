"""``ivf_pq``: ``IndexIVFPQ`` (Jégou et al., "Product Quantization for Nearest Neighbor Search", TPAMI 2011).

Ids are stored natively and removal is supported. Until the collection holds ``min_train_points`` vectors the
index is an exact flat one; training then uses a random sample of at most ``train_sample`` stored vectors. With
``rerank`` > 1, ``rerank * top_k`` PQ candidates are re-scored exactly with the stored vectors.
"""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np

from service.collections.index.base import (
    IndexConfigError,
    IndexSpec,
    IndexType,
    flat_vectors,
    int_param,
    reject_unknown,
)
from service.collections.index.coarse import (
    Assignment,
    add_to_lists,
    assign,
    filtered_nprobe,
    ivf_index,
    train_coarse,
    with_search_settings,
)
from service.collections.index.flat import flat_index

IVF_PQ_DEFAULTS = {"nlist": 1024, "nprobe": 16, "m": 48, "nbits": 8, "rerank": 4}
_DERIVED = ("min_train_points", "train_sample")


class IVFPQType(IndexType):
    """Params: ``nlist`` (1..65536), ``nprobe`` (1..nlist), ``m`` (sub-quantizers; must divide the dimension),
    ``nbits`` (4..12), ``min_train_points`` (default ``max(39 * nlist, 39 * 2**nbits)``, at least
    ``max(nlist, 2**nbits)``), ``train_sample`` (default ``64 * nlist`` capped at 200k, and never below ``min_train_points``),
    ``rerank`` (1..100, default 4; 1 returns raw PQ scores)."""

    name = "ivf_pq"

    def normalize_params(self, params: dict[str, Any], dimension: int) -> dict[str, Any]:
        """IVF-PQ: :data:`IVF_PQ_DEFAULTS` and the derived ``min_train_points``/``train_sample`` filled in, every
        value range-checked (ranges in the class docstring).

        Raises:
            IndexConfigError: an unknown param, a value out of range, or ``m`` not dividing ``dimension``.
        """
        reject_unknown(self.name, params, set(IVF_PQ_DEFAULTS) | set(_DERIVED))
        out = {**IVF_PQ_DEFAULTS, **params}
        nlist = int_param(out, "nlist", 1, 65536)
        if "nprobe" not in params:
            out["nprobe"] = min(IVF_PQ_DEFAULTS["nprobe"], nlist)
        int_param(out, "nprobe", 1, nlist)
        m = int_param(out, "m", 1, dimension)
        if dimension % m:
            raise IndexConfigError(f"params.m={m} must divide the dimension {dimension}")
        nbits = int_param(out, "nbits", 4, 12)
        int_param(out, "rerank", 1, 100)
        floor = max(nlist, 2**nbits)
        out.setdefault("min_train_points", max(39 * nlist, 39 * 2**nbits))
        int_param(out, "min_train_points", floor, 10**9)
        # 64 per centroid, capped at 200k, never below min_train_points (FAISS warns under 39 per centroid)
        out.setdefault("train_sample", max(out["min_train_points"], min(64 * nlist, 200_000)))
        int_param(out, "train_sample", floor, 10**9)
        return out

    def user_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """IVF-PQ: params without the derived ``min_train_points`` and ``train_sample``."""
        return {k: v for k, v in params.items() if k not in _DERIVED}

    def create(self, spec: IndexSpec) -> faiss.Index:
        """IVF-PQ: an exact flat index with ids, used until the collection is large enough to train."""
        return flat_index(spec)  # exact until trained

    def train_sample_size(self, spec: IndexSpec, live_count: int) -> int | None:
        """IVF-PQ: ``train_sample`` once ``live_count`` reaches ``min_train_points``, else None."""
        return spec.params["train_sample"] if live_count >= spec.params["min_train_points"] else None

    def create_trained(self, spec: IndexSpec, sample: np.ndarray) -> faiss.Index:
        """IVF-PQ: an ``IndexIVFPQ`` (``nlist``, ``m``, ``nbits``, ``nprobe`` from params; flat coarse quantizer)
        trained on ``sample``, float32 ``(s, dimension)`` (the lists by :func:`.coarse.train_coarse`)."""
        p = spec.params
        index = ivf_index(
            spec, lambda q, metric: faiss.IndexIVFPQ(q, spec.dimension, p["nlist"], p["m"], p["nbits"], metric)
        )
        train_coarse(spec, index, sample)
        index.train(np.ascontiguousarray(sample, dtype=np.float32))
        return index

    def plan_add(self, spec: IndexSpec, index: faiss.Index, vectors: np.ndarray) -> object | None:
        """IVF: each vector's list (:func:`.coarse.assign`); None for the flat fallback."""
        return assign(index, vectors) if isinstance(index, faiss.IndexIVF) else None

    def add(
        self, spec: IndexSpec, index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, plan: object | None = None
    ) -> None:
        """IVF: each vector into its list as :func:`.coarse.add_to_lists` finds it, or as ``plan`` found it for this
        index (the flat fallback: as added)."""
        if isinstance(index, faiss.IndexIVF):
            add_to_lists(index, vectors, ids, plan if isinstance(plan, Assignment) else None)
        else:
            index.add_with_ids(vectors, ids)

    def is_trained(self, spec: IndexSpec, index: faiss.Index) -> bool:
        """IVF-PQ: True once ``index`` is the trained IVF index, False for the flat fallback."""
        return isinstance(index, faiss.IndexIVF)

    def search_params(
        self, spec: IndexSpec, index: faiss.Index, k: int, ef: int | None = None, admitted: float = 1.0
    ) -> faiss.SearchParameters:
        """IVF: ``SearchParametersIVF`` with ``nprobe`` from params, widened for a filter admitting the share
        ``admitted`` of the vectors (:func:`.coarse.filtered_nprobe`); plain parameters for the flat fallback."""
        if not isinstance(index, faiss.IndexIVF):
            return faiss.SearchParameters()
        params = faiss.SearchParametersIVF()
        params.nprobe = filtered_nprobe(spec.params["nprobe"], int(index.nlist), admitted)
        return params

    def rescore_defaults(self, spec: IndexSpec, index: faiss.Index) -> tuple[bool, float] | None:
        """IVF-PQ, once trained: re-scored when the ``rerank`` param is above 1, ``rerank`` candidates per result;
        None for the exact flat fallback."""
        if not self.is_trained(spec, index):
            return None
        rerank = int(spec.params.get("rerank", 1))
        return rerank > 1, float(rerank)

    def held_vectors(self, spec: IndexSpec, index: faiss.Index) -> np.ndarray | None:
        """IVF: the exact fallback's float32 vectors until trained; None after (codes only)."""
        return None if self.is_trained(spec, index) else flat_vectors(index.index, spec.dimension)

    def loaded(self, spec: IndexSpec, index: faiss.Index) -> faiss.Index:
        """IVF-PQ: ``nprobe`` (from params) and ``parallel_mode`` (:func:`.coarse.with_search_settings`) set on a trained index
        read from a snapshot."""
        return with_search_settings(spec, index) if isinstance(index, faiss.IndexIVF) else index
