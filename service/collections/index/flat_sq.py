"""``flat_sq``: scalar quantization, every vector scored from its int8 codes (FAISS ``IndexScalarQuantizer`` with
``QT_8bit``: one byte per dimension, each dimension's own range, behind an ``IndexIDMap2``); ids removed in place.

The codes are what the index holds in RAM (``d`` bytes per vector instead of ``4 d``); the float32 originals stay in
the SQLite store, which re-scores the candidates exactly (Qdrant's ``rescore``, on by default, with ``oversampling``
candidates per result: :class:`~service.collections.query_model.QuantizationSearch`). The ranges are trained on a
sample of the stored vectors (Qdrant's ``quantile``: the central ``quantile`` of each dimension's values; none: the
whole range), so until the collection holds ``min_train_points`` vectors the index is an exact flat one, as an IVF-PQ
index is; the write that reaches it trains the ranges on (a sample of) the vectors held and moves them to codes, in
place (training is a pass over the sample: cheap), for a model-bound vector and a client-supplied one alike; a
build from the store (at open, after maintenance) trains on a sample of the stored vectors. The params follow Qdrant's ``ScalarQuantizationConfig`` (Qdrant API reference,
"Collections", ``quantization_config.scalar``) and the codes FAISS's ``ScalarQuantizer`` (Johnson, Douze & Jégou,
"Billion-scale similarity search with GPUs", 2017; the FAISS wiki, "Index IO, cloning and hyper parameter tuning").
"""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np

from service.collections.index.base import (
    IndexConfigError,
    IndexSpec,
    faiss_metric,
    flat_vectors,
    id_map,
    int_param,
    reject_unknown,
)
from service.collections.index.flat import FlatType, flat_index

#: Qdrant's scalar quantization config: ``type`` (int8 only), ``quantile`` (None: the whole range), ``always_ram``
QUANTIZATION_DEFAULTS: dict[str, Any] = {"type": "int8", "quantile": None, "always_ram": None}
#: training: from ``min_train_points`` stored vectors on, on a sample of at most ``train_sample`` of them
SQ_TRAINING = {"min_train_points": 1000, "train_sample": 20_000}


