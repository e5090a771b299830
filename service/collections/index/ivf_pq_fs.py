"""``ivf_pq_fs``: an inverted file over 4-bit product-quantization codes scored by SIMD table lookups (FAISS
``IndexIVFPQFastScan``: André, Kermarrec & Le Scouarnec, "Cache locality is not enough: High-performance nearest
neighbor search with product quantization fast scan", VLDB 2015; Guo et al., "Accelerating Large-Scale Inference with
Anisotropic Vector Quantization" (ScaNN), ICML 2020, for the same 4-bit lookup-table scan; Milvus's ``SCANN`` index is
this scan with raw-data reordering).

Each vector is ``m`` sub-vectors of 4-bit codes (``m / 2`` bytes: 192 bytes' worth of 384 floats in 96 by default,
against ``ivf_sq``'s 384), packed in blocks of 32 vectors so that one SIMD shuffle scores a sub-quantizer of 32
vectors at once. A search scans the ``nprobe`` nearest lists, keeps ``rerank * top_k`` candidates by their
approximate scores, and the service re-scores them exactly from the stored originals (on by default, as Qdrant's
``rescore``; ``rerank`` is the oversampling). 4-bit codes order candidates coarsely, so more candidates are re-scored
than for int8 codes: at 1M corpus vectors, nlist 4096, nprobe 256, recall@10 0.956 with 200 candidates re-scored and
0.965 with 500, at a quarter of ``ivf_sq``'s scan time (docs/performance.md, "Which dense index reaches recall@10 0.95
at 1M").

Like ``ivf_pq``: an exact flat index until ``min_train_points`` vectors are stored, training (two-level k-means for
the lists, :mod:`.coarse`, then the codebooks) as maintenance built beside, ids stored natively and removed in place.
A write's vectors find their list in the centroids' HNSW graph (:func:`.coarse.add_through_graph`), inside the write
lock (the blocks are packed by FAISS's own add).
"""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np

from service.collections.index.base import IndexConfigError, IndexSpec, int_param, reject_unknown
from service.collections.index.coarse import add_through_graph, ivf_index, train_coarse
from service.collections.index.ivf_pq import IVFPQType

#: ``m`` defaults to half the dimension (two dimensions a 4-bit sub-quantizer); ``rerank`` candidates per result
IVF_PQ_FS_DEFAULTS = {"nlist": 1024, "nprobe": 16, "rerank": 20, "by_residual": True}
_DERIVED = ("min_train_points", "train_sample")


class IVFPQFastScanType(IVFPQType):
    """Params: ``nlist`` (1..65536), ``nprobe`` (1..nlist), ``m`` (4-bit sub-quantizers: even, dividing the dimension;
    default ``dimension / 2`` rounded down to such a divisor), ``rerank`` (1..1000 candidates re-scored per result,
    default 20; 1 returns the 4-bit scores), ``by_residual`` (default true: each vector's code encodes its residual to
    its list's centroid, FAISS's ``PQ<m>x4fsr``; false: the vector itself), ``min_train_points`` (default ``39 * nlist``, at least ``nlist``) and
    ``train_sample`` (default ``64 * nlist`` capped at 200k, never below ``min_train_points``)."""

    name = "ivf_pq_fs"

    def normalize_params(self, params: dict[str, Any], dimension: int) -> dict[str, Any]:
        """IVF-PQ fast scan: :data:`IVF_PQ_FS_DEFAULTS`, ``m`` and the derived ``min_train_points``/``train_sample``
        filled in and range-checked (ranges in the class docstring).

        Raises:
            IndexConfigError: an unknown param, a value out of range, or ``m`` odd or not dividing ``dimension``.
        """
        reject_unknown(self.name, params, {*IVF_PQ_FS_DEFAULTS, "m", *_DERIVED})
        out = {**IVF_PQ_FS_DEFAULTS, **params}
        nlist = int_param(out, "nlist", 1, 65536)
        if "nprobe" not in params:
            out["nprobe"] = min(IVF_PQ_FS_DEFAULTS["nprobe"], nlist)
        int_param(out, "nprobe", 1, nlist)
        int_param(out, "rerank", 1, 1000)
        if not isinstance(out["by_residual"], bool):
            raise IndexConfigError(f"params.by_residual must be a boolean, got {out['by_residual']!r}")
        if "m" not in params:
            even = [m for m in range(2, dimension // 2 + 1, 2) if dimension % m == 0]
            if not even:
                raise IndexConfigError(f"ivf_pq_fs needs an even number m dividing the dimension {dimension}")
            out["m"] = even[-1]
        m = int_param(out, "m", 2, dimension)
        if dimension % m or m % 2:
            raise IndexConfigError(f"params.m={m} must be even and divide the dimension {dimension}")
        out.setdefault("min_train_points", 39 * nlist)
        int_param(out, "min_train_points", max(nlist, 16), 10**9)
        out.setdefault("train_sample", max(out["min_train_points"], min(64 * nlist, 200_000)))
        int_param(out, "train_sample", out["min_train_points"], 10**9)
        return out

    def create_trained(self, spec: IndexSpec, sample: np.ndarray) -> faiss.Index:
        """IVF-PQ fast scan: an ``IndexIVFPQFastScan`` (``nlist`` lists, ``m`` 4-bit sub-quantizers of the residuals or
        the vectors, ``by_residual``, blocks of 32; flat coarse quantizer, ``nprobe`` from params) with its lists
        (:func:`.coarse.train_coarse`) and codebooks trained on ``sample``, float32 ``(s, dimension)``."""
        p = spec.params
        index = ivf_index(
            spec, lambda q, metric: faiss.IndexIVFPQFastScan(q, spec.dimension, p["nlist"], p["m"], 4, metric)
        )
        index.by_residual = p["by_residual"]
        train_coarse(spec, index, sample)
        index.train(np.ascontiguousarray(sample, dtype=np.float32))
        return index

    def plan_add(self, spec: IndexSpec, index: faiss.Index, vectors: np.ndarray) -> object | None:
        """Fast scan: nothing ahead (FAISS's own add finds the lists: :func:`.coarse.add_through_graph`)."""
        return None

    def add(
        self, spec: IndexSpec, index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, plan: object | None = None
    ) -> None:
        """Fast scan: :func:`.coarse.add_through_graph` once trained (``plan`` is not used); the flat fallback's
        ``add_with_ids`` before."""
        if isinstance(index, faiss.IndexIVF):
            add_through_graph(index, vectors, ids)
        else:
            index.add_with_ids(vectors, ids)

    def every_code_params(self, spec: IndexSpec, index: faiss.Index) -> faiss.SearchParameters | None:
        """Fast scan, once trained: ``nprobe = nlist``, every list scanned and the selector deciding (the selective
        filter's path, as ``ivf_sq``'s), the ``rerank`` best re-scored."""
        if not self.is_trained(spec, index):
            return None
        params = faiss.SearchParametersIVF()
        params.nprobe = spec.params["nlist"]
        return params
