"""The query sets of ``scale_bench --mode hybrid`` (:mod:`bench.micro.scale_hybrid`'s docstring says what each
measures): the Query API bodies, their latencies and hit ids, recall against the exact search, and the payload
indexes of each phase."""

from __future__ import annotations

import argparse
import json
import time

import httpx
import numpy as np
import orjson

from bench.micro import scale_docs as docs
from bench.micro.scale_report import KINDS, PHASES, Results, stats

NAME = "hybrid"
K = 10
BM25 = "qdrant/bm25"


def set_indexes(c: httpx.Client, phase: str, res: Results) -> None:
    """No payload index (``none``) or one per field of ``docs.INDEXES`` (``indexed``); records the build time and
    the ``payload_schema`` the collection then reports."""
    t0 = time.perf_counter()
    for field, schema in docs.INDEXES.items():
        if phase == "none":
            r = c.delete(f"/qdrant/collections/{NAME}/index/{field}?wait=true")
        else:
            r = c.put(f"/qdrant/collections/{NAME}/index?wait=true", json={"field_name": field, "field_schema": schema})
        if r.status_code not in (200, 404):
            raise RuntimeError(f"payload index {field} ({phase}): {r.status_code} {r.text[:300]}")
    secs = round(time.perf_counter() - t0, 2)
    schema = c.get(f"/qdrant/collections/{NAME}").json()["result"].get("payload_schema")
    if f"indexes/{phase}" not in res:
        res.put(f"indexes/{phase}", seconds=secs, payload_schema=schema)


def query_body(
    kind: str, text: str, vec: np.ndarray, flt: dict | None, a: argparse.Namespace, exact: bool, ef: int | None = None
) -> bytes:
    """The Query API body of one query (module docstring), serialised; ``ef``: the dense search's ``hnsw_ef``."""
    dense, doc = vec.tolist(), {"text": text, "model": BM25}
    params = {**json.loads(a.search_params), **({"hnsw_ef": ef} if ef is not None else {})} or None
    if kind == "hybrid":
        pre = [
            {"query": dense, "using": "dense", "limit": a.prefetch, **({"params": params} if params else {})},
            {"query": doc, "using": "bm25", "limit": a.prefetch},
        ]
        body = {"prefetch": [{**p, "filter": flt} if flt else p for p in pre], "query": {"fusion": "rrf"}}
    else:
        body = {"query": dense if kind == "dense" else doc, "using": kind}
        if flt:
            body["filter"] = flt
    if exact:
        body["params"] = {"exact": True}
    elif params and kind == "dense":
        body["params"] = params
    return orjson.dumps({**body, "limit": K, "with_payload": False})


def timed(
    c: httpx.Client, bodies: list[bytes], warmup: int = 3, scores: list | None = None
) -> tuple[np.ndarray, list[list[int]]]:
    """Latencies (ms) and hit ids of ``bodies`` sent one at a time (the first ``warmup`` also sent untimed); each
    answer's hit scores appended to ``scores`` when given."""
    url, hdr = f"/qdrant/collections/{NAME}/points/query", {"content-type": "application/json"}
    for b in bodies[:warmup]:
        c.post(url, content=b, headers=hdr).raise_for_status()
    lat, ids = [], []
    for b in bodies:
        t0 = time.perf_counter()
        r = c.post(url, content=b, headers=hdr)
        lat.append((time.perf_counter() - t0) * 1000)
        if r.status_code != 200:
            raise RuntimeError(f"query: {r.status_code} {r.text[:500]}")
        points = r.json()["result"]["points"]
        ids.append([p["id"] for p in points])
        if scores is not None:
            scores.append([p["score"] for p in points])
    return np.asarray(lat), ids


