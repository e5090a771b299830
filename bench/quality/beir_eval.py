"""Retrieval quality of the service on BEIR SciFact (nDCG@10, Recall@100 by BEIR's protocol) for dense, BM25
(server-side) and hybrid (RRF, DBSF) search, through the native API and through qdrant-client, with the latency of
one query (1 client, sequential requests).

A real service (embedded backend, the default artifact all-MiniLM-L6-v2) indexes the corpus through the HTTP API
(``title + " " + text``, as BEIR does) in one collection with a dense vector bound to the model (exact ``flat``
index) and a ``qdrant/bm25`` sparse vector with ``modifier: idf``; each of the 300 test queries is then searched in
each mode, top 100. Published numbers (the data README): MTEB all-MiniLM-L6-v2 64.51; Lucene BM25 67.91 (bm25s),
Anserini 67.89; RRF (k = 60) of the two top-100 lists by hand 71.32.

    python -m bench.quality.beir_eval --json data/bench/beir_scifact.json

Run it alone (no suite or other benchmark beside it); it prints the CPU and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import httpx

from bench.lib.machine import cpu_model, write_json
from bench.lib.scifact import BATCH, NATIVE_MODES, data_args, index_native, load, run_native, score
from bench.lib.server import run_server

MODEL = "all-minilm-l6-v2"
PUBLISHED = {"dense": "64.51 (MTEB)", "bm25": "67.91 (Lucene, bm25s); Anserini 67.89", "hybrid rrf k=60": "71.32"}


def qdrant_client_runs(url: str, corpus: list[dict], queries: dict[str, str]) -> dict[str, tuple]:
    """The same searches through qdrant-client (REST, ``cloud_inference=True``: ``Document`` objects embedded by
    the server), in a collection created and filled by it."""
    from qdrant_client import QdrantClient, models

    qc = QdrantClient(url=f"{url}/qdrant", cloud_inference=True, timeout=600)
    if qc.collection_exists("scifact_qc"):
        qc.delete_collection("scifact_qc")
    qc.create_collection(
        "scifact_qc",
        vectors_config={"dense": models.VectorParams(size=384, distance=models.Distance.COSINE,
                                                      hnsw_config=models.HnswConfigDiff(m=0))},
        sparse_vectors_config={"bm25": models.SparseVectorParams(modifier=models.Modifier.IDF)},
    )  # fmt: skip
    for i in range(0, len(corpus), BATCH):
        qc.upsert("scifact_qc", [
            models.PointStruct(id=j, payload={"doc": d["_id"]}, vector={
                "dense": models.Document(text=f"{d['title']} {d['text']}", model=MODEL),
                "bm25": models.Document(text=f"{d['title']} {d['text']}", model="qdrant/bm25")})
            for j, d in enumerate(corpus[i : i + BATCH], start=i)])  # fmt: skip

    def dense(t: str) -> dict:
        return {"query": models.Document(text=t, model=MODEL), "using": "dense"}

    def bm25(t: str) -> dict:
        return {"query": models.Document(text=t, model="qdrant/bm25"), "using": "bm25"}

    def fused(query: object) -> object:
        return lambda t: {"prefetch": [models.Prefetch(**dense(t), limit=100), models.Prefetch(**bm25(t), limit=100)],
                          "query": query}  # fmt: skip

    modes = {"dense": dense, "bm25": bm25, "hybrid rrf": fused(models.FusionQuery(fusion=models.Fusion.RRF)),
             "hybrid rrf k=60": fused(models.RrfQuery(rrf=models.Rrf(k=60))),
             "hybrid dbsf": fused(models.FusionQuery(fusion=models.Fusion.DBSF))}  # fmt: skip
    out = {}
    for mode, make in modes.items():
        runs, lat = {}, []
        for qid, text in queries.items():
            t0 = time.perf_counter()
            pts = qc.query_points("scifact_qc", limit=100, with_payload=True, **make(text)).points
            lat.append(1000 * (time.perf_counter() - t0))
            runs[qid] = [p.payload["doc"] for p in pts]
        out[mode] = (runs, lat)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data_args(ap)
    ap.add_argument("--skip-qdrant-client", action="store_true", help="the native API only")
    ap.add_argument("--default-model", help="the artifact of --models-dir that embeds (default: the service's)")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args(argv)
    args = ["--default-model", a.default_model] if a.default_model else []
    corpus, queries, qrels = load(Path(a.data))
    print(f"CPU: {cpu_model()}; load average before: {os.getloadavg()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp, run_server(Path(a.models_dir), workdir=Path(tmp), args=args) as server:
        with httpx.Client(base_url=server.url, timeout=600) as c:
            secs = index_native(c, corpus)
            print(f"indexed {len(corpus)} documents (dense + bm25) in {secs:.1f} s", flush=True)
            results = {("native", m): run_native(c, queries, b) for m, b in NATIVE_MODES.items()}
            if not a.skip_qdrant_client:
                for m, r in qdrant_client_runs(server.url, corpus, queries).items():
                    results[("qdrant-client", m)] = r
    for (api, mode), (runs, lat) in results.items():
        ndcg, rec = score(runs, qrels)
        lat.sort()
        rows.append({"api": api, "mode": mode, "ndcg@10": round(ndcg, 2), "recall@100": round(rec, 2),
                     "p50_ms": round(lat[len(lat) // 2], 1), "p95_ms": round(lat[int(0.95 * len(lat))], 1),
                     "published": PUBLISHED.get(mode, "")})  # fmt: skip
    print(f"\nload average after: {os.getloadavg()}\n")
    print(
        "| API | mode | nDCG@10 | Recall@100 | p50 ms | p95 ms | published nDCG@10 |\n|---|---|---:|---:|---:|---:|---|"
    )
    for r in rows:
        print(f"| {r['api']} | {r['mode']} | {r['ndcg@10']:.2f} | {r['recall@100']:.2f} | {r['p50_ms']} | "
              f"{r['p95_ms']} | {r['published']} |")  # fmt: skip
    write_json(a.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
