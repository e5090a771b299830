"""Flat dense search: FAISS's exhaustive search against the NumPy scan of the vectors FAISS holds.

One flat :class:`~service.collections.index.VectorIndex` of ``--n`` random ``--dim``-d vectors (unit rows for
``cosine``, Gaussian for ``l2``), top ``--k``. For each batch of ``--queries`` queries, the median of ``--repeat``
runs in ms of:

* ``faiss 1t`` / ``faiss 2t``: ``IndexIDMap2(IndexFlat).search`` with one / two OpenMP threads (the service runs
  FAISS on one, ``collections_faiss_threads``; under 128,000 / d queries FAISS scores one vector at a time, with two
  threads and one query it splits the vectors in two and multiplies matrices, ``faiss/utils/distances.cpp``);
* ``numpy``: ``X @ q.T`` + ``argpartition`` over the whole matrix (the previous ``params.exact`` path; cosine only:
  its L2 form squares the whole matrix into a temporary);
* ``scan``: :meth:`VectorIndex.search` answered by the NumPy scan (:mod:`service.collections.index.scan`): chunked
  BLAS products, candidates within the rounding bound re-scored by FAISS's kernels; checked to return FAISS's
  (1-thread) ids and scores (``same``).

Then one query with the BLAS threads varied (``threadpoolctl``): one product with 2 BLAS threads, with 1, and two
Python threads each multiplying half the rows with 1 BLAS thread each. Then filtered search of one query over an
allowed set of ``--allowed`` fractions of the ids (random): FAISS with an ``IDSelectorBatch``, the previous exact
path (``np.isin`` over the ids, the rows gathered, ``X @ q``), and :meth:`VectorIndex.exact_search` now (rows scored
in place by FAISS's kernel, or the scan with the others masked out).

    python -m bench.micro.flat_scan_bench --n 100000 --queries 1,2,4,8,16,32,64,128,256,512
    python -m bench.micro.flat_scan_bench --n 1000000 --queries 1,2,4,8,16,32 --faiss-max 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable

import faiss
import numpy as np
from threadpoolctl import threadpool_limits

from bench.lib.machine import cpu_model
from service.collections.index import IndexSpec, VectorIndex, exact_search


def vectors(n: int, d: int, metric: str, seed: int) -> np.ndarray:
    """``n`` random float32 rows, unit rows for cosine, generated in chunks of 100k."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, d), np.float32)
    for i in range(0, n, 100_000):
        x = rng.standard_normal((min(100_000, n - i), d), dtype=np.float32)
        out[i : i + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True) if metric == "cosine" else x
    return out


class Took(float):
    """A median wall time in ms that prints with the median CPU time of the process (all its threads) beside it:
    ``wall (cpu)``; on a shared machine the CPU time says more about the work than the wall time."""

    cpu: float = 0.0

    def __format__(self, spec: str) -> str:
        return f"{format(float(self), spec)} ({format(self.cpu, '.0f')})"


def ms(fn: Callable[[], object], repeat: int) -> tuple[Took, object]:
    """Median wall and CPU time of ``fn`` over ``repeat`` runs (ms) and its last result."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append((time.perf_counter() - t) * 1000)
        cpus.append((time.process_time() - c) * 1000)
    took = Took(statistics.median(walls))
    took.cpu = statistics.median(cpus)
    return took, out


def faiss_search(vi: VectorIndex, q: np.ndarray, k: int, threads: int, allowed: np.ndarray | None = None):
    """FAISS's own search of ``vi``'s index (raw scores) with ``threads`` OpenMP threads."""
    faiss.omp_set_num_threads(threads)
    params = faiss.SearchParameters()
    sel = faiss.IDSelectorBatch(allowed) if allowed is not None else None
    if sel is not None:
        params.sel = sel
    try:
        return vi.index.search(q, k, params=params)
    finally:
        faiss.omp_set_num_threads(1)


def batches(vi: VectorIndex, X: np.ndarray, Q: np.ndarray, args: argparse.Namespace, metric: str) -> None:
    """The table queries x method -> ms for one metric."""
    print(f"\n{metric}: N={len(X):,}, d={X.shape[1]}, top {args.k}; wall ms (CPU ms), median of {args.repeat}")
    print("| queries | faiss 1t | faiss 2t | numpy | scan | scan same as faiss 1t |")
    print("|---:|---:|---:|---:|---:|---|")
    ids = np.arange(len(X), dtype=np.int64)
    for nq in args.queries:
        q = np.ascontiguousarray(Q[:nq])
        row = [str(nq)]
        raw = None
        if nq <= args.faiss_max:
            t, raw = ms(lambda q=q: faiss_search(vi, q, args.k, 1), args.repeat)
            row.append(f"{t:.1f}")
            row.append(f"{ms(lambda q=q: faiss_search(vi, q, args.k, 2), args.repeat)[0]:.1f}" if nq <= 4 else "-")
        else:
            row += ["-", "-"]
        if metric == "cosine" and nq <= args.numpy_max:
            row.append(f"{ms(lambda q=q: exact_search(q, X, ids, args.k, metric), args.repeat)[0]:.1f}")
        else:
            row.append("-")
        t, (D, I) = ms(lambda q=q: vi.search(q, args.k), args.repeat)
        row.append(f"{t:.1f}")
        if raw is not None:
            fd = np.sqrt(np.maximum(raw[0], 0)) if metric == "l2" else raw[0]
            row.append("yes" if np.array_equal(I, raw[1]) and np.array_equal(D, fd) else "NO")
        else:
            row.append("-")
        print("| " + " | ".join(row) + " |", flush=True)


def blas_threads(X: np.ndarray, q: np.ndarray, repeat: int) -> None:
    """One query's matrix-vector product with 2 BLAS threads, 1, and 2 Python threads x 1 BLAS thread."""
    print(f"\none query, X @ q (N={len(X):,}): wall ms (CPU ms), median of {repeat}")

    def halves() -> None:
        half = len(X) // 2
        out = np.empty(len(X), np.float32)
        parts = ((0, half), (half, len(X)))
        ts = [threading.Thread(target=lambda a, b: np.matmul(X[a:b], q, out=out[a:b]), args=r) for r in parts]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    with threadpool_limits(2, user_api="blas"):
        print(f"| 2 BLAS threads | {ms(lambda: X @ q, repeat)[0]:.1f} |")
    with threadpool_limits(1, user_api="blas"):
        print(f"| 1 BLAS thread | {ms(lambda: X @ q, repeat)[0]:.1f} |")
        print(f"| 2 Python threads x 1 BLAS thread (halves) | {ms(halves, repeat)[0]:.1f} |")


