"""One embedded collection: a SQLite :class:`~.store.Store` (truth) plus a derived FAISS index of its model-bound
vector (:class:`~.bound_index.BoundIndex`) and :class:`~.named.NamedIndexes` of its other named vectors
(docs/architecture.md, "Named vectors"), composed under :class:`~.locks.CollectionLocks`; implements
:class:`~..backend.CollectionHandle`.

Concurrency: searches hold the read side of a readers-writer lock for the FAISS search *and* the SQLite row
lookups; a write holds a write mutex (one write at a time) and, for its SQLite commit plus the FAISS update, the
write side — so a search sees the collection either before or after a write, never half of it. Index maintenance
(HNSW rebuild, IVF training, a changed index config) builds the new index beside the old one while writes and
searches go on, catches up with the writes made meanwhile, and swaps it in under the write side
(:mod:`.maintenance`); the switch at the end of a re-embedding builds beside under the write mutex. Every method
here blocks: call it from a worker thread.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from service.collections.conditions import parse_path
from service.collections.embedded.bound_index import BoundIndex
from service.collections.embedded.held_payload import HeldPayloadIndexes
from service.collections.embedded.inflight import InFlight
from service.collections.embedded.locks import CollectionLocks
from service.collections.embedded.maintenance import Maintenance
from service.collections.embedded.named import NamedIndexes
from service.collections.embedded.ordering import ordered_rows
from service.collections.embedded.payload_indexing import PayloadIndexing
from service.collections.embedded.reembedding import Reembedding
from service.collections.embedded.search import assemble_hits, budgeted_page, left_out, nearest, points_of
from service.collections.embedded.staged_write import StagedWrite
from service.collections.embedded.store import Store
from service.collections.embedded.store.files import create_directory, vectors_from_meta, vectors_meta
from service.collections.embedded.target import EmbeddedTarget
from service.collections.errors import ModelChanged
from service.collections.filters import Filter
from service.collections.ids import decode_id, encode_id, last_occurrences
from service.collections.index import IndexSpec, VectorIndex
from service.collections.reads import Hit
from service.collections.schema import VectorsConfig
from service.collections.vector_backend import same_model

log = logging.getLogger("service.collections")


class Collection(PayloadIndexing, Maintenance):
    """A named, persistent set of points with a FAISS index (and payload indexes: :class:`.PayloadIndexing`).

    Use :meth:`create` for a new one and :meth:`open` for an existing directory.
    Attributes ``name``, ``path``, ``vectors`` (:class:`~..schema.VectorsConfig`); ``spec`` (:class:`IndexSpec`) and
    ``model`` (dict with name, version, sha256) are the model-bound vector's (None without one). Its parts: ``store``,
    ``bound`` (the model-bound vector's index and snapshots), ``named`` and ``reembedding`` (the attached target).

    Args:
        exact_filter_threshold: a search over at most this many points (a filter's, or an index's) is exact (by
            brute force); broader filters use a FAISS ``IDSelector`` over the index.
    """

    def __init__(self, path: Path, store: Store, exact_filter_threshold: int = 20000) -> None:
        self.path = Path(path)
        self.name = self.path.name
        self.store = store
        meta = store.meta()
        self.vectors = vectors_from_meta(meta)
        self.named = NamedIndexes(store, self.vectors)
        self.bound = BoundIndex(self.name, self.path, store, self.spec)
        self.reembedding = Reembedding(self.name)
        self.created_at: float = meta.get("created_at", 0.0)
        self.exact_filter_threshold = exact_filter_threshold
        self._seq = int(meta["seq"])
        self._count = 0
        self._locks = CollectionLocks(self.name)
        self._admitted: InFlight[np.ndarray] = InFlight()  # a filter's ids, shared by concurrent searches (.inflight)
        self.held_payload = HeldPayloadIndexes(store)  # numeric payload indexes in memory, for searches' allowed ids
        self._building = threading.Lock()  # payload index builds, one at a time (.payload_indexing)
        # the last re-embedding's status (kept after it ends; the re-embedder sets it too)
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

    @property
    def index(self) -> VectorIndex | None:
        """The model-bound vector's FAISS index (None without one)."""
        return self.bound.index

    # --- lifecycle ---------------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: Path, vectors: VectorsConfig, **kw: Any) -> Collection:
        """Create a collection directory at ``path`` atomically (:func:`.store.files.create_directory`) and open it.

        Raises:
            FileExistsError: ``path`` exists.
        """
        create_directory(Path(path), vectors_meta(vectors))
        return cls.open(path, **kw)

    @classmethod
    def open(cls, path: Path, **kw: Any) -> Collection:
        """Open an existing collection: load its newest snapshot, replay later writes, or rebuild; its numeric payload
        indexes are copied into memory in the background (:mod:`.held_payload`)."""
        c = cls(path, Store(path), **kw)
        c._count, c._seq = c.bound.load()
        if c.named.dense or c.vectors.sparse:
            log.info("collection %s: named vectors loaded in %.2fs", c.name, c.named.load())
        c.held_payload.prepare()
        return c

    def close(self) -> None:
        """Wait for running operations, then close the store. Idempotent."""
        self._locks.close(self.store.close)

    @contextmanager
    def writes_paused(self) -> Iterator[None]:
        """Hold the write mutex: no write, FAISS snapshot or pruning runs inside (searches do). Raises CollectionClosed."""
        with self._locks.writing():
            yield

    # --- writes ----------------------------------------------------------------------------------------------
    def upsert(
        self, ids, texts, payloads, vectors, *, model=None, shadow_model=None, shadow_vectors=None, named=None
    ) -> int:
        """Insert or replace points durably (SQLite commit, fsynced) and searchably (FAISS updated); also writes the
        attached re-embedding's vectors. See :meth:`~..backend.CollectionHandle.upsert` for the arguments.

        Raises:
            CollectionClosed, ModelChanged; ValueError: vector shape mismatch.
        """
        keys, order = last_occurrences(ids)
        texts_ = [texts[i] for i in order]
        payloads_ = [json.dumps(payloads[i] or {}, ensure_ascii=False, allow_nan=False) for i in order]
        try:  # before the write mutex: concurrent writes prepare their vectors and IVF lists side by side
            early = StagedWrite.of(self.vectors, self.bound, self.named, vectors, named, order)
        except Exception:  # staged again under the mutex, where a model switch is told apart from a bad vector
            early = None
        with self._locks.writing():
            if model is not None and not same_model(model, self.model):
                if not same_model(shadow_model, self.model):
                    raise ModelChanged(f"collection {self.name} is now embedded by {self.model}")
                vectors, shadow_model, shadow_vectors = shadow_vectors, None, None  # a swap happened meanwhile
            shadow = self.reembedding.target
            if shadow is not None and (shadow_vectors is None or not same_model(shadow_model, shadow.model)):
                raise ModelChanged(f"collection {self.name} is being re-embedded with {shadow.model}")
            staged = early
            if staged is None or not staged.holds_for(self.vectors, self.bound, self.named, vectors):
                staged = StagedWrite.of(self.vectors, self.bound, self.named, vectors, named, order, plan=False)
            vecs, extra = staged.vecs, staged.extra
            with self._locks.swapping():
                seq, new_iids, old_iids, lost = self.store.upsert(
                    keys, texts_, payloads_, vecs, extra, self.named.fields
                )
                self._seq = seq
                self._count += len(new_iids) - len(old_iids)
                self.bound.apply(
                    lambda index: (index.remove(old_iids), index.add(new_iids, vecs, staged.bound_plan)), self._count
                )
                self.named.removed(old_iids, lost)
                self.named.added(new_iids, extra or [], staged.named_plans)
            if shadow is not None:
                shadow.write(new_iids, np.asarray(shadow_vectors, dtype=np.float32)[order])
        return seq

    def delete(self, ids: list[int | str] | None = None, where: Filter | None = None) -> tuple[int, int]:
        """Delete points by ``ids`` and/or filter ``where``; returns ``(deleted, seq)`` once durable."""
        keys = [encode_id(i) for i in ids] if ids is not None else None
        with self._locks.writing():
            with self._locks.swapping():
                seq, old, lost = self.store.delete(keys, where, self.named.fields)
                self._seq = seq
                self._count -= len(old)
                self.bound.apply(lambda index: index.remove(old), self._count)
                self.named.removed(old, lost)
        return len(old), seq

    def update_vectors(self, change: Callable[[VectorsConfig], VectorsConfig | None]) -> None:
        """Replace the collection's vectors by ``change(current vectors)`` (None: nothing to change): a named vector
        added or dropped (Qdrant's "Create vector name" / "Delete vector name"; the policy is
        :mod:`..vector_names`'). Computed and applied under the write mutex (no write runs meanwhile) and swapped in
        under the write side (a search sees the old vectors or the new ones); :meth:`.named.NamedIndexes.reconfigure`
        stores it: a vector dropped loses every stored value; a vector added is held by no point; a dense vector whose
        index config changed (:mod:`..index_change`) keeps its index, searched, until :meth:`maintain` has rebuilt it.

        Raises:
            CollectionClosed: the collection was deleted; what ``change`` raises (nothing is changed then);
            ReembeddingInProgress: the model-bound vector's index changed during a re-embedding.
        """
        with self._locks.writing():
            new = change(self.vectors)
            if new is None:
                return
            named = self._record_vectors(new)  # an index config changed: rebuilt by maintain()
            with self._locks.swapping():
                self.vectors, self.named = new, named

    # --- re-embedding ---------------------------------------------------------------------------------------
    @property
    def reembed_model(self) -> dict[str, Any] | None:
        """The target model of the attached re-embedding (upserts must carry its vectors too), else None."""
        return self.reembedding.model

    def begin_reembed(self, model: dict[str, Any], dimension: int, owner: str = "") -> EmbeddedTarget:
        """Attach a re-embedding towards ``model`` (resuming its stored target vectors if it was interrupted);
        from now on every upsert writes both vectors. ``owner`` is not needed: one process owns the collection.

        Raises:
            InvalidCollectionRequest: the index params cannot be carried to ``dimension``.
            CollectionClosed: the collection was deleted.
        """
        target = EmbeddedTarget(self, model, dimension)
        target.prepare()
        with self._locks.writing():
            self.reembedding.attach(target)
            self.reembed_status = target.status
        return target

    def detach_reembed(self, target: EmbeddedTarget) -> None:
        """Stop writing ``target``'s vectors (if it is still the attached one)."""
        with self._locks.mutex:
            self.reembedding.detach(target)

    def complete_reembed(self, target: EmbeddedTarget) -> bool:
        """Switch to ``target``'s vectors: the new index is built beside the old one (searches go on, writes wait),
        then one SQLite transaction moves the vectors and records the model, dimension and index params, and the
        index, spec and model are swapped under the write side; the old snapshots are deleted.

        Returns:
            True when switched; False when points still lack a target vector or ``target`` is not attached.
        """
        with self._locks.writing():
            if not self.reembedding.ready(target):
                return False
            spec = target.spec
            index, built = self.reembedding.build(target, self._count)
            with self._locks.swapping():
                # the old vectors' snapshots go first: the promote keeps the sequence number, so after a crash
                # between the two one of them would load as if it held the new model's vectors; without one, an
                # open rebuilds from SQLite, whichever side of the promote the crash fell
                self.bound.forget_snapshots()
                config = {"index": spec.kind, "metric": spec.metric, "params": spec.params}
                target.table.promote(target.model, spec.dimension, config)
                self.bound.use(index)
                self.vectors = self.vectors.with_bound_spec(spec, target.model)
                # with the model, under the same lock as info(): never the new model beside a "running" state
                self.reembedding.finish(target, self._count, built)
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
        using=None,
        exact=False,
        quantization=None,
        hnsw_ef=None,
    ) -> list[list[Hit]]:
        """Nearest points of each query by the vector ``using`` (None: the model-bound one), see
        :meth:`~..backend.CollectionHandle.search`. A filter only leaving listed points out is a search for that many
        more hits (:func:`.search.left_out`). The search itself is :func:`.search.nearest`. Always strong
        (``consistency`` is accepted and needs nothing: a write is answered once searchable).

        Raises:
            CollectionClosed, ModelChanged.
        """
        using = self.vectors.bound.name if using is None and self.vectors.bound else using
        bound = self.vectors.bound is not None and using == self.vectors.bound.name
        with self._locks.reading():
            if bound and model is not None and not same_model(model, self.model):
                raise ModelChanged(f"collection {self.name} is now embedded by {self.model}")
            (where, dropped), nq = left_out(self.store, where), len(queries)
            allowed, k = None, top_k + len(dropped)
            if where is not None:
                allowed = self._admitted.get(repr(where), lambda: self._allowed(where))
                if len(allowed) == 0:
                    return [[] for _ in range(nq)]
            args = (queries, top_k, k, allowed, self.exact_filter_threshold, exact, quantization, hnsw_ef)
            D, I, metric = nearest(self.store, self.bound if bound else None, self.named, using, *args)
            if len(dropped):
                I = np.where(np.isin(I, dropped), -1, I)  # left out (assemble_hits skips -1)
            found, counts = np.unique(I[I >= 0], return_counts=True)
            wanted = [int(i) for i in found]
            hits_per_row = dict(zip(wanted, (int(n) for n in counts)))
            rows = self.store.rows_for(wanted, with_text, with_payload, budget, hits_per_row) if wanted else {}
        return assemble_hits(D, I, rows, top_k, score_threshold, metric)

    def _allowed(self, where: Filter) -> np.ndarray:
        """The internal ids a search's filter admits: from the payload indexes held in memory where they answer it
        (:mod:`.held_payload`: dead points' ids included, which no index holds), else from SQLite."""
        found = self.held_payload.allowed(where)
        return found if found is not None else self.store.matching_iids(where)

    def get(self, point_id: int | str, with_vector: Any = False, consistency: Any = None) -> dict[str, Any] | None:
        """The stored point ``{id, text, payload[, vector][, vectors]}`` or None (always strong)."""
        with self._locks.reading():
            row = self.store.get(encode_id(point_id))
            return None if row is None else points_of(self.named, [(point_id, *row)], with_vector)[0]

    def scroll(self, start, limit, where=None, with_vector=False, budget=None, with_text=True, with_payload=True):
        """Points in id order (integers numerically, then strings) from ``start``, as the backend's ``scroll`` says;
        with a ``budget``, a page's bytes are spent before its texts, payloads and vectors are read
        (:func:`.search.budgeted_page`). Raises CollectionClosed, ResponseTooLarge."""
        with self._locks.reading():
            key = None if start is None else encode_id(start)
            if budget is None:
                rows = self.store.scroll(key, limit, where, bool(with_vector), with_text, with_payload)
            else:
                bound, others = self.named.wanted(with_vector)
                page = self.store.scroll(key, limit, where, False, False, False)  # ids only: spent before read
                dim = self.spec.dimension if bound else 0
                rows = budgeted_page(self.store, self.named, page, dim, others, budget, with_text, with_payload)
            return points_of(self.named, [(decode_id(k), i, t, p, v) for k, i, t, p, v in rows], with_vector)

    def count_matching(self, where: Filter | None = None) -> int:
        """Live points matching ``where``, counted exactly."""
        with self._locks.reading():
            return self.store.count_where(where)

    def order_values(self, where: Filter | None, key: str, descending: bool, start: Any, limit: int) -> list | None:
        """The first ``limit`` ``(point id, order value)`` entries by payload ``key`` (:func:`.ordering.ordered_rows`),
        or None for a key that is not a plain top-level name (the caller then scans). Raises CollectionClosed."""
        if parse_path(key) != (key,):
            return None
        with self._locks.reading():
            return ordered_rows(self.store.reader(), where, key, descending, start, limit)

    count = property(lambda self: self._count, doc="Live points.")
    seq = property(lambda self: self._seq, doc="The last write's sequence number.")

    def info(self, consistency: Any = None) -> dict[str, Any]:
        """Description for ``GET /collections/{name}`` (always strong; under the read lock, so a switch is seen
        whole: model, dimension, index and the re-embedding's state together). ``dimension``, ``metric``, ``index``
        and ``model`` are the model-bound vector's (None / empty without one); ``vectors`` describes them all."""
        with self._locks.rw.read():
            spec, index = self.spec, self.bound.describe()
            vectors, named = self.vectors.to_json(), self.named.info()
            for kind in ("dense", "sparse"):
                for n, v in vectors[kind].items():
                    v.update(named.get(n, {"points": self._count}))  # the model-bound one: every point
            return {
                "name": self.name,
                "status": "ok" if not self._locks.closed else "closed",
                "count": self._count,
                "dimension": spec.dimension if spec else None,
                "metric": spec.metric if spec else None,
                "index": index,
                "trained": index["trained"],
                "model": self.model,
                "vectors": vectors,
                "payload_indexes": self.payload_schema(),
                "reembedding": self.reembed_status,
                "rebuilding": self.rebuilding(),  # dense vectors whose index is being rebuilt for a new config
                "indexing": self.indexing(),  # ... whose index is due a training or a rebuild, or is rebuilt
                "sequence": self._seq,
                "snapshot_sequence": self.bound.snapshot_seq,
                "snapshot_age_seconds": round(self.seconds_since_snapshot(), 3),
                "created_at": self.created_at,
            }
