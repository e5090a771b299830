"""``ivf_sq``: an inverted file over int8 scalar-quantized codes (FAISS ``IndexIVFScalarQuantizer`` with ``QT_8bit``;
Jégou, Douze & Schmid, "Product Quantization for Nearest Neighbor Search", TPAMI 2011, for the inverted file; Milvus's
``IVF_SQ8``).

A k-means coarse quantizer of ``nlist`` centroids assigns each vector to a list; a search scans the ``nprobe`` lists
nearest the query, scoring their ``d``-byte codes (each vector's residual to its centroid, quantized per dimension as
:mod:`.flat_sq` says), and the candidates are re-scored exactly from the stored originals (Qdrant's ``rescore``, on by
default, with ``oversampling`` candidates per result). A write costs one assignment (from 1,024 lists a search of
an HNSW graph over the centroids, :mod:`.coarse`: ~0.04 ms a vector on one core at nlist 4096, against 0.19 ms for
``nlist`` inner products), and a search reads about ``nprobe / nlist`` of the codes. Ids are stored natively and
removed in place. Until the collection holds ``min_train_points`` vectors the index is an exact flat one; training
(k-means over ``train_sample`` stored vectors, two-level from 1,024 lists: :mod:`.coarse`; ~45 s for 4,096 lists on
200,000 vectors) is maintenance, built beside while writes go on, as IVF-PQ's is.
"""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np

from service.collections.index.base import IndexSpec, int_param, reject_unknown
from service.collections.index.coarse import ivf_index, train_coarse
from service.collections.index.flat_sq import normalize_sq, trained_sq
from service.collections.index.ivf_pq import IVFPQType

IVF_SQ_DEFAULTS = {"nlist": 1024, "nprobe": 16}
_DERIVED = ("min_train_points", "train_sample")


class IVFSQType(IVFPQType):
    """Params: ``nlist`` (1..65536), ``nprobe`` (1..nlist), ``quantization`` (Qdrant's scalar config ``{type: int8,
    quantile, always_ram}``, as ``flat_sq``), ``min_train_points`` (default ``39 * nlist``, at least ``nlist``) and
    ``train_sample`` (default ``64 * nlist`` capped at 200k, never below ``min_train_points``)."""

    name = "ivf_sq"

    def normalize_params(self, params: dict[str, Any], dimension: int) -> dict[str, Any]:
        """IVF-SQ: :data:`IVF_SQ_DEFAULTS`, the quantization config (:func:`.flat_sq.normalize_sq`) and the derived
        ``min_train_points``/``train_sample`` filled in and range-checked (``dimension`` is not used).

        Raises:
            IndexConfigError: an unknown param or a value out of range.
        """
        reject_unknown(self.name, params, {*IVF_SQ_DEFAULTS, "quantization", *_DERIVED})
        out = {**IVF_SQ_DEFAULTS, **{k: params[k] for k in IVF_SQ_DEFAULTS if k in params}}
        nlist = int_param(out, "nlist", 1, 65536)
        if "nprobe" not in params:
            out["nprobe"] = min(IVF_SQ_DEFAULTS["nprobe"], nlist)
        int_param(out, "nprobe", 1, nlist)
        derived = {k: params[k] for k in _DERIVED if k in params}
        derived.setdefault("min_train_points", 39 * nlist)
        int_param(derived, "min_train_points", nlist, 10**9)
        derived.setdefault("train_sample", max(derived["min_train_points"], min(64 * nlist, 200_000)))
        sq = normalize_sq(self.name, {"quantization": params.get("quantization") or {}, **derived})
        return {**out, **sq}

    def user_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """IVF-SQ: params without the derived ``min_train_points`` and ``train_sample``."""
        return {k: v for k, v in params.items() if k not in _DERIVED}

    def create_trained(self, spec: IndexSpec, sample: np.ndarray) -> faiss.Index:
        """IVF-SQ: an ``IndexIVFScalarQuantizer`` (``nlist`` lists, ``QT_8bit`` residual codes, flat coarse quantizer,
        ``nprobe`` from params) with its centroids (:func:`.coarse.train_coarse`) and code ranges
        (:func:`.flat_sq.trained_sq`) trained on ``sample``, float32 ``(s, dimension)``."""
        qt, nlist = faiss.ScalarQuantizer.QT_8bit, spec.params["nlist"]
        index = ivf_index(spec, lambda q, metric: faiss.IndexIVFScalarQuantizer(q, spec.dimension, nlist, qt, metric))
        train_coarse(spec, index, sample)
        return trained_sq(spec, index, sample)

    def every_code_params(self, spec: IndexSpec, index: faiss.Index) -> faiss.SearchParameters | None:
        """IVF-SQ, once trained: ``nprobe = nlist``, every list scanned (its selector skips the codes it does not
        admit): a 1 % filter at 1M scores 10,000 codes in ~15 ms instead of reading their 15 MB of floats from the
        store (docs/performance.md)."""
        if not self.is_trained(spec, index):
            return None
        params = faiss.SearchParametersIVF()
        params.nprobe = spec.params["nlist"]
        return params

    def rescore_defaults(self, spec: IndexSpec, index: faiss.Index) -> tuple[bool, float] | None:
        """IVF-SQ, once trained: rescored, oversampling 1 (Qdrant's scalar-quantization defaults); None for the
        exact flat fallback."""
        return (True, 1.0) if self.is_trained(spec, index) else None
