"""The payload indexes of an embedded collection (:mod:`...payload_indexes`; stored and used by
:mod:`.store.payload_index`): created, dropped and described under the collection's locks."""

from __future__ import annotations

from typing import Any

from service.collections.embedded.held_payload import HeldPayloadIndexes
from service.collections.embedded.locks import CollectionLocks
from service.collections.embedded.store import Store
from service.collections.embedded.store.payload_index import points_per_field
from service.collections.payload_indexes import PayloadIndex


class PayloadIndexing:
    """The payload-index operations of :class:`~.collection.Collection` (which provides ``store`` and ``_locks``)."""

    store: Store
    _locks: CollectionLocks
    held_payload: HeldPayloadIndexes

    def create_payload_index(self, index: PayloadIndex) -> None:
        """Build ``index`` from the stored payloads and use it (replacing another index of its key); durable when it
        returns. Writes wait meanwhile; searches go on without it (a replaced one is dropped from their view first,
        so no search reads a half-built index). A numeric index is then copied into memory in the background, for
        searches (:mod:`.held_payload`). The same index again changes nothing.

        Raises:
            CollectionClosed: the collection was deleted.
        """
        with self._locks.writing():
            if self.store.payload_indexes.get(index.key) == index:
                return
            self._forget(index.key)
            new = self.store.write_payload_index(index, index.key)
            with self._locks.swapping():
                self.store.payload_indexes = new
        self.held_payload.prepare()  # a numeric index's copy in memory, read in the background

    def delete_payload_index(self, key: str) -> bool:
        """Drop the index of payload ``key``; False when there is none. Durable when it returns.

        Raises:
            CollectionClosed: the collection was deleted.
        """
        with self._locks.writing():
            if key not in self.store.payload_indexes:
                return False
            self._forget(key)
            self.store.write_payload_index(None, key)
            return True

    def _forget(self, key: str) -> None:
        """Searches stop reading the index of ``key`` (before its entries change)."""
        if key in self.store.payload_indexes:
            with self._locks.swapping():
                self.store.payload_indexes = {k: i for k, i in self.store.payload_indexes.items() if k != key}

    def payload_schema(self) -> dict[str, dict[str, Any]]:
        """``{key: {data_type, params?, points}}`` of the indexes (Qdrant's ``payload_schema``; ``points``: the points
        holding a value the index holds, kept by the writes). Call under the read lock."""
        indexes = self.store.payload_indexes
        if not indexes:
            return {}
        counts = points_per_field(self.store.reader())
        return {k: {**i.to_json(), "points": counts.get(k, 0)} for k, i in sorted(indexes.items())}
