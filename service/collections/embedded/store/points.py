"""SQLite storage of one collection: the source of truth.

One file, ``<collection dir>/points.sqlite3``, in WAL mode with ``synchronous=FULL``
(a commit returns only after the WAL is fsynced, so an acknowledged write survives
a crash or power loss). Tables:

* ``meta(key, value)``: JSON values — ``config`` (index kind, params, metric),
  ``model`` (name, version, sha256 of the artifact that embedded the vectors),
  ``dimension``, ``seq`` (last write's sequence number), ``next_iid``, ``created_at``.
* ``points(iid, key, text, payload, vector, seq)``: one row per live point. ``key``
  is the point id as JSON text (``123`` and ``"123"`` are different ids); ``iid`` is
  the int64 internal id used by FAISS, fresh for every upsert and never reused;
  ``vector`` is float32 bytes; ``seq`` the write that stored the row.
* ``removed(iid, seq)``: internal ids deleted or replaced by write ``seq``; replayed
  over a FAISS snapshot at start and pruned once a durable snapshot covers them.

Index ``points_order`` (:mod:`.order`) keeps points in Qdrant's id order for scroll pages.
Index ``points_filter(payload, key)`` covers what a payload filter reads (and the row id): a filter scans it instead
of the table, whose rows hold the vectors (10M points, ``{"g": 7}``: 7 s instead of 15 s warm, 40 s cold; +1.2 %
disk; built in 18–41 s when a collection from before it opens).

Every write (an upsert batch or a deletion) takes the next sequence number.
Texts are kept so a collection can be re-embedded with another model.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from service.collections.embedded.store import named, payload_index
from service.collections.embedded.store.files import DB_FILE, FILTER_INDEX, connect
from service.collections.embedded.store.named import chunks, marks
from service.collections.embedded.store.order import ORDER_INDEX, sample_query
from service.collections.embedded.store.point_rows import PointRows
from service.collections.embedded.store.where import to_sql
from service.collections.filters import Filter
from service.collections.payload_indexes import PayloadIndex

log = logging.getLogger("service.collections")


class Store(PointRows):
    """The SQLite file of one collection.

    One writer connection (callers serialise writes) and one reader connection per
    thread; WAL lets readers run while a write commits.

    Args:
        path: the collection directory.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.db_path = self.path / DB_FILE
        self._w = connect(self.db_path)
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        self._w.executescript(named.SCHEMA)
        self._w.executescript(payload_index.SCHEMA)
        #: the payload indexes (:mod:`.payload_index`) by key; replaced whole (readers see one or the other)
        self.payload_indexes: dict[str, PayloadIndex] = payload_index.load(self.meta())
        tables = {r[0] for r in self._w.execute("SELECT name FROM sqlite_master")}
        for name, ddl in (("points_filter", FILTER_INDEX), ("points_order", ORDER_INDEX)):
            if "points" in tables and name not in tables:  # a collection from before the index
                t0 = time.perf_counter()
                self._w.execute(ddl)
                log.info("%s: built index %s in %.1fs", self.path.name, name, time.perf_counter() - t0)

    # --- connections -----------------------------------------------------------------------------
    def reader(self) -> sqlite3.Connection:
        """This thread's read connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.db_path)
            conn.execute("PRAGMA query_only=ON")
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def close(self) -> None:
        """Close every connection (checkpointing the WAL)."""
        if self._closed:
            return
        self._closed = True
        with self._readers_lock:
            for c in self._readers:
                try:
                    c.close()
                except sqlite3.Error:
                    pass
            self._readers.clear()
        try:
            self._w.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass
        self._w.close()

    # --- meta -----------------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        """All meta values, decoded."""
        return {k: json.loads(v) for k, v in self._w.execute("SELECT key, value FROM meta")}

    def set_meta(self, **values: Any) -> None:
        """Set meta values in one durable transaction."""
        self._write(
            lambda w: w.executemany(
                "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [(k, json.dumps(v)) for k, v in values.items()],
            )
        )

    # --- writes (caller serialises) -----------------------------------------------------------------
    def upsert(
        self,
        keys: list[str],
        texts: list[str],
        payloads: list[str],
        vectors: np.ndarray | None,
        named_vecs=None,
        fields: tuple[list[str], list[str]] = ([], []),
    ) -> tuple[int, np.ndarray, np.ndarray, dict[str, int]]:
        """Store points (replacing existing keys) as one durable write.

        Args:
            keys: encoded point ids (unique within the call).
            texts: the texts.
            payloads: JSON object texts.
            vectors: float32 ``(n, d)`` of the model-bound vector (None: the collection has none; stored empty).
            named_vecs: per point, its other vectors ``{name: array | SparseVec}`` (:func:`.named.write`).
            fields: the collection's (dense, sparse) named vectors, removed with a replaced point.

        Returns:
            ``(seq, new_iids, removed_iids, lost)``: the write's sequence number, the internal
            ids of the stored rows (in input order) and those of the replaced rows, and how many of
            those held each named vector.
        """
        n = len(keys)
        blobs = [b""] * n if vectors is None else [v.tobytes() for v in np.ascontiguousarray(vectors, np.float32)]

        def write(w: sqlite3.Connection) -> tuple[int, np.ndarray, np.ndarray, dict[str, int]]:
            seq = json.loads(w.execute("SELECT value FROM meta WHERE key='seq'").fetchone()[0]) + 1
            next_iid = json.loads(w.execute("SELECT value FROM meta WHERE key='next_iid'").fetchone()[0])
            old: list[int] = []
            for part in chunks(keys):
                old.extend(r[0] for r in w.execute(f"SELECT iid FROM points WHERE key IN ({marks(part)})", part))
            lost = self._remove(old, seq, fields)
            iids = np.arange(next_iid, next_iid + n, dtype=np.int64)
            w.executemany(
                "INSERT INTO points(iid, key, text, payload, vector, seq) VALUES (?, ?, ?, ?, ?, ?)",
                [(int(iids[i]), keys[i], texts[i], payloads[i], blobs[i], seq) for i in range(n)],
            )
            named.write(w, iids, named_vecs or [])
            payload_index.add(w, self.payload_indexes.values(), zip(iids.tolist(), payloads))
            w.execute("UPDATE meta SET value=? WHERE key='seq'", (json.dumps(seq),))
            w.execute("UPDATE meta SET value=? WHERE key='next_iid'", (json.dumps(next_iid + n),))
            return seq, iids, np.asarray(old, dtype=np.int64), lost

        return self._write(write)

    def _remove(self, old: list[int], seq: int, fields: tuple[list[str], list[str]]) -> dict[str, int]:
        """Inside a write: log the internal ids ``old`` as removed by ``seq`` and delete their rows and named vectors;
        returns how many of them held each named vector."""
        if not old:
            return {}
        self._w.executemany("INSERT INTO removed(iid, seq) VALUES (?, ?)", [(i, seq) for i in old])
        for part in chunks(old):
            self._w.execute(f"DELETE FROM points WHERE iid IN ({marks(part)})", part)
        payload_index.remove(self._w, old)
        return named.remove(self._w, old, *fields)

    def delete(
        self, keys: list[str] | None = None, where: Filter | None = None, fields: tuple[list[str], list[str]] = ([], [])
    ) -> tuple[int, np.ndarray, dict[str, int]]:
        """Delete points by encoded ``keys`` or by filter ``where`` as one durable write (with their named vectors
        ``fields``).

        Returns:
            ``(seq, removed_iids, lost)``; seq is the write's sequence number (a write that
            matched nothing still takes one); ``lost`` as :meth:`upsert`'s.
        """

        def write(w: sqlite3.Connection) -> tuple[int, np.ndarray, dict[str, int]]:
            seq = json.loads(w.execute("SELECT value FROM meta WHERE key='seq'").fetchone()[0]) + 1
            old: list[int] = []
            for part in chunks(keys or []):
                old.extend(r[0] for r in w.execute(f"SELECT iid FROM points WHERE key IN ({marks(part)})", part))
            if where is not None:
                sql, params = to_sql(where, indexes=self.payload_indexes)
                old.extend(r[0] for r in w.execute(f"SELECT iid FROM points WHERE {sql}", params))
            old = sorted(set(old))
            lost = self._remove(old, seq, fields)
            w.execute("UPDATE meta SET value=? WHERE key='seq'", (json.dumps(seq),))
            return seq, np.asarray(old, dtype=np.int64), lost

        return self._write(write)

    def drop_payload_index(self, key: str) -> dict[str, PayloadIndex]:
        """Drop the index of payload ``key`` (its entries and points count) and record the indexes left, as one
        durable write; returns them (the caller makes them :attr:`payload_indexes` once no search reads the old)."""
        new = {k: i for k, i in self.payload_indexes.items() if k != key}

        def drop(w: sqlite3.Connection) -> None:
            payload_index.drop(w, key)
            payload_index.record(w, new)

        self._write(drop)
        return new

    def add_payload_entries(self, index: PayloadIndex, after: int, limit: int) -> tuple[int, int]:
        """Add the entries of ``index`` (not recorded yet) for at most ``limit`` points after internal id ``after``,
        in id order, as one durable write (a part of an index's build); ``(the last internal id read, points
        read)``."""

        def part(w: sqlite3.Connection) -> list[tuple[int, str]]:
            rows = w.execute("SELECT iid, payload FROM points WHERE iid > ? ORDER BY iid LIMIT ?", (after, limit))
            rows = rows.fetchall()
            payload_index.add(w, [index], rows)
            return rows

        rows = self._write(part)
        return (rows[-1][0] if rows else after), len(rows)

    def record_payload_index(self, index: PayloadIndex) -> dict[str, PayloadIndex]:
        """Record ``index``, whose entries are all added, as one of the collection's indexes (one durable write);
        returns the indexes then recorded (for :attr:`payload_indexes`)."""
        new = {**{k: i for k, i in self.payload_indexes.items() if k != index.key}, index.key: index}
        self._write(lambda w: payload_index.record(w, new))
        return new

    def _write(self, body: Callable[[sqlite3.Connection], Any]) -> Any:
        """``body(writer)`` in one ``BEGIN IMMEDIATE`` transaction, committed (rolled back if it raises)."""
        w = self._w
        w.execute("BEGIN IMMEDIATE")
        try:
            out = body(w)
            w.execute("COMMIT")
        except BaseException:
            w.execute("ROLLBACK")
            raise
        return out

    def prune_removed(self, upto_seq: int) -> None:
        """Forget removals covered by a durable snapshot of ``upto_seq``."""
        self._w.execute("DELETE FROM removed WHERE seq <= ?", (upto_seq,))

    # --- reads -----------------------------------------------------------------------------------------
    def count(self, conn: sqlite3.Connection | None = None) -> int:
        """Live points."""
        return (conn or self.reader()).execute("SELECT COUNT(*) FROM points").fetchone()[0]

    def seq(self) -> int:
        """The last write's sequence number."""
        return json.loads(self.reader().execute("SELECT value FROM meta WHERE key='seq'").fetchone()[0])

    def iter_vectors(
        self, dimension: int, after_seq: int = 0, chunk: int = 20000
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(iids, vectors)`` chunks (int64 ``(c,)``, float32 ``(c, d)``) of rows with ``seq > after_seq``, in iid
        order.

        With ``after_seq`` (a replay after a snapshot, a rebuild's catch-up): the rows' iids are found in the
        ``points_seq`` index first, then read by iid. One query ordered by iid let SQLite walk the whole table by
        its primary key instead (12 s of a 20 s restart at 10M points, for no row to replay).
        """
        conn = self.reader()
        if after_seq > 0:
            listed = conn.execute("SELECT iid FROM points INDEXED BY points_seq WHERE seq > ?", (after_seq,))
            iids = np.sort(np.fromiter((r[0] for r in listed), dtype=np.int64))
            read = "SELECT iid, vector FROM points WHERE iid IN ({}) ORDER BY iid"
            for s in range(0, len(iids), chunk):
                part_ids = iids[s : s + chunk].tolist()
                rows = [r for part in chunks(part_ids) for r in conn.execute(read.format(marks(part)), part)]
                if rows:
                    yield _vector_rows(rows, dimension)
            return
        last = 0
        while True:
            rows = conn.execute(
                "SELECT iid, vector FROM points WHERE seq > 0 AND iid > ? ORDER BY iid LIMIT ?", (last, chunk)
            ).fetchall()
            if not rows:
                return
            ids, vecs = _vector_rows(rows, dimension)
            yield ids, vecs
            last = int(ids[-1])

    def sample_vectors(self, dimension: int, n: int) -> np.ndarray:
        """Up to ``n`` stored vectors, float32 ``(<=n, d)`` (an index's training sample): the deterministic
        pseudo-random choice of :func:`.order.sample_query`, in internal-id order."""
        rows = self.reader().execute(sample_query("points"), (n,)).fetchall()
        return np.frombuffer(b"".join(r[0] for r in rows), dtype=np.float32).reshape(len(rows), dimension)

    def removed_after(self, seq: int) -> np.ndarray:
        """Internal ids removed by writes after ``seq``, int64."""
        rows = self.reader().execute("SELECT iid FROM removed WHERE seq > ?", (seq,)).fetchall()
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))


def _vector_rows(rows: list[tuple[int, bytes]], dimension: int) -> tuple[np.ndarray, np.ndarray]:
    """``(iids, vectors)`` (int64 ``(c,)``, float32 ``(c, d)``) of ``(iid, vector blob)`` rows."""
    ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    return ids, np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), dimension)