def filtered(vi: VectorIndex, X: np.ndarray, q: np.ndarray, args: argparse.Namespace, metric: str) -> None:
    """One query over allowed sets of several sizes: FAISS with a selector, the previous exact path, now."""
    print(f"\n{metric}, one query, allowed set (N={len(X):,}): wall ms (CPU ms), median of {args.repeat}")
    print("| allowed | faiss 1t + IDSelectorBatch | previous exact (isin + gather + numpy) | now | same as faiss |")
    print("|---|---:|---:|---:|---|")
    rng = np.random.default_rng(7)
    all_ids = np.arange(len(X), dtype=np.int64)
    for frac in args.allowed:
        allowed = np.sort(rng.choice(len(X), int(len(X) * frac), replace=False)).astype(np.int64)
        t_f, (D, I) = ms(lambda a=allowed: faiss_search(vi, q, args.k, 1, a), args.repeat)

        def previous(allowed: np.ndarray = allowed) -> tuple[np.ndarray, np.ndarray]:
            keep = np.isin(all_ids, allowed)
            return exact_search(q, X[keep], all_ids[keep], args.k, metric)

        t_p = f"{ms(previous, args.repeat)[0]:.1f}" if metric == "cosine" else "-"
        t_n, (S, J) = ms(lambda a=allowed: vi.exact_search(q, args.k, a), args.repeat)
        fd = np.sqrt(np.maximum(D, 0)) if metric == "l2" else D
        same = np.array_equal(I, J) and np.array_equal(fd, S)
        print(f"| {frac:.1%} ({len(allowed):,}) | {t_f:.1f} | {t_p} | {t_n:.1f} | {'yes' if same else 'NO'} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--queries", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--faiss-max", type=int, default=1 << 30, help="largest batch FAISS is timed on")
    ap.add_argument("--numpy-max", type=int, default=64, help="largest batch the previous numpy path is timed on")
    ap.add_argument("--metrics", default="cosine,l2")
    ap.add_argument("--allowed", type=lambda s: [float(x) for x in s.split(",")], default=[0.001, 0.01, 0.1, 0.5])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    faiss.omp_set_num_threads(1)
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average before: {os.getloadavg()}")
    t0 = time.perf_counter()
    for metric in args.metrics.split(","):
        X = vectors(args.n, args.dim, metric, 0)
        Q = vectors(max(args.queries), args.dim, metric, 1)
        vi = VectorIndex(IndexSpec("flat", metric, {}, args.dim))
        for a in range(0, len(X), 100_000):
            vi.add(np.arange(a, min(a + 100_000, len(X)), dtype=np.int64), X[a : a + 100_000])
        del X  # the index's own copy is scanned from here on
        X = vi.type.held_vectors(vi.spec, vi.index)
        vi.search(Q[:1], args.k)  # the norms, once
        batches(vi, X, Q, args, metric)
        if metric == args.metrics.split(",")[0]:
            blas_threads(X, Q[0], args.repeat)
        filtered(vi, X, Q[:1], args, metric)
        del vi, X
    print(f"\nload average after: {os.getloadavg()}; {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
