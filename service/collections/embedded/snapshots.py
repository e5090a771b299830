"""FAISS index snapshots of an embedded collection: ``<dir>/index-<seq>.snap`` files, each covering every write up to
sequence number ``seq``. At open, the newest usable snapshot is loaded and the later writes are replayed from
SQLite; a missing or bad snapshot is never fatal (the index is rebuilt from SQLite, the source of truth)."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

from artifact_contract.fsio import fsync_dir
from service.collections.embedded.store import Store
from service.collections.index import IndexSpec, VectorIndex, get_type, read_snapshot

log = logging.getLogger("service.collections")

SNAPSHOT_RE = re.compile(r"^index-(\d{20})\.snap$")


def snapshot_path(directory: Path, seq: int) -> Path:
    """Where the snapshot covering sequence number ``seq`` lives."""
    return directory / f"index-{seq:020d}.snap"


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """``[(seq, path)]`` of the snapshots in ``directory``, oldest first."""
    out = []
    for p in directory.iterdir():
        m = SNAPSHOT_RE.match(p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def remove_snapshots(directory: Path, below: int | None = None) -> None:
    """Delete the snapshots older than sequence ``below`` (all of them when None, durably: the directory is
    fsynced, so a crash after this returns never finds one of them again)."""
    for s, p in list_snapshots(directory):
        if below is None or s < below:
            p.unlink(missing_ok=True)
    if below is None:
        fsync_dir(directory)


def build_index(store: Store, spec: IndexSpec, count: int) -> VectorIndex:
    """A fresh index over every stored vector (trained on a sample when the type trains and ``count`` suffices)."""
    n = get_type(spec.kind).train_sample_size(spec, count)
    sample = store.sample_vectors(spec.dimension, n) if n else None
    return VectorIndex.build(spec, store.iter_vectors(spec.dimension), train_sample=sample)


def load_index(name: str, directory: Path, store: Store, spec: IndexSpec) -> tuple[VectorIndex, int, int, int]:
    """The collection's index: the newest snapshot plus a replay of later writes, else a rebuild from SQLite.

    Returns:
        ``(index, live count, store sequence, snapshot sequence)`` (snapshot sequence 0 after a rebuild).
    """
    t0 = time.monotonic()
    seq = store.seq()
    count = store.count()
    snaps = list_snapshots(directory)
    how = "rebuilt from SQLite"
    if snaps:
        snap_seq, snap_path = snaps[-1]
        try:
            if snap_seq > seq:
                raise ValueError(f"snapshot seq {snap_seq} is ahead of the store ({seq})")
            index, snap_seq = read_snapshot(snap_path, spec)
            removed = store.removed_after(snap_seq)
            index.remove(removed, may_be_absent=True)
            n_new = 0
            for ids, vecs in store.iter_vectors(spec.dimension, after_seq=snap_seq):
                index.add(ids, vecs)
                n_new += len(ids)
            if index.live != count:
                raise ValueError(f"after replay the index holds {index.live} live vectors, the store {count}")
            how = f"snapshot seq {snap_seq} + replay of {len(removed)} removals, {n_new} rows"
            log.info("collection %s: %d points, %s in %.2fs", name, count, how, time.monotonic() - t0)
            return index, count, seq, snap_seq
        except Exception as e:  # a bad snapshot is never fatal: SQLite has everything
            log.warning("collection %s: snapshot %s unusable (%s); rebuilding from SQLite", name, snap_path.name, e)
    index = build_index(store, spec, count)
    log.info("collection %s: %d points, %s in %.2fs", name, count, how, time.monotonic() - t0)
    return index, count, seq, 0
