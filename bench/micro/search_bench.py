"""Vector search benchmark: flat vs HNSW vs IVF-PQ at top_k 10.

Datasets (384-d, unit-norm float32):

* ``random100k`` / ``random1m``: Gaussian vectors normalised to the unit sphere (the
  hardest case for approximate indexes: no cluster structure).
* ``corpus``: ``../shared/data/corpus/en_sentences.txt`` embedded once with the default
  ONNX artifact and cached as ``.npy`` under ``--cache-dir`` (gitignored ``data/``);
  ``--corpus-limit`` embeds only the first N sentences.

Queries: ``--queries`` fresh random unit vectors (random sets) or held-out corpus
sentences (the last ``--queries`` lines, not indexed). Each query is searched alone
(one query per call, ``faiss.omp_set_num_threads(1)``, as the service's worker threads
do); reported: queries/s (= queries / total time, sequential), p50/p99 latency (ms),
recall@10 against the exact flat index, index bytes per vector (serialised FAISS
index / n; flat and HNSW include the 8-byte id map), build time (s, ``--build-threads``).
The indexes are the service's own :class:`service.collections.index.VectorIndex`.

Usage::

    python -m bench.micro.search_bench --datasets random100k,corpus,random1m --json data/bench/results.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import faiss
import numpy as np

from bench.lib import REPO
from bench.lib.corpus import corpus_embeddings
from service.collections.index import IndexSpec, VectorIndex, exact_search, normalize_params

D = 384
K = 10


def unit_random(n: int, seed: int) -> np.ndarray:
    """``n`` random unit vectors, float32 ``(n, 384)``, generated in chunks."""
    rng = np.random.default_rng(seed)
    out = np.empty((n, D), np.float32)
    for i in range(0, n, 100_000):
        x = rng.standard_normal((min(100_000, n - i), D), dtype=np.float32)
        out[i : i + len(x)] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def configs(n: int) -> list[tuple[str, str, dict, dict]]:
    """(label, kind, index params, search overrides) per row."""
    nlist = 1024  # one setting for every size: training cost stays bounded on 2 cores (k-means on a 40k sample)
    ivf = {"nlist": nlist, "nprobe": 16, "m": 48, "min_train_points": 39 * nlist, "train_sample": min(n, 40 * nlist)}
    return [
        ("flat", "flat", {}, {}),
        ("hnsw M16 efS64", "hnsw", {"M": 16, "ef_construction": 64, "ef_search": 64}, {}),
        ("hnsw M16 efS256", "hnsw", {"M": 16, "ef_construction": 64, "ef_search": 256}, {"reuse": "hnsw M16 efS64"}),
        (f"ivf_pq nlist{nlist} m48 np16", "ivf_pq", {**ivf, "rerank": 1}, {}),
        (
            f"ivf_pq nlist{nlist} m48 np16 rerank4",
            "ivf_pq",
            {**ivf, "rerank": 4},
            {"reuse": f"ivf_pq nlist{nlist} m48 np16"},
        ),
        (
            f"ivf_pq nlist{nlist} m48 np64 rerank4",
            "ivf_pq",
            {**ivf, "nprobe": 64, "rerank": 4},
            {"reuse": f"ivf_pq nlist{nlist} m48 np16"},
        ),
    ]


def run_dataset(name: str, X: np.ndarray, Q: np.ndarray, build_threads: int) -> list[dict]:
    n = len(X)
    ids = np.arange(n, dtype=np.int64)
    rows: list[dict] = []
    built: dict[str, VectorIndex] = {}
    truth = None
    for label, kind, params, extra in configs(n):
        spec = IndexSpec(kind, "cosine", normalize_params(kind, params, D), D)
        faiss.omp_set_num_threads(build_threads)
        if "reuse" in extra:
            vi = built[extra["reuse"]]
            vi = VectorIndex(spec, vi.index)
            build_s = rows[[r["index"] for r in rows].index(extra["reuse"])]["build_s"]
        else:
            t0 = time.perf_counter()
            chunks = ((ids[i : i + 50_000], X[i : i + 50_000]) for i in range(0, n, 50_000))
            sample = None
            if kind == "ivf_pq":
                sample = X[np.random.default_rng(0).choice(n, spec.params["train_sample"], replace=False)]
            vi = VectorIndex.build(spec, chunks, train_sample=sample)
            build_s = time.perf_counter() - t0
        built[label] = vi
        mem = vi.memory_bytes() / n
        faiss.omp_set_num_threads(1)
        rerank = spec.params.get("rerank", 1) if kind == "ivf_pq" else 1
        lat = np.empty(len(Q))
        got = np.empty((len(Q), K), np.int64)
        t_all = time.perf_counter()
        for i in range(len(Q)):
            t0 = time.perf_counter()
            _, I = vi.search(Q[i : i + 1], K * rerank)
            if rerank > 1:  # what the service does with the stored vectors (here: in memory, not SQLite)
                cand = I[0][I[0] >= 0]
                _, top = exact_search(Q[i : i + 1], X[cand], cand, K, "cosine")
                I = top
            lat[i] = time.perf_counter() - t0
            got[i] = I[0][:K]
        total = time.perf_counter() - t_all
        if kind == "flat":
            truth = got.copy()
        recall = float(np.mean([len(set(truth[i]) & set(got[i])) / K for i in range(len(Q))]))
        row = {
            "dataset": name,
            "n": n,
            "index": label,
            "build_s": round(build_s, 1),
            "qps": round(len(Q) / total, 1),
            "p50_ms": round(float(np.percentile(lat, 50)) * 1e3, 2),
            "p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 2),
            "recall@10": round(recall, 3),
            "bytes_per_vector": round(mem, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """A Markdown table of the rows."""
    cols = ["dataset", "n", "index", "build_s", "qps", "p50_ms", "p99_ms", "recall@10", "bytes_per_vector"]
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return head + "".join("| " + " | ".join(str(r[c]) for c in cols) + " |\n" for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="random100k,corpus,random1m")
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--corpus-limit", type=int, default=0, help="embed only the first N corpus sentences (0 = all)")
    p.add_argument("--cache-dir", type=Path, default=REPO / "data" / "bench")
    p.add_argument("--artifact", type=Path, default=REPO / "models" / "all-minilm-l6-v2")
    p.add_argument("--build-threads", type=int, default=2)
    p.add_argument("--embed-only", action="store_true", help="only embed and cache the corpus")
    p.add_argument("--json", type=Path, default=None, help="append result rows (JSON lines) here")
    a = p.parse_args()
    print(
        f"faiss {faiss.__version__}, numpy {np.__version__}, {platform.processor() or platform.machine()}, "
        f"{faiss.omp_get_max_threads()} OpenMP threads available"
    )
    rows: list[dict] = []
    for name in a.datasets.split(","):
        if name == "corpus":
            X, _ = corpus_embeddings(a.cache_dir, a.corpus_limit or None, a.artifact)
            if a.embed_only:
                continue
            X, Q = X[: -a.queries], X[-a.queries :]
        elif name.startswith("random"):
            if a.embed_only:
                continue
            n = {"random100k": 100_000, "random1m": 1_000_000}[name]
            X, Q = unit_random(n, 0), unit_random(a.queries, 1)
        else:
            raise SystemExit(f"unknown dataset {name}")
        out = run_dataset(name, X, Q, a.build_threads)
        rows.extend(out)
        if a.json:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            with open(a.json, "a") as f:
                for r in out:
                    f.write(json.dumps(r) + "\n")
        del X
    if rows:
        print(table(rows))


if __name__ == "__main__":
    main()
