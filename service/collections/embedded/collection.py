"""One embedded collection: a SQLite :class:`~.store.Store` (truth) plus a derived FAISS
:class:`~..index.VectorIndex` of its model-bound vector and :class:`~.named.NamedIndexes` of its other named vectors
(docs/architecture.md, "Named vectors"); implements :class:`~..backend.CollectionHandle`.

Concurrency: searches hold the read side of a readers-writer lock for the FAISS search *and* the SQLite row
lookups; a write holds a write mutex (one write at a time) and, for its SQLite commit plus the FAISS update, the
write side — so a search sees the collection either before or after a write, never half of it. Index maintenance
(HNSW rebuild, IVF-PQ training) and the switch at the end of a re-embedding build the new index beside the old one
under the write mutex only (searches continue on the old one) and swap it in under the write side. Every method
here blocks: call it from a worker thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from service.collections.embedded.locks import RWLock
from service.collections.embedded.named import NamedIndexes, prepared
from service.collections.embedded.ordering import Ordering
from service.collections.embedded.reconfigure import Reconfiguring
from service.collections.embedded.reembedding import Reembedding
from service.collections.embedded.search import assemble_hits, budgeted_page, dense_search, left_out, point_dict
from service.collections.embedded.snapshots import build_index, load_index, remove_snapshots, snapshot_path
from service.collections.embedded.store import Store
from service.collections.errors import CollectionClosed, ModelChanged
from service.collections.filters import Filter
from service.collections.ids import decode_id, encode_id
from service.collections.index import IndexSpec, VectorIndex, higher_is_better
from service.collections.schema import VectorsConfig
from service.collections.scorers import Scorer
from service.collections.vector_backend import Hit, same_model

log = logging.getLogger("service.collections")


class Collection(Reembedding, Reconfiguring, Ordering):
    """A named, persistent set of points with a FAISS index.

    Use :meth:`create` for a new one and :meth:`open` for an existing directory.
    Attributes ``name``, ``path``, ``vectors`` (:class:`~..schema.VectorsConfig`); ``spec`` (:class:`IndexSpec`) and
    ``model`` (dict with name, version, sha256) are the model-bound vector's (None without one).

    Args:
        exact_filter_threshold: a search over at most this many points (a filter's, or an index's) is exact (by
            brute force); broader filters use a FAISS ``IDSelector`` over the index.
    """

    def __init__(self, path: Path, store: Store, exact_filter_threshold: int = 20000) -> None:
        self.path = Path(path)
        self.name = self.path.name
        self.store = store
        meta = store.meta()
        # the model-bound vector's spec and model are the meta keys a re-embedding's switch rewrites
        cfg, model = meta.get("config"), meta.get("model")
        spec = IndexSpec(cfg["index"], cfg["metric"], cfg["params"], int(meta["dimension"])) if cfg else None
        if "vectors" not in meta:  # a collection from before named vectors: one model-bound vector ""
            self.vectors = VectorsConfig.single(spec, model)
        else:
            self.vectors = VectorsConfig.from_json(meta["vectors"])
            self.vectors = self.vectors.with_bound_spec(spec, model) if spec else self.vectors
        self.named = NamedIndexes(store, self.vectors)
        self.created_at: float = meta.get("created_at", 0.0)
        self.exact_filter_threshold = exact_filter_threshold
        self.index = VectorIndex(self.spec) if self.spec else None
        self._seq = int(meta["seq"])
        self._count = 0
        self._snapshot_seq = 0
        self._snapshot_time = time.monotonic()
        self._rw = RWLock()
        self._wmutex = threading.Lock()
        self._closed = False
        self.last_error: str | None = None
        # re-embedding towards another model: its target while attached, and its status (kept after it ends)
        self._target: Any = None  # an EmbeddedTarget
        self.reembed_status: dict[str, Any] | None = None

    @property
    def spec(self) -> IndexSpec | None:
        """The model-bound vector's index spec (None without one)."""
        b = self.vectors.bound
        return b.spec if b is not None else None

    @property
    def model(self) -> dict[str, Any] | None:
        """The record of the model that embedded the model-bound vectors (None without one)."""
        b = self.vectors.bound
        return b.model if b is not None else None

    # --- lifecycle ---------------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: Path, vectors: VectorsConfig, **kw: Any) -> Collection:
        """Create a collection directory at ``path`` atomically (see :meth:`Store.create_directory`) and open it.

        Raises:
            FileExistsError: ``path`` exists.
        """
        meta: dict[str, Any] = {"vectors": vectors.to_json()}
        if (b := vectors.bound) is not None:
            spec = b.spec
            meta.update(
                config={"index": spec.kind, "metric": spec.metric, "params": spec.params},
                dimension=spec.dimension,
                model=b.model,
            )
        Store.create_directory(Path(path), meta)
        return cls.open(path, **kw)

    @classmethod
    def open(cls, path: Path, **kw: Any) -> Collection:
        """Open an existing collection: load its newest snapshot, replay later writes, or rebuild."""
        c = cls(path, Store(path), **kw)
        c._load()
        return c

    def _load(self) -> None:
        if self.spec is not None:
            self.index, self._count, self._seq, self._snapshot_seq = load_index(
                self.name, self.path, self.store, self.spec
            )
        else:
            self._count, self._seq = self.store.count(), self.store.seq()
        if self.named.dense or self.vectors.sparse:
            log.info("collection %s: named vectors loaded in %.2fs", self.name, self.named.load())

    def _build_index(self, count: int) -> VectorIndex:
        return build_index(self.store, self.spec, count)

    def close(self) -> None:
        """Wait for running operations, then close the store. Idempotent."""
        with self._wmutex:
            with self._rw.write():
                if self._closed:
                    return
                self._closed = True
                self.store.close()

    def _check_open(self) -> None:
        if self._closed:
            raise CollectionClosed(f"collection {self.name!r} not found (deleted)")

    @contextmanager
    def writes_paused(self) -> Iterator[None]:
        """Hold the write mutex: no write, FAISS snapshot or pruning runs inside (searches do). Raises CollectionClosed."""
        with self._wmutex:
            self._check_open()
            yield

    # --- writes ----------------------------------------------------------------------------------------------
    def _prepare(self, vectors: np.ndarray) -> np.ndarray:
        v = np.ascontiguousarray(vectors, dtype=np.float32)
        if v.ndim != 2 or v.shape[1] != self.spec.dimension:
            raise ValueError(f"vectors must have shape (n, {self.spec.dimension}), got {v.shape}")
        return prepared(v, self.spec.metric)

    def upsert(
        self, ids, texts, payloads, vectors, *, model=None, shadow_model=None, shadow_vectors=None, named=None
    ) -> int:
        """Insert or replace points durably (SQLite commit, fsynced) and searchably (FAISS updated); also writes the
        attached re-embedding's vectors. See :meth:`~..backend.CollectionHandle.upsert` for the arguments.

        Raises:
            CollectionClosed, ModelChanged; ValueError: vector shape mismatch.
        """
        last: dict[str, int] = {}
        for i, pid in enumerate(ids):
            last[encode_id(pid)] = i
        order = list(last.values())
        keys = list(last.keys())
        texts_ = [texts[i] for i in order]
        payloads_ = [json.dumps(payloads[i] or {}, ensure_ascii=False, allow_nan=False) for i in order]
        with self._wmutex:
            self._check_open()
            if model is not None and not same_model(model, self.model):
                if not same_model(shadow_model, self.model):
                    raise ModelChanged(f"collection {self.name} is now embedded by {self.model}")
                vectors, shadow_model, shadow_vectors = shadow_vectors, None, None  # a swap happened meanwhile
            shadow = self._target
            if shadow is not None and (shadow_vectors is None or not same_model(shadow_model, shadow.model)):
                raise ModelChanged(f"collection {self.name} is being re-embedded with {shadow.model}")
            vecs = self._prepare(vectors)[order] if self.spec is not None else None
            extra = self.named.prepare([named[i] for i in order]) if named else None
            with self._rw.write():
                seq, new_iids, old_iids, lost = self.store.upsert(
                    keys, texts_, payloads_, vecs, extra, self.named.fields
                )
                self._seq = seq
                self._count += len(new_iids) - len(old_iids)
                if self.index is not None:
                    self._apply(lambda: (self.index.remove(old_iids), self.index.add(new_iids, vecs)))
                self.named.removed(old_iids, lost)
                self.named.added(new_iids, extra or [])
            if shadow is not None:
                shadow.write(new_iids, np.asarray(shadow_vectors, dtype=np.float32)[order])
        return seq

    def delete(self, ids: list[int | str] | None = None, where: Filter | None = None) -> tuple[int, int]:
        """Delete points by ``ids`` and/or filter ``where``; returns ``(deleted, seq)`` once durable."""
        keys = [encode_id(i) for i in ids] if ids is not None else None
        with self._wmutex:
            self._check_open()
            with self._rw.write():
                seq, old, lost = self.store.delete(keys, where, self.named.fields)
                self._seq = seq
                self._count -= len(old)
                if self.index is not None:
                    self._apply(lambda: self.index.remove(old))
                self.named.removed(old, lost)
        return len(old), seq

    def _apply(self, fn: Any) -> None:
        """Apply a committed write to FAISS; on failure rebuild the index from SQLite (the truth)."""
        try:
            fn()
        except Exception as e:
            log.exception("collection %s: index update failed; rebuilding from SQLite", self.name)
            self.last_error = f"index rebuilt after: {e}"
            self.index = self._build_index(self._count)

    # --- maintenance ----------------------------------------------------------------------------------------
    def needs_maintenance(self) -> bool:
        """An HNSW rebuild (too many tombstones) or IVF-PQ training (enough points) is due."""
        idx = self.index
        return not self._closed and idx is not None and (idx.needs_rebuild() or idx.needs_training(self._count))

    def maintain(self) -> str | None:
        """Rebuild or train the index if due, beside the live one, then swap it in.

        Searches continue on the old index meanwhile; writes wait. Returns what was done.
        """
        with self._wmutex:
            if not self.needs_maintenance():
                return None
            what = "trained ivf_pq" if self.index.needs_training(self._count) else "rebuilt hnsw"
            t0 = time.monotonic()
            new = self._build_index(self._count)
            with self._rw.write():
                self.index = new
            log.info("collection %s: %s over %d points in %.2fs", self.name, what, self._count, time.monotonic() - t0)
            return what

    def changes_since_snapshot(self) -> int:
        """Writes (sequence numbers) not covered by the newest snapshot."""
        return self._seq - self._snapshot_seq

    def seconds_since_snapshot(self) -> float:
        """Seconds since the last snapshot (or since open)."""
        return time.monotonic() - self._snapshot_time

    def snapshot(self) -> int | None:
        """Write a FAISS snapshot covering every write so far (atomically), prune what it covers.

        Returns the covered sequence number, or None when nothing changed since the last one.
        """
        with self._wmutex:
            if self._closed or self._seq == self._snapshot_seq:
                return None
            seq = self._seq
            if self.index is not None:
                self.index.write_snapshot(snapshot_path(self.path, seq), seq)
            self.store.prune_removed(seq)
            remove_snapshots(self.path, below=seq)
            self._snapshot_seq = seq
            self._snapshot_time = time.monotonic()
            return seq

    # --- reads --------------------------------------------------------------------------------------------------
    def search(
        self,
        queries,
        top_k,
        where=None,
        score_threshold=None,
        with_payload=True,
        with_text=True,
        model=None,
        budget=None,
        consistency=None,
        using=None,
        exact=False,
    ) -> list[list[Hit]]:
        """Nearest points of each query by the vector ``using`` (None: the model-bound one), see
        :meth:`~..backend.CollectionHandle.search`. A filter only leaving listed points out is a search for that many
        more hits (:func:`.search.left_out`). A dense search is :func:`.search.dense_search` (exact over a narrow
        filter's points or when ``exact`` asks, else FAISS); a sparse one is exact (:meth:`.named.NamedIndexes.sparse_search`). Always
        strong (``consistency`` is accepted and needs nothing: a write is answered once searchable).

        Raises:
            CollectionClosed, ModelChanged.
        """
        using = self.vectors.bound.name if using is None and self.vectors.bound else using
        bound = self.vectors.bound is not None and using == self.vectors.bound.name
        with self._rw.read():
            self._check_open()
            if bound and model is not None and not same_model(model, self.model):
                raise ModelChanged(f"collection {self.name} is now embedded by {self.model}")
            (where, dropped), nq = left_out(self.store, where), len(queries)
            allowed, k = None, top_k + len(dropped)
            if where is not None:
                allowed = self.store.matching_iids(where)
                if len(allowed) == 0:
                    return [[] for _ in range(nq)]
            if self.named.scanned(using):  # a sparse vector or a multivector: no FAISS index
                D, I = self.named.sparse_search(using, queries, k, allowed)
                metric = self.named.metric(using)
            else:
                if bound:
                    index, q = self.index, queries if isinstance(queries, Scorer) else self._prepare(queries)
                    fetch = lambda iids: self.store.vectors_for(iids, self.spec.dimension)  # noqa: E731
                    scan = lambda: self.store.iter_vectors(self.spec.dimension)  # noqa: E731
                else:
                    index, q = self.named.indexes[using], prepared(queries, self.named.dense[using].spec.metric)
                    fetch = lambda iids: self.named.fetch_dense(using, iids)  # noqa: E731
                    scan = lambda: self.named.scan_dense(using)  # noqa: E731
                cap = self.exact_filter_threshold
                scored = isinstance(q, Scorer)  # a multi-example query: higher is better whatever the metric
                D, I = dense_search(index, fetch, q, top_k, k, allowed, cap, scan if exact or scored else None)
                metric = "dot" if scored else index.spec.metric
            if len(dropped):
                I = np.where(np.isin(I, dropped), -1, I)  # left out (assemble_hits skips -1)
            found, counts = np.unique(I[I >= 0], return_counts=True)
            wanted = [int(i) for i in found]
            hits_per_row = dict(zip(wanted, (int(n) for n in counts)))
            rows = self.store.rows_for(wanted, with_text, with_payload, budget, hits_per_row) if wanted else {}
        return assemble_hits(D, I, rows, top_k, score_threshold, higher_is_better(metric))

    def _points(self, rows: list[tuple], with_vector: Any) -> list[dict[str, Any]]:
        """Stored rows ``(id, iid, text, payload, vector bytes)`` as points: ``vector`` the model-bound vector and
        ``vectors`` the named others asked for by ``with_vector`` (:meth:`.named.NamedIndexes.wanted`)."""
        want_bound, others = self.named.wanted(with_vector)
        named = self.named.vectors_of([r[1] for r in rows], others) if others else {}
        has_named = bool(self.named.dense or self.vectors.sparse)  # then "vectors" is always answered, maybe empty
        return [
            point_dict(pid, t, p, v if want_bound else None, named.get(iid, {}) if has_named else None)
            for pid, iid, t, p, v in rows
        ]

    def get(self, point_id: int | str, with_vector: Any = False, consistency: Any = None) -> dict[str, Any] | None:
        """The stored point ``{id, text, payload[, vector][, vectors]}`` or None (always strong)."""
        with self._rw.read():
            self._check_open()
            row = self.store.get(encode_id(point_id))
            return None if row is None else self._points([(point_id, *row)], with_vector)[0]

    def scroll(self, start, limit, where=None, with_vector=False, budget=None, with_text=True, with_payload=True):
        """Points in id order (integers numerically, then strings) from ``start``, as the backend's ``scroll`` says;
        with a ``budget``, a page's bytes are spent before its texts, payloads and vectors are read
        (:func:`.search.budgeted_page`). Raises CollectionClosed, ResponseTooLarge."""
        with self._rw.read():
            self._check_open()
            key = None if start is None else encode_id(start)
            if budget is None:
                rows = self.store.scroll(key, limit, where, bool(with_vector), with_text, with_payload)
            else:
                bound, others = self.named.wanted(with_vector)
                page = self.store.scroll(key, limit, where, False, False, False)  # ids only: spent before read
                dim = self.spec.dimension if bound else 0
                rows = budgeted_page(self.store, self.named, page, dim, others, budget, with_text, with_payload)
            return self._points([(decode_id(k), i, t, p, v) for k, i, t, p, v in rows], with_vector)

    def count_matching(self, where: Filter | None = None) -> int:
        """Live points matching ``where``, counted exactly."""
        with self._rw.read():
            self._check_open()
            return self.store.count_where(where)

    @property
    def count(self) -> int:
        """Live points."""
        return self._count

    @property
    def seq(self) -> int:
        """The last write's sequence number."""
        return self._seq

    def info(self, consistency: Any = None) -> dict[str, Any]:
        """Description for ``GET /collections/{name}`` (always strong; under the read lock, so a switch is seen
        whole: model, dimension, index and the re-embedding's state together). ``dimension``, ``metric``, ``index``
        and ``model`` are the model-bound vector's (None / empty without one); ``vectors`` describes them all."""
        with self._rw.read():
            idx, spec = self.index, self.spec
            index = {
                "type": spec.kind if spec else None,
                "params": spec.params if spec else {},
                "trained": idx.trained if idx else True,
                "vectors": idx.ntotal if idx else 0,
                "in_use": (spec.kind if idx.trained else "flat (until trained)") if idx else None,
                "tombstones": idx.n_tombstones if idx else 0,
            }
            vectors, named = self.vectors.to_json(), self.named.info()
            for kind in ("dense", "sparse"):
                for n, v in vectors[kind].items():
                    v.update(named.get(n, {"points": self._count}))  # the model-bound one: every point
            return {
                "name": self.name,
                "status": "ok" if not self._closed else "closed",
                "count": self._count,
                "dimension": spec.dimension if spec else None,
                "metric": spec.metric if spec else None,
                "index": index,
                "trained": index["trained"],
                "model": self.model,
                "vectors": vectors,
                "reembedding": self.reembed_status,
                "sequence": self._seq,
                "snapshot_sequence": self._snapshot_seq,
                "snapshot_age_seconds": round(self.seconds_since_snapshot(), 3),
                "created_at": self.created_at,
            }
