"""SQLite storage of an embedded collection, the source of truth: every SQL statement of the embedded backend lives
in this package (:mod:`.files`: the file, its schema and creation; :mod:`.points`: points, removals and meta; :mod:`.shadow`: a re-embedding's target vectors)."""

from service.collections.embedded.store.files import DB_FILE
from service.collections.embedded.store.points import Store
from service.collections.embedded.store.shadow import ShadowTable

__all__ = ["DB_FILE", "ShadowTable", "Store"]
