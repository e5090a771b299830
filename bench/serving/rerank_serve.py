"""Rerank and hybrid search served, at 1 and 16 clients: the latency a RAG pipeline sees from the service on one
device (made for a lent GPU, docs/gpu.md; it runs on a CPU too, which is how it was checked).

Two kinds of point, each a closed loop for ``--seconds`` after ``--warmup`` seconds of unrecorded traffic, with
``--clients`` threads (each request sent as soon as the previous answer arrived), on BEIR SciFact:

- ``rerank``: ``POST /rerank`` (TEI's route) of one claim and ``--candidates`` abstracts (title + text, truncated
  by the reranker's tokenizer at its ``max_seq_length``: ``--pair-tokens`` sets it on a copy of the artifact, so
  that each (claim, abstract) pair is that many tokens); reported: p50/p99 request latency, requests/s, pairs/s,
  and the mean tokens per pair (the reranker's tokenizer, special tokens included, after truncation).
- ``hybrid``: ``POST /collections/scifact/search`` with ``mode: hybrid`` (the claim searched by the model-bound dense
  vector and by the ``qdrant/bm25`` sparse vector, ``--hybrid-candidates`` hits each, fused by DBSF), then the best
  ``--rerank-top`` reranked by the same reranker, ``top_k`` 10: the whole path over HTTP (embedding the query,
  both searches, fusion, reading the texts, reranking). The collection is the SciFact corpus (5,183 abstracts)
  indexed through the API first (its time is printed).

Usage (on the device, after ``bench/device/kit.sh install``; the reranker artifact in the kit)::

    python -m bench.serving.rerank_serve --encoder all-minilm-l6-v2-fp16 --reranker scifact-reranker-tiny \\
        --providers cuda --json $OUT/rerank_serve.json
    python -m bench.serving.rerank_serve ... --reranker-dtype fp16   # the reranker's fp16 twin (GPU only)
    python -m bench.serving.rerank_serve --encoder all-minilm-l6-v2 --providers cpu --seconds 3 --warmup 1   # a CPU

Not a test: it asserts nothing, it prints a table (and ``--json`` writes the numbers).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.lib.machine import cpu_model
from bench.lib.scifact import data_args, index_native, load
from bench.lib.server import run_server
from bench.serving.gpu_serve import scrape


def closed_loop(url: str, make, clients: int, seconds: float) -> dict:
    """``clients`` threads sending ``make(i)`` (a ``(path, body)``) back to back for ``seconds``: latencies of the
    answers that arrived in time, errors."""
    lat: list[float] = []
    errors: list[str] = []
    answered = [0]  # every answer, those after the end included (their work is in the service's metrics)
    lock = threading.Lock()
    stop = time.time() + seconds

    def loop(j: int) -> None:
        i = j * 131
        with httpx.Client(base_url=url, timeout=120) as c:
            while (t0 := time.time()) < stop:
                path, body = make(i)
                r = c.post(path, json=body)
                t1 = time.time()
                with lock:
                    answered[0] += 1
                    if r.status_code != 200:
                        errors.append(f"{r.status_code} {r.text[:160]}")
                    elif t1 <= stop:
                        lat.append(t1 - t0)
                i += 7919

    ts = [threading.Thread(target=loop, args=(j,)) for j in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    ms = np.array(lat) * 1000 if lat else np.array([float("nan")])
    return {"clients": clients, "requests": len(lat), "answered": answered[0], "req_per_s": len(lat) / seconds,
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "errors": len(errors), "first_error": errors[0] if errors else None}  # fmt: skip


def per_request(before: dict[str, float], after: dict[str, float], requests: int) -> dict[str, float]:
    """The core's tokenizer and ONNX Runtime milliseconds and inference batches per request between two
    :func:`bench.serving.gpu_serve.scrape` results (every model's batchers: the encoder's too, for hybrid searches).
    Tokenizer time is summed over a request's chunks, which run on several threads at once: CPU-like, not wall."""
    n = max(requests, 1)
    return {
        "tok_ms": 1000 * (after["tok_s"] - before["tok_s"]) / n,
        "ort_ms": 1000 * (after["ort_s"] - before["ort_s"]) / n,
        "batches": (after["batches"] - before["batches"]) / n,
    }


