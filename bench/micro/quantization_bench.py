"""Scalar quantization against float32 (a quick run, about two minutes of CPU): RAM of the index, recall@10 against
exact search and p50 latency of one query, for the service's own index types (``flat``, ``flat_sq``, ``hnsw_sq``;
:class:`service.collections.index.VectorIndex`) and its own rescoring (:func:`service.collections.embedded.search.rerank`)
reading the float32 originals from SQLite BLOBs, as an embedded collection keeps them. A binary row (sign bits,
``IndexBinaryFlat``, Hamming candidates rescored the same way) says whether binary quantization is worth exposing.

Vectors: ``--points`` 384-d unit vectors with the structure of real text, derived as ``bench/micro/scale_bench.py``
derives its 10M points (``a·x_p + (1−a)·x_q + ε`` over real sentence embeddings: the first ``--bases`` lines of
``../shared/data/corpus/en_sentences.txt`` embedded with the default artifact, cached under ``data/bench/``);
queries: the next ``--queries`` corpus sentences' own embeddings (never mixed into the points). One query per call,
one FAISS thread (as the service's workers search); the builds use two.

RAM of the index: FAISS's serialised size (codes, graph, ids; the id map's hash table is not counted). The originals
are on disk (SQLite, the page cache warm after the first queries): a rescored query reads ``ceil(oversampling * 10)``
rows by key.

``--sizing N`` instead measures what each byte on disk is for an embedded collection of ``N`` such points (a corpus
sentence as text, a payload ``{category, year, tag}``, the vector client-supplied), once with an ``hnsw`` index and
once with ``hnsw_sq``: SQLite's pages per table and index (``dbstat``, overflow pages apart), the FAISS snapshot,
the WAL, and a collection snapshot archive (``.snapshot`` tar).

Usage::

    python -m bench.micro.quantization_bench                    # 200k points, 200 queries
    python -m bench.micro.quantization_bench --points 50000     # quicker
    python -m bench.micro.quantization_bench --sizing 20000     # docs/sizing.md
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np

from bench.lib import REPO
from bench.lib.machine import cpu_model
from bench.micro.scale_bench import generate
from service.collections.embedded.search import rerank
from service.collections.index import (
    IndexSpec,
    QuantizationSearch,
    VectorIndex,
    exact_search,
    get_type,
    normalize_params,
)

D, K = 384, 10
#: (kind, params, label) of the quantized indexes measured (an HNSW graph is built once, searched at each ef_search)
HNSW = {"M": 16, "ef_construction": 40}
QUANTIZED = [
    ("flat_sq", {}, "flat_sq int8"),
    ("hnsw_sq", {**HNSW, "ef_search": 64}, "hnsw_sq M16 efC40 efS64"),
    ("hnsw_sq", {**HNSW, "ef_search": 128}, "hnsw_sq M16 efC40 efS128"),
]
#: (label, search params) of each search of a quantized index (None: the defaults, rescore with oversampling 1)
SEARCHES = [
    ("no rescore", QuantizationSearch(rescore=False)),
    ("rescore x1", None),
    ("rescore x2", QuantizationSearch(oversampling=2.0)),
    ("rescore x4", QuantizationSearch(oversampling=4.0)),
]


class Originals:
    """The float32 originals as an embedded collection stores them: one BLOB per row of a SQLite table, read by key."""

    def __init__(self, path: Path, X: np.ndarray) -> None:
        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.conn.execute("CREATE TABLE points (iid INTEGER PRIMARY KEY, vector BLOB NOT NULL)")
        with self.conn:
            self.conn.executemany("INSERT INTO points VALUES (?, ?)", ((i, X[i].tobytes()) for i in range(len(X))))

    def fetch(self, iids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(iids found, their vectors)``."""
        marks = ",".join("?" * len(iids))
        rows = self.conn.execute(f"SELECT iid, vector FROM points WHERE iid IN ({marks})", iids.tolist()).fetchall()
        ids = np.array([r[0] for r in rows], np.int64)
        return ids, np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(len(rows), D)


def sentence_embeddings(n: int, artifact: Path, cache_dir: Path) -> np.ndarray:
    """The first ``n`` corpus sentences (``$SHARED_DATA_DIR/corpus/en_sentences.txt``, default ``../shared/data``)
    embedded with ``artifact``, cached as ``.npy`` in ``cache_dir``."""
    path = cache_dir / f"quant_corpus_{n}_{artifact.name}.npy"
    if path.exists():
        return np.load(path)
    from training.onnx_encoder import OnnxArtifactEncoder

    data = Path(os.environ.get("SHARED_DATA_DIR", REPO.parent / "shared" / "data"))
    lines = [s for s in (data / "corpus" / "en_sentences.txt").read_text(encoding="utf-8").split("\n") if s.strip()]
    X = OnnxArtifactEncoder(artifact, intra_op_threads=2).encode(lines[:n], batch_size=128).astype(np.float32)
    cache_dir.mkdir(parents=True, exist_ok=True)
    np.save(path, X)
    return X


