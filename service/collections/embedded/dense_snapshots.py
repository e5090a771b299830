"""Snapshots of the FAISS indexes of an embedded collection's client-supplied (named) dense vectors, so an open loads
them and replays only the later writes instead of rebuilding from every ``named_dense`` row (a 1M-point HNSW graph
takes tens of minutes to build on 2 cores, a 1M-point IVF index minutes: k-means, then every vector's list), as the
model-bound vector's snapshots do (:mod:`.snapshots`) and the sparse vectors' (:mod:`.sparse_snapshots`).

Layout, per dense vector, in ``<collection dir>/dense-<hex of the vector's name>/``: ``snap-<seq>-<last>.faiss``, the
index (:func:`~..index.write_snapshot`: FAISS's serialisation, tombstones, a CRC) covering every write up
to sequence number ``seq``, ``last`` the highest internal id stored then. Written durably (temporary name, fsync,
rename, fsync of the directory), the older ones deleted after. The collection writes these before it prunes the
``removed`` table (:meth:`~.maintenance.Maintenance.snapshot`), and never for an index whose config is not the vector's
(a rebuild for a new config is pending: an open builds it), and forgets them when the vector's config changes.

Loading (:func:`load`): only the newest snapshot is tried; the points removed after its ``seq`` are dropped, the rows
with internal ids past ``last`` added (internal ids only grow: exactly the points written after it), and the result
must hold as many vectors as the table does. A snapshot missing, unreadable, of another kind, metric or dimension,
ahead of the store or inconsistent is left for a full rebuild: slower, never wrong.
"""

from __future__ import annotations

import logging
import re
import shutil
import sqlite3
from pathlib import Path

from artifact_contract.fsio import fsync_dir
from service.collections.embedded.replay import replay
from service.collections.embedded.store import Store
from service.collections.embedded.store import named as tables
from service.collections.index import IndexSpec, VectorIndex, read_snapshot, write_snapshot

log = logging.getLogger("service.collections")

SNAP_RE = re.compile(r"^snap-(\d{20})-(\d{20})\.faiss$")


def directory(collection: Path, name: str) -> Path:
    """The snapshot folder of the dense vector ``name`` (any string: its UTF-8 bytes in hex)."""
    return Path(collection) / f"dense-{name.encode().hex()}"


def _snapshots(d: Path) -> list[tuple[int, int, Path]]:
    """``[(seq, last internal id, path)]`` of the snapshots in ``d``, oldest first (none when ``d`` is missing)."""
    found = [(SNAP_RE.match(p.name), p) for p in d.iterdir()] if d.is_dir() else []
    return sorted((int(m.group(1)), int(m.group(2)), p) for m, p in found if m)


def save(index: VectorIndex, collection: Path, name: str, seq: int, last: int) -> int:
    """Write the snapshot of ``index`` (the dense vector ``name``'s, covering every write up to ``seq``, internal ids
    up to ``last``; the caller holds the collection's write mutex) durably, then delete the older ones. Returns the
    bytes written."""
    d = directory(collection, name)
    d.mkdir(exist_ok=True)
    path = d / f"snap-{seq:020d}-{max(last, 0):020d}.faiss"
    size = write_snapshot(index, path, seq)
    for p in d.iterdir():
        if p != path:
            p.unlink(missing_ok=True)
    fsync_dir(d)
    return size


def forget(collection: Path, name: str) -> None:
    """Delete every snapshot of the dense vector ``name``, durably (its values or its config are about to change)."""
    d = directory(collection, name)
    if d.exists():
        shutil.rmtree(d)
        fsync_dir(d.parent)


def load(
    collection: Path, store: Store, conn: sqlite3.Connection, name: str, spec: IndexSpec, stored: int
) -> tuple[VectorIndex, int] | None:
    """The index of the dense vector ``name`` (``spec``, ``stored`` rows in the table) from its newest snapshot plus
    a replay of the later writes (module docstring), with the snapshot's sequence number; None when there is no usable
    one (rebuild)."""
    snaps = _snapshots(directory(collection, name))
    if not snaps:
        return None
    seq, last, path = snaps[-1]
    try:
        if seq > store.seq():
            raise ValueError(f"snapshot seq {seq} is ahead of the store ({store.seq()})")
        index, got = read_snapshot(path, spec)
        if got != seq:
            raise ValueError(f"the file says seq {got}, its name {seq}")
        removed = store.removed_after(seq)
        index.remove(removed, may_be_absent=True)
        rows = tables.iter_dense(conn, name, spec.dimension, after=last)
        replay(index, rows, stored, f"dense vector {name}", seq, len(removed))
        return index, seq
    except Exception as e:  # never fatal: the rows are the truth
        log.warning("dense vector %s: snapshot %s unusable (%s); rebuilding from its rows", name, path, e)
        return None
