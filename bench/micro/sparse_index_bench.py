"""Sparse (BM25-like) search on the embedded backend: the in-memory inverted index (``sparse_index.SparseIndex``)
against the SQL inverted index it replaced and two other layouts, on synthetic documents.

``--docs`` documents of about ``--terms`` distinct terms each, drawn from a Zipf vocabulary (``--vocab`` terms,
exponent 1.1, term ids scattered over uint32 as hashed tokens are), values BM25-like in [0.3, 2); ``--queries``
queries of 6 Zipf-drawn terms (value 1), scored with ``modifier: idf``, top 10, unfiltered and restricted to a random
1 % of the documents. Prints build time, memory and query p50/p95 per layout (each query's best of 3 runs; the SQL
layout's of 1, on half the queries):

* SQL (before): ``sparse_postings(field, term, iid, value)`` rows in SQLite read with ``term IN (...)`` into Python,
  then numpy (the function below is the service's until this index, kept here), filtered after scoring;
* segments (after): ``SparseIndex`` built at once (one segment) and fed in batches of 256 points (several segments),
  then with 10 % of the points deleted (tombstones);
* CSC sort: the same postings, each query's scored by ``np.unique`` + ``np.bincount`` instead of a dense accumulator;
* scipy CSC: ``scipy.sparse.csc_matrix`` (float64 data, exact) and ``X[:, terms] @ w``.

    python -m bench.micro.sparse_index_bench --docs 100000
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.lib.machine import cpu_model
from service.collections.embedded.sparse_index import SparseIndex, _weights
from service.collections.embedded.store.named import chunks, iter_sparse, marks
from service.collections.schema import SparseVec, idf


def corpus(n: int, terms: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(lengths, terms, vals, term_ids)``: ``n`` documents' postings, one document after another (terms ascending
    within one), and the vocabulary's ids by rank (rank 0 the most frequent)."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(2**31, vocab, replace=False)).astype(np.uint32)
    ids = rng.permutation(ids)  # rank -> id: frequent terms anywhere in the id space
    raw = np.minimum(rng.zipf(1.1, (n, int(terms * 1.6))) - 1, vocab - 1)
    lengths, out = np.empty(n, np.int64), []
    for i in range(n):
        t = np.unique(ids[raw[i]])[:terms]
        lengths[i] = len(t)
        out.append(t)
    t = np.concatenate(out)
    return lengths, t, rng.uniform(0.3, 2.0, len(t)).astype(np.float32), ids


def queries(ids: np.ndarray, n: int, seed: int = 1) -> list[SparseVec]:
    """``n`` queries of up to 6 distinct Zipf-drawn terms, values 1."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        t = np.unique(ids[np.minimum(rng.zipf(1.1, 6) - 1, len(ids) - 1)])
        out.append(SparseVec(t, np.ones(len(t), np.float32)))
    return out


def sql_scores(conn, name, query, modifier, n_points):
    """The service's SQL sparse scoring before the in-memory index (``store/named.py``'s ``sparse_scores``)."""
    terms = [int(t) for t in query.indices]
    weight = dict(zip(terms, query.values.astype(np.float64)))
    t_all, i_all, v_all = [], [], []
    for part in chunks(terms):
        q = f"SELECT term, iid, value FROM sparse_postings WHERE field=? AND term IN ({marks(part)})"
        rows = conn.execute(q, [name, *part]).fetchall()
        if rows:
            t, iid, v = zip(*rows)
            t_all.append(np.asarray(t, np.int64))
            i_all.append(np.asarray(iid, np.int64))
            v_all.append(np.asarray(v, np.float64))
    if not t_all:
        return np.empty(0, np.int64), np.empty(0, np.float32)
    t, iid, v = np.concatenate(t_all), np.concatenate(i_all), np.concatenate(v_all)
    uterms, tinv, df = np.unique(t, return_inverse=True, return_counts=True)
    w = np.array([weight[int(x)] for x in uterms], dtype=np.float64)
    if modifier == "idf":
        w = w * idf(n_points, df).astype(np.float64)
    ids, inv = np.unique(iid, return_inverse=True)
    scores = np.bincount(inv, weights=v * w[tinv], minlength=len(ids))
    return ids, scores.astype(np.float32)


