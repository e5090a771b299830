"""Open time of an embedded collection with one sparse vector (``modifier: idf``): the inverted index rebuilt from
every ``sparse_vectors`` row (no snapshot) against loaded from its snapshot plus a replay of the writes after it
(:mod:`service.collections.embedded.sparse_snapshots`).

``--docs`` synthetic documents (``sparse_index_bench.corpus``: about ``--terms`` distinct Zipf terms each) are
upserted in batches of 2,000, a snapshot is taken, then ``--after`` points are replaced and as many deleted (the
replay); each open is timed ``--repeat`` times (best kept), page cache warm.

    python -m bench.micro.sparse_open_bench --docs 100000
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.lib.machine import cpu_model
from bench.micro.sparse_index_bench import corpus
from service.collections.embedded import Collection, sparse_snapshots
from service.collections.schema import SparseVec, SparseVector, VectorsConfig


def timed_open(path: Path, repeat: int) -> tuple[float, int]:
    """``(best seconds, the sparse snapshot seq used)`` of ``Collection.open(path)``."""
    best, used = float("inf"), 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        c = Collection.open(path)
        best = min(best, time.perf_counter() - t0)
        used = c.named.snapshot_seqs["kw"]
        c.close()
    return best, used


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--terms", type=int, default=40)
    ap.add_argument("--vocab", type=int, default=200_000)
    ap.add_argument("--after", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = args.docs
    lengths, terms, vals, _ = corpus(n, args.terms, args.vocab)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    vec = lambda i: SparseVec(terms[starts[i] : starts[i + 1]], vals[starts[i] : starts[i + 1]])  # noqa: E731
    root = Path(tempfile.mkdtemp(prefix="sparse-open-"))
    try:
        path = root / "c"
        c = Collection.create(path, VectorsConfig({}, {"kw": SparseVector("kw", "idf")}))
        t0 = time.perf_counter()
        for b in range(0, n, 2000):
            ids = list(range(b, min(n, b + 2000)))
            c.upsert(ids, [""] * len(ids), [None] * len(ids), None, named=[{"kw": vec(i)} for i in ids])
        ingest = time.perf_counter() - t0
        t0 = time.perf_counter()
        c.snapshot()
        snap = time.perf_counter() - t0
        rng = np.random.default_rng(3)
        again = [int(i) for i in rng.choice(n, args.after, replace=False)]
        c.upsert(again, [""] * len(again), [None] * len(again), None, named=[{"kw": vec(i)} for i in again])
        c.delete([int(i) for i in rng.choice(n, args.after, replace=False)])
        c.close()
        size = sum(p.stat().st_size for p in sparse_snapshots.directory(path, "kw").iterdir())
        loaded, used = timed_open(path, args.repeat)
        assert used > 0
        shutil.rmtree(sparse_snapshots.directory(path, "kw"))
        rebuilt, used = timed_open(path, args.repeat)
        assert used == 0
        print(
            f"{n} docs, {len(terms)} postings; {cpu_model()}, load {os.getloadavg()[0]:.2f}; ingest {ingest:.1f}s; "
            f"snapshot write {snap:.2f}s, {size / 2**20:.0f} MiB; open: rebuilt {rebuilt:.2f}s, "
            f"snapshot + replay of {args.after} replaced and {args.after} deleted {loaded:.2f}s"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
