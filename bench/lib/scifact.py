"""BEIR SciFact through the service: the data (corpus, test claims, relevance judgements), BEIR's scores, the
collection that indexes it (dense + ``qdrant/bm25``) and the first-stage searches, for the retrieval and reranking
benchmarks."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import httpx

from bench.lib import REPO
from training.retrieval import ndcg_at  # BEIR's nDCG@k, the one definition

#: documents a request when indexing
BATCH = 64
#: the native API's first stages (request bodies of ``POST /collections/scifact/search``)
NATIVE_MODES = {
    "dense": {"mode": "dense"},
    "bm25": {"mode": "sparse"},
    "hybrid rrf": {"mode": "hybrid", "fusion": "rrf"},
    "hybrid rrf k=60": {"mode": "hybrid", "fusion": "rrf", "rrf_k": 60},
    "hybrid dbsf": {"mode": "hybrid", "fusion": "dbsf"},
}
#: the first stages the reranking benchmarks rerank, the best one first (reranked, and timed, first)
FIRST_STAGES = {m: NATIVE_MODES[m] for m in ("hybrid dbsf", "hybrid rrf", "hybrid rrf k=60", "dense", "bm25")}


def load(root: Path) -> tuple[list[dict], dict[str, str], dict[str, dict[str, int]]]:
    """``(corpus rows, test query texts by id, test qrels {query id: {doc id: relevance}})`` of BEIR SciFact."""
    with open(root / "corpus.jsonl", encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    with open(root / "queries.jsonl", encoding="utf-8") as f:
        queries = {q["_id"]: q["text"] for q in map(json.loads, f)}
    qrels: dict[str, dict[str, int]] = {}
    with open(root / "qrels" / "test.tsv", encoding="utf-8") as f:
        next(f)
        for line in f:
            qid, did, rel = line.strip().split("\t")
            qrels.setdefault(qid, {})[did] = int(rel)
    return corpus, {q: queries[q] for q in qrels}, qrels


def recall_at(ranked: list[str], rel: dict[str, int], k: int = 100) -> float:
    """Relevant documents among the top ``k`` over all relevant ones."""
    good = {d for d, g in rel.items() if g > 0}
    return len(good & set(ranked[:k])) / len(good) if good else 0.0


def score(runs: dict[str, list[str]], qrels: dict[str, dict[str, int]]) -> tuple[float, float]:
    """Mean nDCG@10 and Recall@100, x100, over every test query (a query with no hit scores 0)."""
    n = [ndcg_at(runs.get(q, []), r) for q, r in qrels.items()]
    rc = [recall_at(runs.get(q, []), r) for q, r in qrels.items()]
    return 100 * statistics.fmean(n), 100 * statistics.fmean(rc)


def index_native(c: httpx.Client, corpus: list[dict]) -> float:
    body = {"vectors": {"dense": {"model": True, "index": "flat"}},
            "sparse_vectors": {"bm25": {"modifier": "idf", "model": "qdrant/bm25"}}}  # fmt: skip
    c.delete("/collections/scifact")
    r = c.put("/collections/scifact", json=body)
    r.raise_for_status()
    t0 = time.perf_counter()
    for i in range(0, len(corpus), BATCH):
        pts = [{"id": j, "text": f"{d['title']} {d['text']}", "payload": {"doc": d["_id"]}}
               for j, d in enumerate(corpus[i : i + BATCH], start=i)]  # fmt: skip
        c.put("/collections/scifact/points", json={"points": pts}).raise_for_status()
    return time.perf_counter() - t0


def run_native(c: httpx.Client, queries: dict[str, str], body: dict) -> tuple[dict[str, list[str]], list[float]]:
    runs, lat = {}, []
    for qid, text in queries.items():
        t0 = time.perf_counter()
        r = c.post("/collections/scifact/search", json={"query": text, "top_k": 100, "with_text": False, **body})
        lat.append(1000 * (time.perf_counter() - t0))
        r.raise_for_status()
        runs[qid] = [h["payload"]["doc"] for h in r.json()]
    return runs, lat


def reranked(runs: dict[str, list[str]], scores: dict[str, dict[str, float]]) -> dict[str, list[str]]:
    """Each claim's candidates ordered by reranker score, best first (ties: the first stage's order)."""
    return {q: sorted(docs, key=lambda d: -scores[q][d]) for q, docs in runs.items()}


def data_args(ap: argparse.ArgumentParser) -> None:
    """``--data`` (the BEIR SciFact folder under ``$SHARED_DATA_DIR``) and ``--models-dir``, shared with
    the reranking benchmarks."""
    default_data = Path(os.environ.get("SHARED_DATA_DIR", REPO.parent / "shared" / "data")) / "beir" / "scifact"
    ap.add_argument("--data", default=str(default_data), help="the BEIR SciFact folder")
    ap.add_argument("--models-dir", default=str(REPO / "models"))
