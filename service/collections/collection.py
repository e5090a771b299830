"""One collection: a SQLite :class:`~.store.Store` (truth) plus a derived :class:`~.index.VectorIndex`.

Concurrency: searches hold the read side of a readers-writer lock for the FAISS
search *and* the SQLite row lookups; a write holds a write mutex (one write at a
time) and, for its SQLite commit plus the FAISS update, the write side — so a search
sees the collection either before or after a write, never half of it. Index
maintenance (HNSW rebuild, IVF-PQ training) builds the new index beside the old one
under the write mutex only (searches continue on the old one) and swaps it in under
the write side. Every method here blocks: call it from a worker thread.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from artifact_contract.fsio import fsync_dir

from .errors import CollectionClosed, ModelChanged
from .filters import Condition
from .index import IndexSpec, VectorIndex, exact_search, get_type, higher_is_better
from .store import Store, decode_id, encode_id
from .vectors import unit_rows

log = logging.getLogger("service.collections")

SNAPSHOT_RE = re.compile(r"^index-(\d{20})\.snap$")


def same_model(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two model dicts (``{name, version, sha256}``) denote the same artifact."""
    return a is not None and b is not None and all(a.get(k) == b.get(k) for k in ("name", "version", "sha256"))


class RWLock:
    """A writer-preferring readers-writer lock (threads)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        """Shared access; waits while a writer holds or waits for the lock."""
        with self._cond:
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        """Exclusive access."""
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


@dataclass
class Hit:
    """One search result: point ``id``, ``score`` (similarity, or distance for l2), optional text and payload."""

    id: int | str
    score: float
    text: str | None = None
    payload: dict[str, Any] | None = None


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
        # re-embedding towards another model: a Shadow while running, and its status
        self.shadow: Any = None
        self.reembed_status: dict[str, Any] | None = None

    # --- lifecycle ---------------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: Path, spec: IndexSpec, model: dict[str, Any], **kw: Any) -> Collection:
        """Create a collection directory at ``path`` atomically (temp dir, then rename).

        Raises:
            FileExistsError: ``path`` exists.
        """
        path = Path(path)
        if path.exists():
            raise FileExistsError(path) from None
        tmp = path.with_name(f".creating-{path.name}-{os.getpid()}-{time.monotonic_ns()}")
        tmp.mkdir(parents=True)
        meta = {
            "config": {"index": spec.kind, "metric": spec.metric, "params": spec.params},
            "dimension": spec.dimension,
            "model": model,
        }
        Store.create(tmp, meta).close()
        fsync_dir(tmp)
        try:
            os.rename(tmp, path)  # fails if path appeared meanwhile (non-empty dir)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise FileExistsError(path) from None
        fsync_dir(path.parent)
        return cls.open(path, **kw)

    @classmethod
    def open(cls, path: Path, **kw: Any) -> Collection:
        """Open an existing collection: load its newest snapshot, replay later writes, or rebuild."""
        c = cls(path, Store(path), **kw)
        c._load()
        return c

    def _snapshots(self) -> list[tuple[int, Path]]:
        out = []
        for p in self.path.iterdir():
            m = SNAPSHOT_RE.match(p.name)
            if m:
                out.append((int(m.group(1)), p))
        return sorted(out)

    def _load(self) -> None:
        t0 = time.monotonic()
        seq = self.store.seq()
        self._seq = seq
        count = self.store.count()
        snaps = self._snapshots()
        index = None
        how = "rebuilt from SQLite"
        if snaps:
            snap_seq, snap_path = snaps[-1]
            try:
                if snap_seq > seq:
                    raise ValueError(f"snapshot seq {snap_seq} is ahead of the store ({seq})")
                index, snap_seq = VectorIndex.read_snapshot(snap_path, self.spec)
                removed = self.store.removed_after(snap_seq)
                index.remove(removed, may_be_absent=True)
                n_new = 0
                for ids, vecs in self.store.iter_vectors(self.spec.dimension, after_seq=snap_seq):
                    index.add(ids, vecs)
                    n_new += len(ids)
                if index.live != count:
                    raise ValueError(f"after replay the index holds {index.live} live vectors, the store {count}")
                self._snapshot_seq = snap_seq
                how = f"snapshot seq {snap_seq} + replay of {len(removed)} removals, {n_new} rows"
            except Exception as e:  # a bad snapshot is never fatal: SQLite has everything
                log.warning(
                    "collection %s: snapshot %s unusable (%s); rebuilding from SQLite", self.name, snap_path.name, e
                )
                index = None
        if index is None:
            index = self._build_index(count)
            self._snapshot_seq = 0
        self.index = index
        self._count = count
        log.info("collection %s: %d points, %s in %.2fs", self.name, count, how, time.monotonic() - t0)

    def _build_index(self, count: int) -> VectorIndex:
        n = get_type(self.spec.kind).train_sample_size(self.spec, count)
        sample = self.store.sample_vectors(self.spec.dimension, n) if n else None
        return VectorIndex.build(self.spec, self.store.iter_vectors(self.spec.dimension), train_sample=sample)

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

    # --- writes ----------------------------------------------------------------------------------------------
    def _prepare(self, vectors: np.ndarray) -> np.ndarray:
        v = np.ascontiguousarray(vectors, dtype=np.float32)
        if v.ndim != 2 or v.shape[1] != self.spec.dimension:
            raise ValueError(f"vectors must have shape (n, {self.spec.dimension}), got {v.shape}")
        if self.spec.metric == "cosine":
            return unit_rows(v)
        return np.ascontiguousarray(v, dtype=np.float32)

    def upsert(
        self,
        ids: list[int | str],
        texts: list[str],
        payloads: list[dict[str, Any] | None],
        vectors: np.ndarray,
        *,
        model: dict[str, Any] | None = None,
        shadow_model: dict[str, Any] | None = None,
        shadow_vectors: np.ndarray | None = None,
    ) -> int:
        """Insert or replace points; returns once the write is durable and searchable.

        Args:
            ids: point ids (unsigned ints or strings); a repeated id keeps its last occurrence.
            texts: their texts.
            payloads: JSON-object payloads (None = ``{}``).
            vectors: float32 ``(n, dimension)`` (normalised here for cosine).
            model: the model (``{name, version, sha256}``) that made ``vectors``; checked against the
                collection's under the write lock (None: not checked, and refused while re-embedding).
            shadow_model, shadow_vectors: while a re-embedding runs, the same texts embedded by its
                target model, float32 ``(n, target dimension)``; written to the shadow too.

        Returns:
            the write's sequence number.

        Raises:
            CollectionClosed: the collection was deleted.
            ModelChanged: the vectors given are not from the collection's model, or a re-embedding
                runs and its target's vectors are missing (embed again and retry).
            ValueError: vector shape mismatch.
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
            shadow = self.shadow
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

    def delete(self, ids: list[int | str] | None = None, conditions: list[Condition] | None = None) -> tuple[int, int]:
        """Delete points by ``ids`` and/or filter ``conditions``; returns ``(deleted, seq)`` once durable."""
        keys = [encode_id(i) for i in ids] if ids is not None else None
        with self._wmutex:
            self._check_open()
            with self._rw.write():
                seq, old = self.store.delete(keys, conditions)
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
            path = self.path / f"index-{seq:020d}.snap"
            self.index.write_snapshot(path, seq)
            self.store.prune_removed(seq)
            for s, p in self._snapshots():
                if s < seq:
                    p.unlink(missing_ok=True)
            self._snapshot_seq = seq
            self._snapshot_time = time.monotonic()
            return seq

    # --- reads --------------------------------------------------------------------------------------------------
    def search(
        self,
        queries: np.ndarray,
        top_k: int,
        conditions: list[Condition] | None = None,
        score_threshold: float | None = None,
        with_payload: bool = True,
        with_text: bool = True,
        model: dict[str, Any] | None = None,
    ) -> list[list[Hit]]:
        """Nearest points of each query.

        Args:
            queries: float32 ``(nq, dimension)`` (normalised here for cosine).
            top_k: most results per query.
            conditions: a parsed payload filter; only matching points are returned, and the
                top_k are the best among the matching points.
            score_threshold: drop results scoring below it (cosine/dot) or farther than it (l2).
            with_payload, with_text: include them in the hits.
            model: the model that embedded ``queries``; if given and no longer the collection's
                (a re-embedding swapped meanwhile), :class:`ModelChanged` is raised.

        Returns:
            one list of :class:`Hit` per query, best first.
        """
        with self._rw.read():
            self._check_open()
            if model is not None and not same_model(model, self.model):
                raise ModelChanged(f"collection {self.name} is now embedded by {self.model}")
            q = self._prepare(queries)
            allowed = None
            exact = None
            if conditions:
                cap = self.exact_filter_threshold
                allowed = self.store.matching_iids(conditions)
                if len(allowed) == 0:
                    return [[] for _ in range(len(q))]
                if len(allowed) <= cap:
                    ids, vecs = self.store.vectors_for(allowed, self.spec.dimension)
                    exact = exact_search(q, vecs, ids, top_k, self.spec.metric)
            if exact is not None:
                D, I = exact
            elif (factor := self.index.rerank_factor()) > 1:
                D, I = self._rerank(q, top_k, allowed, factor)
            else:
                D, I = self.index.search(q, top_k, allowed)
            hib = higher_is_better(self.spec.metric)
            wanted = sorted({int(i) for i in I.ravel() if i >= 0})
            rows = self.store.rows_for(wanted) if wanted else {}
        out: list[list[Hit]] = []
        for qi in range(len(q)):
            hits: list[Hit] = []
            for s, iid in zip(D[qi], I[qi]):
                iid = int(iid)
                if iid < 0 or iid not in rows:
                    continue
                s = float(s)
                if score_threshold is not None and (s < score_threshold if hib else s > score_threshold):
                    continue
                key, text, payload = rows[iid]
                hits.append(
                    Hit(decode_id(key), s, text if with_text else None, json.loads(payload) if with_payload else None)
                )
                if len(hits) == top_k:
                    break
            out.append(hits)
        return out

    def _rerank(
        self, q: np.ndarray, top_k: int, allowed: np.ndarray | None, factor: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``factor * top_k`` approximate candidates re-scored exactly with the stored vectors."""
        _, cand = self.index.search(q, top_k * factor, allowed)
        ids, vecs = self.store.vectors_for(np.unique(cand[cand >= 0]), self.spec.dimension)
        pos = {int(i): j for j, i in enumerate(ids)}
        D = np.full((len(q), top_k), np.nan, np.float32)
        I = np.full((len(q), top_k), -1, np.int64)
        for qi in range(len(q)):
            rows = [pos[int(i)] for i in cand[qi] if i >= 0 and int(i) in pos]
            if rows:
                s, top = exact_search(q[qi : qi + 1], vecs[rows], ids[rows], top_k, self.spec.metric)
                D[qi, : top.shape[1]], I[qi, : top.shape[1]] = s[0], top[0]
        return D, I

    def get(self, point_id: int | str, with_vector: bool = False) -> dict[str, Any] | None:
        """The stored point ``{id, text, payload[, vector]}`` or None."""
        with self._rw.read():
            self._check_open()
            row = self.store.get(encode_id(point_id))
        if row is None:
            return None
        out: dict[str, Any] = {"id": point_id, "text": row[1], "payload": json.loads(row[2])}
        if with_vector:
            out["vector"] = np.frombuffer(row[3], dtype=np.float32).tolist()
        return out

    @property
    def count(self) -> int:
        """Live points."""
        return self._count

    @property
    def seq(self) -> int:
        """The last write's sequence number."""
        return self._seq

    def info(self) -> dict[str, Any]:
        """Description for ``GET /collections/{name}``."""
        idx = self.index
        return {
            "name": self.name,
            "status": "ok" if not self._closed else "closed",
            "count": self._count,
            "dimension": self.spec.dimension,
            "metric": self.spec.metric,
            "index": {
                "type": self.spec.kind,
                "params": self.spec.params,
                "trained": idx.trained,
                "in_use": self.spec.kind if idx.trained else "flat (until trained)",
                "vectors": idx.ntotal,
                "tombstones": idx.n_tombstones,
            },
            "trained": idx.trained,
            "model": self.model,
            "reembedding": self.reembed_status,
            "sequence": self._seq,
            "snapshot_sequence": self._snapshot_seq,
            "created_at": self.created_at,
        }
