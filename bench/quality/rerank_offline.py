"""Rerankers on BEIR SciFact test, in-process (sentence-transformers' ``CrossEncoder.predict``, on CUDA when present):
each first stage's top-100 (the service's runs, cached by :mod:`bench.quality.rerank_eval` in ``first_stage.json``) reordered
by each trained model's score, nDCG@10 before and after by BEIR's protocol.

This is the quality half of :mod:`bench.quality.rerank_eval` without a service, for model directories that are not artifacts
yet (a GPU run's candidates, say); the served number comes from ``rerank_eval`` once the chosen model is published.
A pair's score depends on that pair only, so each distinct (claim, document) pair is scored once.

    python -m bench.quality.rerank_offline --first-stage /work/runs/rerank_eval/first_stage.json \\
        --model bce=runs/rr-bce/model --model mnrl=runs/rr-mnrl/model --json out.json

Prints the CPU (and GPU) and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.lib.machine import cpu_model, gpu_model, write_json
from bench.lib.scifact import FIRST_STAGES, data_args, load, reranked, score


def score_pairs(model_dir: str, pairs: list[tuple[str, str]], max_length: int, batch_size: int) -> list[float]:
    """Raw scores (logits) of ``pairs`` (query, passage) by the cross-encoder in ``model_dir``."""
    from sentence_transformers import CrossEncoder

    m = CrossEncoder(model_dir, max_length=max_length)
    return [float(x) for x in m.predict(pairs, batch_size=batch_size, activation_fn=None, show_progress_bar=False)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data_args(ap)
    ap.add_argument("--first-stage", required=True, help="first_stage.json of bench/quality/rerank_eval.py")
    ap.add_argument("--model", action="append", required=True, help="NAME=DIR, a cross-encoder directory (repeat)")
    ap.add_argument("--max-length", type=int, default=256, help="tokens of a pair")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--max-queries", type=int, help="only the first N test claims (a smoke run)")
    ap.add_argument("--json", help="write the table here too")
    a = ap.parse_args(argv)
    corpus, queries, qrels = load(Path(a.data))
    if a.max_queries:
        queries = dict(list(queries.items())[: a.max_queries])
        qrels = {q: qrels[q] for q in queries}
    texts = {d["_id"]: f"{d['title']} {d['text']}" for d in corpus}
    runs = {m: {q: r[q] for q in queries} for m, r in json.loads(Path(a.first_stage).read_text()).items()}
    keys = sorted({(q, d) for m in FIRST_STAGES for q in queries for d in runs[m][q]})
    pairs = [(queries[q], texts[d]) for q, d in keys]
    print(f"CPU: {cpu_model()}; GPU: {gpu_model()}; load average before: {os.getloadavg()}", flush=True)
    results = {}
    for spec in a.model:
        name, path = spec.split("=", 1)
        t0 = time.perf_counter()
        raw = score_pairs(path, pairs, a.max_length, a.batch_size)
        scores: dict[str, dict[str, float]] = {}
        for (q, d), s in zip(keys, raw):
            scores.setdefault(q, {})[d] = s
        results[name] = scores
        print(f"{name}: {len(pairs)} pairs scored in {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"load average after: {os.getloadavg()}\n")
    rows = []
    for mode in FIRST_STAGES:
        before = score(runs[mode], qrels)[0]
        row = {"first_stage": mode, "ndcg@10": round(before, 2)}
        for name, scores in results.items():
            row[name] = round(score(reranked(runs[mode], scores), qrels)[0], 2)
        rows.append(row)
    print("| first stage | nDCG@10 | " + " | ".join(f"{n} reranked" for n in results) + " |")
    print("|---|---:|" + "---:|" * len(results))
    for r in rows:
        print(f"| {r['first_stage']} | {r['ndcg@10']:.2f} | " + " | ".join(f"{r[n]:.2f}" for n in results) + " |")
    write_json(a.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
