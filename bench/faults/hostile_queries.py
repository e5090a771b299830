"""Expensive query kinds at the largest size the default limits allow, each beside a stream of light requests (part
of :mod:`bench.faults.hostile_bench`; run alone on the machine).

One server (the default artifact, the test reranker when present for rerank-in-search), a ``/qdrant`` collection of
``points`` points (32-dimensional client vectors; payloads of 20 tags, 12 words of text, a number and 20 geo
locations in an array) and a native collection of 1,000 short texts embedded by the model. For each kind, its
largest request runs in a thread while ``/health`` and a one-sentence embedding are sent in turn, one at a time;
the table gives the heavy request's status and time and the light requests' p50 / p99 / max (the rule: both under
1 s). Kinds: MMR, formula, rich filters, geo into arrays, order_by, distance matrix, groups, recommend, discover,
context, hybrid (fusion of 256 prefetches, without and with payloads), rerank-in-search.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from harness.hostile_data import DIM, payload, polygon, vector

Q = "/qdrant/collections"
HEAVY, DOCS = "heavy", "docs"
SENTENCE = {"input": "A man is playing a guitar."}


def setup(url: str, points: int, texts: int) -> None:
    """The two collections (module docstring), written in small requests."""
    rng = np.random.default_rng(0)
    with httpx.Client(base_url=url, timeout=300) as c:
        c.put(f"{Q}/{HEAVY}", json={"vectors": {"size": DIM, "distance": "Cosine"}}).raise_for_status()
        for k in range(0, points, 500):
            pts = [{"id": i, "vector": vector(rng), "payload": payload(i, rng)} for i in range(k, min(points, k + 500))]
            c.put(f"{Q}/{HEAVY}/points?wait=true", json={"points": pts}).raise_for_status()
        c.put(f"/collections/{DOCS}", json={"index": "flat", "metric": "cosine"}).raise_for_status()
        docs = [{"id": i, "text": f"note {i}: {' '.join(f'w{(i * j) % 97}' for j in range(6))}"} for i in range(texts)]
        for k in range(0, texts, 250):
            c.put(f"/collections/{DOCS}/points", json={"points": docs[k : k + 250]}).raise_for_status()


def largest() -> dict[str, tuple[str, dict]]:
    """Per kind: ``(path, body)``, each the largest the default limits allow (1,000 hits, candidates, prefetched
    or sampled points; 1,024 filter values or examples; 256 prefetches; 1,000 rerank candidates)."""
    rng = np.random.default_rng(1)
    q = vector(rng)
    absent = [f"x{i}" for i in range(1000)]
    pair = lambda: {"positive": vector(rng), "negative": vector(rng)}  # noqa: E731
    one_of = {"key": "tags", "match": {"any": absent}}
    return {
        "mmr": (f"{Q}/{HEAVY}/points/query",
                {"query": {"nearest": q, "mmr": {"diversity": 0.5, "candidates_limit": 1000}}, "limit": 1000}),
        "formula": (f"{Q}/{HEAVY}/points/query", {"prefetch": [{"query": q, "limit": 1000}], "limit": 10,
                    "query": {"formula": {"sum": ["$score", one_of, one_of]}}}),
        "rich filter": (f"{Q}/{HEAVY}/points/count", {"exact": True, "filter": {"min_should": {"min_count": 1,
                        "conditions": [{"key": "text", "match": {"phrase": " ".join(f"w{i}" for i in range(500))}},
                                       {"key": "tags[]", "match": {"any": absent[:500]}}]}}}),
        "geo into arrays": (f"{Q}/{HEAVY}/points/count",
                            {"exact": True, "filter": {"must": [{"key": "items[].loc", "geo_polygon": polygon(1000)}]}}),
        "order_by": (f"{Q}/{HEAVY}/points/scroll", {"order_by": {"key": "tags[]"}, "limit": 1000, "with_payload": False}),
        "matrix": (f"{Q}/{HEAVY}/points/search/matrix/pairs", {"sample": 1000, "limit": 10}),
        "groups": (f"{Q}/{HEAVY}/points/query/groups", {"query": q, "group_by": "tags", "limit": 100, "group_size": 10}),
        "recommend": (f"{Q}/{HEAVY}/points/query", {"query": {"recommend": {"positive": [vector(rng) for _ in range(1024)],
                      "strategy": "best_score"}}, "limit": 1000}),
        "discover": (f"{Q}/{HEAVY}/points/query",
                     {"query": {"discover": {"target": q, "context": [pair() for _ in range(511)]}}, "limit": 1000}),
        "context": (f"{Q}/{HEAVY}/points/query", {"query": {"context": [pair() for _ in range(512)]}, "limit": 1000}),
        "hybrid (fusion)": (f"{Q}/{HEAVY}/points/query", {"prefetch": [{"query": vector(rng), "limit": 1000}
                            for _ in range(256)], "query": {"fusion": "rrf"}, "limit": 1000}),
        "hybrid (fusion, payloads)": (f"{Q}/{HEAVY}/points/query", {"prefetch": [{"query": vector(rng), "limit": 1000}
                                      for _ in range(256)], "query": {"fusion": "rrf"}, "limit": 1000,
                                      "with_payload": True}),
        "rerank-in-search": (f"/collections/{DOCS}/search",
                             {"query": SENTENCE["input"], "top_k": 10, "rerank": {"candidates": 1000}}),
    }  # fmt: skip


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def beside(url: str, send: Callable[[httpx.Client], httpx.Response]) -> dict:
    """Run ``send`` in a thread; time ``/health`` and a one-sentence embedding in turn until it ends (each at least
    once): ``{status, seconds, health: [s], embed: [s]}``."""
    out: dict = {"health": [], "embed": []}

    def heavy() -> None:
        t0 = time.perf_counter()
        with httpx.Client(base_url=url, timeout=600) as c:
            try:
                out["status"] = send(c).status_code
            except httpx.HTTPError as e:
                out["status"] = type(e).__name__
        out["seconds"] = time.perf_counter() - t0

    t = threading.Thread(target=heavy)
    with httpx.Client(base_url=url, timeout=120) as probe:
        t.start()
        time.sleep(0.2)
        while True:
            for key, call in (("health", lambda: probe.get("/health")),
                              ("embed", lambda: probe.post("/v1/embeddings", json=SENTENCE))):  # fmt: skip
                t0 = time.perf_counter()
                call()
                out[key].append(time.perf_counter() - t0)
            if not t.is_alive():
                break
            time.sleep(0.05)
    t.join()
    return out


def run(url: str, kinds: list[str] | None = None) -> list[dict]:
    """Each kind (all by default) beside the light requests; a row per kind."""
    rows = []
    for kind, (path, body) in largest().items():
        if kinds and kind not in kinds:
            continue
        r = beside(url, lambda c, p=path, b=body: c.post(p, json=b))
        rows.append({"kind": kind, **r})
    return rows


def table(rows: list[dict]) -> str:
    """The markdown table of :func:`run`'s rows (latencies in ms)."""
    lines = ["| kind | heavy request | health p50 / p99 / max | embedding p50 / p99 / max |", "|---|---|---|---|"]
    for r in rows:
        h, e = r["health"], r["embed"]
        lines.append(
            f"| {r['kind']} | {r.get('status')} in {r.get('seconds', float('nan')):.2f} s | "
            f"{statistics.median(h) * 1000:.0f} / {_pct(h, 0.99) * 1000:.0f} / {max(h) * 1000:.0f} | "
            f"{statistics.median(e) * 1000:.0f} / {_pct(e, 0.99) * 1000:.0f} / {max(e) * 1000:.0f} |"
        )
    return "\n".join(lines)


def server_args(models_dir: Path, reranker: str) -> list[str]:
    """The reranker flag when its artifact is in ``models_dir`` (rerank-in-search answers 409 without it)."""
    return ["--rerank-models", reranker] if (models_dir / reranker).is_dir() else []
