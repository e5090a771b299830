"""The in-memory sparse inverted index (service/collections/embedded/sparse_index.py) against a numpy reference: the
exact dot product (IDF-weighted for ``modifier: idf``, Qdrant's formula), best first with ties by internal id, under
upserts, replacements and deletes interleaved, with and without a filter; the same answers after a reopen; and the
durable layout: one row per sparse vector, no per-entry rows."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from service.collections.embedded import Collection
from service.collections.embedded.sparse_index import SparseIndex, pack
from service.collections.embedded.store.files import DB_FILE
from service.collections.filters import parse_filter
from service.collections.schema import SparseVec, SparseVector, VectorsConfig, idf

VOCAB = 300  # small: many shared terms, frequent ties (values from a short list)
VALUES = np.array([0.25, 0.5, 1.0, 1.5, 2.0], np.float32)


def random_vec(rng: np.random.Generator, max_nnz: int = 12) -> SparseVec:
    """A random sparse vector over a Zipf-like vocabulary (low term ids common), sometimes with a value of 0."""
    n = int(rng.integers(0, max_nnz + 1))
    terms = np.unique(np.minimum(rng.zipf(1.3, n) - 1, VOCAB - 1)).astype(np.uint32)
    vals = VALUES[rng.integers(0, len(VALUES), len(terms))] * rng.choice([1, 1, 1, -1, 0], len(terms))
    return SparseVec(terms, vals.astype(np.float32))


def dense(docs: dict[int, SparseVec]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(iids, X, present)``: the documents ``{iid: vector}`` as a dense float64 matrix and its nonzero pattern."""
    iids = np.array(sorted(docs), np.int64)
    X = np.zeros((len(iids), VOCAB), np.float64)
    present = np.zeros((len(iids), VOCAB), bool)
    for r, i in enumerate(iids):
        X[r, docs[i].indices] = docs[i].values
        present[r, docs[i].indices] = True
    return iids, X, present


def reference(docs, query: SparseVec, modifier: str, allowed=None, k: int = 10):
    """``(scores, iids)`` of the ``k`` best documents (``{iid: vector}`` or :func:`dense`'s matrix) by a dense matrix
    dot product, accumulated in float64 column after column in ascending term order (the index's summation order),
    IDF over the documents."""
    iids, X, present = dense(docs) if isinstance(docs, dict) else docs
    df = present.sum(0)
    acc, hit = np.zeros(len(iids)), np.zeros(len(iids), bool)
    for t, q in sorted(zip(query.indices.tolist(), query.values.tolist())):
        if df[t] == 0:
            continue
        w = np.float64(np.float32(q))
        if modifier == "idf":
            w = w * np.float64(idf(len(iids), np.array([df[t]]))[0])
        acc += X[:, t] * w
        hit |= present[:, t]
    if allowed is not None:
        hit &= np.isin(iids, allowed)
    ids, sc = iids[hit], acc[hit].astype(np.float32)
    order = np.lexsort((ids, -sc))[:k]
    return sc[order], ids[order]


@pytest.mark.parametrize("modifier", ["none", "idf"])
def test_scores_and_order_equal_a_numpy_reference_through_writes(modifier):
    rng = np.random.default_rng(7)
    index, docs, next_iid = SparseIndex(), {}, 0
    for step in range(30):
        n = int(rng.integers(20, 150))
        iids = np.arange(next_iid, next_iid + n, dtype=np.int64)
        next_iid += n
        vecs = [random_vec(rng) for _ in range(n)]
        index.add(iids, pack(vecs))
        docs.update(zip(iids.tolist(), vecs))
        if step % 3 == 2 and docs:  # deletes and replacements: some with their terms, some found from postings
            gone = rng.choice(sorted(docs), size=min(len(docs), int(rng.integers(1, 120))), replace=False)
            terms = np.concatenate([docs[int(i)].indices for i in gone]) if step % 2 else None
            index.remove(np.concatenate([gone, [next_iid + 10**6]]), terms)  # an id never indexed is ignored
            for i in gone:
                del docs[int(i)]
        assert index.live == len(docs)
        assert np.array_equal(index.holders(), sorted(docs))
        matrix = dense(docs)
        for _ in range(4):
            q = random_vec(rng, 8)
            q = SparseVec(q.indices, np.abs(q.values) + 0.5)
            live = np.array(sorted(docs), np.int64)
            size = len(live) // 7 if rng.random() < 0.5 else min(len(live), 12)  # small: posting lists searched
            allowed = None if rng.random() < 0.4 else rng.choice(live, size=size, replace=False)
            if allowed is not None and rng.random() < 0.3:
                allowed = np.concatenate([allowed, [next_iid + 5]])  # an unknown id in the filter: ignored
            want = reference(matrix, q, modifier, allowed, k=15)
            got = index.search(q, modifier, 15, allowed)
            assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0]), (step, q)
    assert len(index._state.segments) <= 12  # merged as it grew (binary-counter policy)


