"""Snapshots of the in-memory sparse inverted indexes (:mod:`.sparse_index`) of an embedded collection, so an open
loads them and replays only the later writes instead of rebuilding from every ``sparse_vectors`` row (as the FAISS
index's snapshots do: :mod:`.snapshots`).

Layout, per sparse vector, in ``<collection dir>/sparse-<hex of the vector's name>/``:

* ``seg-<sid>.npz``: one immutable segment (``terms``, ``indptr``, ``slots``, ``vals``), written once under its
  name and kept while a snapshot lists it (the binary-counter merges leave the large segments alone for long, so a
  snapshot mostly writes the small recent ones);
* ``snap-<seq>.npz``: the snapshot covering every write up to sequence number ``seq``: :data:`FORMAT`, the segment
  names, the slot table, tombstones, dead postings per term and counters (:meth:`.SparseIndex.saved`).

Every file is written durably (a temporary name, fsync, rename, fsync of the directory); a snapshot's segments are
written before it, and the files it no longer needs are deleted after it. The ``removed`` table that an open replays
is pruned only up to a sequence number both this snapshot and the FAISS one cover (the collection writes this one
first: :meth:`~.collection.Collection.snapshot`).

Loading (:func:`load`): only the newest snapshot is tried (an older one may predate the pruning of ``removed``); the
points removed after its ``seq`` are dropped, the points whose internal id is past its last slot are added from
their rows (internal ids only grow, so those are exactly the points written after it), and the result must hold as
many points as the table does. A snapshot missing, unreadable (``.npz`` members carry a CRC), of another format,
ahead of the store or inconsistent is left for a full rebuild: slower, never wrong.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path

import numpy as np

from artifact_contract.fsio import fsync_dir
from service.collections.embedded.replay import replay
from service.collections.embedded.sparse_index import Segment, SparseIndex
from service.collections.embedded.store import Store
from service.collections.embedded.store import named as tables

log = logging.getLogger("service.collections")

#: bumped whenever what a snapshot holds changes meaning; another value is never loaded
FORMAT = 1
SNAP_RE = re.compile(r"^snap-(\d{20})\.npz$")
SEG_RE = re.compile(r"^seg-([0-9a-f]{32})\.npz$")


def directory(collection: Path, name: str) -> Path:
    """The snapshot folder of the sparse vector ``name`` (any string: its UTF-8 bytes in hex)."""
    return Path(collection) / f"sparse-{name.encode().hex()}"


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` as an uncompressed ``.npz``, durably (temporary name, fsync, rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _snapshots(d: Path) -> list[tuple[int, Path]]:
    """``[(seq, path)]`` of the snapshots in ``d``, oldest first (none when ``d`` is missing)."""
    found = [(SNAP_RE.match(p.name), p) for p in d.iterdir()] if d.is_dir() else []
    return sorted((int(m.group(1)), p) for m, p in found if m)


def save(index: SparseIndex, collection: Path, name: str, seq: int) -> None:
    """Write the snapshot of ``index`` (the sparse vector ``name``'s, covering every write up to ``seq``; the caller
    holds the collection's write mutex) durably, then delete the older snapshots and the segments only they used."""
    d = directory(collection, name)
    d.mkdir(exist_ok=True)
    segments, arrays = index.saved()
    for s in segments:
        p = d / f"seg-{s.sid}.npz"
        if not p.exists():
            _write_npz(p, {"terms": s.terms, "indptr": s.indptr, "slots": s.slots, "vals": s.vals})
    ids = np.array([s.sid for s in segments], dtype="<U32")
    _write_npz(
        d / f"snap-{seq:020d}.npz", {"format": np.int64(FORMAT), "seq": np.int64(seq), "segments": ids, **arrays}
    )
    fsync_dir(d)
    keep = {f"seg-{s.sid}.npz" for s in segments} | {f"snap-{seq:020d}.npz"}
    for p in d.iterdir():
        if p.name not in keep:
            p.unlink(missing_ok=True)


def forget(collection: Path, name: str) -> None:
    """Delete every snapshot of the sparse vector ``name``, durably (its values are about to be cleared)."""
    d = directory(collection, name)
    if d.exists():
        shutil.rmtree(d)
        fsync_dir(d.parent)


def _read(path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The arrays ``keys`` of the ``.npz`` at ``path``, read whole (each member's CRC checked)."""
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in keys}


def load(collection: Path, store: Store, conn: sqlite3.Connection, name: str) -> tuple[SparseIndex, int] | None:
    """The index of the sparse vector ``name`` from its newest snapshot plus a replay of the later writes (see the
    module docstring), with the snapshot's sequence number; None when there is no usable one (rebuild)."""
    snaps = _snapshots(directory(collection, name))
    if not snaps:
        return None
    seq, path = snaps[-1]
    try:
        keys = ("format", "seq", "segments", "slot_iid", "dead", "dead_terms", "dead_counts", "live", "dead_postings")
        a = _read(path, keys)
        if int(a["format"]) != FORMAT or int(a["seq"]) != seq:
            raise ValueError(f"format {int(a['format'])} (this service reads {FORMAT}) or sequence mismatch")
        if seq > store.seq():
            raise ValueError(f"snapshot seq {seq} is ahead of the store ({store.seq()})")
        segments = []
        for sid in a["segments"].tolist():
            s = _read(path.parent / f"seg-{sid}.npz", ("terms", "indptr", "slots", "vals"))
            segments.append(Segment(s["terms"], s["indptr"], s["slots"], s["vals"], sid=sid))
        index = SparseIndex.restored(segments, a)
        removed = store.removed_after(seq)
        index.remove(removed)
        last = int(a["slot_iid"][-1]) if len(a["slot_iid"]) else -1
        rows = (
            (iids, (lengths, terms, vals)) for iids, lengths, terms, vals in tables.iter_sparse(conn, name, after=last)
        )
        replay(index, rows, tables.count(conn, name, sparse=True), f"sparse vector {name}", seq, len(removed))
        return index, seq
    except Exception as e:  # never fatal: the rows are the truth
        log.warning("sparse vector %s: snapshot %s unusable (%s); rebuilding from its rows", name, path, e)
        return None
