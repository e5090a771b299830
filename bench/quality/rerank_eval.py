"""Reranking on BEIR SciFact through the service: each first stage's top-100 (dense, BM25, hybrid RRF / RRF k = 60 /
DBSF, as :mod:`bench.quality.beir_eval` defines and runs them) reranked by ``POST /rerank`` with a published reranker
artifact (fp32, and its ``-int8`` twin when published), nDCG@10 by BEIR's protocol before and after, and the rerank
latency of 100 candidates (one client, sequential requests).

A real service (embedded backend, the default encoder for the first stages, the rerankers loaded with
``--rerank-models``) indexes the corpus through the HTTP API (:func:`bench.lib.scifact.index_native`) and searches the
300 test claims in each mode, top 100; each claim's candidates are then scored by ``POST /rerank``
(``raw_scores: true``) and reordered by that score. The best first stage (DBSF) is reranked first, one request of
exactly its 100 candidates per claim (these requests are the latency samples), by every reranker; then a candidate
of another first stage that DBSF's top-100 lacks is scored in one request per claim (not timed): a pair's score does
not depend on the other pairs of its request.

``--weight A`` (repeatable) adds the served fusion with the first stage: each claim's native search ``mode: hybrid,
fusion: dbsf, top_k: 100, rerank: {model, candidates: 100, weight: A}`` (docs/api.md, "Rerank inside a native
search"), one request at a time, its ranking scored and its end-to-end latency (hybrid search + rerank of 100 +
fusion) recorded; choose ``A`` on dev with ``python -m training rerank-eval``, never on test.

Resumable: the first stages' top-100 (``first_stage.json``) and each reranker's scores (``scores-<name>-<version>
.json``, written every 20 claims) are cached in ``--cache-dir`` (outside the repository); a rerun reuses them, so
it does not index again once the first stages are cached and only scores what is missing.

    python -m bench.quality.rerank_eval --reranker scifact-reranker --json /work/runs/rerank_eval/result.json

Run it alone; it prints the CPU and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from artifact_contract import find_artifacts
from artifact_contract.fsio import atomic_write_json
from bench.lib import REPO
from bench.lib.machine import cpu_model, write_json
from bench.lib.scifact import FIRST_STAGES, data_args, index_native, load, reranked, run_native, score
from bench.lib.server import run_server

SAVE_EVERY = 20


def first_stages(c: httpx.Client | None, corpus: list[dict], queries: dict[str, str], cache: Path) -> dict:
    """``{mode: {query id: [doc id, ...top 100]}}``, from ``cache`` when it holds every mode, else searched through
    the service (indexing the corpus first) and cached. ``c`` None: the cache must exist."""
    if cache.is_file():
        runs = json.loads(cache.read_text())
        if set(FIRST_STAGES) <= set(runs):
            return runs
    if c is None:
        raise FileNotFoundError(f"{cache}: no cached first stages")
    secs = index_native(c, corpus)
    print(f"indexed {len(corpus)} documents (dense + bm25) in {secs:.1f} s", flush=True)
    runs = {m: run_native(c, queries, body)[0] for m, body in FIRST_STAGES.items()}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(runs))
    return runs


def artifact_version(models_dir: Path, name: str) -> str | None:
    """The newest version of artifact ``name`` in ``models_dir`` (what ``--rerank-models`` loads), or None."""
    versions = [r.version for r in find_artifacts(str(models_dir)) if r.name == name]
    return versions[-1] if versions else None


def rerank_all(c: httpx.Client, model: str, runs: dict, queries: dict[str, str], texts: dict[str, str],
               cache: Path, others: bool = True) -> tuple[dict[str, dict[str, float]], dict[str, float]]:  # fmt: skip
    """Scores ``{query id: {doc id: raw score}}`` of every first stage's candidates by reranker ``model`` (``others``
    False: DBSF's only), and the latency (ms) of each claim's request of DBSF's 100 candidates; resumed from ``cache``
    and saved there as it goes."""
    state = json.loads(cache.read_text()) if cache.is_file() else {"scores": {}, "latency_ms": {}}
    scores, lat = state["scores"], state["latency_ms"]

    def save() -> None:
        atomic_write_json(cache, state, indent=None)

    def post(qid: str, docs: list[str]) -> float:
        t0 = time.perf_counter()
        r = c.post("/rerank", json={"query": queries[qid], "texts": [texts[d] for d in docs], "raw_scores": True,
                                    "model": model})  # fmt: skip
        ms = 1000 * (time.perf_counter() - t0)
        r.raise_for_status()
        got = scores.setdefault(qid, {})
        for item in r.json():
            got[docs[item["index"]]] = item["score"]
        return ms

    for n, qid in enumerate(queries, 1):  # DBSF's 100 candidates, one timed request per claim
        if qid not in lat:
            lat[qid] = post(qid, runs["hybrid dbsf"][qid])
            if n % SAVE_EVERY == 0:
                save()
                print(f"  {model}: {n}/{len(queries)} claims, p50 {statistics.median(lat.values()):.0f} ms", flush=True)
    save()
    for n, qid in enumerate(queries if others else [], 1):  # what the other first stages add
        missing = sorted({d for m in FIRST_STAGES for d in runs[m][qid]} - set(scores.get(qid, {})))
        if missing:
            post(qid, missing)
            if n % SAVE_EVERY == 0:
                save()
                print(f"  {model}: other first stages, {n}/{len(queries)} claims", flush=True)
    save()
    return scores, lat


def served_fusion(
    c: httpx.Client, model: str, weight: float, queries: dict[str, str], cache: Path
) -> tuple[dict[str, list[str]], dict[str, float]]:
    """``({query id: [doc id, ...top 100]}, {query id: latency ms})`` of the native DBSF search reranked by ``model``
    fused with weight ``weight`` (one request per claim, sequential); resumed from ``cache`` and saved there."""
    state = json.loads(cache.read_text()) if cache.is_file() else {"runs": {}, "latency_ms": {}}
    rerank = {"model": model, "candidates": 100, "weight": weight}
    body = {**FIRST_STAGES["hybrid dbsf"], "top_k": 100, "with_text": False, "rerank": rerank}
    for n, (qid, text) in enumerate(queries.items(), 1):
        if qid in state["runs"]:
            continue
        t0 = time.perf_counter()
        r = c.post("/collections/scifact/search", json={"query": text, **body})
        state["latency_ms"][qid] = 1000 * (time.perf_counter() - t0)
        r.raise_for_status()
        state["runs"][qid] = [h["payload"]["doc"] for h in r.json()]
        if n % SAVE_EVERY == 0 or n == len(queries):
            atomic_write_json(cache, state, indent=None)
            print(f"  {model}, weight {weight}: {n}/{len(queries)} claims", flush=True)
    return state["runs"], state["latency_ms"]


def percentile(values: list[float], p: float) -> float:
    """The ``p`` quantile (nearest rank) of ``values``."""
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data_args(ap)
    ap.add_argument("--reranker", default="scifact-reranker", help="reranker artifact (and NAME-int8 if published)")
    ap.add_argument("--cache-dir", default=str(REPO.parent / "runs" / "rerank_eval"), help="resumable state")
    ap.add_argument("--first-stage-only", action="store_true", help="cache the first stages, rerank nothing")
    ap.add_argument("--max-queries", type=int, help="rerank (and score) only the first N test claims (a smoke run)")
    ap.add_argument("--weight", type=float, action="append", default=[], help="also served DBSF + rerank.weight A")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args(argv)
    models_dir, cache = Path(a.models_dir), Path(a.cache_dir)
    corpus, queries, qrels = load(Path(a.data))
    texts = {d["_id"]: f"{d['title']} {d['text']}" for d in corpus}
    names = [] if a.first_stage_only else [n for n in (a.reranker, f"{a.reranker}-int8")
                                           if artifact_version(models_dir, n)]  # fmt: skip
    if not a.first_stage_only and a.reranker not in names:
        ap.error(f"no artifact {a.reranker!r} in {models_dir}")
    print(f"CPU: {cpu_model()}; load average before: {os.getloadavg()}", flush=True)
    versions = {name: f"{name}:{artifact_version(models_dir, name)}" for name in names}
    weights = [] if a.first_stage_only else a.weight
    results, fusions = {}, {}
    args = ["--log-level", "warning"] + (["--rerank-models", ",".join(names)] if names else [])
    with tempfile.TemporaryDirectory() as tmp, run_server(models_dir, workdir=Path(tmp), args=args) as server:
        with httpx.Client(base_url=server.url, timeout=600) as c:
            runs = first_stages(c, corpus, queries, cache / "first_stage.json")
            if a.max_queries:
                queries = dict(list(queries.items())[: a.max_queries])
                qrels = {q: qrels[q] for q in queries}
                runs = {m: {q: r[q] for q in queries} for m, r in runs.items()}
            for others in (False, True):  # every reranker on DBSF first, then the other first stages
                for name, key in versions.items():
                    print(f"reranking with {key}{', other first stages' if others else ''}", flush=True)
                    path = cache / f"scores-{key.replace(':', '-')}.json"
                    results[key] = rerank_all(c, name, runs, queries, texts, path, others)
            if weights and c.get("/collections/scifact").status_code == 404:  # first stages read from the cache
                print(f"indexed {len(corpus)} documents for the served fusion in {index_native(c, corpus):.1f} s")
            for w in weights:
                for name, key in versions.items():
                    print(f"served search reranked by {key}, weight {w}", flush=True)
                    path = cache / f"search-{key.replace(':', '-')}-w{w}.json"
                    fusions[(key, w)] = served_fusion(c, name, w, queries, path)
    print(f"\nload average after: {os.getloadavg()}\n")
    rows = []
    for mode in FIRST_STAGES:
        ndcg, rec = score(runs[mode], qrels)
        row = {"first_stage": mode, "ndcg@10": round(ndcg, 2), "recall@100": round(rec, 2)}
        for key, (scores, _) in results.items():
            after = score(reranked(runs[mode], scores), qrels)[0]
            row[key] = {"ndcg@10": round(after, 2), "delta": round(after - ndcg, 2)}
        rows.append(row)
    keys = list(results)
    print("| first stage | nDCG@10 | Recall@100 | " + " | ".join(f"{k} nDCG@10 | Δ" for k in keys) + " |")
    print("|---|---:|---:|" + "---:|---:|" * len(keys))
    for r in rows:
        cells = " | ".join(f"{r[k]['ndcg@10']:.2f} | {r[k]['delta']:+.2f}" for k in keys)
        print(f"| {r['first_stage']} | {r['ndcg@10']:.2f} | {r['recall@100']:.2f} | {cells} |")
    for (key, w), (run, lat) in fusions.items():
        ndcg, rec = score(run, qrels)
        ms = [lat[q] for q in queries if q in lat]
        p50, p99 = round(percentile(ms, 0.5), 1), round(percentile(ms, 0.99), 1)
        rows.append({"served_fusion": key, "weight": w, "ndcg@10": round(ndcg, 2), "p50_ms": p50, "p99_ms": p99})
        print(
            f"served DBSF reranked by {key}, weight {w}: nDCG@10 {ndcg:.2f}, Recall@100 {rec:.2f}, p50 {p50} ms, p99 {p99} ms"
        )
    print("\nrerank latency, 100 candidates (DBSF's top-100), one request at a time:")
    for key, (_, lat) in results.items():
        ms = [lat[q] for q in queries if q in lat]
        rows.append({"latency": key, "p50_ms": round(percentile(ms, 0.5), 1), "p99_ms": round(percentile(ms, 0.99), 1),
                     "n": len(ms)})  # fmt: skip
        print(f"  {key}: p50 {rows[-1]['p50_ms']} ms, p99 {rows[-1]['p99_ms']} ms over {len(ms)} claims")
    write_json(a.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
