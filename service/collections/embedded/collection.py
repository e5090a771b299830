"""One embedded collection: a SQLite :class:`~.store.Store` (truth) plus a derived FAISS
:class:`~..index.VectorIndex`; implements :class:`~..backend.CollectionHandle`.

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

from ..backend import Hit, model_id, same_model
from ..errors import CollectionClosed, ModelChanged
from ..filters import Filter
from ..ids import decode_id, encode_id
from ..index import IndexSpec, VectorIndex, exact_search, get_type, higher_is_better
from ..vectors import unit_rows
from .locks import RWLock
from .search import assemble_hits, left_out, point_dict, rerank
from .snapshots import build_index, load_index, remove_snapshots, snapshot_path
from .store import Store
from .target import EmbeddedTarget

log = logging.getLogger("service.collections")


class Collection:
    """A named, persistent set of points with a FAISS index.

    Use :meth:`create` for a new one and :meth:`open` for an existing directory.
    Attributes ``name``, ``path``, ``spec`` (:class:`IndexSpec`), ``model`` (dict with
    name, version, sha256) are fixed at creation.

    Args:
        exact_filter_threshold: a filtered search whose filter matches at most this many
            points is answered by brute force over their stored vectors (exact, for any
            index kind); broader filters use a FAISS ``IDSelector`` over the index.
    """

    def __init__(self, path: Path, store: Store, exact_filter_threshold: int = 20000) -> None:
        self.path = Path(path)
        self.name = self.path.name
        self.store = store
        meta = store.meta()
        cfg = meta["config"]
        self.spec = IndexSpec(cfg["index"], cfg["metric"], cfg["params"], int(meta["dimension"]))
        self.model: dict[str, Any] = meta["model"]
        self.created_at: float = meta.get("created_at", 0.0)
        self.exact_filter_threshold = exact_filter_threshold
        self.index = VectorIndex(self.spec)
        self._seq = int(meta["seq"])
        self._count = 0
        self._snapshot_seq = 0
        self._snapshot_time = time.monotonic()
        self._rw = RWLock()
        self._wmutex = threading.Lock()
        self._closed = False
        self.last_error: str | None = None
        # re-embedding towards another model: its target while attached, and its status (kept after it ends)
        self._target: EmbeddedTarget | None = None
        self.reembed_status: dict[str, Any] | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: Path, spec: IndexSpec, model: dict[str, Any], **kw: Any) -> Collection:
        """Create a collection directory at ``path`` atomically (see :meth:`Store.create_directory`) and open it.

        Raises:
            FileExistsError: ``path`` exists.
        """
        meta = {
            "config": {"index": spec.kind, "metric": spec.metric, "params": spec.params},
            "dimension": spec.dimension,
            "model": model,
        }
        Store.create_directory(Path(path), meta)
        return cls.open(path, **kw)

    @classmethod
    def open(cls, path: Path, **kw: Any) -> Collection:
        """Open an existing collection: load its newest snapshot, replay later writes, or rebuild."""
        c = cls(path, Store(path), **kw)
        c._load()
        return c

    def _load(self) -> None:
        self.index, self._count, self._seq, self._snapshot_seq = load_index(self.name, self.path, self.store, self.spec)

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
        if self.spec.metric == "cosine":
            return unit_rows(v)
        return np.ascontiguousarray(v, dtype=np.float32)

    def upsert(self, ids, texts, payloads, vectors, *, model=None, shadow_model=None, shadow_vectors=None) -> int:
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
            vecs = self._prepare(vectors)[order]
            with self._rw.write():
                seq, new_iids, old_iids = self.store.upsert(keys, texts_, payloads_, vecs)
                self._seq = seq
                self._count += len(new_iids) - len(old_iids)
                self._apply(lambda: (self.index.remove(old_iids), self.index.add(new_iids, vecs)))
            if shadow is not None:
                shadow.write(new_iids, np.asarray(shadow_vectors, dtype=np.float32)[order])
        return seq

    def delete(self, ids: list[int | str] | None = None, where: Filter | None = None) -> tuple[int, int]:
        """Delete points by ``ids`` and/or filter ``where``; returns ``(deleted, seq)`` once durable."""
        keys = [encode_id(i) for i in ids] if ids is not None else None
        with self._wmutex:
            self._check_open()
            with self._rw.write():
                seq, old = self.store.delete(keys, where)
                self._seq = seq
                self._count -= len(old)
                self._apply(lambda: self.index.remove(old))
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
        return not self._closed and (self.index.needs_rebuild() or self.index.needs_training(self._count))

    def maintain(self) -> str | None:
        """Rebuild or train the index if due, beside the live one, then swap it in.

        Searches continue on the old index meanwhile; writes wait. Returns what was done.
        """
        with self._wmutex:
            if self._closed or not (self.index.needs_rebuild() or self.index.needs_training(self._count)):
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
            self.index.write_snapshot(snapshot_path(self.path, seq), seq)
            self.store.prune_removed(seq)
            remove_snapshots(self.path, below=seq)
            self._snapshot_seq = seq
            self._snapshot_time = time.monotonic()
            return seq

    # --- re-embedding ---------------------------------------------------------------------------------------
    @property
    def reembed_model(self) -> dict[str, Any] | None:
        """The target model of the attached re-embedding (upserts must carry its vectors too), else None."""
        t = self._target
        return dict(t.model) if t is not None else None

    def begin_reembed(self, model: dict[str, Any], dimension: int, owner: str = "") -> EmbeddedTarget:
        """Attach a re-embedding towards ``model`` (resuming its stored target vectors if it was interrupted);
        from now on every upsert writes both vectors. ``owner`` is not needed: one process owns the collection.

        Raises:
            InvalidCollectionRequest: the index params cannot be carried to ``dimension``.
            CollectionClosed: the collection was deleted.
        """
        target = EmbeddedTarget(self, model, dimension)
        target.prepare()
        with self._wmutex:
            self._check_open()
            if self._target is not None:
                self._target.abandoned = True
            self._target = target
            self.reembed_status = target.status
        return target

    def detach_reembed(self, target: EmbeddedTarget) -> None:
        """Stop writing ``target``'s vectors (if it is still the attached one)."""
        with self._wmutex:
            if self._target is target:
                self._target = None

    def complete_reembed(self, target: EmbeddedTarget) -> bool:
        """Switch to ``target``'s vectors: the new index is built beside the old one (searches go on, writes wait),
        then one SQLite transaction moves the vectors and records the model, dimension and index params, and the
        index, spec and model are swapped under the write side; the old snapshots are deleted.

        Returns:
            True when switched; False when points still lack a target vector or ``target`` is not attached.
        """
        with self._wmutex:
            self._check_open()
            if self._target is not target or target.table.missing():
                return False
            spec = target.spec
            n = get_type(spec.kind).train_sample_size(spec, self._count)
            t0 = time.monotonic()
            index = VectorIndex.build(
                spec, target.table.iter_vectors(), train_sample=target.table.sample(n) if n else None
            )
            built = time.monotonic() - t0
            with self._rw.write():
                # the old vectors' snapshots go first: the promote keeps the sequence number, so after a crash
                # between the two one of them would load as if it held the new model's vectors; without one, an
                # open rebuilds from SQLite, whichever side of the promote the crash fell
                remove_snapshots(self.path)
                config = {"index": spec.kind, "metric": spec.metric, "params": spec.params}
                target.table.promote(target.model, spec.dimension, config)
                self.index, self.spec, self.model = index, spec, dict(target.model)
                self._target = None
                # with the model, under the same lock as info(): never the new model beside a "running" state
                target.status.update(state="completed", done=self._count, total=self._count, finished_at=time.time())
                self._snapshot_seq, self._snapshot_time = 0, time.monotonic()
        log.info(
            "collection %s: switched to %s (%d points, dimension %d; index built in %.2fs)",
            self.name, model_id(target.model), self._count, spec.dimension, built,
        )  # fmt: skip
        try:
            self.snapshot()
        except Exception:
            log.exception("collection %s: snapshot after the switch failed (SQLite has everything)", self.name)
        return True

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
    ) -> list[list[Hit]]:
        """Nearest points of each query (see :meth:`~..backend.CollectionHandle.search`). A filter only leaving listed
        points out is a search for that many more hits (:func:`.search.left_out`). A filter matching at most
        ``exact_filter_threshold`` points is answered exactly over their stored vectors; a broader one restricts the
        FAISS search with an ``IDSelector``; IVF-PQ candidates are re-ranked exactly. Always strong (``consistency``
        is accepted and needs nothing: a write is answered once searchable).

        Raises:
            CollectionClosed, ModelChanged.
        """
        with self._rw.read():
            self._check_open()
            if model is not None and not same_model(model, self.model):
                raise ModelChanged(f"collection {self.name} is now embedded by {self.model}")
            q, (where, dropped) = self._prepare(queries), left_out(self.store, where)
            allowed, exact, k = None, None, top_k + len(dropped)
            if where is not None:
                cap = self.exact_filter_threshold
                allowed = self.store.matching_iids(where)
                if len(allowed) == 0:
                    return [[] for _ in range(len(q))]
                if len(allowed) <= cap:
                    ids, vecs = self.store.vectors_for(allowed, self.spec.dimension)
                    exact = exact_search(q, vecs, ids, top_k, self.spec.metric)
            if exact is not None:
                D, I = exact
            elif (factor := self.index.rerank_factor()) > 1:
                D, I = rerank(self.index, self.store, q, k, allowed, factor, self.spec)
            else:
                D, I = self.index.search(q, k, allowed)
            if len(dropped):
                I = np.where(np.isin(I, dropped), -1, I)  # left out (assemble_hits skips -1)
            hib = higher_is_better(self.spec.metric)
            found, counts = np.unique(I[I >= 0], return_counts=True)
            wanted = [int(i) for i in found]
            hits_per_row = dict(zip(wanted, (int(n) for n in counts)))
            rows = self.store.rows_for(wanted, with_text, with_payload, budget, hits_per_row) if wanted else {}
        return assemble_hits(D, I, rows, top_k, score_threshold, hib)

    def get(self, point_id: int | str, with_vector: bool = False, consistency: Any = None) -> dict[str, Any] | None:
        """The stored point ``{id, text, payload[, vector]}`` or None (always strong)."""
        with self._rw.read():
            self._check_open()
            row = self.store.get(encode_id(point_id))
        return None if row is None else point_dict(point_id, row[1], row[2], row[3] if with_vector else None)

    def scroll(self, start, limit, where=None, with_vector=False) -> list[dict[str, Any]]:
        """Points in stored-key order from ``start`` (see :meth:`~..backend.CollectionHandle.scroll`)."""
        with self._rw.read():
            self._check_open()
            rows = self.store.scroll(None if start is None else encode_id(start), limit, where, with_vector)
        return [point_dict(decode_id(k), t, p, v) for k, t, p, v in rows]

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
        whole: model, dimension, index and the re-embedding's state together)."""
        with self._rw.read():
            idx = self.index
            index = {"type": self.spec.kind, "params": self.spec.params, "trained": idx.trained,
                     "in_use": self.spec.kind if idx.trained else "flat (until trained)", "vectors": idx.ntotal,
                     "tombstones": idx.n_tombstones}  # fmt: skip
            return {
                "name": self.name, "status": "ok" if not self._closed else "closed", "count": self._count,
                "dimension": self.spec.dimension, "metric": self.spec.metric, "index": index, "trained": idx.trained,
                "model": self.model, "reembedding": self.reembed_status, "sequence": self._seq,
                "snapshot_sequence": self._snapshot_seq,
                "snapshot_age_seconds": round(self.seconds_since_snapshot(), 3), "created_at": self.created_at,
            }  # fmt: skip
