"""The index-type interface: what every FAISS index type of a collection provides.

An index is *derived* data: the SQLite store holds every point, and an index can always be rebuilt from it. An
:class:`IndexType` says how one kind of index validates its params, creates (and optionally trains) its FAISS
index, searches it and when it needs maintenance; :class:`~.vector_index.VectorIndex` does the rest (ids,
deletions, tombstones, filtered search, snapshots) the same way for every type. Types are listed in
``registry.py``; adding one is a new module here plus one line there.

Scores: ``cosine`` and ``dot`` use inner product (vectors of a cosine collection are L2-normalised), higher is
better; ``l2`` reports the Euclidean distance (not squared), lower is better.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np

from service.collections.metric import is_distance

METRICS = ("cosine", "dot", "l2")


class IndexConfigError(ValueError):
    """Index kind, metric or params are invalid (message names the field)."""


@dataclass(frozen=True)
class QuantizationSearch:
    """How a search uses a quantized index (Qdrant API reference, schema ``QuantizationSearchParams``), a part of the
    core's query model (:class:`~service.collections.query_model.SearchQuery`): ``ignore`` searches the original
    vectors instead of the codes (here: exactly, over the stored originals); ``rescore`` re-scores the candidates
    exactly with the originals (None: the index type's default, true for scalar quantization); ``oversampling``
    (>= 1; None: the type's default, 1.0 for scalar quantization) asks for ``ceil(oversampling * k)`` candidates to
    re-score. No effect on an index that is not quantized (yet)."""

    ignore: bool = False
    rescore: bool | None = None
    oversampling: float | None = None


@dataclass
class IndexSpec:
    """What a collection's index is: ``kind``, ``metric``, complete ``params``, vector ``dimension``."""

    kind: str
    metric: str
    params: dict[str, Any]
    dimension: int


def faiss_metric(metric: str) -> int:
    """The FAISS metric constant for ``cosine``/``dot`` (inner product) or ``l2``.

    Raises:
        IndexConfigError: unknown metric.
    """
    if metric not in METRICS:
        raise IndexConfigError(f"metric must be one of {METRICS}, got {metric!r}")
    return faiss.METRIC_L2 if is_distance(metric) else faiss.METRIC_INNER_PRODUCT


def int_param(params: dict[str, Any], name: str, lo: int, hi: int) -> int:
    """``params[name]`` checked to be an integer in ``[lo, hi]``.

    Raises:
        IndexConfigError: not an integer (bools included) or out of range.
    """
    v = params[name]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise IndexConfigError(f"params.{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def reject_unknown(kind: str, params: dict[str, Any], known: set[str]) -> None:
    """Raise :class:`IndexConfigError` naming any param of ``kind`` outside ``known``."""
    unknown = set(params) - known
    if unknown:
        raise IndexConfigError(f"params: unknown {kind} params {sorted(unknown)} (known: {sorted(known)})")


class IndexType(ABC):
    """One kind of index. Subclasses set :attr:`name` and override what differs from an exact flat index.

    Attributes:
        name: the ``index`` value users give when creating a collection.
        removes_in_place: False when the FAISS index cannot delete vectors (HNSW): deleted ids are then kept as
            tombstones, excluded from results, until :meth:`rebuild_due` asks for a rebuild.
        trains_on_add: True when training is cheap and needs only the vectors the untrained index holds (scalar
            quantization: ranges): the write that brings the index to :meth:`train_sample_size` trains it in place
            (so does a build from the store), whoever owns the index; otherwise maintenance trains it beside.
    """

    name: str = ""
    removes_in_place: bool = True
    trains_on_add: bool = False

    @abstractmethod
    def normalize_params(self, params: dict[str, Any], dimension: int) -> dict[str, Any]:
        """Defaults filled in and every value validated, for vectors of ``dimension``.

        Raises:
            IndexConfigError: an unknown param name or a value out of range.
        """

    def user_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The params to carry over when the dimension changes (derived defaults are dropped and recomputed)."""
        return dict(params)

    @abstractmethod
    def create(self, spec: IndexSpec) -> faiss.Index:
        """An empty FAISS index that accepts ``add_with_ids`` at once (no training)."""

    def plan_add(self, spec: IndexSpec, index: faiss.Index, vectors: np.ndarray) -> object | None:
        """The part of adding ``vectors`` (float32 ``(n, dimension)``, contiguous) to ``index`` that only reads it,
        done before the write takes the collection's write mutex and handed to :meth:`add` (None: nothing to do
        ahead; the base type's case)."""
        return None

    def add(
        self, spec: IndexSpec, index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, plan: object | None = None
    ) -> None:
        """Add ``vectors`` (float32 ``(n, dimension)``, contiguous) under ``ids`` (int64 ``(n,)``) to ``index``:
        FAISS's ``add_with_ids``. ``plan``: :meth:`plan_add`'s result for these vectors (possibly made for another
        index object, when the index was replaced meanwhile: then ignored)."""
        index.add_with_ids(vectors, ids)

    def train_sample_size(self, spec: IndexSpec, live_count: int) -> int | None:
        """Vectors to sample for training once the collection holds ``live_count``; None: no training (yet)."""
        return None

    def create_trained(self, spec: IndexSpec, sample: np.ndarray) -> faiss.Index:
        """An empty index trained on ``sample`` (float32 ``(s, dimension)``); only for types that train.

        Raises:
            TypeError: this type does not train (its :meth:`train_sample_size` is always None).
        """
        raise TypeError(f"index type {self.name!r} is not trained")

    def is_trained(self, spec: IndexSpec, index: faiss.Index) -> bool:
        """Whether ``index`` is the configured index rather than a pre-training fallback."""
        return True

    def search_params(
        self, spec: IndexSpec, index: faiss.Index, k: int, ef: int | None = None, admitted: float = 1.0
    ) -> faiss.SearchParameters:
        """Per-search FAISS parameters for ``k`` results (an ``IDSelector`` is added by the caller); ``ef``: an HNSW
        graph's search breadth asked for by the search (None: the index's), ignored by types without a graph;
        ``admitted``: the share of the index's live vectors the search's filter admits (1.0: unfiltered), for types
        that search wider as a filter narrows."""
        return faiss.SearchParameters()

    def every_code_params(self, spec: IndexSpec, index: faiss.Index) -> faiss.SearchParameters | None:
        """Parameters under which a search of ``index`` scores the code of every vector its ``IDSelector`` admits
        (the selective filter's path for an index that holds codes, not floats: Qdrant's full scan over quantized
        vectors, then rescoring), or None when the type cannot (a graph) or holds no codes fine enough to choose the
        candidates to rescore: the caller then reads the stored vectors."""
        return None

    def rescore_defaults(self, spec: IndexSpec, index: faiss.Index) -> tuple[bool, float] | None:
        """``(rescore, oversampling)`` by default when ``index`` scores compressed codes (a quantized type, trained):
        whether ``ceil(oversampling * k)`` candidates are re-scored exactly with the stored originals. None: the
        index's scores are exact (no quantization, or the exact fallback before training)."""
        return None

    def held_vectors(self, spec: IndexSpec, index: faiss.Index) -> np.ndarray | None:
        """The float32 ``(ntotal, dimension)`` vectors ``index`` holds uncompressed, row ``i`` under the ``i``-th id
        of its id map, viewed without a copy (valid while the index does not change), or None when it holds none
        uncompressed (an exact search then reads the store)."""
        return None

    def rebuild_due(self, spec: IndexSpec, ntotal: int, n_tombstones: int) -> bool:
        """Whether tombstones have grown enough to rebuild the index from the store."""
        return False

    def loaded(self, spec: IndexSpec, index: faiss.Index) -> faiss.Index:
        """Restore search-time settings FAISS does not serialise, after reading a snapshot."""
        return index


def flat_vectors(flat: faiss.Index, dimension: int) -> np.ndarray:
    """The vectors of a FAISS ``IndexFlat`` as a float32 ``(ntotal, dimension)`` view of its storage (no copy)."""
    flat = faiss.downcast_index(flat)
    n = int(flat.ntotal)
    if n == 0:
        return np.zeros((0, dimension), np.float32)
    return faiss.rev_swig_ptr(flat.get_xb(), n * dimension).reshape(n, dimension)


#: bytes FAISS's callback writer and reader pass through Python at a time
CHUNK_BYTES = 1 << 20


def stream_index(index: faiss.Index, put: Callable[[bytes], None]) -> int:
    """FAISS's serialisation of ``index`` (``faiss.write_index``) handed to ``put`` in chunks of at most
    :data:`CHUNK_BYTES` as it is written (``faiss.PyCallbackIOWriter``), never held whole in memory (a 10M-vector
    index of int8 codes is ~3.9 GB). Returns the bytes written."""
    size = 0

    def counted(chunk: bytes) -> None:
        nonlocal size
        put(chunk)
        size += len(chunk)

    faiss.write_index(index, faiss.PyCallbackIOWriter(counted, CHUNK_BYTES))
    return size


def id_map(spec: IndexSpec, inner: faiss.Index) -> faiss.Index:
    """``inner`` wrapped in an ``IndexIDMap2`` (int64 ids, removal, ``id_map`` readable)."""
    return faiss.IndexIDMap2(inner)