def timed(Q: np.ndarray, one) -> tuple[np.ndarray, np.ndarray]:
    """``(ids (nq, K), latencies s)`` of ``one(q)`` per query."""
    got, lat = np.full((len(Q), K), -1, np.int64), np.empty(len(Q))
    for i in range(len(Q)):
        t0 = time.perf_counter()
        ids = one(Q[i : i + 1])
        lat[i] = time.perf_counter() - t0
        got[i, : len(ids)] = ids[:K]
    return got, lat


def row(label: str, got: np.ndarray, lat: np.ndarray, truth: np.ndarray, ram: int, n: int, build_s: float) -> dict:
    rec = float(np.mean([len(set(t) & set(g)) / K for t, g in zip(truth, got)]))
    out = {"index": label, "n": n, "build_s": round(build_s, 1), "ram_mib": round(ram / 2**20, 1),
           "bytes_per_vector": round(ram / n, 1), "recall@10": round(rec, 3),
           "p50_ms": round(float(np.percentile(lat, 50)) * 1e3, 2)}  # fmt: skip
    print(json.dumps(out), flush=True)
    return out


def build(kind: str, params: dict, X: np.ndarray, sample: np.ndarray | None) -> tuple[VectorIndex, float]:
    spec = IndexSpec(kind, "cosine", normalize_params(kind, params, D), D)
    ids = np.arange(len(X), dtype=np.int64)
    faiss.omp_set_num_threads(2)
    t0 = time.perf_counter()
    sample = sample if get_type(kind).train_sample_size(spec, len(X)) else None  # only the types that train
    vi = VectorIndex.build(spec, ((ids[i : i + 50_000], X[i : i + 50_000]) for i in range(0, len(X), 50_000)), sample)
    faiss.omp_set_num_threads(1)
    return vi, time.perf_counter() - t0


