"""The SQLite file of an embedded collection (``<collection dir>/points.sqlite3``, the tables :mod:`.points`
describes): its schema, its connections (WAL, ``synchronous=FULL``) and the atomic creation of a collection directory
holding a new one, with the ``meta`` values that record the collection's vectors (:func:`vectors_meta`, read back by
:func:`vectors_from_meta`)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from artifact_contract.fsio import fsync_dir
from service.collections.embedded.store import named
from service.collections.embedded.store.order import ORDER_INDEX
from service.collections.embedded.store.where import register
from service.collections.index import IndexSpec
from service.collections.schema import VectorsConfig

DB_FILE = "points.sqlite3"
FORMAT = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS points (
    iid INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    text TEXT NOT NULL,
    payload TEXT NOT NULL,
    vector BLOB NOT NULL,
    seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS points_seq ON points(seq);
CREATE TABLE IF NOT EXISTS removed (iid INTEGER PRIMARY KEY, seq INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS removed_seq ON removed(seq);
"""
#: what a payload filter reads, covered (see :mod:`.points`)
FILTER_INDEX = "CREATE INDEX IF NOT EXISTS points_filter ON points(payload, key)"
SCHEMA += FILTER_INDEX + ";\n" + ORDER_INDEX + ";\n"


#: the page size of a new collection file (SQLite's default is 4 KiB): a 384-d float32 vector's row (~1.6 KB) fits
#: twice in 4 KiB, leaving a quarter of each page empty (1.38x the floats' bytes a row, indexes included), and 10
#: times in 16 KiB (1.11x); inserts ran 1.9x as fast and 20 random rows read as fast (docs/performance.md,
#: "SQLite page size"). A file keeps the page size it was created with.
PAGE_SIZE = 16384


def connect(path: Path, page_size: int | None = None) -> sqlite3.Connection:
    """A connection to the SQLite file ``path``: autocommit (transactions are explicit), WAL, ``synchronous=FULL``
    (a commit returns once the WAL is fsynced), a 60 s busy timeout, the filter functions of :mod:`.where`;
    ``page_size``: for a file being created (set before WAL, which fixes it)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60.0)
    if page_size is not None:
        conn.execute(f"PRAGMA page_size={int(page_size)}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA busy_timeout=60000")
    register(conn)
    return conn


def create_file(directory: Path, meta: dict[str, Any]) -> None:
    """Create the SQLite file in ``directory`` (an existing directory): the schema, ``meta`` and sequence 0."""
    conn = connect(directory / DB_FILE, PAGE_SIZE)
    try:
        conn.executescript(named.SCHEMA)
        conn.executescript(SCHEMA)
        values = {"format": FORMAT, "seq": 0, "next_iid": 1, "created_at": time.time(), **meta}
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", [(k, json.dumps(v)) for k, v in values.items()])
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def create_directory(path: Path, meta: dict[str, Any]) -> None:
    """Create a collection directory at ``path`` holding a new SQLite file with ``meta``, atomically: built in a
    hidden temp directory, fsynced, then renamed into place.

    Raises:
        FileExistsError: ``path`` exists (or appeared meanwhile).
    """
    if path.exists():
        raise FileExistsError(path) from None
    tmp = path.with_name(f".creating-{path.name}-{os.getpid()}-{time.monotonic_ns()}")
    tmp.mkdir(parents=True)
    create_file(tmp, meta)
    fsync_dir(tmp)
    try:
        os.rename(tmp, path)  # fails if path appeared meanwhile (non-empty dir)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise FileExistsError(path) from None
    fsync_dir(path.parent)


def vectors_meta(vectors: VectorsConfig) -> dict[str, Any]:
    """The ``meta`` values of a new collection holding ``vectors``: ``vectors`` (their config), and for the
    model-bound vector ``config`` (index kind, metric, params), ``dimension`` and ``model`` (the keys a
    re-embedding's switch rewrites)."""
    meta: dict[str, Any] = {"vectors": vectors.to_json()}
    if (b := vectors.bound) is not None:
        spec = b.spec
        meta.update(
            config={"index": spec.kind, "metric": spec.metric, "params": spec.params},
            dimension=spec.dimension,
            model=b.model,
        )
    return meta


def vectors_from_meta(meta: dict[str, Any]) -> VectorsConfig:
    """The collection's vectors recorded in ``meta`` (:func:`vectors_meta`; a collection from before named vectors
    has one model-bound vector ``""``)."""
    cfg, model = meta.get("config"), meta.get("model")
    spec = IndexSpec(cfg["index"], cfg["metric"], cfg["params"], int(meta["dimension"])) if cfg else None
    if "vectors" not in meta:
        return VectorsConfig.single(spec, model)
    vectors = VectorsConfig.from_json(meta["vectors"])
    return vectors.with_bound_spec(spec, model) if spec else vectors
