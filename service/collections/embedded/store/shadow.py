"""The target vectors of a re-embedding, in the collection's own SQLite file.

Table ``shadow_vectors(iid, vector)``: one row per live point (internal id, see :mod:`.points`) re-embedded by the
target model recorded in ``meta['shadow_model']``. Rows survive a restart, so a re-embedding towards the same model
resumes; a re-embedding towards another model starts from an empty table. The switch (:meth:`ShadowTable.promote`)
moves the vectors into ``points`` and records the new model in one transaction.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from service.collections.embedded.store.order import sample_query

_SCHEMA = "CREATE TABLE IF NOT EXISTS shadow_vectors (iid INTEGER PRIMARY KEY, vector BLOB NOT NULL)"
_MISSING = "SELECT COUNT(*) FROM points p LEFT JOIN shadow_vectors s ON s.iid = p.iid WHERE s.iid IS NULL"


class ShadowTable:
    """The ``shadow_vectors`` table of one collection, on its own connection (the re-embedding writes it beside the
    collection's writer). Thread-safe.

    Args:
        db_path: the collection's SQLite file.
        dimension: the target vectors' width.
    """

    def __init__(self, db_path: Path, dimension: int) -> None:
        self.dimension = dimension
        self._conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False, timeout=60.0)
        self._conn.execute("PRAGMA busy_timeout=60000")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._lock = threading.Lock()

    def _tx(self, *statements: tuple[str, tuple[Any, ...] | list[Any]], many: bool = False) -> None:
        c = self._conn
        c.execute("BEGIN IMMEDIATE")
        try:
            for sql, args in statements:
                (c.executemany if many else c.execute)(sql, args)
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise

    def prepare(self, model: dict[str, Any]) -> int:
        """Create the table; keep its rows when they were made by ``model`` (resume), else clear them.

        Returns:
            live points that already have a target vector.
        """
        with self._lock:
            self._conn.execute(_SCHEMA)
            row = self._conn.execute("SELECT value FROM meta WHERE key='shadow_model'").fetchone()
            prev = json.loads(row[0]) if row else None
            if prev is None or any(prev.get(k) != model.get(k) for k in ("name", "version", "sha256")):
                upsert_meta = (
                    "INSERT INTO meta(key, value) VALUES ('shadow_model', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value"
                )
                self._tx(("DELETE FROM shadow_vectors", ()), (upsert_meta, (json.dumps(model),)))
            return self._conn.execute(
                "SELECT COUNT(*) FROM shadow_vectors s JOIN points p ON p.iid = s.iid"
            ).fetchone()[0]

    def pending(self, after_iid: int, limit: int) -> list[tuple[int, str]]:
        """Up to ``limit`` live points with ``iid > after_iid`` and no target vector: ``[(iid, text)]`` by iid."""
        with self._lock:
            return self._conn.execute(
                "SELECT p.iid, p.text FROM points p LEFT JOIN shadow_vectors s ON s.iid = p.iid "
                "WHERE s.iid IS NULL AND p.iid > ? ORDER BY p.iid LIMIT ?",
                (after_iid, limit),
            ).fetchall()

    def write(self, iids: np.ndarray, vectors: np.ndarray) -> None:
        """Store target vectors, float32 ``(n, dimension)``, for internal ids ``iids``, durably.

        Raises:
            ValueError: wrong vector shape.
        """
        v = np.ascontiguousarray(vectors, dtype=np.float32)
        if v.ndim != 2 or v.shape != (len(iids), self.dimension):
            raise ValueError(f"target vectors must have shape ({len(iids)}, {self.dimension}), got {v.shape}")
        rows = [(int(i), v[j].tobytes()) for j, i in enumerate(iids)]
        with self._lock:
            self._tx(("INSERT OR REPLACE INTO shadow_vectors(iid, vector) VALUES (?, ?)", rows), many=True)

    def missing(self) -> int:
        """Live points without a target vector."""
        with self._lock:
            return self._conn.execute(_MISSING).fetchone()[0]

    def sample(self, n: int) -> np.ndarray:
        """Up to ``n`` target vectors of live points, float32 ``(<=n, dimension)`` (index training): the same
        deterministic pseudo-random choice, in internal-id order, as the stored vectors' (:func:`.order.sample_query`)."""
        live = "(SELECT s.iid AS iid, s.vector AS vector FROM shadow_vectors s JOIN points p ON p.iid = s.iid)"
        q = sample_query(live)
        with self._lock:
            rows = self._conn.execute(q, (n,)).fetchall()
        return np.frombuffer(b"".join(r[0] for r in rows), np.float32).reshape(len(rows), self.dimension)

    def iter_vectors(self, chunk: int = 20000) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(iids, vectors)`` chunks (int64 ``(c,)``, float32 ``(c, dimension)``) of the live points' target vectors."""
        last = 0
        while True:
            with self._lock:
                rows = self._conn.execute(
                    "SELECT s.iid, s.vector FROM shadow_vectors s JOIN points p ON p.iid = s.iid WHERE s.iid > ? "
                    "ORDER BY s.iid LIMIT ?",
                    (last, chunk),
                ).fetchall()
            if not rows:
                return
            ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            yield ids, np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), self.dimension)
            last = int(ids[-1])

    def promote(self, model: dict[str, Any], dimension: int, config: dict[str, Any]) -> None:
        """In one durable transaction: every live point's vector becomes its target vector, the collection's
        ``model``, ``dimension`` and index ``config`` are recorded, and the table and the removal log are cleared
        (old snapshots must never be replayed over the new vectors)."""
        meta = "UPDATE meta SET value = ? WHERE key = ?"
        with self._lock:
            self._tx(
                ("UPDATE points SET vector = (SELECT s.vector FROM shadow_vectors s WHERE s.iid = points.iid)", ()),
                (meta, (json.dumps(model), "model")),
                (meta, (json.dumps(dimension), "dimension")),
                (meta, (json.dumps(config), "config")),
                ("DELETE FROM meta WHERE key = 'shadow_model'", ()),
                ("DELETE FROM shadow_vectors", ()),
                ("DELETE FROM removed", ()),
            )

    def drop(self) -> None:
        """Forget the target vectors and the target model (best effort)."""
        with self._lock:
            try:
                self._tx(("DELETE FROM shadow_vectors", ()), ("DELETE FROM meta WHERE key = 'shadow_model'", ()))
            except sqlite3.Error:
                pass

    def close(self) -> None:
        """Close the connection. Idempotent."""
        with self._lock:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