def normalize_sq(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The scalar-quantization part of ``params`` (``quantization``, ``min_train_points``, ``train_sample``) with its
    defaults filled in and checked; ``quantization`` is Qdrant's ``{type, quantile, always_ram}``.

    Raises:
        IndexConfigError: a type other than ``int8``, ``quantile`` outside [0.5, 1], ``always_ram`` not a boolean,
            an unknown key, ``min_train_points`` outside [2, 10**9] or ``train_sample`` below it.
    """
    given = params.get("quantization") or {}
    if not isinstance(given, dict):
        raise IndexConfigError(f"params.quantization must be an object, got {given!r}")
    reject_unknown(f"{kind} quantization", given, set(QUANTIZATION_DEFAULTS))
    q = {**QUANTIZATION_DEFAULTS, **given}
    if q["type"] != "int8":
        raise IndexConfigError(f"params.quantization.type must be 'int8' (scalar quantization), got {q['type']!r}")
    qt = q["quantile"]
    if qt is not None and (isinstance(qt, bool) or not isinstance(qt, (int, float)) or not 0.5 <= qt <= 1.0):
        raise IndexConfigError(f"params.quantization.quantile must be a number in [0.5, 1], got {qt!r}")
    if q["always_ram"] is not None and not isinstance(q["always_ram"], bool):
        raise IndexConfigError(f"params.quantization.always_ram must be a boolean, got {q['always_ram']!r}")
    out = {**SQ_TRAINING, **{k: params[k] for k in SQ_TRAINING if k in params}, "quantization": q}
    int_param(out, "min_train_points", 2, 10**9)
    int_param(out, "train_sample", out["min_train_points"], 10**9)
    if qt is not None:
        q["quantile"] = float(qt)
    return out


def trained_sq(spec: IndexSpec, index: faiss.Index, sample: np.ndarray) -> faiss.Index:
    """``index`` (an ``IndexScalarQuantizer``, or an HNSW index over one) with its ranges trained on ``sample``
    (float32 ``(s, dimension)``): per dimension, the central ``quantile`` of the values (FAISS ``RS_quantiles``,
    ``(1 - quantile) / 2`` cut at each end) or, without a quantile, their min and max."""
    storage = faiss.downcast_index(index.storage) if isinstance(index, faiss.IndexHNSW) else index
    quantile = spec.params["quantization"]["quantile"]
    if quantile is not None and quantile < 1.0:
        storage.sq.rangestat = faiss.ScalarQuantizer.RS_quantiles
        storage.sq.rangestat_arg = (1.0 - quantile) / 2
    index.train(np.ascontiguousarray(sample, dtype=np.float32))
    return index


def sq_training(spec: IndexSpec, live_count: int) -> int | None:
    """``train_sample`` once ``live_count`` reaches ``min_train_points``, else None (the ranges are not trained yet)."""
    return spec.params["train_sample"] if live_count >= spec.params["min_train_points"] else None


class FlatSQType(FlatType):
    """Params: ``quantization`` (Qdrant's ``{type: int8, quantile (0.5..1 or null), always_ram}``; the codes are
    always in RAM here), ``min_train_points`` (2..10**9, default 1000) and ``train_sample`` (at least
    ``min_train_points``, default 20,000)."""

    name = "flat_sq"
    trains_on_add = True

    def normalize_params(self, params: dict[str, Any], dimension: int) -> dict[str, Any]:
        """Flat SQ: :func:`normalize_sq` (``dimension`` is not used).

        Raises:
            IndexConfigError: an unknown param or a value out of range.
        """
        reject_unknown(self.name, params, {"quantization", *SQ_TRAINING})
        return normalize_sq(self.name, params)

    def create(self, spec: IndexSpec) -> faiss.Index:
        """Flat SQ: an exact flat index with ids, used until the collection is large enough to train the ranges."""
        return flat_index(spec)

    def train_sample_size(self, spec: IndexSpec, live_count: int) -> int | None:
        """Flat SQ: :func:`sq_training`."""
        return sq_training(spec, live_count)

    def create_trained(self, spec: IndexSpec, sample: np.ndarray) -> faiss.Index:
        """Flat SQ: an ``IndexScalarQuantizer`` (``QT_8bit``) trained on ``sample`` (:func:`trained_sq`), behind an
        ``IndexIDMap2``."""
        sq = faiss.IndexScalarQuantizer(spec.dimension, faiss.ScalarQuantizer.QT_8bit, faiss_metric(spec.metric))
        return id_map(spec, trained_sq(spec, sq, sample))

    def is_trained(self, spec: IndexSpec, index: faiss.Index) -> bool:
        """Flat SQ: True once the id map holds the scalar quantizer, False for the flat fallback."""
        return isinstance(faiss.downcast_index(index.index), faiss.IndexScalarQuantizer)

    def rescore_defaults(self, spec: IndexSpec, index: faiss.Index) -> tuple[bool, float] | None:
        """Flat SQ, once trained: rescored, oversampling 1 (Qdrant's defaults); None for the flat fallback."""
        return (True, 1.0) if self.is_trained(spec, index) else None

    def every_code_params(self, spec: IndexSpec, index: faiss.Index) -> faiss.SearchParameters | None:
        """Flat SQ, once trained: plain parameters (its search scores every code)."""
        return faiss.SearchParameters() if self.is_trained(spec, index) else None

    def held_vectors(self, spec: IndexSpec, index: faiss.Index) -> np.ndarray | None:
        """Flat SQ: the fallback's float32 vectors; None once trained (only codes are held)."""
        return None if self.is_trained(spec, index) else flat_vectors(index.index, spec.dimension)