def sizing(n: int, X: np.ndarray, texts: list[str], out_dir: Path) -> list[dict]:
    """What each byte on disk is for an embedded collection of ``n`` points of ``X`` (module docstring)."""
    from service.collections.embedded import Collection
    from service.collections.embedded.archive import write_archive
    from service.collections.embedded.store.files import DB_FILE
    from service.collections.schema import DenseVector, VectorsConfig

    model = {"name": "bench", "version": "1", "sha256": "0" * 64}
    rows = []
    for kind, named in (("hnsw", False), ("hnsw_sq", False), ("hnsw", True)):
        path = out_dir / f"{kind}{'-named' if named else ''}" / "c"
        spec = IndexSpec(kind, "cosine", normalize_params(kind, {"M": 16}, D), D)
        cfg = VectorsConfig({"dense": DenseVector("dense", spec)}, {}) if named else VectorsConfig.single(spec, model)
        c = Collection.create(path, cfg)
        for s in range(0, n, 1000):
            ids = list(range(s, min(n, s + 1000)))
            payloads = [{"category": i % 100, "year": 2000 + i % 25, "tag": f"t{i % 1000}"} for i in ids]
            vecs = X[s : s + len(ids)]
            extra = {"named": [{"dense": v} for v in vecs]} if named else {}
            c.upsert(ids, [texts[i % len(texts)] for i in ids], payloads, None if named else vecs, **extra)
        c.maintain()  # hnsw_sq: trained on a sample, the graph rebuilt over codes
        c.snapshot()
        try:
            archive = write_archive(c, path.parent / "archives")["name"]
        except KeyError as e:  # an archive of a collection without a model-bound vector fails here (reported)
            archive = None
            print(f"no archive: KeyError {e}", flush=True)
        c.close()
        conn = sqlite3.connect(path / DB_FILE)
        stat = conn.execute(
            "SELECT name, pagetype = 'overflow', sum(pgsize), sum(payload) FROM dbstat GROUP BY name, pagetype = 'overflow'"
        ).fetchall()
        conn.close()
        files = {p.name: p.stat().st_size for p in sorted(path.iterdir()) if p.is_file()}
        size = (path.parent / "archives" / archive).stat().st_size if archive else None
        row = {"index": kind, "named": named, "points": n, "files": files, "archive_bytes": size,
               "sqlite": [{"object": a, "overflow": bool(o), "bytes": b, "payload_bytes": p} for a, o, b, p in stat]}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=200_000)
    ap.add_argument("--bases", type=int, default=2000, help="real sentence embeddings the points are derived from")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--cache-dir", type=Path, default=REPO / "data" / "bench")
    ap.add_argument("--artifact", type=Path, default=REPO / "models" / "all-minilm-l6-v2")
    ap.add_argument("--json", default=None)
    ap.add_argument("--sizing", type=int, default=0, help="measure the disk of a collection of this many points")
    ap.add_argument("--hnsw-float", action="store_true", help="also the float32 HNSW graph (what hnsw_sq loses)")
    a = ap.parse_args()
    t_start, cpu0, load = time.time(), time.process_time(), os.getloadavg()
    E = sentence_embeddings(a.bases + a.queries, a.artifact, a.cache_dir)
    cpu_embed = time.process_time() - cpu0
    bases, Q = E[: a.bases], np.ascontiguousarray(E[a.bases :])
    if a.sizing:
        data = Path(os.environ.get("SHARED_DATA_DIR", REPO.parent / "shared" / "data"))
        texts = (data / "corpus" / "en_sentences.txt").read_text(encoding="utf-8").split("\n")[:50_000]
        with tempfile.TemporaryDirectory() as tmp:
            rows = sizing(a.sizing, generate(bases, 0, a.sizing, seed=0), [t for t in texts if t], Path(tmp))
        if a.json:
            Path(a.json).write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1))
        return
    X = generate(bases, 0, a.points, seed=0)
    n = len(X)
    truth = exact_search(Q, X, np.arange(n, dtype=np.int64), K, "cosine")[1]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Originals(Path(tmp) / "points.db", X)
        sample = X[np.random.default_rng(0).choice(n, 20_000, replace=False)]

        flat, secs = build("flat", {}, X, None)
        got, lat = timed(Q, lambda qv, flat=flat: flat.search(qv, K)[1][0])
        rows.append(row("flat float32", got, lat, truth, flat.memory_bytes(), n, secs))
        flat = None

        graph = None
        extra = (
            [("hnsw", {**HNSW, "ef_search": e}, f"hnsw M16 efC40 efS{e}") for e in (64, 128)] if a.hnsw_float else []
        )
        for kind, params, label in QUANTIZED + extra:
            if graph is not None and kind == graph[0].spec.kind:  # the same graph, another ef_search
                spec = IndexSpec(kind, "cosine", normalize_params(kind, params, D), D)
                vi, secs = VectorIndex(spec, graph[0].index), graph[1]
            else:
                vi, secs = build(kind, params, X, sample)
                graph = (vi, secs)
            for what, q in SEARCHES if vi.quantized else [("float32", None)]:

                def one(qv, q=q, vi=vi):
                    m = vi.rescore_candidates(K, q)
                    if m is None:
                        return vi.search(qv, K)[1][0]
                    return rerank(vi, store.fetch, qv, K, None, m, "cosine")[1][0]

                got, lat = timed(Q, one)
                rows.append(row(f"{label}, {what}", got, lat, truth, vi.memory_bytes(), n, secs))
            vi = None
        graph = None

        # binary: one bit per dimension (the sign), Hamming candidates rescored from the originals
        t0 = time.perf_counter()
        bits = faiss.IndexBinaryFlat(D)
        bits.add(np.packbits(X > 0, axis=1))
        secs = time.perf_counter() - t0
        for over in (1, 4, 10):

            def one_bin(qv, over=over):
                _, cand = bits.search(np.packbits(qv > 0, axis=1), K * over)
                ids, vecs = store.fetch(cand[0][cand[0] >= 0])
                return exact_search(qv, vecs, ids, K, "cosine")[1][0]

            got, lat = timed(Q, one_bin)
            rows.append(row(f"binary (sign bits), rescore x{over}", got, lat, truth, n * D // 8, n, secs))
        db_bytes = os.path.getsize(Path(tmp) / "points.db")
    info = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)), "cpu": cpu_model(),
            "load_before": load, "load_after": os.getloadavg(), "cpu_embed_s": round(cpu_embed, 1),
            "cpu_s": round(time.process_time() - cpu0, 1),
            "wall_s": round(time.time() - t_start, 1), "originals_sqlite_mib": round(db_bytes / 2**20, 1)}  # fmt: skip
    print(json.dumps(info))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({**info, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
