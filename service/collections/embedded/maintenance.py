"""Index maintenance and snapshots of an embedded collection (a part of :class:`~.collection.Collection`): an HNSW
rebuild or IVF-PQ training when due, the rebuild of an index whose configuration changed (Qdrant's ``PATCH
/collections/{name}`` with another ``quantization_config``: the new config is recorded at once, the index is rebuilt
from the stored vectors by the backend's upkeep, and searches go on over the old one until the new one is swapped
in), and the snapshots that let an open skip rebuilding (FAISS's, :mod:`.snapshots`; the sparse indexes',
:mod:`.sparse_snapshots`).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time

from service.collections.embedded.bound_index import BoundIndex
from service.collections.embedded.locks import CollectionLocks
from service.collections.embedded.named import NamedIndexes
from service.collections.embedded.reembedding import Reembedding
from service.collections.embedded.store import Store
from service.collections.errors import ReembeddingInProgress
from service.collections.index import IndexSpec
from service.collections.schema import VectorsConfig

log = logging.getLogger("service.collections")


def record_bound_config(store: Store, spec: IndexSpec) -> None:
    """Record the model-bound vector's index ``spec`` (``meta['config']``: index kind, metric, params, read back by
    :func:`.store.files.vectors_from_meta` over the vectors' config) durably, on a connection of its own (the caller
    holds the write mutex)."""
    conn = sqlite3.connect(store.db_path, isolation_level=None, timeout=60.0)
    try:
        conn.execute("PRAGMA synchronous=FULL")
        config = {"index": spec.kind, "metric": spec.metric, "params": spec.params}
        conn.execute("UPDATE meta SET value=? WHERE key='config'", (json.dumps(config),))
    finally:
        conn.close()


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
            record_bound_config(self.store, new_b.spec)
        return named

    def rebuilding(self) -> list[str]:
        """The dense vectors whose index does not have their configured spec yet (rebuilt by :meth:`maintain`)."""
        out = [n for n, i in self.named.indexes.items() if i.spec != self.named.dense[n].spec]
        b = self.vectors.bound
        if b is not None and self.bound.index is not None and self.bound.spec != b.spec:
            out.append(b.name)
        return sorted(out)

    def needs_maintenance(self) -> bool:
        """An HNSW rebuild (too many tombstones), IVF-PQ training (enough points) or the rebuild of an index whose
        config changed is due."""
        return not self._locks.closed and (self.bound.needs_maintenance(self._count) or bool(self.rebuilding()))

    def maintain(self) -> str | None:
        """Do the due maintenance (:meth:`needs_maintenance`): the new indexes are built beside the live ones, then
        swapped in. Searches continue on the old indexes meanwhile; writes wait. Returns what was done."""
        with self._locks.mutex:
            if not self.needs_maintenance():
                return None
            t0 = time.monotonic()
            done, bound, named = [], None, {}
            b = self.vectors.bound
            for name in self.rebuilding():
                if b is not None and name == b.name:
                    bound = self.bound.rebuilt(self._count, b.spec)[1]
                    kind = b.spec.kind
                else:
                    named[name] = self.named.rebuilt(name)
                    kind = named[name].spec.kind
                done.append(f"rebuilt {name!r} as {kind} (index config changed)")
            if bound is None and self.bound.needs_maintenance(self._count):
                what, bound = self.bound.rebuilt(self._count)
                done.append(what)
            with self._locks.swapping():
                if bound is not None:
                    self.bound.use(bound)
                self.named.indexes.update(named)
            what = ", ".join(done)
            log.info("collection %s: %s over %d points in %.2fs", self.name, what, self._count, time.monotonic() - t0)
            return what

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
            self.bound.snapshot(seq)
            return seq