def test_a_large_delete_compacts_and_keeps_the_answers():
    rng = np.random.default_rng(3)
    vecs = [random_vec(rng, 20) for _ in range(3000)]
    index = SparseIndex.build([(np.arange(3000, dtype=np.int64), *pack(vecs))])
    docs = dict(enumerate(vecs))
    gone = np.arange(0, 3000, 2)
    index.remove(gone, np.concatenate([vecs[i].indices for i in gone]))
    for i in gone:
        del docs[int(i)]
    st = index._state
    assert st.n == 1500 and not st.dead.any() and st.dead_postings == 0  # rewritten without the dead
    docs = dense(docs)
    for _ in range(20):
        terms = np.unique(rng.integers(0, 40, 5)).astype(np.uint32)
        q = SparseVec(terms, np.ones(len(terms), np.float32))
        for modifier in ("none", "idf"):
            assert all(
                np.array_equal(a, b) for a, b in zip(index.search(q, modifier, 10), reference(docs, q, modifier))
            )


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A sparse-only collection (``modifier: idf``) after upserts, replacements and deletes, with its reference."""
    path = tmp_path_factory.mktemp("sparse") / "c"
    c = Collection.create(path, VectorsConfig({}, {"kw": SparseVector("kw", "idf")}))
    rng = np.random.default_rng(11)
    truth: dict[int, tuple[int, SparseVec]] = {}  # point id -> (internal id, vector)
    iid = 0
    for step in range(12):
        ids = [int(i) for i in rng.choice(4000, size=300, replace=False)]  # replaces points already there
        vecs = [random_vec(rng) for _ in ids]
        c.upsert(ids, [""] * len(ids), [{"g": i % 10} for i in ids], None, named=[{"kw": v} for v in vecs])
        for i, v in zip(ids, vecs):
            truth[i] = (iid, v)
            iid += 1
        if step % 2:
            gone = [int(i) for i in rng.choice(sorted(truth), size=60, replace=False)]
            c.delete(gone)
            for i in gone:
                del truth[i]
    yield path, c, truth
    c.close()


def answers(c: Collection, queries: list[SparseVec], where=None) -> list[list[tuple[int, float]]]:
    """Each query's hits ``(point id, score)`` from the collection."""
    hits = c.search(queries, 10, where=where, using="kw", with_payload=False, with_text=False)
    return [[(h.id, h.score) for h in row] for row in hits]


def expected(truth, queries: list[SparseVec], keep=None) -> list[list[tuple[int, float]]]:
    """Each query's hits from :func:`reference` over ``truth`` (points with ``keep(id)`` only, when given)."""
    docs = dense({iid: v for iid, v in truth.values()})
    by_iid = {iid: pid for pid, (iid, _) in truth.items()}
    allowed = None if keep is None else np.array([iid for pid, (iid, _) in truth.items() if keep(pid)], np.int64)
    out = []
    for q in queries:
        sc, ids = reference(docs, q, "idf", allowed)
        out.append([(by_iid[int(i)], float(s)) for s, i in zip(sc, ids)])
    return out


def test_a_collection_answers_as_the_reference_and_again_after_a_reopen(filled):
    path, c, truth = filled
    rng = np.random.default_rng(5)
    queries = [SparseVec(v.indices, np.ones(len(v.indices), np.float32)) for v in (random_vec(rng) for _ in range(8))]
    plain, where = expected(truth, queries), parse_filter({"g": 3})
    filtered = expected(truth, queries, keep=lambda pid: pid % 10 == 3)
    assert answers(c, queries) == plain and answers(c, queries, where) == filtered
    assert any(plain) and any(filtered)
    assert c.named.counts["kw"] == len(truth)
    again = Collection.open(path)  # what a restart (or a SIGKILL's) reads: the sparse_vectors rows
    try:
        assert answers(again, queries) == plain and answers(again, queries, where) == filtered
        assert again.named.counts["kw"] == len(truth)
    finally:
        again.close()


def test_one_row_per_sparse_vector_and_the_old_postings_table_dropped(filled):
    path, c, truth = filled
    db = sqlite3.connect(path / DB_FILE)
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "sparse_postings" not in tables
        assert db.execute("SELECT COUNT(*) FROM sparse_vectors").fetchone()[0] == len(truth)
        db.execute("CREATE TABLE sparse_postings (field TEXT, term INTEGER, iid INTEGER, value REAL)")  # old layout
        db.commit()
    finally:
        db.close()
    Collection.open(path).close()  # an older collection: the table goes at open
    db = sqlite3.connect(path / DB_FILE)
    try:
        assert not db.execute("SELECT name FROM sqlite_master WHERE name='sparse_postings'").fetchall()
    finally:
        db.close()


