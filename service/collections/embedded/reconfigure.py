"""A change of an embedded collection's vectors (a part of :class:`~.collection.Collection`): a named vector added or
dropped (Qdrant's "Create vector name" / "Delete vector name"; the policy is :mod:`..vector_names`'). The new config
and the removal of the stored values it affects are one SQLite transaction (:func:`.store.named.reconfigure`): the
collection reopens with the old config and its values, or the new one without them.
"""

from __future__ import annotations

from collections.abc import Callable

from service.collections.embedded.store import named as tables
from service.collections.schema import VectorsConfig


class Reconfiguring:
    """The vectors-config method of :class:`~.collection.Collection` (which holds the state it uses: its locks, store,
    vectors and named indexes)."""

    def update_vectors(self, change: Callable[[VectorsConfig], VectorsConfig | None]) -> None:
        """Replace the collection's vectors by ``change(current vectors)`` (None: nothing to change), computed and
        applied under the write mutex (no write runs meanwhile) and swapped in under the write side (a search sees
        the old vectors or the new ones). A vector dropped loses every stored value; a vector added is held by no
        point (its stored rows, if any were left, are cleared too).

        Raises:
            CollectionClosed: the collection was deleted; what ``change`` raises (nothing is changed then).
        """
        with self._wmutex:
            self._check_open()
            new = change(self.vectors)
            if new is None:
                return
            old = self.vectors
            names = lambda cfg: {(n, "dense") for n in cfg.dense} | {(n, "sparse") for n in cfg.sparse}  # noqa: E731
            cleared = sorted({n for n, _ in names(old) ^ names(new)})
            tables.reconfigure(self.store.db_path, new.to_json(), cleared)
            named = self.named.reconfigured(new)
            with self._rw.write():
                self.vectors, self.named = new, named
