"""FAISS indexes derived from a collection's stored vectors.

Three kinds, one interface (:class:`VectorIndex`):

* ``flat``: ``IndexIDMap2`` over ``IndexFlatIP`` / ``IndexFlatL2``; exact; ids removed in place.
* ``hnsw``: ``IndexIDMap2`` over ``IndexHNSWFlat``. HNSW cannot remove vectors, so a
  deleted or replaced id becomes a *tombstone*: it stays in the graph, is excluded
  from results by an ``IDSelector``, and the index is rebuilt from the stored
  vectors once tombstones exceed ``rebuild_fraction`` of the graph.
* ``ivf_pq``: ``IndexIVFPQ`` (ids stored natively, removal supported) once the
  collection holds ``min_train_points`` vectors; until then an exact flat index.
  Training uses a random sample of at most ``train_sample`` stored vectors.

Internal ids are int64 assigned by the SQLite store and never reused, so a replaced
point gets a fresh id and its old one is removed (or tombstoned).

Scores: ``cosine`` and ``dot`` use inner product (vectors of a cosine collection are
L2-normalised), higher is better; ``l2`` reports the Euclidean distance (not squared),
lower is better.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

INDEX_KINDS = ("flat", "hnsw", "ivf_pq")
METRICS = ("cosine", "dot", "l2")

HNSW_DEFAULTS = {"M": 32, "ef_construction": 100, "ef_search": 64, "rebuild_fraction": 0.2}
IVF_PQ_DEFAULTS = {"nlist": 1024, "nprobe": 16, "m": 48, "nbits": 8, "rerank": 4}

_SNAP_MAGIC = b"EMBSNAP1"


class IndexConfigError(ValueError):
    """Index kind, metric or params are invalid (message names the field)."""


def _int_param(params: dict[str, Any], name: str, lo: int, hi: int) -> int:
    v = params[name]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise IndexConfigError(f"params.{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def normalize_params(kind: str, params: dict[str, Any] | None, dimension: int) -> dict[str, Any]:
    """Fill defaults and validate the params of an index ``kind`` for vectors of ``dimension``.

    flat: no params. hnsw: ``M`` (4..256), ``ef_construction`` (8..4096), ``ef_search``
    (1..4096), ``rebuild_fraction`` (0.01..1, tombstone share that triggers a rebuild).
    ivf_pq: ``nlist`` (1..65536), ``nprobe`` (1..nlist), ``m`` (sub-quantizers; must
    divide ``dimension``), ``nbits`` (4..12), ``min_train_points`` (default
    ``max(39 * nlist, 39 * 2**nbits)``, at least ``max(nlist, 2**nbits)``),
    ``train_sample`` (default ``max(min_train_points, 64 * nlist)`` capped at 200k),
    ``rerank`` (default 4: fetch ``rerank * top_k`` PQ candidates and re-score them with
    the exact stored vectors; 1 returns raw PQ scores).

    Returns:
        the complete params dict.

    Raises:
        IndexConfigError: unknown kind, unknown param name, or a value out of range.
    """
    params = dict(params or {})
    if kind == "flat":
        if params:
            raise IndexConfigError(f"params: flat takes no params, got {sorted(params)}")
        return {}
    if kind == "hnsw":
        unknown = set(params) - set(HNSW_DEFAULTS)
        if unknown:
            raise IndexConfigError(f"params: unknown hnsw params {sorted(unknown)} (known: {sorted(HNSW_DEFAULTS)})")
        out = {**HNSW_DEFAULTS, **params}
        _int_param(out, "M", 4, 256)
        _int_param(out, "ef_construction", 8, 4096)
        _int_param(out, "ef_search", 1, 4096)
        rf = out["rebuild_fraction"]
        if isinstance(rf, bool) or not isinstance(rf, (int, float)) or not 0.01 <= rf <= 1.0:
            raise IndexConfigError(f"params.rebuild_fraction must be a number in [0.01, 1], got {rf!r}")
        out["rebuild_fraction"] = float(rf)
        return out
    if kind == "ivf_pq":
        known = set(IVF_PQ_DEFAULTS) | {"min_train_points", "train_sample"}
        unknown = set(params) - known
        if unknown:
            raise IndexConfigError(f"params: unknown ivf_pq params {sorted(unknown)} (known: {sorted(known)})")
        out = {**IVF_PQ_DEFAULTS, **params}
        nlist = _int_param(out, "nlist", 1, 65536)
        if "nprobe" not in params:
            out["nprobe"] = min(IVF_PQ_DEFAULTS["nprobe"], nlist)
        _int_param(out, "nprobe", 1, nlist)
        m = _int_param(out, "m", 1, dimension)
        if dimension % m:
            raise IndexConfigError(f"params.m={m} must divide the dimension {dimension}")
        nbits = _int_param(out, "nbits", 4, 12)
        _int_param(out, "rerank", 1, 100)
        floor = max(nlist, 2**nbits)
        out.setdefault("min_train_points", max(39 * nlist, 39 * 2**nbits))
        _int_param(out, "min_train_points", floor, 10**9)
        out.setdefault("train_sample", min(max(out["min_train_points"], 64 * nlist), 200_000))
        _int_param(out, "train_sample", floor, 10**9)
        return out
    raise IndexConfigError(f"index must be one of {INDEX_KINDS}, got {kind!r}")


def faiss_metric(metric: str) -> int:
    """The FAISS metric constant for ``cosine``/``dot`` (inner product) or ``l2``."""
    if metric not in METRICS:
        raise IndexConfigError(f"metric must be one of {METRICS}, got {metric!r}")
    return faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT


def higher_is_better(metric: str) -> bool:
    """True for similarity scores (cosine, dot), False for distances (l2)."""
    return metric != "l2"


@dataclass
class IndexSpec:
    """What a collection's index is: ``kind``, ``metric``, complete ``params``, vector ``dimension``."""

    kind: str
    metric: str
    params: dict[str, Any]
    dimension: int


