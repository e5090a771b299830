"""The model-bound vector's FAISS index of an embedded collection (a part of :class:`~.collection.Collection`):
derived from the SQLite store (the truth), updated by every write, rebuilt or trained by maintenance, persisted by
snapshots (:mod:`.snapshots`). The owning collection holds its locks around everything here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from service.collections.embedded.named import prepared
from service.collections.embedded.snapshots import build_index, load_index, remove_snapshots, snapshot_path
from service.collections.embedded.store import Store
from service.collections.index import IndexSpec, VectorIndex, write_snapshot

log = logging.getLogger("service.collections")


class BoundIndex:
    """The index of one collection's model-bound vector (``index`` None without one) and its snapshot state.

    Args:
        name: the collection's name (for logs).
        path: the collection's directory (where snapshots live).
        store: the collection's store.
        spec: the model-bound vector's index spec (None: the collection has none).

    Attributes:
        snapshot_seq: the sequence number the newest snapshot covers (0: none).
        last_error: why the index was last rebuilt after a failed update (None: never).
    """

    def __init__(self, name: str, path: Path, store: Store, spec: IndexSpec | None) -> None:
        self.name, self.path, self.store = name, path, store
        self.index = VectorIndex(spec) if spec else None
        self.snapshot_seq = 0
        self.snapshot_time = time.monotonic()
        self.last_error: str | None = None

    @property
    def spec(self) -> IndexSpec | None:
        """The index's spec (None without an index)."""
        return self.index.spec if self.index is not None else None

    def load(self) -> tuple[int, int]:
        """Load the newest snapshot and replay later writes, or rebuild (:func:`.snapshots.load_index`).

        Returns:
            ``(live points, store sequence)``.
        """
        if self.spec is None:
            return self.store.count(), self.store.seq()
        self.index, count, seq, self.snapshot_seq = load_index(self.name, self.path, self.store, self.spec)
        return count, seq

    def prepare(self, vectors: np.ndarray) -> np.ndarray:
        """Model-bound vectors ``(n, dimension)`` as indexed (:func:`.named.prepared`).

        Raises:
            ValueError: not of shape ``(n, dimension)``.
        """
        v = np.ascontiguousarray(vectors, dtype=np.float32)
        if v.ndim != 2 or v.shape[1] != self.spec.dimension:
            raise ValueError(f"vectors must have shape (n, {self.spec.dimension}), got {v.shape}")
        return prepared(v, self.spec.metric)

    def apply(self, change: Callable[[VectorIndex], object], count: int) -> None:
        """Apply a committed write to the index (``change(index)``); on failure rebuild it from SQLite (``count``
        live points). Nothing to do without an index."""
        if self.index is None:
            return
        try:
            change(self.index)
        except Exception as e:
            log.exception("collection %s: index update failed; rebuilding from SQLite", self.name)
            self.last_error = f"index rebuilt after: {e}"
            self.index = build_index(self.store, self.spec, count)

    def needs_maintenance(self, count: int) -> bool:
        """An HNSW rebuild (too many tombstones) or IVF-PQ training (enough of the ``count`` points) is due."""
        idx = self.index
        return idx is not None and (idx.needs_rebuild() or idx.needs_training(count))

    def use(self, index: VectorIndex) -> None:
        """Search ``index`` (rebuilt beside by maintenance, or for a re-embedding's target vectors) from now on."""
        self.index = index

    def changes_since_snapshot(self, seq: int) -> int:
        """Writes up to sequence number ``seq`` that the newest snapshot does not cover."""
        return seq - self.snapshot_seq

    def seconds_since_snapshot(self) -> float:
        """Seconds since the last snapshot (or since open)."""
        return time.monotonic() - self.snapshot_time

    def snapshot(self, seq: int, prune: int | None = None, write: bool = True) -> None:
        """Write a snapshot of the index covering the writes up to ``seq`` (atomically) and prune what it covers:
        the store's removals (up to ``prune`` when that is lower: an index rebuilt beside replays those after it)
        and the older snapshots. ``write`` false: no index file (the index no longer has the collection's config:
        an open rebuilds it)."""
        if self.index is not None and write:
            write_snapshot(self.index, snapshot_path(self.path, seq), seq)
        self.store.prune_removed(seq if prune is None else min(seq, prune))
        remove_snapshots(self.path, below=seq)
        self.snapshot_seq, self.snapshot_time = seq, time.monotonic()

    def forget_snapshots(self) -> None:
        """Delete every snapshot, durably (the vectors they hold are about to be replaced)."""
        remove_snapshots(self.path)
        self.snapshot_seq, self.snapshot_time = 0, time.monotonic()

    def describe(self) -> dict[str, object]:
        """The ``index`` entry of the collection's info: type, params, trained, vectors, in use, tombstones."""
        idx, spec = self.index, self.spec
        return {
            "type": spec.kind if spec else None,
            "params": spec.params if spec else {},
            "trained": idx.trained if idx else True,
            "vectors": idx.ntotal if idx else 0,
            "in_use": (spec.kind if idx.trained else "flat (until trained)") if idx else None,
            "tombstones": idx.n_tombstones if idx else 0,
        }
