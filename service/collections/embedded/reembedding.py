"""The re-embedding side of an embedded collection (a part of :class:`~.collection.Collection`): attaching a
:class:`~.target.EmbeddedTarget` towards another model, and the atomic switch to its vectors when it is complete.
Only the model-bound vector is re-embedded; the collection's other named vectors are the client's and stay.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from service.collections.embedded.snapshots import remove_snapshots
from service.collections.embedded.target import EmbeddedTarget
from service.collections.index import VectorIndex, get_type
from service.collections.vector_backend import model_id

log = logging.getLogger("service.collections")


class Reembedding:
    """The re-embedding methods of :class:`~.collection.Collection` (which holds the state they use: its locks, store,
    index, spec, model, vectors and the attached target)."""

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
                self.index, self.vectors = index, self.vectors.with_bound_spec(spec, target.model)
                self._target = None
                # with the model, under the same lock as info(): never the new model beside a "running" state
                target.status.update(state="completed", done=self._count, total=self._count, finished_at=time.time())
                self._snapshot_seq, self._snapshot_time = 0, time.monotonic()
        log.info(
            "collection %s: switched to %s (%d points, dimension %d; index built in %.2fs)",
            self.name,
            model_id(target.model),
            self._count,
            spec.dimension,
            built,
        )
        try:
            self.snapshot()
        except Exception:
            log.exception("collection %s: snapshot after the switch failed (SQLite has everything)", self.name)
        return True
