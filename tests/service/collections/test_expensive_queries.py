"""Every expensive query kind, sent at the largest size its limits allow, leaves the service responsive: while it
runs, ``/health`` and a one-sentence embedding answer at a median under 0.3 s (or, on a host slow enough that the
same probes took over 0.1 s just before, under 3x their median then), and none waits for the heavy request (each
within a second, or within half the heavy request's time where that is longer: a frozen service answers a probe
only once the heavy request is done). Beside that: what is over a limit is
refused before any work (a formula's condition checks, a filter's full-text tokens, a distance matrix that cannot fit
the response), one collection's heavy queries leave threads for the others, and work stops once its request is
answered 503 at ``request_timeout_s``.

One real server for the module, a collection of 3,000 points with client vectors (no embedding cost in the setup).
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from harness.hostile_data import DIM, payload, polygon, vector
from tests.server_utils import run_server

pytestmark = pytest.mark.timeout(300)

N = 3000
TIMEOUT_S = 5.0  # the server's request_timeout_s
HEAVY, LIGHT, DOCS = "heavy", "light", "docs"  # DOCS: 1,000 short texts embedded by the model
Q = "/qdrant/collections"
SENTENCE = "A man is playing a guitar."


@pytest.fixture(scope="module")
def server(default_artifact: Path, reranker_artifact: Path, tmp_path_factory):
    work = tmp_path_factory.mktemp("expensive")
    args = ["--default-model", default_artifact.name, "--intra-op-threads", "1", "--log-level", "warning",
            "--rerank-models", reranker_artifact.name, "--request-timeout-s", str(TIMEOUT_S)]  # fmt: skip
    with run_server(default_artifact.parent, workdir=work, args=args) as srv:
        rng = np.random.default_rng(0)
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            for name, n in ((HEAVY, N), (LIGHT, 10)):
                r = c.put(f"{Q}/{name}", json={"vectors": {"size": DIM, "distance": "Cosine"}})
                assert r.status_code == 200, r.text
                for k in range(0, n, 250):  # small writes: each well within request_timeout_s on a busy machine
                    pts = [
                        {"id": i, "vector": vector(rng), "payload": payload(i, rng)} for i in range(k, min(n, k + 250))
                    ]
                    r = c.put(f"{Q}/{name}/points?wait=true", json={"points": pts})
                    assert r.status_code == 200, r.text
            assert c.put(f"/collections/{DOCS}", json={"index": "flat", "metric": "cosine"}).status_code == 200
            texts = [
                {"id": i, "text": f"note {i}: {' '.join(f'w{(i * j) % 97}' for j in range(6))}"} for i in range(1000)
            ]
            for k in range(0, len(texts), 100):  # each embedded within request_timeout_s on a loaded machine
                r = c.put(f"/collections/{DOCS}/points", json={"points": texts[k : k + 100]})
                assert r.status_code == 200, r.text
        yield srv
        assert srv.alive(), srv.log()[-3000:]


@dataclass
class Probes:
    """``/health`` and one-sentence embedding times in seconds, during a heavy request and just before it."""

    health: list[float]
    embed: list[float]
    health_before: list[float]
    embed_before: list[float]


def _probe(probe: httpx.Client, health: list[float], embed: list[float]) -> None:
    t0 = time.perf_counter()
    assert probe.get("/health").status_code == 200
    health.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    r = probe.post("/v1/embeddings", json={"input": SENTENCE})
    embed.append(time.perf_counter() - t0)
    assert r.status_code == 200, r.text


def _beside(url: str, send) -> tuple[httpx.Response, Probes]:
    """Time ``/health`` and a one-sentence embedding five times, then run ``send(client)`` in a thread and time them
    again while it runs (at least once): ``(its response, the probes' times)``."""
    out: dict = {}

    def heavy() -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            out["r"] = send(c)

    t = threading.Thread(target=heavy)
    p = Probes([], [], [], [])
    with httpx.Client(base_url=url, timeout=60) as probe:
        for _ in range(5):
            _probe(probe, p.health_before, p.embed_before)
        t.start()
        time.sleep(0.3)  # the heavy request is being worked on
        while True:
            _probe(probe, p.health, p.embed)
            if not t.is_alive():
                break
            time.sleep(0.05)
    t.join()
    return out["r"], p


def _responsive(r: httpx.Response, p: Probes) -> bool:
    """The module docstring's rule. The median's bound follows the host: in suite runs on a slowed 2-core host (20
    minutes for what took 10-11) the medians beside the heavy request reached 0.38-0.47 s, over two or three probes
    (they passed when run alone); so a median is held to 0.3 s or to 3x the same probes' median
    just before, whichever is larger (a service over three times slower beside the heavy request than without it,
    and over 0.3 s, fails). The slowest probe is not held to one second beside a request that runs for
    seconds: on a 2-core machine shared with another test worker, the embedding's tail beside a 5-second heavy
    request reached 1.03-1.29 s (its median stays in milliseconds); a frozen service would hold a probe for the
    rest of the heavy request."""
    bound = max(1.0, r.elapsed.total_seconds() / 2)
    pairs = ((p.health, p.health_before), (p.embed, p.embed_before))
    return all(statistics.median(x) < max(0.3, 3 * statistics.median(before)) and max(x) < bound for x, before in pairs)


def _largest() -> dict[str, tuple[str, dict, tuple[int, ...]]]:
    """Per kind: ``(path under the collection, body, accepted statuses)``, each the largest the default limits allow
    (1,000 hits, candidates, prefetched points or sampled points; 1,024 filter values or examples; 256 searches)."""
    rng = np.random.default_rng(1)
    q = vector(rng)
    absent = [f"x{i}" for i in range(1000)]
    pair = lambda: {"positive": vector(rng), "negative": vector(rng)}  # noqa: E731
    done = (200, 503)  # 503: stopped at request_timeout_s, which is within the rule too
    return {
        "mmr": (
            "points/query",
            {"query": {"nearest": q, "mmr": {"diversity": 0.5, "candidates_limit": 1000}}, "limit": 1000},
            (200,),
        ),
        "formula": (
            "points/query",
            {
                "prefetch": [{"query": q, "limit": 1000}],
                "limit": 10,
                "query": {
                    "formula": {
                        "sum": [
                            "$score",
                            {"key": "tags", "match": {"any": absent}},
                            {"key": "tags", "match": {"any": absent}},
                        ]
                    }
                },
            },
            (200,),
        ),
        "rich filter": (
            "points/count",
            {
                "exact": True,
                "filter": {
                    "min_should": {
                        "min_count": 1,
                        "conditions": [
                            {"key": "text", "match": {"phrase": " ".join(f"w{i}" for i in range(500))}},
                            {"key": "tags[]", "match": {"any": absent[:500]}},
                        ],
                    }
                },
            },
            done,
        ),
        "geo into arrays": (
            "points/count",
            {"exact": True, "filter": {"must": [{"key": "items[].loc", "geo_polygon": polygon(1000)}]}},
            done,
        ),
        "order_by": ("points/scroll", {"order_by": {"key": "tags[]"}, "limit": 1000, "with_payload": False}, done),
        "matrix": ("points/search/matrix/pairs", {"sample": 1000, "limit": 10}, done),
        "groups": ("points/query/groups", {"query": q, "group_by": "tags", "limit": 100, "group_size": 10}, (200,)),
        "recommend": (
            "points/query",
            {
                "query": {"recommend": {"positive": [vector(rng) for _ in range(1024)], "strategy": "best_score"}},
                "limit": 1000,
            },
            (200,),
        ),
        "discover": (
            "points/query",
            {"query": {"discover": {"target": q, "context": [pair() for _ in range(511)]}}, "limit": 1000},
            (200,),
        ),
        "context": ("points/query", {"query": {"context": [pair() for _ in range(512)]}, "limit": 1000}, (200,)),
        "hybrid (fusion)": (
            "points/query",
            {
                "prefetch": [{"query": vector(rng), "limit": 1000} for _ in range(256)],
                "query": {"fusion": "rrf"},
                "limit": 1000,
            },
            done,
        ),
    }


KINDS = list(_largest())


@pytest.mark.parametrize("kind", KINDS)
def test_the_largest_request_of_each_kind_leaves_the_service_responsive(server, kind):
    path, body, statuses = _largest()[kind]
    r, p = _beside(server.url, lambda c: c.post(f"{Q}/{HEAVY}/{path}", json=body))
    assert r.status_code in statuses, (kind, r.status_code, r.text[:500])
    assert _responsive(r, p), (kind, r.elapsed, p)


def test_a_search_reranking_its_largest_candidates_leaves_the_service_responsive(server):
    """Rerank-in-search at ``collections_max_top_k`` candidates: 1,000 pairs through the reranker's batcher."""
    body = {"query": SENTENCE, "top_k": 10, "rerank": {"candidates": 1000}}
    r, p = _beside(server.url, lambda c: c.post(f"/collections/{DOCS}/search", json=body))
    assert r.status_code in (200, 503), r.text[:500]
    assert _responsive(r, p), (r.elapsed, p)


def test_mmr_candidates_are_bounded(server):
    body = {"query": {"nearest": [1.0] * DIM, "mmr": {"candidates_limit": 1001}}, "limit": 10}
    r = httpx.post(f"{server.url}{Q}/{HEAVY}/points/query", json=body)
    assert r.status_code == 422 and "candidates_limit" in r.text, r.text


def test_a_formula_over_its_work_bound_is_refused_before_any_work(server):
    """Three conditions of 1,000 values on 1,000 prefetched points: 3,000,000 checks, over the 2,000,000 allowed."""
    any_ = {"key": "tags", "match": {"any": [f"x{i}" for i in range(1000)]}}
    body = {"prefetch": [{"query": [1.0] * DIM, "limit": 1000}], "query": {"formula": {"sum": [any_] * 3}}}
    t0 = time.perf_counter()
    r = httpx.post(f"{server.url}{Q}/{HEAVY}/points/query", json=body, timeout=60)
    assert r.status_code == 422 and "collections_max_formula_work" in r.text, r.text
    assert time.perf_counter() - t0 < 1.0


def test_a_full_text_token_is_a_filter_value(server):
    """1,025 tokens are over ``collections_max_filter_values`` (1,024): refused, before any row is read."""
    flt = {"must": [{"key": "text", "match": {"text": " ".join(f"w{i}" for i in range(1025))}}]}
    r = httpx.post(f"{server.url}{Q}/{HEAVY}/points/count", json={"filter": flt, "exact": True}, timeout=60)
    assert r.status_code == 422 and "collections_max_filter_values" in r.text, r.text
    flt["must"][0]["match"]["text"] = " ".join(f"w{i}" for i in range(1000))
    assert httpx.post(f"{server.url}{Q}/{HEAVY}/points/count", json={"filter": flt}).status_code == 200


def test_a_matrix_that_cannot_fit_the_response_is_refused_before_searching(server):
    """1,000 points with 999 neighbours each hold at least 64 MB (64 bytes a hit), over the 32 MiB budget."""
    t0 = time.perf_counter()
    r = httpx.post(
        f"{server.url}{Q}/{HEAVY}/points/search/matrix/pairs", json={"sample": 1000, "limit": 1000}, timeout=60
    )
    assert r.status_code == 413 and "collections_max_response_bytes" in r.text, r.text
    assert time.perf_counter() - t0 < 1.5  # sampled, then refused: none of the 1,000 searches ran


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_heavy_queries_on_one_collection_leave_threads_for_another_and_stop_at_their_deadline(server):
    """Eight counts with a 1,000-point polygon on keys into arrays (20 locations per point, nearly all outside it,
    so each is tested against every edge) on one collection: counts on another collection answer meanwhile, each
    within a second, and once the eight are answered 503 at ``request_timeout_s`` their work stops (the server's CPU
    use falls to idle within a second)."""
    flt = {"must": [{"key": "items[].loc", "geo_polygon": polygon(1000, scale=0.1)}]}

    def heavy(_: int) -> httpx.Response:
        return httpx.post(f"{server.url}{Q}/{HEAVY}/points/count", json={"filter": flt, "exact": True}, timeout=60)

    light_s = []
    with ThreadPoolExecutor(8) as pool, httpx.Client(base_url=server.url, timeout=60) as light:
        futures = [pool.submit(heavy, i) for i in range(8)]
        time.sleep(1.0)  # all eight are running (or waiting for their collection's share of the pool)
        for _ in range(5):
            t0 = time.perf_counter()
            r = light.post(f"{Q}/{LIGHT}/points/count", json={"exact": True})
            light_s.append(time.perf_counter() - t0)
            assert r.status_code == 200 and r.json()["result"]["count"] == 10, r.text
            time.sleep(0.2)
        statuses = [f.result().status_code for f in futures]
    # One thread at a time evaluates Python filter code (the others wait without the GIL), on NumPy for a large
    # polygon: each light count took 8-252 ms (medians 9-82 ms) on 2 cores at load 6-8, other work running; before,
    # 0.27-0.81 s each (medians 0.34-0.60 s), the eight taking turns at the GIL in per-row Python filter code.
    assert statistics.median(light_s) < 0.3 and max(light_s) < 1.0, light_s
    assert statuses == [503] * 8, statuses  # each ran past request_timeout_s
    time.sleep(1.0)  # within a second of the deadline...
    before = _cpu_s(server.proc.pid)
    time.sleep(2.0)
    assert _cpu_s(server.proc.pid) - before < 0.5  # ...nothing is computing any more
