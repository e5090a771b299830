"""Snapshots of the sparse inverted index (service/collections/embedded/sparse_snapshots.py): an open loads the newest
one and replays the writes after it (upserts, replacements, deletions; IDF over the live points) with the same
answers as before the close and as a numpy reference; a corrupt, foreign-format or stale snapshot is not used (a
full rebuild answers the same); a later snapshot writes only the segments that changed."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from service.collections.embedded import Collection
from service.collections.embedded import sparse_snapshots as snaps
from service.collections.filters import parse_filter
from service.collections.schema import SparseVec, SparseVector, VectorsConfig
from tests.service.collections.test_sparse_index import answers, expected, random_vec

WHERE = parse_filter({"g": 3})


def writes(c: Collection, rng: np.random.Generator, truth: dict, steps: int) -> None:
    """``steps`` batches of upserts (replacing points already there) and deletions, mirrored in ``truth``."""
    for step in range(steps):
        ids = [int(i) for i in rng.choice(3000, size=150, replace=False)]
        vecs = [random_vec(rng) for _ in ids]
        c.upsert(ids, [""] * len(ids), [{"g": i % 10} for i in ids], None, named=[{"kw": v} for v in vecs])
        by_key = {int(k): i for k, i in c.store.reader().execute("SELECT key, iid FROM points")}
        for i, v in zip(ids, vecs):
            truth[i] = (by_key[i], v)
        if step % 2:
            gone = [int(i) for i in rng.choice(sorted(truth), size=40, replace=False)]
            c.delete(gone)
            for i in gone:
                del truth[i]


def queries(seed: int = 5) -> list[SparseVec]:
    rng = np.random.default_rng(seed)
    return [SparseVec(v.indices, np.ones(len(v.indices), np.float32)) for v in (random_vec(rng) for _ in range(10))]


def both(c: Collection, qs: list[SparseVec]) -> tuple[list, list]:
    """Unfiltered and filtered answers."""
    return answers(c, qs), answers(c, qs, WHERE)


@pytest.fixture
def snapped(tmp_path):
    """A sparse collection (``modifier: idf``) with a snapshot, then more writes after it, closed without a final
    snapshot (as a crash leaves it); ``(path, snapshot seq, truth, answers before the close)``."""
    path = tmp_path / "c"
    c = Collection.create(path, VectorsConfig({}, {"kw": SparseVector("kw", "idf")}))
    rng, truth = np.random.default_rng(3), {}
    writes(c, rng, truth, 8)
    seq = c.snapshot()
    writes(c, rng, truth, 5)  # after the snapshot: replayed at open
    before = both(c, queries())
    assert before == (expected(truth, queries()), expected(truth, queries(), keep=lambda p: p % 10 == 3))
    assert any(before[0]) and any(before[1])
    c.close()
    return path, seq, truth, before


def reopened(path, expect_seq: int, before) -> Collection:
    c = Collection.open(path)
    assert c.named.snapshot_seqs["kw"] == expect_seq
    assert both(c, queries()) == before
    return c


def test_an_open_loads_the_snapshot_and_replays_the_writes_after_it(snapped):
    path, seq, truth, before = snapped
    c = reopened(path, seq, before)
    try:
        assert c.named.counts["kw"] == len(truth)
        segs = {p.name for p in snaps.directory(path, "kw").glob("seg-*")}
        rng = np.random.default_rng(9)
        writes(c, rng, truth, 3)
        seq2 = c.snapshot()
        after = both(c, queries())
        assert after == (expected(truth, queries()), expected(truth, queries(), keep=lambda p: p % 10 == 3))
        now = {p.name for p in snaps.directory(path, "kw").glob("seg-*")}
        assert segs & now  # the large segment is kept, not written again
        assert [p.name for p in snaps.directory(path, "kw").glob("snap-*")] == [f"snap-{seq2:020d}.npz"]
    finally:
        c.close()
    reopened(path, seq2, after).close()


@pytest.mark.parametrize("damage", ["segment", "manifest", "format", "missing segment"])
def test_a_bad_snapshot_falls_back_to_a_rebuild(snapped, damage):
    path, seq, truth, before = snapped
    d = snaps.directory(path, "kw")
    seg, snap = sorted(d.glob("seg-*"))[0], d / f"snap-{seq:020d}.npz"
    if damage == "segment":  # a flipped byte in the middle of the postings (the member's CRC no longer matches)
        raw = bytearray(seg.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        seg.write_bytes(bytes(raw))
    elif damage == "manifest":
        snap.write_bytes(snap.read_bytes()[:100])
    elif damage == "format":
        with np.load(snap) as f:
            a = dict(f)
        np.savez(snap, **{**a, "format": np.int64(snaps.FORMAT + 1)})
    else:
        seg.unlink()
    c = reopened(path, 0, before)  # rebuilt from the rows: same answers
    c.close()


def test_a_snapshot_older_than_the_pruned_removals_is_not_used(snapped):
    """The newest snapshot replaced by an older one (whose removals were pruned since): replaying it would keep
    deleted points; the count check sends the open to a rebuild."""
    path, seq, truth, before = snapped
    d = snaps.directory(path, "kw")
    old = d.parent / "old"
    shutil.copytree(d, old)
    c = Collection.open(path)
    writes(c, np.random.default_rng(4), truth, 4)
    c.snapshot()  # prunes the removals up to here
    after = both(c, queries())
    c.close()
    shutil.rmtree(d)
    old.rename(d)
    reopened(path, 0, after).close()


def test_dropping_and_adding_the_vector_again_forgets_its_snapshot(snapped):
    path, seq, truth, before = snapped
    c = Collection.open(path)
    try:
        c.update_vectors(lambda v: VectorsConfig({}, {}))
        assert not snaps.directory(path, "kw").exists()
        c.update_vectors(lambda v: VectorsConfig({}, {"kw": SparseVector("kw", "idf")}))
        assert answers(c, queries()) == [[] for _ in queries()]
    finally:
        c.close()
    c = Collection.open(path)
    try:
        assert answers(c, queries()) == [[] for _ in queries()]
    finally:
        c.close()
