"""SQLite tables of a collection's named vectors other than the model-bound one (docs/architecture.md, "Named
vectors"), written inside the transaction of the upsert or delete that the :class:`~.points.Store` runs:

* ``named_dense(field, iid, vector)``: a client-supplied dense vector (float32 bytes) of point ``iid``;
* ``sparse_vectors(field, iid, indices, vals)``: a sparse vector as stored (uint32 and float32 bytes, by index), the
  durable truth from which the in-memory inverted index (:mod:`..sparse_index`) is built at open.

Rows are keyed by the point's internal id, fresh for each upsert, so replacing or deleting a point removes them with
it (:func:`remove`). An older layout also kept every sparse entry as a row of ``sparse_postings(field, term, iid,
value)`` (an inverted index searched by SQL); that table is dropped when the store opens (:data:`SCHEMA`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from service.collections.embedded.store.order import sample_query
from service.collections.schema import SparseVec

SCHEMA = """
CREATE TABLE IF NOT EXISTS named_dense (
    field TEXT NOT NULL, iid INTEGER NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (field, iid)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sparse_vectors (
    field TEXT NOT NULL, iid INTEGER NOT NULL, indices BLOB NOT NULL, vals BLOB NOT NULL,
    PRIMARY KEY (field, iid)) WITHOUT ROWID;
DROP TABLE IF EXISTS sparse_postings;
"""
CHUNK = 900  # SQL host parameters per IN (...) list


def marks(part: list[Any]) -> str:
    """``?,?,...``: one SQL host parameter per item of ``part``."""
    return ",".join("?" * len(part))


def chunks(seq: list[Any], n: int = CHUNK) -> Iterator[list[Any]]:
    """``seq`` in slices of at most ``n`` (SQLite's host parameters per statement are bounded)."""
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def write(w: sqlite3.Connection, iids: np.ndarray, named: list[dict[str, Any]]) -> None:
    """Insert the named vectors of the points just stored as ``iids`` (in a transaction the caller holds).

    Args:
        named: per point, ``{name: float32 (d,) array | SparseVec}`` (already checked and prepared).
    """
    dense, sparse = [], []
    for iid, vecs in zip((int(i) for i in iids), named):
        for name, v in vecs.items():
            if isinstance(v, SparseVec):
                sparse.append((name, iid, v.indices.astype("<u4").tobytes(), v.values.astype("<f4").tobytes()))
            else:
                dense.append((name, iid, np.asarray(v, dtype="<f4").tobytes()))
    if dense:
        w.executemany("INSERT INTO named_dense(field, iid, vector) VALUES (?, ?, ?)", dense)
    if sparse:
        w.executemany("INSERT INTO sparse_vectors(field, iid, indices, vals) VALUES (?, ?, ?, ?)", sparse)


class Removed(dict):
    """What :func:`remove` deleted: ``{name: how many of the points held the vector}``, and ``terms[name]``: the
    indices (uint32) of the sparse vectors ``name`` deleted, concatenated (their terms' document frequencies go down
    by them in the in-memory index, :meth:`..sparse_index.SparseIndex.remove`)."""

    def __init__(self, counts: dict[str, int], terms: dict[str, np.ndarray]) -> None:
        super().__init__(counts)
        self.terms = terms


def remove(w: sqlite3.Connection, iids: list[int], dense: list[str], sparse: list[str]) -> Removed:
    """Delete every named vector of the points ``iids`` (in a transaction the caller holds); returns how many points
    lost each vector, with the sparse vectors' terms (:class:`Removed`)."""
    out = dict.fromkeys([*dense, *sparse], 0)
    terms: dict[str, list[bytes]] = {n: [] for n in sparse}
    for part in chunks(iids):
        for name in dense:
            cur = w.execute(f"DELETE FROM named_dense WHERE field=? AND iid IN ({marks(part)})", [name, *part])
            out[name] += cur.rowcount
        for name in sparse:
            q = f"SELECT indices FROM sparse_vectors WHERE field=? AND iid IN ({marks(part)})"
            terms[name].extend(r[0] for r in w.execute(q, [name, *part]))
            q = f"DELETE FROM sparse_vectors WHERE field=? AND iid IN ({marks(part)})"
            out[name] += w.execute(q, [name, *part]).rowcount
    return Removed(out, {n: np.frombuffer(b"".join(b), dtype="<u4") for n, b in terms.items()})


def reconfigure(db_path: Path, vectors: dict[str, Any], cleared: list[str]) -> None:
    """Record a collection's new vectors config (``meta['vectors']``, :meth:`~...schema.VectorsConfig.to_json`) and
    delete every stored value of the vectors ``cleared`` (one dropped, or one added: no point holds it yet), in one
    durable transaction on a connection of its own (the caller holds the collection's write mutex: no other write
    runs), so a crash leaves the old config with its values or the new one without them."""
    conn = sqlite3.connect(db_path, isolation_level=None, timeout=60.0)
    try:
        conn.execute("PRAGMA busy_timeout=60000")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for table in ("named_dense", "sparse_vectors"):
                conn.executemany(f"DELETE FROM {table} WHERE field=?", [(n,) for n in cleared])
            conn.execute(
                "INSERT INTO meta(key, value) VALUES ('vectors', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (json.dumps(vectors),),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


def iter_sparse(conn: sqlite3.Connection, name: str, chunk: int = 20000, after: int = -1) -> Iterator[tuple]:
    """``(iids, lengths, terms, vals)`` chunks of the stored sparse vectors ``name`` of internal id past ``after``
    (default: all), in internal-id order: int64
    ``(c,)`` twice, then uint32 and float32 ``(sum(lengths),)`` (the chunk's vectors one after another), read a chunk
    of rows at a time (no Python object per entry)."""
    last = after
    while True:
        rows = conn.execute(
            "SELECT iid, indices, vals FROM sparse_vectors WHERE field=? AND iid > ? ORDER BY iid LIMIT ?",
            (name, last, chunk),
        ).fetchall()
        if not rows:
            return
        ids = np.fromiter((r[0] for r in rows), np.int64, count=len(rows))
        lengths = np.fromiter((len(r[1]) // 4 for r in rows), np.int64, count=len(rows))
        terms = np.frombuffer(b"".join(r[1] for r in rows), dtype="<u4")
        vals = np.frombuffer(b"".join(r[2] for r in rows), dtype="<f4")
        yield ids, lengths, terms, vals
        last = int(ids[-1])


def _chunks_of(conn: sqlite3.Connection, name: str, chunk: int, after: int = -1) -> Iterator[list[tuple[int, bytes]]]:
    """``[(iid, vector bytes), ...]`` chunks of the stored dense vector ``name`` (internal ids past ``after``), in
    internal-id order."""
    last = after
    while True:
        rows = conn.execute(
            "SELECT iid, vector FROM named_dense WHERE field=? AND iid > ? ORDER BY iid LIMIT ?", (name, last, chunk)
        ).fetchall()
        if not rows:
            return
        yield rows
        last = int(rows[-1][0])


def iter_dense(conn: sqlite3.Connection, name: str, dimension: int, chunk: int = 20000, after: int = -1) -> Iterator:
    """``(iids, vectors)`` chunks (int64 ``(c,)``, float32 ``(c, d)``) of the dense vector ``name`` (internal ids
    past ``after``: default all)."""
    for rows in _chunks_of(conn, name, chunk, after):
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        yield ids, np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(len(rows), dimension)


def iter_blobs(conn: sqlite3.Connection, name: str, chunk: int = 5000) -> Iterator[tuple[int, bytes]]:
    """``(iid, vector bytes)`` of every stored dense vector ``name`` (a multivector's rows, one blob per point)."""
    for rows in _chunks_of(conn, name, chunk):
        yield from rows


def sample_dense(conn: sqlite3.Connection, name: str, dimension: int, n: int) -> np.ndarray:
    """Up to ``n`` stored vectors ``name``, float32 ``(<=n, d)`` (an index's training sample): the deterministic
    pseudo-random choice of :func:`.order.sample_query`, in internal-id order."""
    rows = conn.execute(sample_query("named_dense WHERE field=?"), (name, n)).fetchall()
    return np.frombuffer(b"".join(r[0] for r in rows), dtype="<f4").reshape(len(rows), dimension)


def dense_for(conn: sqlite3.Connection, name: str, iids: np.ndarray, dimension: int) -> tuple[np.ndarray, np.ndarray]:
    """``(iids, vectors)`` of the points among ``iids`` that hold the dense vector ``name`` (order not kept)."""
    out_ids: list[int] = []
    blobs: list[bytes] = []
    ids = [int(i) for i in iids]
    for part in chunks(ids):
        q = f"SELECT iid, vector FROM named_dense WHERE field=? AND iid IN ({marks(part)})"
        for iid, vec in conn.execute(q, [name, *part]):
            out_ids.append(iid)
            blobs.append(vec)
    vecs = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(out_ids), dimension)
    return np.asarray(out_ids, dtype=np.int64), vecs


def vectors_of(
    conn: sqlite3.Connection, iids: list[int], names: list[str], dense: set[str]
) -> dict[int, dict[str, Any]]:
    """``{iid: {name: float32 array | SparseVec}}``: the vectors among ``names`` that the points ``iids`` hold
    (``dense``: which of the names are dense; the others are sparse)."""
    out: dict[int, dict[str, Any]] = {}
    for part in chunks(iids):
        for name in names:
            if name in dense:
                q = f"SELECT iid, vector FROM named_dense WHERE field=? AND iid IN ({marks(part)})"
                for iid, blob in conn.execute(q, [name, *part]):
                    out.setdefault(iid, {})[name] = np.frombuffer(blob, dtype="<f4")
            else:
                q = f"SELECT iid, indices, vals FROM sparse_vectors WHERE field=? AND iid IN ({marks(part)})"
                for iid, idx, vals in conn.execute(q, [name, *part]):
                    sv = SparseVec(np.frombuffer(idx, dtype="<u4"), np.frombuffer(vals, dtype="<f4"))
                    out.setdefault(iid, {})[name] = sv
    return out


def value_counts(conn: sqlite3.Connection, iids: list[int], names: list[str], dims: dict[str, int]) -> tuple[int, int]:
    """``(dense values, sparse entries)``: how many values the vectors among ``names`` that the points ``iids`` hold
    have in all (``dims``: the dense ones' dimensions; the other names are sparse), counted from the keys and the
    blobs' lengths, without reading the vectors."""
    floats = entries = 0
    for part in chunks(iids):
        for name in names:
            if name in dims:
                q = f"SELECT TOTAL(length(vector)) FROM named_dense WHERE field=? AND iid IN ({marks(part)})"
                floats += int(conn.execute(q, [name, *part]).fetchone()[0]) // 4  # float32 (a multivector: m rows)
            else:
                q = f"SELECT TOTAL(length(indices)) FROM sparse_vectors WHERE field=? AND iid IN ({marks(part)})"
                entries += int(conn.execute(q, [name, *part]).fetchone()[0]) // 4  # uint32 indices
    return floats, entries


def count(conn: sqlite3.Connection, name: str, sparse: bool) -> int:
    """How many points hold the vector ``name``."""
    table = "sparse_vectors" if sparse else "named_dense"
    return conn.execute(f"SELECT COUNT(*) FROM {table} WHERE field=?", (name,)).fetchone()[0]
