"""The 10M dense scale bench's ``ivf_sq`` (or ``--kind ivf_pq_fs``) index built by FAISS alone, the service's way, and
searched at several ``nprobe``: which setting the service run (:mod:`bench.micro.scale_bench`) should use, and what it
can reach (not in CI; run alone; ~15 minutes and ~5 GB of RAM for 10M points).

The points are :mod:`bench.micro.scale_bench`'s (the same ``generate``, seed and queries); the index is what the
service makes of them: the type's ``create_trained`` (two-level k-means, then int8 code ranges or 4-bit codebooks) on
the first ``min_train_points`` points (the service trains on the points it holds when it reaches that many, written in
id order by the bench), every point then added through the type's ``add`` (lists found in the centroids' HNSW graph). ``--threads``
OpenMP threads (default 1, the service's ``collections_faiss_threads`` default; above 1, FAISS's
``parallel_mode = 1`` splits one query's lists over them). The exact top 10 of each truth query is computed
in the same pass and saved as ``truth.npz`` in ``--work`` (the file the service run reads, if it is not there yet).

Prints, per ``nprobe`` and per number of candidates (``--candidates``; default ``ceil(oversampling x 10)``): recall@10
after the service's exact re-scoring of the candidates (a true top-10 point among the candidates is always kept by it:
recall is the share of the truth among the candidates) and the p50/p99 of single-query searches (re-scoring not
timed); then the filters (0.1 / 1 / 10 %, the most candidates): each scored over every list with the service's selector (its path for a filter admitting at most ``exact_filter_threshold`` points) and at each ``nprobe``.

    python -m bench.micro.scale_sweep --points 10000000 --nlist 16384 --work ~/.cache/redundancy-embed/scale_bench/10m-ivf_sq

``--snapshot`` searches the service run's own index instead (its snapshot in ``--work``, ids mapped through its
``points`` table; a minute to read, no build): the same table for the index the service serves.
"""

from __future__ import annotations

import argparse
import math
import os
import sqlite3
import time
from pathlib import Path

import faiss
import numpy as np

from bench.lib import REPO
from bench.lib.corpus import corpus_embeddings
from bench.lib.machine import cpu_model
from bench.micro.scale_bench import FILTERS, K, exact_truth, generate
from service.collections.index import IndexSpec, get_type, normalize_params, read_snapshot
from service.collections.index.vector_index import allowed_selector


def timed(idx: faiss.Index, Q: np.ndarray, k: int, params: faiss.SearchParameters, allowed=None) -> tuple:
    """``(p50 ms, p99 ms, candidates (nq, k))`` of single-query searches (a selector for ``allowed`` built in each)."""
    ts, out = [], []
    for q in Q:
        t0 = time.perf_counter()
        if allowed is not None:
            params.sel, keep = allowed_selector(allowed)
        out.append(idx.search(q[None], k, params=params)[1][0])
        ts.append(time.perf_counter() - t0)
        if allowed is not None:
            del keep
    ms = np.asarray(ts) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), np.asarray(out)


def service_index(a: argparse.Namespace, spec: IndexSpec) -> tuple[faiss.Index, dict[str, np.ndarray], np.ndarray]:
    """The FAISS index of the service run in ``--work`` (its newest snapshot) and ``truth.npz`` in its internal ids
    (``points.iid`` for each point id ``points.key``), so that candidates compare with the truth as they are, and
    that map (``iid_of[point id]``)."""
    col = a.work / "data" / "collections" / "scale"
    index, _ = read_snapshot(sorted(col.glob("index-*.snap"))[-1], spec)
    if index.n_tombstones:
        raise SystemExit("the snapshot holds tombstones: searches here would not skip them")
    conn = sqlite3.connect(f"file:{col / 'points.sqlite3'}?mode=ro", uri=True)
    pairs = np.asarray(conn.execute("SELECT CAST(key AS INTEGER), iid FROM points").fetchall(), dtype=np.int64)
    iid_of = np.full(pairs[:, 0].max() + 1, -1, np.int64)
    iid_of[pairs[:, 0]] = pairs[:, 1]
    t = np.load(a.work / "truth.npz")
    return index.index, {k: iid_of[t[k]] for k in t.files}, iid_of