def top(ids: np.ndarray, sc: np.ndarray, k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best, ties by id."""
    if len(sc) > k:
        part = np.argpartition(-sc, k - 1)
        keep = sc >= sc[part[k - 1]]
        ids, sc = ids[keep], sc[keep]
    order = np.lexsort((ids, -sc))[:k]
    return sc[order], ids[order]


def timed(fn, qs, reps: int = 3) -> tuple[float, float, list]:
    """p50 and p95 in ms of ``fn(q)`` over the queries (each query's best of ``reps`` runs: the machine is shared),
    and the answers."""
    out, ms = [], []
    for q in qs:
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            got = fn(q)
            best = min(best, (time.perf_counter() - t0) * 1e3)
        out.append(got)
        ms.append(best)
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 95)), out


def sort_based(index: SparseIndex, q: SparseVec, allowed_slots=None):
    """Scores from the index's postings, summed by ``np.unique`` + ``np.bincount`` (the sort-based alternative)."""
    st = index._state
    _, w, lists = _weights(st, q, "idf")
    sl, co = [], []
    for wt, spans in zip(w.tolist(), lists):
        for seg, b, e in spans:
            s, v = seg.slots[b:e], seg.vals[b:e]
            if allowed_slots is not None:
                keep = np.isin(s, allowed_slots)
                s, v = s[keep], v[keep]
            sl.append(s)
            co.append(v.astype(np.float64) * wt)
    slots, inv = np.unique(np.concatenate(sl), return_inverse=True)
    return top(st.slot_iid[slots], np.bincount(inv, weights=np.concatenate(co)).astype(np.float32))


def written() -> int:
    """Bytes this process has caused to be written to storage (``/proc/self/io``; 0 where absent)."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--terms", type=int, default=40)
    ap.add_argument("--vocab", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument(
        "--skip-sql", action="store_true", help="leave the SQL postings out (their ingest is the slow part)"
    )
    args = ap.parse_args()
    n = args.docs
    lengths, terms, vals, vocab_ids = corpus(n, args.terms, args.vocab)
    iids = np.arange(n, dtype=np.int64)
    qs = queries(vocab_ids, args.queries)
    rng = np.random.default_rng(2)
    allowed = np.sort(rng.choice(n, n // 100, replace=False)).astype(np.int64)
    rows: list[tuple] = []
    print(
        f"{n} docs, {len(terms)} postings ({len(terms) / n:.1f}/doc), vocab {args.vocab}; {cpu_model()}, "
        f"load {os.getloadavg()[0]:.2f}"
    )

    # after: one segment, built as at open
    t0 = time.perf_counter()
    chunked = [(iids[i : i + 20000], lengths[i : i + 20000]) for i in range(0, n, 20000)]
    starts = np.concatenate([[0], np.cumsum(lengths)])
    index = SparseIndex.build(
        (ii, ll, terms[starts[ii[0]] : starts[ii[-1] + 1]], vals[starts[ii[0]] : starts[ii[-1] + 1]])
        for ii, ll in chunked
    )
    build = time.perf_counter() - t0
    p50, p95, want = timed(lambda q: index.search(q, "idf", 10), qs)
    f50, f95, fwant = timed(lambda q: index.search(q, "idf", 10, allowed), qs)
    st = index._state
    post = [sum(int(e - b) for s in st.segments for b, e in zip(*s.lookup(q.indices))) for q in qs]
    print(f"postings per query: p50 {np.median(post):.0f}, max {max(post)}")
    rows.append(("segments, built at once (after)", build, index.nbytes, p50, p95, f50, f95))

    # fed in batches (as ingest does), then 10 % deleted
    t0 = time.perf_counter()
    fed = SparseIndex()
    for i in range(0, n, 256):
        fed.add(
            iids[i : i + 256],
            (
                lengths[i : i + 256],
                terms[starts[i] : starts[min(i + 256, n)]],
                vals[starts[i] : starts[min(i + 256, n)]],
            ),
        )
    feed = time.perf_counter() - t0
    p50, p95, got = timed(lambda q: fed.search(q, "idf", 10), qs)
    assert all(np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0]) for a, b in zip(got, want))
    f50, f95, _ = timed(lambda q: fed.search(q, "idf", 10, allowed), qs)
    rows.append(
        (f"segments, fed 256 at a time ({len(fed._state.segments)} segments)", feed, fed.nbytes, p50, p95, f50, f95)
    )
    gone = np.sort(rng.choice(n, n // 10, replace=False))
    t0 = time.perf_counter()
    fed.remove(gone, np.concatenate([terms[starts[i] : starts[i + 1]] for i in gone]))
    rm = time.perf_counter() - t0
    p50, p95, _ = timed(lambda q: fed.search(q, "idf", 10), qs)
    f50, f95, _ = timed(lambda q: fed.search(q, "idf", 10, allowed), qs)
    rows.append(("  then 10 % deleted (tombstones; remove time)", rm, fed.nbytes, p50, p95, f50, f95))

    # CSC sort-based accumulation
    p50, p95, got = timed(lambda q: sort_based(index, q), qs)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(got, want))
    f50, f95, _ = timed(lambda q: sort_based(index, q, allowed), qs)  # allowed == slots here (one per iid)
    rows.append(("CSC, np.unique + bincount per query", build, index.nbytes, p50, p95, f50, f95))

    # scipy.sparse CSC, float64 data (float32 data would not be exact)
    import scipy.sparse as sp

    t0 = time.perf_counter()
    vocab, col = np.unique(terms, return_inverse=True)
    X = sp.csc_matrix((vals.astype(np.float64), (np.repeat(iids, lengths), col)), shape=(n, len(vocab)))
    df = np.diff(X.indptr)
    sbuild = time.perf_counter() - t0

    def scipy_search(q, allowed=None):
        pos = np.searchsorted(vocab, q.indices)
        pos = pos[(pos < len(vocab)) & (vocab[np.minimum(pos, len(vocab) - 1)] == q.indices)]
        w = idf(n, df[pos]).astype(np.float64)
        sub = X[:, pos]
        s = sub @ w
        hit = np.flatnonzero(np.diff(sub.tocsr().indptr) > 0)
        if allowed is not None:
            hit = hit[np.isin(hit, allowed)]
        return top(hit, s[hit].astype(np.float32))

    p50, p95, _ = timed(scipy_search, qs)
    f50, f95, _ = timed(lambda q: scipy_search(q, allowed), qs)
    mem = X.data.nbytes + X.indices.nbytes + X.indptr.nbytes + vocab.nbytes
    rows.append(("scipy.sparse CSC (float64), X[:, terms] @ w", sbuild, mem, p50, p95, f50, f95))

    # before: SQL postings
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "p.sqlite3"
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE sparse_postings (field TEXT NOT NULL, term INTEGER NOT NULL, iid INTEGER NOT NULL,"
            " value REAL NOT NULL, PRIMARY KEY (field, term, iid)) WITHOUT ROWID"
        )
        conn.execute(
            "CREATE TABLE sparse_vectors (field TEXT NOT NULL, iid INTEGER NOT NULL, indices BLOB NOT NULL,"
            " vals BLOB NOT NULL, PRIMARY KEY (field, iid)) WITHOUT ROWID"
        )
        conn.execute("PRAGMA synchronous=NORMAL")  # no fsync per commit: the bytes, not the disk's latency
        tail = max(0, n - 10_000)  # the last points are ingested as the service does: a transaction per 256

        def ingest(rows_of, lo: int, hi: int, batch: int) -> tuple[float, int]:
            w0, t0 = written(), time.perf_counter()
            for i in range(lo, hi, batch):
                conn.execute("BEGIN")
                rows_of(i, min(i + batch, hi))
                conn.execute("COMMIT")
            return time.perf_counter() - t0, written() - w0

        def vec_rows(lo: int, hi: int) -> None:
            conn.executemany(
                "INSERT INTO sparse_vectors VALUES ('s', ?, ?, ?)",
                (
                    (i, terms[starts[i] : starts[i + 1]].tobytes(), vals[starts[i] : starts[i + 1]].tobytes())
                    for i in range(lo, hi)
                ),
            )

        def post_rows(lo: int, hi: int) -> None:
            a, b = starts[lo], starts[hi]
            conn.executemany(
                "INSERT INTO sparse_postings VALUES ('s', ?, ?, ?)",
                zip(
                    terms[a:b].tolist(),
                    np.repeat(iids[lo:hi], lengths[lo:hi]).tolist(),
                    vals[a:b].astype(np.float64).tolist(),
                ),
            )

        vec_s = ingest(vec_rows, 0, tail, tail or 1)[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        vt, vw = ingest(vec_rows, tail, n, 256)
        t0 = time.perf_counter()
        opened = SparseIndex.build(iter_sparse(conn, "s"))  # what a collection's open does
        load = time.perf_counter() - t0
        p50, p95, got = timed(lambda q: opened.search(q, "idf", 10), qs)
        assert all(np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0]) for a, b in zip(got, want))
        f50, f95, _ = timed(lambda q: opened.search(q, "idf", 10, allowed), qs)
        rows.insert(1, ("segments, loaded from sparse_vectors rows (an open)", load, opened.nbytes, p50, p95, f50, f95))
        if args.skip_sql:
            conn.close()
            return report(rows)
        post_s = ingest(post_rows, 0, tail, tail or 1)[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pt, pw = ingest(post_rows, tail, n, 256)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        all_bytes = db.stat().st_size
        vec_bytes = conn.execute("SELECT SUM(length(indices) + length(vals)) FROM sparse_vectors").fetchone()[0]
        sq = qs[: max(10, len(qs) // 2)]

        def sql_search(q, allowed=None):
            ids, sc = sql_scores(conn, "s", q, "idf", n)
            if allowed is not None:
                keep = np.isin(ids, allowed)
                ids, sc = ids[keep], sc[keep]
            return top(ids, sc)

        p50, p95, got = timed(sql_search, sq, reps=1)
        assert all(np.array_equal(a[1], b[1]) and np.array_equal(a[0], b[0]) for a, b in zip(got, want))
        f50, f95, _ = timed(lambda q: sql_search(q, allowed), sq, reps=1)
        rows.append(("SQL sparse_postings (before; build: one transaction)", post_s, all_bytes, p50, p95, f50, f95))
        conn.close()
    m = n - tail
    print(
        f"SQLite ingest of {tail} points in one transaction: sparse_vectors {vec_s:.1f} s, sparse_postings "
        f"{post_s:.1f} s; database {all_bytes / n:.0f} B/point (blobs {vec_bytes / n:.0f} B/point).\nThe last {m} "
        f"points in transactions of 256 (WAL): sparse_vectors {vt / m * 1e3:.2f} ms and {vw / m / 1024:.1f} KiB "
        f"written per point, sparse_postings {pt / m * 1e3:.2f} ms and {pw / m / 1024:.1f} KiB written per point"
    )
    report(rows)


def report(rows: list[tuple]) -> None:
    """Print the table."""
    print(
        "\n| layout | build (s) | memory (MiB; SQL: disk) | p50 / p95 (ms) | 1 % filter p50 / p95 (ms) |\n|---|---|---|---|---|"
    )
    for name, b, mem, a50, a95, g50, g95 in rows:
        print(f"| {name} | {b:.2f} | {mem / 2**20:.0f} | {a50:.2f} / {a95:.2f} | {g50:.2f} / {g95:.2f} |")


if __name__ == "__main__":
    main()