def reranker_copy(models_dir: Path, name: str, pair_tokens: int, dest: Path, dtype: str = "fp32") -> str:
    """A copy of the reranker artifact ``name`` under ``dest`` whose manifest truncates pairs at ``pair_tokens`` (0:
    the artifact's own; the graph's sequence axis is dynamic, the weights are the same), or with ``dtype="fp16"``
    its fp16 twin (``python -m training export-reranker --dtype fp16``'s conversion, made here): its name."""
    out = dest / f"{name}-{pair_tokens or 'own'}{'-fp16' if dtype == 'fp16' else ''}"
    if dtype == "fp16":
        from training.export.reranker_twins import fp16_reranker

        fp16_reranker(models_dir / name, out, name=out.name)
    else:
        shutil.copytree(models_dir / name, out, dirs_exist_ok=True)
    m = json.loads((out / "manifest.json").read_text())
    m["max_seq_length"], m["name"] = pair_tokens or m["max_seq_length"], out.name
    (out / "manifest.json").write_text(json.dumps(m, indent=1))
    return out.name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data_args(ap)
    ap.add_argument("--encoder", default="all-minilm-l6-v2-fp16")
    ap.add_argument("--reranker", default="scifact-reranker-tiny")
    ap.add_argument("--providers", default="auto")
    ap.add_argument("--server-arg", action="append", default=[], help="an extra service flag (repeatable)")
    ap.add_argument("--clients", default="1,16")
    ap.add_argument("--candidates", type=int, default=100, help="abstracts per /rerank request")
    ap.add_argument("--pair-tokens", type=int, default=256, help="the reranker's max_seq_length (0: the artifact's)")
    ap.add_argument(
        "--reranker-dtype",
        choices=["fp32", "fp16"],
        default="fp32",
        help="fp16: serve the reranker's fp16 twin, converted here first (GPU serving only)",
    )
    ap.add_argument("--hybrid-candidates", type=int, default=100, help="hits of each hybrid leg")
    ap.add_argument("--rerank-top", type=int, default=50, help="fused hits reranked")
    ap.add_argument("--seconds", type=float, default=10.0, help="per point")
    ap.add_argument("--warmup", type=float, default=3.0, help="unrecorded seconds per kind, at the most clients")
    ap.add_argument("--skip-hybrid", action="store_true")
    ap.add_argument("--max-docs", type=int, default=0, help="index only the first N abstracts (0: all; smoke runs)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)

    from tokenizers import Tokenizer

    corpus, queries, _ = load(Path(a.data))
    corpus = corpus[: a.max_docs or None]
    claims = list(queries.values())
    texts = [f"{d['title']} {d['text']}" for d in corpus]
    load0 = os.getloadavg()[0]
    gpu = "none"
    if shutil.which("nvidia-smi"):
        q = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
        gpu = subprocess.run(q, capture_output=True, text=True).stdout.strip()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; GPU: {gpu}; load average {load0:.2f}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="rerank-serve-"))
    models = work / "models"
    models.mkdir()
    for n in {a.encoder, a.reranker}:
        (models / n).symlink_to(Path(a.models_dir).resolve() / n)
    if a.pair_tokens or a.reranker_dtype == "fp16":
        rr = reranker_copy(Path(a.models_dir), a.reranker, a.pair_tokens, models, a.reranker_dtype)
    else:
        rr = a.reranker
    tok = Tokenizer.from_file(str(models / rr / "tokenizer.json"))
    max_len = int(json.loads((models / rr / "manifest.json").read_text())["max_seq_length"])
    tok.enable_truncation(max_len)
    rng = np.random.default_rng(0)
    reqs = [(claims[i % len(claims)], [texts[j] for j in rng.choice(len(texts), a.candidates, replace=False)])
            for i in range(64)]  # fmt: skip
    pair_toks = [len(e.ids) for q, docs in reqs[:8] for e in tok.encode_batch([(q, d) for d in docs])]
    results: dict = {"args": vars(a), "gpu": gpu, "cpu": cpu_model(), "reranker_max_seq_length": max_len,
                     "mean_pair_tokens": float(np.mean(pair_toks)), "points": []}  # fmt: skip
    args = ["--default-model", a.encoder, "--rerank-models", rr, "--providers", a.providers, "--log-level", "warning",
            *a.server_arg]  # fmt: skip
    kinds = {"rerank": lambda i: ("/rerank", {"query": reqs[i % 64][0], "texts": reqs[i % 64][1], "raw_scores": True})}
    if not a.skip_hybrid:
        body = {"mode": "hybrid", "fusion": "dbsf", "candidates": a.hybrid_candidates, "top_k": 10, "with_text": False,
                "rerank": {"model": rr, "candidates": a.rerank_top}}  # fmt: skip
        kinds["hybrid"] = lambda i: ("/collections/scifact/search", {"query": claims[i % len(claims)], **body})
    most = max(map(int, a.clients.split(",")))
    with run_server(models, workdir=work, args=args) as srv, httpx.Client(base_url=srv.url, timeout=600) as c:
        info = c.get("/info").json()
        print("service /info:", json.dumps({k: info.get(k) for k in ("model_id", "providers")}), flush=True)
        if not a.skip_hybrid:
            secs = index_native(c, corpus)
            results["index_s"] = secs
            print(f"indexed {len(corpus)} abstracts (dense + bm25) in {secs:.1f} s", flush=True)
        for kind, make in kinds.items():
            if a.warmup > 0:
                closed_loop(srv.url, make, most, a.warmup)
            for n in map(int, a.clients.split(",")):
                m0 = scrape([srv.url])
                r = {"kind": kind, **closed_loop(srv.url, make, n, a.seconds)}
                r.update(per_request(m0, scrape([srv.url]), r["answered"]))
                r["pairs_per_s"] = r["req_per_s"] * (a.candidates if kind == "rerank" else a.rerank_top)
                results["points"].append(r)
                print(f"  {kind} x{n}: p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, {r['req_per_s']:.1f} req/s, "
                      f"{r['pairs_per_s']:.0f} pairs/s, errors {r['errors']} {r['first_error'] or ''}", flush=True)  # fmt: skip
                if a.json:  # after every point: a run stopped at its limit keeps what it measured
                    Path(a.json).write_text(json.dumps(results, indent=1))
    results["load_after"] = os.getloadavg()[0]
    print(f"\nencoder {a.encoder}, reranker {rr} (pairs truncated at {max_len} tokens, mean "
          f"{results['mean_pair_tokens']:.0f}), providers {a.providers}, {a.seconds:.0f} s per point")  # fmt: skip
    print("| kind | clients | p50 ms | p99 ms | requests/s | pairs/s | errors | tokenizer ms / request | ORT ms / request "
          "| batches / request |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results["points"]:
        print(f"| {r['kind']} | {r['clients']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['req_per_s']:.1f} "
              f"| {r['pairs_per_s']:,.0f} | {r['errors']} | {r['tok_ms']:.1f} | {r['ort_ms']:.1f} "
              f"| {r['batches']:.2f} |")  # fmt: skip
    print(f"\nload average before {load0:.2f}, after {results['load_after']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