def recall(cand: np.ndarray, truth: np.ndarray) -> float:
    """Recall@10 after exact re-scoring of the candidates: the share of each truth row among its candidates."""
    return float(np.mean([len(set(c.tolist()) & set(t.tolist())) / K for c, t in zip(cand, truth)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=10_000_000)
    ap.add_argument("--nlist", type=int, default=16384)
    ap.add_argument("--nprobe", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument(
        "--threads", type=int, default=1, help="OpenMP threads (above 1: one query's lists split over them)"
    )
    ap.add_argument("--nprobe-filtered", type=int, nargs="*", default=[], help="more nprobe values for the filters")
    ap.add_argument("--kind", default="ivf_sq", choices=["ivf_sq", "ivf_pq_fs"], help="the service's index type")
    ap.add_argument("--m", type=int, help="ivf_pq_fs: 4-bit sub-quantizers (default: the type's, dimension / 2)")
    ap.add_argument("--oversampling", type=float, default=2.0)
    ap.add_argument("--candidates", type=int, nargs="*", default=[], help="candidates re-scored (several: a row each)")
    ap.add_argument("--truth", type=int, default=200, help="queries with an exact ground truth (the first ones)")
    ap.add_argument("--timed", type=int, default=100, help="of those, searched one at a time and timed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache-dir", type=Path, default=REPO / "data" / "bench")
    ap.add_argument("--models-dir", type=Path, default=REPO / "models")
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--work", type=Path, required=True, help="where truth.npz is kept (the service run's --work)")
    ap.add_argument(
        "--snapshot",
        action="store_true",
        help="search the service run's own index (its snapshot in --work), not a new one",
    )
    a = ap.parse_args()
    faiss.omp_set_num_threads(a.threads)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} load average before: {os.getloadavg()}  cpu: {cpu_model()}", flush=True
    )
    C, _ = corpus_embeddings(a.cache_dir, None, a.models_dir / a.model)
    X, Q = C[:-1000], C[-1000:][: a.truth]
    kind = get_type(a.kind)
    given = {"nlist": a.nlist, **({"m": a.m} if a.m else {})}
    spec = IndexSpec(a.kind, "cosine", normalize_params(a.kind, given, 384), 384)
    t0 = time.perf_counter()
    if a.snapshot:
        idx, truth, iid_of = service_index(a, spec)
        a.points = len(iid_of)
        print(f"the service's index and its ids read in {time.perf_counter() - t0:.0f} s", flush=True)
    else:
        idx = kind.create_trained(spec, generate(X, 0, spec.params["min_train_points"], a.seed))
        print(f"trained on {spec.params['min_train_points']:,} points in {time.perf_counter() - t0:.0f} s", flush=True)
        t0 = time.perf_counter()
        truth = exact_truth(X, Q, a.points, a.seed, each=lambda ids, V: kind.add(spec, idx, V, ids.astype(np.int64)))
        print(
            f"{a.points:,} points generated, added, their truth found in {time.perf_counter() - t0:.0f} s", flush=True
        )
        a.work.mkdir(parents=True, exist_ok=True)
        if not (a.work / "truth.npz").exists():
            np.savez(a.work / "truth.npz", **truth)
    idx.parallel_mode = 1 if a.threads > 1 else 0  # FAISS's IndexIVF: 1 splits one query's probed lists
    ks = a.candidates or [max(K, math.ceil(a.oversampling * K - 1e-9))]
    qt = Q[: a.timed]
    what = f"{a.kind} nlist {a.nlist}" + (f" m {spec.params['m']}" if "m" in spec.params else "")
    print(f"\n{a.points:,} points, {what}; {a.threads} thread(s)\n")
    print("| search | candidates | recall@10 | p50 ms | p99 ms |\n|---|---:|---:|---:|---:|")
    for nprobe in a.nprobe:
        params = faiss.SearchParametersIVF()
        params.nprobe = nprobe
        for k in ks:
            p50, p99, cand = timed(idx, qt, k, params)
            r = recall(cand, truth["all"][: a.timed])
            print(f"| unfiltered, nprobe {nprobe} | {k} | {r:.4f} | {p50:.1f} | {p99:.1f} |", flush=True)
    k = max(ks)
    ids = np.arange(a.points, dtype=np.int64)
    for name, (_, keep) in FILTERS.items():
        allowed = ids[keep(ids)] if not a.snapshot else np.sort(iid_of[ids[keep(ids)]])
        for nprobe in [a.nlist, *a.nprobe, *a.nprobe_filtered]:
            params = faiss.SearchParametersIVF()
            params.nprobe = nprobe
            p50, p99, cand = timed(idx, qt[:20], k, params, allowed)
            how = "every list" if nprobe == a.nlist else f"nprobe {nprobe}"
            r = recall(cand, truth[name][:20])
            print(f"| {name} filter, {how} | {k} | {r:.4f} | {p50:.1f} | {p99:.1f} |", flush=True)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M:%S')} load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