def measure(c: httpx.Client, texts: list[str], Q: np.ndarray, a: argparse.Namespace, res: Results) -> None:
    """Every measurement not in ``res`` yet: the exact truths, then each phase's latencies and recalls."""
    filters = {"none": None} | {f: v[0] for f, v in docs.FILTERS.items()}
    for f, flt in filters.items():
        if f"truth/{f}" not in res:
            lat, ids = timed(c, [query_body("dense", t, q, flt, a, exact=True) for t, q in zip(texts, Q)])
            res.put(f"truth/{f}", ids=ids, **stats(lat))
            print(f"exact dense, filter {f}: {stats(lat)}", flush=True)
    for phase in PHASES:
        todo = [(k, f) for f in filters for k in KINDS if (f != "none" or phase == "none")]
        if a.skip_unindexed and phase == "none":  # full payload scans: seconds each
            todo = [(k, f) for k, f in todo if f == "none"]
        todo = [(k, f) for k, f in todo if f"lat/{phase}/{k}/{f}" not in res]
        if not todo:
            continue
        set_indexes(c, phase, res)
        for kind, f in todo:
            lat, ids = timed(c, [query_body(kind, t, q, filters[f], a, exact=False) for t, q in zip(texts, Q)])
            rec = stats(lat) | {"hits": round(float(np.mean([len(x) for x in ids])), 2)}
            if f != "none":
                rec["only_matching"] = all(docs.FILTERS[f][2](i) for x in ids for i in x)
            if kind == "dense":
                truth = res.get(f"truth/{f}")["ids"]
                rec["recall_at_10"] = round(
                    float(np.mean([len(set(g) & set(t)) / max(len(t), 1) for g, t in zip(ids, truth)])), 4
                )
            res.put(f"lat/{phase}/{kind}/{f}", **rec)
            print(f"{phase:8} {kind:7} {f:5} {rec}", flush=True)


def measure_ef(c: httpx.Client, texts: list[str], Q: np.ndarray, a: argparse.Namespace, res: Results) -> None:
    """Unfiltered dense (its recall@10 against exact search by ids, and by score: hits scoring at least the exact
    10th score, so ties count) and hybrid queries at each ``--hnsw-ef``: the HNSW graph's search breadth against
    latency (``ef/<ef>/<kind>`` in the results)."""
    if "truth/none" not in res or "truth_kth/none" not in res:  # one exact pass gives both
        got: list = []
        lat, ids = timed(c, [query_body("dense", t, q, None, a, exact=True) for t, q in zip(texts, Q)], scores=got)
        if "truth/none" not in res:
            res.put("truth/none", ids=ids, **stats(lat))
        res.put("truth_kth/none", kth=[x[-1] if len(x) == K else None for x in got])
    truth, kth = res.get("truth/none")["ids"], res.get("truth_kth/none")["kth"]
    for ef in a.hnsw_ef:
        for kind in ("dense", "hybrid"):
            if f"ef/{ef}/{kind}" in res:
                continue
            got = []
            lat, ids = timed(c, [query_body(kind, t, q, None, a, False, ef) for t, q in zip(texts, Q)], scores=got)
            rec = stats(lat)
            if kind == "dense":
                rec["recall_at_10"] = round(float(np.mean([len(set(g) & set(t)) / K for g, t in zip(ids, truth)])), 4)
                by_score = [sum(v >= b - 1e-6 for v in x) / K for x, b in zip(got, kth) if b is not None]
                rec["recall_by_score"] = round(float(np.mean(by_score)), 4)
            res.put(f"ef/{ef}/{kind}", **rec)
            print(f"hnsw_ef {ef:5} {kind:7} {rec}", flush=True)
    head = "| hnsw_ef | dense recall@10 (ids) | (by score) | dense p50 / p95 ms | hybrid p50 / p95 ms |"
    print(f"\n{head}\n|---:|---:|---:|---:|---:|")
    for ef in a.hnsw_ef:
        d, h = res.get(f"ef/{ef}/dense") or {}, res.get(f"ef/{ef}/hybrid") or {}
        cells = [d.get("recall_at_10", "—"), d.get("recall_by_score", "—")]
        cells += [f"{x.get('p50_ms', '—')} / {x.get('p95_ms', '—')}" for x in (d, h)]
        print(f"| {ef} | {' | '.join(map(str, cells))} |")
