"""A collection's FAISS index over (int64 id, float32 vector) pairs, the same for every index type.

Internal ids are int64 assigned by the SQLite store and never reused, so a replaced point gets a fresh id and its
old one is removed, or tombstoned when the type cannot remove in place (``IndexType.removes_in_place``). What
differs between types (params, construction, training, search parameters, rebuilds) is asked of the
:class:`~.base.IndexType` registered for ``spec.kind``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import faiss
import numpy as np

from service.collections.index.base import IndexSpec, QuantizationSearch, stream_index
from service.collections.index.registry import get_type
from service.collections.index.scan import ScanState, rows_top_k, scan_top_k
from service.collections.metric import is_distance

#: a flat index answers every search over an allowed set, and every search over at least this many held floats
#: (rows x dimension, 32 MiB), by the NumPy scan (:mod:`.scan`), whatever the batch: FAISS's own answer to a batch
#: under its ``distance_compute_blas_threshold`` (128,000 query floats), and the same answer to larger batches, for
#: which FAISS multiplies matrices and rounds differently (cheaper too: docs/performance.md, "Flat dense scan"). Under
#: it FAISS searches: fast anyway, and OpenBLAS's threads cost more than they save on a busy machine (a 5,000 x 384
#: matrix-vector product took ~150 ms beside other work with 2 BLAS threads, under 1 ms with 1)
SCAN_MIN_FLOATS = 1 << 23
#: an allowed set of at most 1/ROWS_RATIO of the held rows is scored row by row, in place; a larger one by the scan
#: with the others masked
ROWS_RATIO = 2
#: an allowed set is given to FAISS as a bitmap while its largest id is under this many (a 512 KiB bitmap), or under
#: BITMAP_IDS_PER_ALLOWED times the number of allowed ids (64 bytes of bitmap each, about what a hash set spends)
BITMAP_MIN_IDS, BITMAP_IDS_PER_ALLOWED = 1 << 22, 512


def allowed_selector(allowed: np.ndarray) -> tuple[faiss.IDSelector, np.ndarray | None]:
    """A FAISS ``IDSelector`` admitting the int64 ids ``allowed`` (>= 0), and the array it reads (keep both alive while
    it is used): an ``IDSelectorBitmap`` (one bit per id up to the largest: a search tests a bit per scanned vector)
    while that bitmap is small (ids up to :data:`BITMAP_MIN_IDS`, or up to :data:`BITMAP_IDS_PER_ALLOWED` per allowed
    id), else FAISS's hash set ``IDSelectorBatch``. Every list of a 1M-vector IVF index scanned for 10,000 admitted
    ids: 16.6 ms with the bitmap against 22.1 with the hash set, one thread (docs/performance.md)."""
    top = int(allowed.max()) + 1 if len(allowed) else 0
    if not len(allowed) or allowed.min() < 0 or top > max(BITMAP_MIN_IDS, BITMAP_IDS_PER_ALLOWED * len(allowed)):
        return faiss.IDSelectorBatch(np.ascontiguousarray(allowed)), None
    bits = np.zeros(top, bool)
    bits[allowed] = True
    bitmap = np.packbits(bits, bitorder="little")
    return faiss.IDSelectorBitmap(len(bitmap), faiss.swig_ptr(bitmap)), bitmap


def _ids_at(ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The ids (int64) at the positions ``rows`` of the id map ``ids``, -1 where a row is -1."""
    return np.where(rows >= 0, ids[np.maximum(rows, 0)], -1) if len(ids) else np.full(rows.shape, -1, np.int64)