def _flat(spec: IndexSpec) -> faiss.Index:
    return faiss.IndexIDMap2(faiss.IndexFlat(spec.dimension, faiss_metric(spec.metric)))


def _hnsw(spec: IndexSpec) -> faiss.Index:
    inner = faiss.IndexHNSWFlat(spec.dimension, spec.params["M"], faiss_metric(spec.metric))
    inner.hnsw.efConstruction = spec.params["ef_construction"]
    inner.hnsw.efSearch = spec.params["ef_search"]
    return faiss.IndexIDMap2(inner)


def _ivf_pq(spec: IndexSpec) -> faiss.Index:
    metric = faiss_metric(spec.metric)
    quantizer = faiss.IndexFlat(spec.dimension, metric)
    index = faiss.IndexIVFPQ(
        quantizer, spec.dimension, spec.params["nlist"], spec.params["m"], spec.params["nbits"], metric
    )
    index.own_fields = True
    quantizer.this.disown()
    index.nprobe = spec.params["nprobe"]
    return index


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
        if index is None:
            index = _hnsw(spec) if spec.kind == "hnsw" else _flat(spec)
        self.index = index
        self._tombstones: set[int] = set(int(t) for t in (tombstones if tombstones is not None else []))
        self._tomb_sel: Any = None
        self._tomb_arr: np.ndarray | None = None
        self._refresh_tomb_selector()

    # --- state -------------------------------------------------------------------------------
    @property
    def trained(self) -> bool:
        """Whether the configured index is in use: always for flat/hnsw; for ivf_pq once trained."""
        return self.spec.kind != "ivf_pq" or isinstance(self.index, faiss.IndexIVF)

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
        """HNSW only: tombstones exceed ``rebuild_fraction`` of the graph."""
        if self.spec.kind != "hnsw" or not self._tombstones:
            return False
        return len(self._tombstones) > self.spec.params["rebuild_fraction"] * max(self.ntotal, 1)

    def needs_training(self, live_count: int) -> bool:
        """ivf_pq only: still flat and ``live_count`` reached ``min_train_points``."""
        return self.spec.kind == "ivf_pq" and not self.trained and live_count >= self.spec.params["min_train_points"]

    def id_array(self) -> np.ndarray | None:
        """All ids in an ``IndexIDMap2`` (flat/hnsw/untrained ivf_pq), int64; None for a trained IVF index."""
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
    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add ``vectors`` (float32 ``(n, dimension)``) under fresh ``ids`` (int64 ``(n,)``)."""
        if len(ids) == 0:
            return
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.spec.dimension or len(ids) != len(vectors):
            raise ValueError(f"expected ({len(ids)}, {self.spec.dimension}) vectors, got {vectors.shape}")
        self.index.add_with_ids(vectors, np.ascontiguousarray(ids, dtype=np.int64))

    def remove(self, ids: np.ndarray, present: np.ndarray | None = None) -> None:
        """Remove ``ids`` (int64); absent ids are ignored. HNSW tombstones them instead.

        Args:
            present: for HNSW, the ids known to be in the graph (when some of ``ids`` may not be);
                by default every id is assumed present.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if len(ids) == 0:
            return
        if self.spec.kind == "hnsw":
            if present is not None:
                ids = ids[np.isin(ids, present)]
            if len(ids):
                self._tombstones.update(int(i) for i in ids)
                self._refresh_tomb_selector()
        else:
            self.index.remove_ids(faiss.IDSelectorBatch(ids))

    # --- search --------------------------------------------------------------------------------
    def search(self, queries: np.ndarray, k: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest stored vectors of each query.

        Args:
            queries: float32 ``(nq, dimension)``.
            k: neighbours per query (>= 1).
            allowed: if given, int64 ids outside it are never returned (FAISS ``IDSelectorBatch``).

        Returns:
            ``(scores, ids)``, each ``(nq, k)``; missing results have id -1. Scores are inner
            products (cosine/dot) or Euclidean distances (l2), best first.
        """
        q = np.ascontiguousarray(queries, dtype=np.float32)
        k = max(1, min(int(k), max(self.ntotal, 1)))
        keep: list[Any] = []
        sel = None
        if allowed is not None:
            batch = faiss.IDSelectorBatch(np.ascontiguousarray(allowed, dtype=np.int64))
            keep.append(batch)
            sel = batch
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
        if self.spec.kind == "hnsw":
            params = faiss.SearchParametersHNSW()
            params.efSearch = max(self.spec.params["ef_search"], k)
        elif isinstance(self.index, faiss.IndexIVF):
            params = faiss.SearchParametersIVF()
            params.nprobe = self.spec.params["nprobe"]
        else:
            params = faiss.SearchParameters()
        if sel is not None:
            params.sel = sel
        D, I = self.index.search(q, k, params=params)
        del keep
        if self.spec.metric == "l2":
            D = np.sqrt(np.maximum(D, 0))
        return D, I

    # --- builds ----------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        spec: IndexSpec,
        chunks: Iterable[tuple[np.ndarray, np.ndarray]],
        train_sample: np.ndarray | None = None,
    ) -> VectorIndex:
        """A fresh index over ``chunks`` of ``(ids, vectors)``.

        For ivf_pq, pass ``train_sample`` (float32 ``(s, dimension)``) to train an IVF-PQ
        index; without it (too few vectors) the untrained flat fallback is built.
        """
        if spec.kind == "ivf_pq" and train_sample is not None:
            index = _ivf_pq(spec)
            index.train(np.ascontiguousarray(train_sample, dtype=np.float32))
            vi = cls(spec, index)
        else:
            vi = cls(spec)
        for ids, vecs in chunks:
            vi.add(ids, vecs)
        return vi

    # --- snapshots ---------------------------------------------------------------------------------
    def write_snapshot(self, path: Path, seq: int) -> int:
        """Write this index, its tombstones and ``seq`` (the last write it covers) to ``path`` atomically.

        Temporary file in the same directory, fsync, rename over ``path``, fsync the directory.

        Returns:
            bytes written.
        """
        body = faiss.serialize_index(self.index)
        tomb = self.tombstones()
        header = json.dumps(
            {
                "seq": int(seq),
                "kind": self.spec.kind,
                "metric": self.spec.metric,
                "dimension": self.spec.dimension,
                "trained": self.trained,
                "n_tombstones": int(len(tomb)),
                "index_bytes": int(len(body)),
                "crc32": zlib.crc32(memoryview(body), zlib.crc32(tomb.tobytes())),
            }
        ).encode()
        tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write(_SNAP_MAGIC + struct.pack("<Q", len(header)) + header)
            f.write(tomb.tobytes())
            f.write(memoryview(body))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
        return len(header) + len(tomb) * 8 + len(body) + 16

    @classmethod
    def read_snapshot(cls, path: Path, spec: IndexSpec) -> tuple[VectorIndex, int]:
        """Load a snapshot written by :meth:`write_snapshot`.

        Returns:
            ``(index, seq)``.

        Raises:
            ValueError: bad magic, checksum, or a kind/metric/dimension that differs from ``spec``.
        """
        with open(path, "rb") as f:
            if f.read(8) != _SNAP_MAGIC:
                raise ValueError(f"{path}: not a snapshot")
            (hlen,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(hlen))
            tomb = np.frombuffer(f.read(8 * header["n_tombstones"]), dtype=np.int64)
            body = np.frombuffer(f.read(), dtype=np.uint8)
        if (
            len(body) != header["index_bytes"]
            or zlib.crc32(memoryview(body), zlib.crc32(tomb.tobytes())) != header["crc32"]
        ):
            raise ValueError(f"{path}: truncated or corrupt (checksum mismatch)")
        for key in ("kind", "metric", "dimension"):
            if header[key] != getattr(spec, key):
                raise ValueError(
                    f"{path}: snapshot {key} {header[key]!r} differs from the collection's {getattr(spec, key)!r}"
                )
        index = faiss.deserialize_index(body)
        if isinstance(index, faiss.IndexIVF):
            index.nprobe = spec.params["nprobe"]
        return cls(spec, index, tomb), int(header["seq"])

    def memory_bytes(self) -> int:
        """Serialized size of the FAISS index in bytes (a close proxy of its memory)."""
        return int(len(faiss.serialize_index(self.index)))


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename or create inside it is durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def exact_search(
    queries: np.ndarray, vectors: np.ndarray, ids: np.ndarray, k: int, metric: str
) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force top ``k`` of ``queries`` (``(nq, d)``) over ``vectors`` (``(n, d)``) with ``ids`` (``(n,)``).

    Returns ``(scores, ids)`` shaped ``(nq, min(k, n))``, best first, in the same
    units as :meth:`VectorIndex.search`.
    """
    nq = len(queries)
    if len(ids) == 0:
        return np.zeros((nq, 0), np.float32), np.zeros((nq, 0), np.int64)
    k = min(k, len(ids))
    if metric == "l2":
        d2 = (queries**2).sum(1)[:, None] - 2 * queries @ vectors.T + (vectors**2).sum(1)[None, :]
        score = -np.maximum(d2, 0)
    else:
        score = queries @ vectors.T
    part = np.argpartition(-score, k - 1, axis=1)[:, :k] if k < len(ids) else np.tile(np.arange(len(ids)), (nq, 1))
    ps = np.take_along_axis(score, part, 1)
    order = np.argsort(-ps, axis=1, kind="stable")
    top = np.take_along_axis(part, order, 1)
    s = np.take_along_axis(score, top, 1).astype(np.float32)
    if metric == "l2":
        s = np.sqrt(-s)
    return s, ids[top]
