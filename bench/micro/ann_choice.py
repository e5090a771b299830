"""Which FAISS index reaches recall@10 >= 0.95 on the hybrid scale bench's 1M dense vectors, and at what cost: FAISS
alone (no service), one query at a time on one OpenMP thread (the service's ``collections_faiss_threads``), against
the exact top 10 by a NumPy product (not in CI; run alone; minutes to tens of minutes per index).

Vectors: the ``random-projection`` document vectors of :mod:`bench.micro.scale_docs` (documents ``0..N-1``, seed 0)
and the first 200 held-out query sentences, generated in seconds. Indexes (``--which``, one per run):

* ``sq8``: ``IndexScalarQuantizer`` ``QT_8bit`` (the ``flat_sq`` codes), 1 and 2 threads, candidates ``1/2/4 x 10``
  re-scored exactly;
* ``hnsw:M:efC``: ``IndexHNSWFlat`` (the ``hnsw`` index), ``efSearch`` 64-1024;
* ``ivf:nlist``: ``IndexIVFScalarQuantizer`` ``QT_8bit`` (the ``ivf_sq`` index), ``nprobe`` 16-256, 40 candidates
  re-scored exactly;
* ``pq:nlist:m``: ``IndexIVFPQ`` 8 bits (the ``ivf_pq`` index), ``nprobe`` 64-512, 40 or 100 candidates re-scored;
* ``fs:nlist:m``: ``IndexIVFPQFastScan`` 4 bits (``m / 2`` bytes a vector, scored by SIMD table lookups; no index
  type of the service before 2026-11-28, then ``ivf_pq_fs``), ``nprobe`` 64-512, 40 / 100 / 200 / 500 / 1,000
  candidates re-scored; ``fsr:nlist:m`` the same with codes of each vector's residual to its list's centroid
  (``by_residual``, FAISS's ``PQ<m>x4fsr``) instead of the vector itself;
* ``sel:nlist``: the service's ``ivf_sq`` (as ``assign`` below builds it) searched as the service searches a
  selective filter: every list probed (``nprobe = nlist``), a random 0.1 / 1 / 10 % of the ids admitted by FAISS's
  ``IDSelectorBatch`` and by the service's selector (``allowed_selector``: a bitmap while small), each timed with
  its construction; 20 candidates re-scored, against the exact top 10 of the admitted vectors (20 queries; the NumPy
  product over the admitted float32 rows, as a flat index scores them in RAM, timed beside; before 2026-11-28 this
  mode trained FAISS's one k-means and timed the hash set only);
* ``train:nlist``: how the ``ivf_sq`` index's lists are trained, on the service's default sample (``64 x nlist``
  capped at 200,000, seeded): FAISS's one k-means (``IndexIVF.train``) against the service's two-level k-means
  (:func:`service.collections.index.coarse.train_coarse`), the same two-level k-means without spherical
  centroids, and with its centroids in an HNSW graph (FAISS's ``IVF<nlist>_HNSW32``: a write's list found in the
  graph instead of by ``nlist`` inner products): training time, the list-imbalance factor after adding every
  vector, recall@10 of 20 candidates re-scored at ``nprobe`` 128-512 (these rows print their own line).
* ``assign:nlist``: the service's ``ivf_sq`` (two-level k-means, as ``train``) filled two ways: each vector's list
  found by the exact quantizer (``nlist`` inner products, what ``add`` does) or by an HNSW graph over the centroids
  (M 32, ``efSearch`` 16 / 64) and added with ``faiss.contrib.ivf_tools.add_preassigned``, searches always through
  the exact quantizer: add time, the share of vectors in their nearest list, recall@10 at ``nprobe`` 128-512.

Prints one line per setting: recall@10 and the p50 of 50 single-query searches (ms; re-scoring not timed).

    python -m bench.micro.ann_choice --which ivf:4096
    python -m bench.micro.ann_choice --which hnsw:32:400 --n 200000
    python -m bench.micro.ann_choice --which train:4096
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import faiss
import numpy as np
from faiss.contrib.clustering import two_level_clustering
from faiss.contrib.ivf_tools import add_preassigned

from bench.micro import scale_docs as docs
from service.collections.index import IndexSpec, normalize_params
from service.collections.index.coarse import add_to_lists, ivf_index, train_coarse
from service.collections.index.vector_index import allowed_selector

K = 10


def vectors(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(X (n, 384), Q (200, 384))``: the documents' and the queries' random-projection unit vectors."""
    lines = docs.corpus_lines()
    dv = docs.DenseVectors("random-projection", lines, 0, Path("/tmp"), Path("unused"))
    X = np.concatenate([dv.chunk(c) for c in range(-(-n // docs.CHUNK))])[:n]
    return np.ascontiguousarray(X), dv.queries(200)[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--which",
        required=True,
        help="sq8 | hnsw:M:efC | ivf:nlist | pq:nlist:m | fs:nlist:m | fsr:nlist:m | sel:nlist | train:nlist | assign:nlist",
    )
    ap.add_argument("--n", type=int, default=1_000_000)
    a = ap.parse_args()
    X, Q = vectors(a.n)
    t = time.time()
    T = np.argsort(-(Q @ X.T), axis=1)[:, :K]
    print(f"n {a.n:,}: exact truth in {time.time() - t:.1f} s", flush=True)

    def recall(I: np.ndarray | list) -> float:
        return float(np.mean([len(set(I[i][:K]) & set(T[i])) / K for i in range(len(Q))]))

    def p50(f, nq: int = 50) -> float:
        ts = []
        for i in range(nq):
            t = time.perf_counter()
            f(Q[i : i + 1])
            ts.append((time.perf_counter() - t) * 1000)
        return float(np.median(ts))

    def rescored(I: np.ndarray) -> list:
        out = []
        for i in range(len(Q)):
            c = I[i][I[i] >= 0]
            out.append(c[np.argsort(-(X[c] @ Q[i]))[:K]])
        return out

    kind, *p = a.which.split(":")
    t = time.time()
    if kind == "sq8":
        idx = faiss.IndexScalarQuantizer(384, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
        idx.train(X[:100_000])
        idx.add(X)
        print(f"build {time.time() - t:.0f} s", flush=True)
        for th in (1, 2):
            faiss.omp_set_num_threads(th)
            for ov in (1, 2, 4):
                _, I = idx.search(Q, K * ov)
                ms = p50(lambda q, k=K * ov: idx.search(q, k))
                print(f"sq8 threads {th} candidates {K * ov}: recall {recall(rescored(I)):.3f}, p50 {ms:.1f} ms")
        return
    if kind == "hnsw":
        M, efc = int(p[0]), int(p[1])
        idx = faiss.IndexHNSWFlat(384, M, faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = efc
        idx.add(X)
        print(f"build {time.time() - t:.0f} s", flush=True)
        faiss.omp_set_num_threads(1)
        for ef in (64, 128, 256, 512, 1024):
            idx.hnsw.efSearch = ef
            _, I = idx.search(Q, K)
            print(f"hnsw M {M} efC {efc} ef {ef}: recall {recall(I):.3f}, p50 {p50(lambda q: idx.search(q, K)):.2f} ms")
        return
    nlist = int(p[0])
    quantizer = faiss.IndexFlatIP(384)
    if kind == "sel":
        selective(X, Q[:20], nlist)
        return
    if kind == "assign":
        assigned(X, Q, nlist, lambda I: recall(rescored(I)))
        return
    if kind == "train":
        for how in ("one k-means", "two-level", "two-level, not spherical", "two-level, HNSW quantizer"):
            training(X, Q, nlist, how, lambda I: recall(rescored(I)))
        return
    if kind == "ivf":
        idx = faiss.IndexIVFScalarQuantizer(
            quantizer, 384, nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
        )
        probes, cands = (16, 32, 64, 128, 256), (4,)
    elif kind in ("fs", "fsr"):
        idx = faiss.IndexIVFPQFastScan(quantizer, 384, nlist, int(p[1]), 4, faiss.METRIC_INNER_PRODUCT)
        idx.by_residual = kind == "fsr"
        probes, cands = (64, 128, 256, 512), (4, 10, 20, 50, 100)
    else:
        idx = faiss.IndexIVFPQ(quantizer, 384, nlist, int(p[1]), 8, faiss.METRIC_INNER_PRODUCT)
        probes, cands = (64, 128, 256, 512), (4, 10)
    idx.train(X[:: max(1, a.n // (40 * nlist))])
    idx.add(X)
    print(f"build (train on ~{40 * nlist:,}, add {a.n:,}) {time.time() - t:.0f} s", flush=True)
    faiss.omp_set_num_threads(1)
    for nprobe in probes:
        idx.nprobe = nprobe
        for c in cands:
            _, I = idx.search(Q, K * c)
            ms = p50(lambda q, k=K * c: idx.search(q, k))
            print(f"{a.which} nprobe {nprobe} candidates {K * c}: recall {recall(rescored(I)):.3f}, p50 {ms:.2f} ms")
    if kind == "pq":  # how balanced the k-means lists are
        sizes = np.array([idx.invlists.list_size(i) for i in range(nlist)])
        print(
            f"list sizes: max {sizes.max()}, mean {sizes.mean():.1f}, imbalance {idx.invlists.imbalance_factor():.2f}"
        )


def _untrained(X: np.ndarray, nlist: int) -> tuple[IndexSpec, faiss.IndexIVF, np.ndarray]:
    """``(spec, empty ivf_sq index as the service makes it, the service's default training sample)``."""
    faiss.omp_set_num_threads(1)
    n = min(64 * nlist, 200_000, len(X))
    sample = np.ascontiguousarray(X[np.sort(np.random.default_rng(0).choice(len(X), n, replace=False))])
    spec = IndexSpec("ivf_sq", "cosine", normalize_params("ivf_sq", {"nlist": nlist, "nprobe": 256}, 384), 384)
    idx = ivf_index(spec, lambda q, m: faiss.IndexIVFScalarQuantizer(q, 384, nlist, faiss.ScalarQuantizer.QT_8bit, m))
    return spec, idx, sample


def _recalls(idx: faiss.IndexIVF, Q: np.ndarray, score) -> str:
    """Recall@10 of 20 candidates re-scored (``score``) at nprobe 128 / 256 / 512."""
    probes = []
    for nprobe in (128, 256, 512):
        sp = faiss.SearchParametersIVF()
        sp.nprobe = nprobe
        probes.append(f"{score(idx.search(Q, 2 * K, params=sp)[1]):.3f}")
    return " / ".join(probes)


def training(X: np.ndarray, Q: np.ndarray, nlist: int, how: str, score) -> None:
    """One ``train`` row (module docstring); ``score(I)``: the recall@10 of the candidates ``I`` re-scored."""
    spec, idx, sample = _untrained(X, nlist)
    t = time.time()
    if how == "two-level":
        assert train_coarse(spec, idx, sample)
    elif how == "two-level, HNSW quantizer":  # FAISS's "IVF<nlist>_HNSW32": each vector's list found in a graph
        assert train_coarse(spec, idx, sample)
        hnsw = faiss.IndexHNSWFlat(384, 32, faiss.METRIC_INNER_PRODUCT)
        hnsw.add(idx.quantizer.reconstruct_n(0, nlist))
        hnsw.this.disown()
        idx = faiss.IndexIVFScalarQuantizer(hnsw, 384, nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
        idx.own_fields = True
    elif how == "two-level, not spherical":
        idx.quantizer.add(two_level_clustering(sample, int(np.sqrt(nlist)), nlist)[0])
    lists = time.time() - t
    idx.train(sample)  # the code ranges (and the lists, for one k-means)
    train = time.time() - t
    t = time.time()
    idx.add(X)
    add = time.time() - t
    r = _recalls(idx, Q, score)
    print(
        f"{how}: {len(sample):,} training vectors, lists {lists if how != 'one k-means' else train:.0f} s, all training "
        f"{train:.0f} s, add {len(X):,} {add:.0f} s, imbalance {idx.invlists.imbalance_factor():.2f}, recall@10 "
        f"(20 re-scored) at nprobe 128 / 256 / 512: {r}",
        flush=True,
    )


def assigned(X: np.ndarray, Q: np.ndarray, nlist: int, score) -> None:
    """The ``assign`` rows (module docstring); ``score(I)``: the recall@10 of the candidates ``I`` re-scored."""
    spec, idx, sample = _untrained(X, nlist)
    assert train_coarse(spec, idx, sample)
    idx.train(sample)
    exact = idx.quantizer.assign(X, 1).ravel()
    blob = faiss.serialize_index(idx)  # trained, empty: each row starts from it
    for ef in (None, 16, 64):
        ivf = faiss.deserialize_index(blob)
        t = time.time()
        if ef is None:
            ivf.add(X)
            lists = exact
        else:
            graph = faiss.IndexHNSWFlat(384, 32, faiss.METRIC_INNER_PRODUCT)
            graph.add(ivf.quantizer.reconstruct_n(0, nlist))
            graph.hnsw.efSearch = ef
            lists = graph.assign(X, 1).ravel()
            add_preassigned(ivf, X, lists)
        secs = time.time() - t
        how = "exact quantizer" if ef is None else f"HNSW graph, efSearch {ef}"
        print(
            f"lists by {how}: add {len(X):,} in {secs:.0f} s, {np.mean(lists == exact):.3f} in their nearest list, "
            f"recall@10 (20 re-scored) at nprobe 128 / 256 / 512: {_recalls(ivf, Q, score)}",
            flush=True,
        )


def selective(X: np.ndarray, Q: np.ndarray, nlist: int) -> None:
    """The ``sel`` rows (module docstring)."""
    t = time.time()
    spec, idx, sample = _untrained(X, nlist)
    assert train_coarse(spec, idx, sample)
    idx.train(sample)
    add_to_lists(idx, X, np.arange(len(X), dtype=np.int64))
    print(f"build {time.time() - t:.0f} s", flush=True)
    rng = np.random.default_rng(0)
    for frac in (0.001, 0.01, 0.1):
        allowed = np.sort(rng.choice(len(X), int(frac * len(X)), replace=False)).astype(np.int64)
        times = {}
        for service in (False, True):
            ts = []
            for i in range(len(Q)):
                t0 = time.perf_counter()
                sel, keep = allowed_selector(allowed) if service else (faiss.IDSelectorBatch(allowed), None)
                params = faiss.SearchParametersIVF()
                params.nprobe, params.sel = nlist, sel
                idx.search(Q[i : i + 1], 2 * K, params=params)
                ts.append(time.perf_counter() - t0)
            name = "the service's selector" if service else "FAISS's hash set"
            times[f"{name} ({type(sel).__name__})"] = np.median(ts) * 1000
            del keep
        truth = allowed[np.argsort(-(Q @ X[allowed].T), axis=1)[:, :K]]
        params = faiss.SearchParametersIVF()
        params.nprobe, params.sel = nlist, faiss.IDSelectorBatch(allowed)
        _, I = idx.search(Q, 2 * K, params=params)
        got = [c[np.argsort(-(X[c[c >= 0]] @ Q[i]))[:K]] for i, c in enumerate(I)]
        rec = np.mean([len(set(g) & set(t)) / K for g, t in zip(got, truth)])
        t0 = time.perf_counter()
        X[allowed] @ Q[0]
        flat = (time.perf_counter() - t0) * 1000
        print(
            f"allowed {frac:.1%}: every list, p50 (selector built and searched) "
            + ", ".join(f"{k} {v:.1f} ms" for k, v in times.items())
            + f"; recall {rec:.3f}; NumPy over the admitted floats {flat:.1f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
