"""Index maintenance and snapshots of an embedded collection (a part of :class:`~.collection.Collection`): an HNSW
rebuild or IVF training when due, and the rebuild of an index whose configuration changed (Qdrant's ``PATCH
/collections/{name}`` with another ``quantization_config``: the new config is recorded at once), each built from the
stored vectors beside the live index while writes and searches go on, caught up with the writes made meanwhile and
swapped in; and the snapshots that let an open skip rebuilding (FAISS's, :mod:`.snapshots`; the sparse indexes',
:mod:`.sparse_snapshots`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from service.collections.embedded.bound_index import BoundIndex
from service.collections.embedded.locks import CollectionLocks
from service.collections.embedded.named import NamedIndexes
from service.collections.embedded.reembedding import Reembedding
from service.collections.embedded.store import Store
from service.collections.embedded.store import named as tables
from service.collections.errors import ReembeddingInProgress
from service.collections.index import IndexSpec, VectorIndex, get_type
from service.collections.schema import VectorsConfig

log = logging.getLogger("service.collections")
#: an index built beside catches up with the writes made meanwhile, without the write mutex, while a round finds at
#: least CATCH_UP_ROWS new points, for at most CATCH_UP_ROUNDS rounds (docs/architecture.md, "Index upkeep")
CATCH_UP_ROWS = 10_000
CATCH_UP_ROUNDS = 8


class Maintenance:
    """The maintenance and snapshot operations of :class:`~.collection.Collection` (which provides the attributes
    below; its methods hold its locks)."""

    name: str
    store: Store
    vectors: VectorsConfig
    bound: BoundIndex
    reembedding: Reembedding
    named: NamedIndexes
    _locks: CollectionLocks
    _count: int
    _seq: int
    #: while an index is rebuilt beside (:meth:`_rebuild_beside`): the write after which removals are replayed
    _prune_floor: int | None = None

    def _record_vectors(self, new: VectorsConfig) -> NamedIndexes:
        """Store ``new`` as the collection's vectors (under the write mutex; :meth:`.named.NamedIndexes.reconfigure`)
        and return the named indexes for it. A model-bound vector whose index config changed (refused with
        ReembeddingInProgress while a re-embedding is attached) loses its FAISS
        snapshots first (durably: a crash after the new config is stored must not load an index of the old one) and
        gets its ``meta['config']`` written after; its index is rebuilt by :meth:`maintain`."""
        old_b, new_b = self.vectors.bound, new.bound
        changed = old_b is not None and new_b is not None and old_b.spec != new_b.spec
        if changed and self.reembedding.target is not None:  # its switch records the index params it was begun with
            raise ReembeddingInProgress(f"collection {self.name} is being re-embedded; change its index after")
        if changed:
            self.bound.forget_snapshots()
        named = self.named.reconfigure(new)
        if changed:
            spec = new_b.spec
            self.store.set_meta(config={"index": spec.kind, "metric": spec.metric, "params": spec.params})
        return named

    def rebuilding(self) -> list[str]:
        """The dense vectors whose index does not have their configured spec yet (rebuilt by :meth:`maintain`)."""
        out = [n for n, i in self.named.indexes.items() if i.spec != self.named.dense[n].spec]
        b = self.vectors.bound
        if b is not None and self.bound.index is not None and self.bound.spec != b.spec:
            out.append(b.name)
        return sorted(out)

    def _due(self) -> list[str]:
        """The dense vectors whose index needs its due upkeep: IVF training (enough points) or an HNSW rebuild (too
        many tombstones), the model-bound vector's as a client-supplied one's; done beside, as a config change's
        (:meth:`_rebuild_beside`)."""
        counts = self.named.counts
        due = [n for n, i in self.named.indexes.items() if i.needs_rebuild() or i.needs_training(counts.get(n, 0))]
        b = self.vectors.bound
        if b is not None and not self._locks.closed and self.bound.needs_maintenance(self._count):
            due.append(b.name)
        return sorted(due)

    def indexing(self) -> list[str]:
        """The dense vectors whose index upkeep is due or under way (:meth:`needs_maintenance`, by vector): an IVF
        index to train, an HNSW graph to rebuild, an index of a changed config; Qdrant reports a collection with
        any as ``status: yellow`` (optimizations in progress)."""
        return sorted({*self.rebuilding(), *self._due()})

    def needs_maintenance(self) -> bool:
        """An HNSW rebuild (too many tombstones), IVF-PQ training (enough points) or the rebuild of an index whose
        config changed is due, for the model-bound vector or a client-supplied one."""
        if self._locks.closed:
            return False
        return bool(self.rebuilding()) or bool(self._due())

    def maintain(self) -> str | None:
        """Do the due maintenance (:meth:`needs_maintenance`): every new index (a changed config's, an IVF index's
        training, an HNSW graph's rebuild; the model-bound vector's as a client-supplied one's) is built beside the
        live one while writes and searches go on (:meth:`_rebuild_beside`), then swapped in. Returns what was done
        (None: nothing was due)."""
        return self._rebuild_beside()

    def _live(self, name: str) -> tuple[IndexSpec, VectorIndex | None, int]:
        """``(configured spec, index in use, points holding it)`` of the dense vector ``name`` (under the mutex)."""
        b = self.vectors.bound
        if b is not None and name == b.name:
            return b.spec, self.bound.index, self._count
        v = self.named.dense.get(name)
        return (v.spec if v else None), self.named.indexes.get(name), self.named.counts.get(name, 0)

    def _rows(self, name: str, dim: int, upto_iid: int | None = None, after: tuple[int, int] = (-1, 0)) -> Iterator:
        """``(iids, vectors)`` chunks of the stored vector ``name`` (of dimension ``dim``) with internal ids up to
        ``upto_iid`` (None: all), and past ``after = (internal id, write)`` (those stored after that write)."""
        if name == self.bound_name:
            chunks = self.store.iter_vectors(dim, after_seq=after[1])  # by the points' write sequence (indexed)
        else:
            chunks = tables.iter_dense(self.store.reader(), name, dim, after=after[0])
        for ids, vecs in chunks:
            keep = ids <= upto_iid if upto_iid is not None else slice(None)
            yield ids[keep], vecs[keep]

    def _rebuild_beside(self) -> str | None:
        """Rebuild the indexes whose config changed (:meth:`rebuilding`), and those whose training or rebuild is due
        (:meth:`_due`), without holding the write mutex: the points
        stored up to the write ``seq0`` (internal ids up to ``last``) are indexed while writes and searches go on,
        then, under the mutex, the points removed after ``seq0`` are dropped and those stored after it added (the
        ``removed`` table is not pruned past ``seq0`` meanwhile: :meth:`snapshot`), and the index is swapped in when
        its vector still has that config and that old index. Returns what was done (None: nothing to rebuild)."""
        with self._locks.mutex:
            changed = [] if self._locks.closed else self.rebuilding()
            names = changed + [n for n in ([] if self._locks.closed else self._due()) if n not in changed]
            if not names:
                return None
            seq0, last = self._seq, int(self.store.meta()["next_iid"]) - 1
            plan = {n: self._live(n)[:2] for n in names}
            why = {
                n: "index config changed" if n in changed else "trained" if i.needs_training(c) else "tombstones"
                for n, (_, i, c) in ((n, self._live(n)) for n in names)
            }
            self._prune_floor = seq0
        try:
            t0, built = time.monotonic(), {}
            for n, (spec, _) in plan.items():  # no lock held: writes and searches go on
                count = self._live(n)[2]
                size = get_type(spec.kind).train_sample_size(spec, count)
                sample = None
                if size and n == self.bound_name:
                    sample = self.store.sample_vectors(spec.dimension, size)
                elif size:
                    sample = tables.sample_dense(self.store.reader(), n, spec.dimension, size)
                built[n] = VectorIndex.build(spec, self._rows(n, spec.dimension, last), train_sample=sample)
            done_upto = self._catch_up(built, last, seq0)
            with self._locks.mutex:
                if self._locks.closed:
                    return None
                removed, done = self.store.removed_after(seq0), []
                for n, index in built.items():
                    spec, old, count = self._live(n)
                    if (spec, old) != plan[n]:  # the config or the index changed meanwhile: built again later
                        continue
                    index.remove(removed, may_be_absent=True)
                    for ids, vecs in self._rows(n, spec.dimension, after=done_upto):
                        index.add(ids, vecs)
                    if index.live != count:  # never swap in a wrong index: rebuilt again by the next maintenance
                        log.warning(
                            "collection %s: rebuilt %r holds %d vectors, not %d", self.name, n, index.live, count
                        )
                        continue
                    with self._locks.swapping():
                        if n == self.bound_name:
                            self.bound.use(index)
                        else:
                            self.named.indexes[n] = index
                    done.append(f"rebuilt {repr(n) if n else 'the unnamed vector'} as {spec.kind} ({why[n]})")
            what = ", ".join(done) or "index rebuilds dropped (the config changed meanwhile)"
            log.info("collection %s: %s in %.2fs", self.name, what, time.monotonic() - t0)
            return what
        finally:
            self._prune_floor = None

    def _catch_up(self, built: dict[str, VectorIndex], last: int, seq0: int) -> tuple[int, int]:
        """Add to the indexes ``built`` beside, without the write mutex, the points stored since they were planned
        (internal ids past ``last``, writes past ``seq0``), in rounds, until a round finds fewer than
        :data:`CATCH_UP_ROWS` new ones: the rest, and every removal since ``seq0``, are applied under the mutex, which
        then holds writes back for a short replay, not for everything written while a long build ran (an IVF
        index's k-means takes minutes while ingest goes on). Returns ``(internal id, write)`` the indexes hold the
        points up to."""
        done = (last, seq0)
        for _ in range(CATCH_UP_ROUNDS):
            with self._locks.mutex:  # a write holds it until its rows are committed: all up to these are readable
                if self._locks.closed:
                    return done
                upto = (int(self.store.meta()["next_iid"]) - 1, self._seq)
            if upto[0] - done[0] < CATCH_UP_ROWS:
                return done
            for n, index in built.items():
                for ids, vecs in self._rows(n, index.spec.dimension, upto[0], after=done):
                    index.add(ids, vecs)
            done = upto
        return done

    @property
    def bound_name(self) -> str | None:
        """The model-bound vector's name (None without one)."""
        return self.vectors.bound.name if self.vectors.bound is not None else None

    def changes_since_snapshot(self) -> int:
        """Writes (sequence numbers) not covered by the newest snapshot (FAISS's or a sparse index's)."""
        sparse = self.named.snapshot_seq
        return self._seq - min(self.bound.snapshot_seq, self._seq if sparse is None else sparse)

    def seconds_since_snapshot(self) -> float:
        """Seconds since the last snapshot (or since open)."""
        return self.bound.seconds_since_snapshot()

    def snapshot(self) -> int | None:
        """Write a FAISS snapshot and the sparse indexes' (:mod:`.sparse_snapshots`) covering every write so far
        (atomically), prune what they cover.

        Returns the covered sequence number, or None when nothing changed since the last one.
        """
        with self._locks.mutex:
            if self._locks.closed or self.changes_since_snapshot() == 0:
                return None
            seq = self._seq
            self.named.snapshot(seq)  # first: the FAISS snapshot prunes the removals that replaying it needs
            b = self.vectors.bound  # an index being rebuilt for a new config is not saved: an open rebuilds it
            current = b is None or self.bound.index is None or self.bound.spec == b.spec
            self.bound.snapshot(seq, prune=self._prune_floor, write=current)
            return seq