WRITER = """
import sys
import numpy as np
from service.collections.embedded import Collection
from service.collections.schema import SparseVec, SparseVector, VectorsConfig

c = Collection.create(sys.argv[1], VectorsConfig({}, {"kw": SparseVector("kw", "idf")}))
for i in range(100000):  # until killed: each write acknowledged (printed) once it returns
    v = SparseVec(np.array([i % 7, 100 + i], np.uint32), np.array([1.0, 2.0], np.float32))
    c.upsert([i], [""], [None], None, named=[{"kw": v}])
    print(i, flush=True)
    if i % 7 == 6:  # a deletion, acknowledged as -1 - id
        c.delete([i - 3])
        print(-1 - (i - 3), flush=True)
    if i % 10 == 9:  # sparse (and FAISS) snapshots: an open loads the newest and replays the writes after it
        c.snapshot()
"""


def test_sigkill_loses_no_acknowledged_sparse_point(tmp_path):
    """A writer killed (SIGKILL) in the middle of upserts, deletions and snapshots: every point it acknowledged is
    found again by a sparse search after a reopen, and none it acknowledged deleted (the index is loaded from the
    newest sparse snapshot plus the writes after it, all from rows written in each write's transaction)."""
    import os
    import signal
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    p = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path / "c")], stdout=subprocess.PIPE, text=True, env=env
    )
    acked = []
    for line in p.stdout:
        acked.append(int(line))
        if len(acked) == 120:
            break
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    acked += [int(x) for x in p.stdout.read().split()]  # acknowledged before the kill landed
    gone = {-1 - x for x in acked if x < 0}
    alive = [x for x in acked if x >= 0 and x not in gone]
    assert len(gone) >= 10 and list((tmp_path / "c").glob("sparse-*/snap-*.npz"))  # deletions and a snapshot
    c = Collection.open(tmp_path / "c")
    try:
        assert c.named.snapshot_seqs["kw"] > 0  # loaded from a snapshot, not rebuilt
        n = c.named.counts["kw"]
        assert n >= len(alive)
        for i in [*alive, *gone]:
            hits = c.search([SparseVec(np.array([100 + i], np.uint32), np.ones(1, np.float32))], 3, using="kw")[0]
            want = [] if i in gone else [(i, float(np.float32(2.0 * idf(n, np.array([1]))[0])))]
            assert [(h.id, h.score) for h in hits] == want
    finally:
        c.close()


def test_searches_beside_writes_see_whole_writes(tmp_path):
    """Readers on threads while a writer replaces every point at once: each search sees one write's points only
    (every point of a write holds the same vector, so a search seeing two writes would return two scores)."""
    import threading

    c = Collection.create(tmp_path / "c", VectorsConfig({}, {"kw": SparseVector("kw", "none")}))
    ids, done, seen, errors = list(range(200)), threading.Event(), set(), []

    def write(gen: int) -> None:
        v = SparseVec(np.array([1, 2 + gen % 50], np.uint32), np.array([float(gen + 1), 1.0], np.float32))
        c.upsert(ids, [""] * len(ids), [None] * len(ids), None, named=[{"kw": v}] * len(ids))

    def read() -> None:
        q = [SparseVec(np.array([1], np.uint32), np.ones(1, np.float32))]
        try:
            while not done.is_set():
                hits = c.search(q, 300, using="kw", with_payload=False, with_text=False)[0]
                scores = {h.score for h in hits}
                assert len(hits) == len(ids) and len(scores) == 1, (len(hits), scores)
                seen.add(scores.pop())
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    write(0)
    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    try:
        for gen in range(1, 60):
            write(gen)
    finally:
        done.set()
        for t in readers:
            t.join()
        c.close()
    assert not errors, errors[0]
    assert len(seen) > 1  # the readers ran between writes


def test_the_index_alone_publishes_each_write_whole():
    """Without the collection's lock: searches on threads while one writer adds and removes batches of 64 points
    (each batch one vector) see whole batches only (copy-on-write publication), merges and compactions included."""
    import threading

    index, done, errors, batch, reads = SparseIndex(), threading.Event(), [], 64, []
    q = SparseVec(np.array([1], np.uint32), np.ones(1, np.float32))

    def read() -> None:
        try:
            while not done.is_set():
                scores, iids = index.search(q, "idf", 10**6)
                assert len(iids) % batch == 0
                for b in np.unique(iids // batch):  # a batch's points: one vector, one score
                    assert len(set(scores[iids // batch == b].tolist())) == 1
                assert index.live % batch == 0
                reads.append(len(iids))
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        live: list[int] = []
        for b in range(300):
            iids = np.arange(b * batch, (b + 1) * batch, dtype=np.int64)
            v = SparseVec(np.array([1, 2 + b % 7], np.uint32), np.array([1.0 + b % 5, 1.0], np.float32))
            index.add(iids, pack([v] * batch))
            live.append(b)
            if b % 3 == 2:  # remove an older batch: tombstones, then compactions
                gone = live.pop(len(live) // 2)
                index.remove(np.arange(gone * batch, (gone + 1) * batch, dtype=np.int64))
    finally:
        done.set()
        for t in readers:
            t.join()
    assert not errors, errors[0]
    assert index.live == len(live) * batch
    assert len(set(reads)) > 3  # the searches ran between writes