class VectorIndex:
    """A FAISS index over (int64 id, float32 vector) pairs with deletion and filtered search.

    Not thread-safe for writes: callers serialise :meth:`add`/:meth:`remove` and
    exclude searches while they run (the collection's readers-writer lock);
    concurrent :meth:`search` calls are safe.

    Args:
        spec: kind, metric, params, dimension.
        index: an existing FAISS index (from a snapshot); a new empty one when None.
        tombstones: ids still in an HNSW graph but deleted.
    """

    def __init__(self, spec: IndexSpec, index: faiss.Index | None = None, tombstones: np.ndarray | None = None) -> None:
        self.spec = spec
        self.type = get_type(spec.kind)
        self.index = index if index is not None else self.type.create(spec)
        self._tombstones: set[int] = set(int(t) for t in (tombstones if tombstones is not None else []))
        self._tomb_sel: Any = None
        self._tomb_arr: np.ndarray | None = None
        self._refresh_tomb_selector()
        self._scan = ScanState()

    # --- state -------------------------------------------------------------------------------
    @property
    def trained(self) -> bool:
        """Whether the configured index is in use (False: a type that trains still runs its exact fallback)."""
        return self.type.is_trained(self.spec, self.index)

    @property
    def ntotal(self) -> int:
        """Vectors held by FAISS, tombstones included."""
        return int(self.index.ntotal)

    @property
    def n_tombstones(self) -> int:
        """Deleted ids still held by an HNSW graph."""
        return len(self._tombstones)

    @property
    def live(self) -> int:
        """Searchable vectors: ``ntotal - n_tombstones``."""
        return self.ntotal - len(self._tombstones)

    def tombstones(self) -> np.ndarray:
        """The tombstoned ids, int64 ``(t,)``."""
        return np.fromiter(self._tombstones, dtype=np.int64, count=len(self._tombstones))

    def needs_rebuild(self) -> bool:
        """Tombstones have grown past what the type tolerates (HNSW: ``rebuild_fraction`` of the graph)."""
        return self.type.rebuild_due(self.spec, self.ntotal, len(self._tombstones))

    def needs_training(self, live_count: int) -> bool:
        """Still on the untrained fallback while ``live_count`` is enough to train the configured index."""
        return not self.trained and self.type.train_sample_size(self.spec, live_count) is not None

    @property
    def quantized(self) -> bool:
        """Whether searches score compressed codes (a quantized type, trained): then a search's
        :class:`~.base.QuantizationSearch` applies."""
        return self.type.rescore_defaults(self.spec, self.index) is not None

    @property
    def scores_every_code(self) -> bool:
        """Whether a search can score the code of every vector a filter admits (``search(every=True)``)."""
        return self.type.every_code_params(self.spec, self.index) is not None

    def ignores_quantization(self, quantization: QuantizationSearch | None) -> bool:
        """Whether a search asks to ignore this index's codes (``quantization.ignore`` on a quantized index): it is
        then answered from the original vectors, exactly."""
        return quantization is not None and quantization.ignore and self.quantized

    def rescore_candidates(self, k: int, quantization: QuantizationSearch | None = None) -> int | None:
        """How many candidates of an approximate search for ``k`` results to re-score exactly with the stored
        vectors: ``ceil(oversampling * k)`` (at least ``k``) when the index is quantized and rescoring is on, the
        type's defaults (:meth:`~.base.IndexType.rescore_defaults`) overridden by ``quantization``'s ``rescore`` and
        ``oversampling``; None when the index's scores are final (not quantized, or ``rescore: false``)."""
        defaults = self.type.rescore_defaults(self.spec, self.index)
        if defaults is None:
            return None
        rescore, oversampling = defaults
        if quantization is not None:
            rescore = rescore if quantization.rescore is None else quantization.rescore
            oversampling = oversampling if quantization.oversampling is None else quantization.oversampling
        return max(k, math.ceil(k * oversampling - 1e-9)) if rescore else None

    def id_array(self) -> np.ndarray | None:
        """All ids of an index wrapped in an ``IndexIDMap2``, int64; None when the index stores ids natively."""
        if isinstance(self.index, faiss.IndexIDMap2):
            return faiss.vector_to_array(self.index.id_map).astype(np.int64, copy=False)
        return None

    def _refresh_tomb_selector(self) -> None:
        if self._tombstones:
            self._tomb_arr = self.tombstones()
            batch = faiss.IDSelectorBatch(self._tomb_arr)
            self._tomb_sel = (faiss.IDSelectorNot(batch), batch)
        else:
            self._tomb_arr, self._tomb_sel = None, None

    # --- writes --------------------------------------------------------------------------------
    def plan_add(self, vectors: np.ndarray) -> object | None:
        """What :meth:`add` of ``vectors`` (float32 ``(n, dimension)``) can do ahead without changing the index
        (:meth:`~.base.IndexType.plan_add`: an IVF index's list assignment): safe beside searches and writes, so a
        write runs it before taking the collection's write mutex and passes the result to :meth:`add`."""
        v = np.ascontiguousarray(vectors, dtype=np.float32)
        ok = v.ndim == 2 and v.shape[1] == self.spec.dimension and len(v) > 0
        return self.type.plan_add(self.spec, self.index, v) if ok else None

    def add(self, ids: np.ndarray, vectors: np.ndarray, plan: object | None = None) -> None:
        """Add ``vectors`` (float32 ``(n, dimension)``) under fresh ``ids`` (int64 ``(n,)``); ``plan``:
        :meth:`plan_add`'s result for these vectors (ignored where the index was replaced since)."""
        if len(ids) == 0:
            return
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.spec.dimension or len(ids) != len(vectors):
            raise ValueError(f"expected ({len(ids)}, {self.spec.dimension}) vectors, got {vectors.shape}")
        self.type.add(self.spec, self.index, vectors, np.ascontiguousarray(ids, dtype=np.int64), plan)
        self._scan.added(vectors)
        if self.type.trains_on_add and not self.trained and (n := self.type.train_sample_size(self.spec, self.live)):
            self._train_in_place(n)

    def _train_in_place(self, n: int) -> None:
        """Replace the untrained index by the trained one over the same live vectors, trained on at most ``n`` of
        them (a seeded random sample); the tombstones go with the old index."""
        ids, held = self.held()
        sample = held if len(held) <= n else held[np.random.default_rng(0).choice(len(held), n, replace=False)]
        trained = self.type.create_trained(self.spec, np.ascontiguousarray(sample))
        self.type.add(self.spec, trained, np.ascontiguousarray(held), np.ascontiguousarray(ids, dtype=np.int64))
        self.index, self._tombstones = trained, set()
        self._refresh_tomb_selector()
        self._scan.reset()

    def remove(self, ids: np.ndarray, may_be_absent: bool = False) -> None:
        """Remove ``ids`` (int64); absent ids are ignored. A type that cannot remove in place tombstones them.

        Args:
            may_be_absent: some ``ids`` may not be in the index (a replay over a snapshot): only those present
                are tombstoned. By default every id is assumed present.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if len(ids) == 0:
            return
        if not self.type.removes_in_place:
            present = self.id_array() if may_be_absent else None
            if present is not None:
                ids = ids[np.isin(ids, present)]
            if len(ids):
                self._tombstones.update(int(i) for i in ids)
                self._refresh_tomb_selector()
        else:
            held = self._id_view() if self._scan.has_norms else None
            keep = None if held is None else ~np.isin(held, ids)  # FAISS compacts the rest in order
            self.index.remove_ids(faiss.IDSelectorBatch(ids))
            self._scan.removed(keep) if keep is not None else self._scan.reset()

    # --- search --------------------------------------------------------------------------------
    def search(
        self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None, ef: int | None = None, every: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest stored vectors of each query.

        Args:
            queries: float32 ``(nq, dimension)``.
            k: neighbours per query (>= 1).
            allowed: if given, int64 ids outside it are never returned (:func:`allowed_selector`); the type's
                search widens with the share of live vectors it admits (an IVF index's ``nprobe``:
                :func:`.coarse.filtered_nprobe`).
            ef: an HNSW graph's search breadth (None: the index's ``ef_search``; other types ignore it).
            every: score every admitted vector's code (:attr:`scores_every_code` must be true).

        Returns:
            ``(scores, ids)``, each ``(nq, k)``; missing results have id -1. Scores are inner
            products (cosine/dot) or Euclidean distances (l2), best first.
        """
        q = np.ascontiguousarray(queries, dtype=np.float32)
        k = max(1, min(int(k), max(self.ntotal, 1)))
        big = self.ntotal * self.spec.dimension >= SCAN_MIN_FLOATS
        if self.ntotal and (allowed is not None or big) and (flat := self._flat_held()) is not None:
            D, I, _ = self._scanned(q, k, allowed, flat)
            return (np.sqrt(np.maximum(D, 0)) if is_distance(self.spec.metric) else D), I
        keep: list[Any] = []
        sel = None
        if allowed is not None:
            sel, bitmap = allowed_selector(np.asarray(allowed, dtype=np.int64))
            keep += [sel, bitmap]
        if self._tomb_sel is not None:
            tomb = self._tomb_sel  # snapshot the reference: writers replace, never mutate
            keep.append(tomb)
            if sel is None:
                sel = tomb[0]
            else:
                sel = faiss.IDSelectorAnd(sel, tomb[0])
                keep.append(sel)
        if self.ntotal == 0:
            return np.full((len(q), k), np.nan, np.float32), np.full((len(q), k), -1, np.int64)
        params = self.type.every_code_params(self.spec, self.index) if every else None
        admitted = min(1.0, len(allowed) / max(self.live, 1)) if allowed is not None else 1.0
        params = params or self.type.search_params(self.spec, self.index, k, ef, admitted)
        if sel is not None:
            params.sel = sel
        D, I = self.index.search(q, k, params=params)
        del keep
        if is_distance(self.spec.metric):
            D = np.sqrt(np.maximum(D, 0))
        return D, I

    def exact_search(
        self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The exact ``k`` nearest of the vectors the index holds uncompressed (``IndexType.held_vectors``), in
        memory (:mod:`.scan`: FAISS's flat search's answer), tombstones left out; arguments and result as
        :meth:`search` (shapes ``(nq, <=k)``). None when the type holds no uncompressed vectors (IVF-PQ): the caller
        reads the store instead."""
        held = self.type.held_vectors(self.spec, self.index)
        if held is None or not isinstance(self.index, faiss.IndexIDMap2):
            return None
        q = np.ascontiguousarray(queries, dtype=np.float32)
        D, I, n = self._scanned(q, max(1, int(k)), allowed, held)
        D, I = D[:, : min(int(k), n)], I[:, : min(int(k), n)]
        return (np.sqrt(np.maximum(D, 0)) if is_distance(self.spec.metric) else D), I

    def _id_view(self) -> np.ndarray:
        """The id map's ids, int64 ``(ntotal,)``, viewed in place (valid while the index does not change)."""
        n = int(self.index.ntotal)
        return faiss.rev_swig_ptr(self.index.id_map.data(), n) if n else np.zeros(0, np.int64)

    def _flat_held(self) -> np.ndarray | None:
        """The vectors of an index that FAISS searches exhaustively (an ``IndexFlat`` behind the id map), viewed in
        place; None for any other index (its search is not a scan)."""
        if not isinstance(self.index, faiss.IndexIDMap2):
            return None
        if not isinstance(faiss.downcast_index(self.index.index), faiss.IndexFlat):
            return None
        return self.type.held_vectors(self.spec, self.index)

    def _scanned(
        self, q: np.ndarray, k: int, allowed: np.ndarray | None, held: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """FAISS's flat search of ``q`` over ``held`` (the rows of the id map), tombstones and ids outside
        ``allowed`` left out: ``(raw scores, ids, rows searched)``, ``(nq, k)`` padded as FAISS pads. Rows are scored
        one by one by FAISS's kernel where few are searched (at most 1/:data:`ROWS_RATIO` of them, or fewer than
        :data:`SCAN_MIN_FLOATS` floats held), else by the BLAS scan (:func:`.scan.scan_top_k`)."""
        ids, l2 = self._id_view(), is_distance(self.spec.metric)
        small = len(ids) * self.spec.dimension < SCAN_MIN_FLOATS
        tomb = self._tomb_arr  # snapshot the reference: writers replace, never mutate
        gone = self._scan.rows_of(ids, tomb) if tomb is not None else None
        if allowed is not None or small:
            rows = self._scan.rows_of(ids, allowed) if allowed is not None else np.arange(len(ids), dtype=np.int64)
            rows = np.setdiff1d(rows, gone, assume_unique=True) if gone is not None else rows
            n = len(rows)
            if small or n * ROWS_RATIO <= len(ids):
                D, R = rows_top_k(q, held, rows, k, l2)
                return D, _ids_at(ids, R), n
            drop = np.ones(len(ids), bool)
            drop[rows] = False
        elif gone is not None and len(gone):
            drop, n = np.zeros(len(ids), bool), len(ids) - len(gone)
            drop[gone] = True
        else:
            drop, n = None, len(ids)
        D, R = scan_top_k(q, held, k, l2, self._scan.norms(held), drop)
        return D, _ids_at(ids, R), n

    def held(self, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """``(ids, vectors)`` (int64 ``(n,)``, float32 ``(n, d)``) of the live vectors the index holds uncompressed
        (those in ``allowed`` when given), or None when the type holds none (IVF-PQ)."""
        held = self.type.held_vectors(self.spec, self.index)
        ids = self.id_array()
        if held is None or ids is None:
            return None
        keep = None
        if (tomb := self._tomb_arr) is not None:  # snapshot the reference: writers replace, never mutate
            keep = ~np.isin(ids, tomb)
        if allowed is not None:
            keep = np.isin(ids, allowed) if keep is None else keep & np.isin(ids, allowed)
        return (ids[keep], held[keep]) if keep is not None else (ids, held)

    # --- builds ----------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        spec: IndexSpec,
        chunks: Iterable[tuple[np.ndarray, np.ndarray]],
        train_sample: np.ndarray | None = None,
    ) -> VectorIndex:
        """A fresh index over ``chunks`` of ``(ids, vectors)``.

        For a type that trains, pass ``train_sample`` (float32 ``(s, dimension)``, see
        :meth:`~.base.IndexType.train_sample_size`) to build the trained index; without it the untrained
        fallback is built.
        """
        index_type = get_type(spec.kind)
        vi = cls(spec, index_type.create_trained(spec, train_sample) if train_sample is not None else None)
        for ids, vecs in chunks:
            vi.add(ids, vecs)
        return vi

    def memory_bytes(self) -> int:
        """Serialized size of the FAISS index in bytes (a close proxy of its memory), counted as FAISS writes it
        (nothing is copied)."""
        return stream_index(self.index, lambda chunk: None)
