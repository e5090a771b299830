"""The payload indexes of an embedded collection (:mod:`...payload_indexes`; stored and used by
:mod:`.store.payload_index`): created, dropped and described under the collection's locks."""

from __future__ import annotations

import threading
import time
from typing import Any

from service.collections.embedded.held_payload import HeldPayloadIndexes
from service.collections.embedded.locks import CollectionLocks
from service.collections.embedded.store import Store
from service.collections.embedded.store.payload_index import points_per_field
from service.collections.payload_indexes import PayloadIndex

#: points whose entries one part of a payload index's build adds, under the write mutex
BUILD_POINTS = 20_000
#: seconds a build waits between its parts, so that a write waiting for the mutex takes it (a plain lock is not fair:
#: the builder, taking it again at once, would win)
BUILD_PAUSE = 0.005


class PayloadIndexing:
    """The payload-index operations of :class:`~.collection.Collection` (which provides ``store`` and ``_locks``)."""

    store: Store
    _locks: CollectionLocks
    held_payload: HeldPayloadIndexes
    _building: threading.Lock

    def create_payload_index(self, index: PayloadIndex) -> None:
        """Build ``index`` from the stored payloads and use it (replacing another index of its key); durable when it
        returns. The build adds the entries of :data:`BUILD_POINTS` points at a time, each part one write under the
        collection's write mutex, so that writes go on between the parts (:data:`BUILD_PAUSE`; Qdrant builds a
        payload index in the background): the points they write have larger internal ids than any part read, so later parts index them,
        and a point they delete takes its entries along. Searches do not read the index until the last part is
        written and the index recorded with it (a replaced one is dropped first: no search reads a half-built
        index; a crash in between leaves no index of the key recorded). A numeric index is then copied into memory
        in the background, for searches (:mod:`.held_payload`). The same index again changes nothing; builds of
        one collection run one at a time.

        Raises:
            CollectionClosed: the collection was deleted.
        """
        with self._building:
            with self._locks.writing():
                if self.store.payload_indexes.get(index.key) == index:
                    return
                self._forget(index.key)
                self.store.drop_payload_index(index.key)
            last = 0
            while True:
                with self._locks.writing():
                    last, n = self.store.add_payload_entries(index, last, BUILD_POINTS)
                    if n < BUILD_POINTS:
                        new = self.store.record_payload_index(index)
                        with self._locks.swapping():
                            self.store.payload_indexes = new
                        break
                time.sleep(BUILD_PAUSE)
        self.held_payload.prepare()

    def delete_payload_index(self, key: str) -> bool:
        """Drop the index of payload ``key``; False when there is none. Durable when it returns.

        Raises:
            CollectionClosed: the collection was deleted.
        """
        with self._locks.writing():
            if key not in self.store.payload_indexes:
                return False
            self._forget(key)
            self.store.drop_payload_index(key)
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
