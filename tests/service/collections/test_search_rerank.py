"""``rerank`` in the native search (``POST /collections/{name}/search``, ``/search/batch``) on the real service with
the session's tiny reranker: dense, sparse and hybrid candidates reranked in one request in the order of
``POST /rerank``'s scores for the same candidates, each hit's score the reranker's raw score; points without text
left out; bad inputs answer 4xx JSON."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.server_utils import run_server
from training.data.scifact import load_scifact

pytestmark = pytest.mark.timeout(300)
ADMIN_KEY = "search-rerank-admin-key"
RERANKER = "scifact-reranker-tiny"


@pytest.fixture(scope="module")
def client(default_artifact: Path, reranker_artifact: Path, tmp_path_factory):
    args = ["--default-model", default_artifact.name, "--rerank-models", reranker_artifact.name,
            "--intra-op-threads", "1", "--admin-api-keys", ADMIN_KEY, "--log-level", "warning"]  # fmt: skip
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("search-rerank"), args=args) as srv:
        with httpx.Client(base_url=srv.url, timeout=120.0) as c:
            yield c
        assert srv.alive(), srv.log()[-3000:]


def _collection(c: httpx.Client) -> str:
    """``scifact``: 20 SciFact abstracts (dense + BM25 from the text) and point 999, a copy of point 0's dense vector
    without text."""
    data = load_scifact(max_queries=2, max_corpus=20, seed=3)
    body = {
        "vectors": {"dense": {"model": True}},
        "sparse_vectors": {"bm25": {"modifier": "idf", "model": "qdrant/bm25"}},
    }
    assert c.put("/collections/scifact", json=body).status_code == 200
    pts = [{"id": i, "text": t, "payload": {"doc": d}} for i, (d, t) in enumerate(data.corpus.items())]
    assert c.put("/collections/scifact/points", json={"points": pts}).status_code == 200
    vec = c.get("/collections/scifact/points/0", params={"with_vector": True}).json()["vector"]
    r = c.put("/collections/scifact/points", json={"points": [{"id": 999, "vector": vec}]})
    assert r.status_code == 200, r.text
    return data.queries[sorted(data.qrels)[0]]


def _expected(c: httpx.Client, query: str, first: dict, top_n: int) -> list[tuple[int, float]]:
    """The first stage's candidates with text, ordered by ``/rerank``'s raw scores: ``[(id, score)]``."""
    hits = [h for h in c.post("/collections/scifact/search", json=first).json() if h["text"]]
    r = c.post("/rerank", json={"query": query, "texts": [h["text"] for h in hits], "raw_scores": True})
    assert r.status_code == 200, r.text
    return [(hits[x["index"]]["id"], x["score"]) for x in r.json()][:top_n]


def _same_order(got: list[dict], want: list[tuple[int, float]]) -> None:
    assert len(got) == len(want)
    for h, (i, s) in zip(got, want):
        assert abs(h["score"] - s) <= 1e-4, (got, want)  # other batches, other padding: the export tolerance
        if h["id"] != i:  # only a tie (within the tolerance) may swap two hits
            assert abs(dict(want).get(h["id"], float("inf")) - s) <= 2e-4, (got, want)
    assert [h["score"] for h in got] == sorted((h["score"] for h in got), reverse=True)


def test_search_reranks_its_candidates(client):
    c = client
    query = _collection(c)
    for mode in ("dense", "sparse", "hybrid"):
        first = {"query": query, "mode": mode, "top_k": 12, "with_text": True}
        r = c.post("/collections/scifact/search", json={**first, "top_k": 5, "rerank": {"candidates": 12}})
        assert r.status_code == 200, r.text
        got = r.json()
        assert {"id", "score", "text", "payload"} <= set(got[0])
        _same_order(got, _expected(c, query, first, 5))
        assert all(h["id"] != 999 for h in got)  # no text: not scored, left out
    # the dense first stage finds the text-less copy of point 0, the reranked answer leaves it out
    plain = c.post("/collections/scifact/search", json={"query": query, "top_k": 21, "with_text": False}).json()
    assert 999 in {h["id"] for h in plain}
    r = c.post("/collections/scifact/search",
               json={"query": query, "top_k": 30, "with_text": False, "with_payload": False,
                     "rerank": {"model": RERANKER, "candidates": 21, "top_n": 30}})  # fmt: skip
    assert r.status_code == 200, r.text
    assert len(r.json()) == 20 and set(r.json()[0]) == {"id", "score"}
    # a batch: each search reranked (or not) as it asks
    first = {"query": query, "mode": "sparse", "top_k": 8, "with_text": True}
    r = c.post("/collections/scifact/search/batch",
               json={"searches": [{**first, "top_k": 3, "rerank": {"candidates": 8}}, first]})  # fmt: skip
    assert r.status_code == 200, r.text
    _same_order(r.json()[0], _expected(c, query, first, 3))
    assert r.json()[1] == c.post("/collections/scifact/search", json=first).json()


def _min_max(xs: list[float]) -> list[float]:
    lo, hi = min(xs), max(xs)
    return [(x - lo) / (hi - lo) for x in xs]


def test_search_rerank_weight_fuses_the_two_stages(client):
    """``rerank.weight`` alpha: 1 answers today's reranked hits, 0 the first stage's order, 0.3 the convex combination
    of the min-max normalised reranker and first-stage scores, computed here from the two score lists."""
    c = client
    if c.get("/collections/scifact").status_code == 404:
        _collection(c)
    data = load_scifact(max_queries=2, max_corpus=20, seed=3)
    query, changed = data.queries[sorted(data.qrels)[0]], []
    for mode in ("dense", "hybrid"):
        first_body = {"query": query, "mode": mode, "top_k": 12, "with_text": True}
        first = [h for h in c.post("/collections/scifact/search", json=first_body).json() if h["text"]]
        r = c.post("/rerank", json={"query": query, "texts": [h["text"] for h in first], "raw_scores": True})
        raw = [x["score"] for x in sorted(r.json(), key=lambda x: x["index"])]

        def search(first_body: dict = first_body, **rerank) -> list[dict]:
            body = {**first_body, "rerank": {"candidates": 12, "top_n": 12, **rerank}}
            r = c.post("/collections/scifact/search", json=body)
            assert r.status_code == 200, r.text
            return r.json()

        today = search()
        assert [h["id"] for h in search(weight=1.0)] == [h["id"] for h in today]
        assert [h["score"] for h in search(weight=1)] == [h["score"] for h in today]
        assert [h["id"] for h in search(weight=0.0)] == [h["id"] for h in first]  # the first stage's order
        alpha = 0.3
        want = {h["id"]: alpha * a + (1 - alpha) * b for h, a, b in zip(first, _min_max(raw), _min_max(
            [h["score"] for h in first]))}  # fmt: skip
        got = search(weight=alpha)
        assert sorted(h["id"] for h in got) == sorted(want)
        for h in got:  # the reranker's batches differ (padding): its raw scores agree within 1e-4
            assert abs(h["score"] - want[h["id"]]) <= 1e-3, (got, want)
        assert [h["score"] for h in got] == sorted((h["score"] for h in got), reverse=True)
        ordered = sorted(want, key=lambda i: -want[i])
        assert [want[h["id"]] for h in got] == pytest.approx([want[i] for i in ordered], abs=2e-3)
        changed.append([h["id"] for h in got] != [h["id"] for h in today])
    assert any(changed)  # the fusion changed an answer
    for bad in (-0.1, 1.5, True, "1"):
        r = c.post("/collections/scifact/search", json={"query": "x", "rerank": {"weight": bad}})
        assert r.status_code == 422 and r.json()["error"]["param"].startswith("rerank.weight"), r.text


def test_search_rerank_bad_inputs(client):
    c = client
    if c.get("/collections/scifact").status_code == 404:
        _collection(c)

    def err(body: dict, path: str = "/collections/scifact/search") -> dict:
        r = c.post(path, json=body)
        assert 400 <= r.status_code < 500 and r.headers["content-type"].startswith("application/json"), r.text
        return {"status": r.status_code, **r.json()["error"]}

    e = err({"query": [0.1] * 384, "rerank": {}})
    assert (e["status"], e["code"], e["param"]) == (422, "invalid_value", "query")
    e = err({"searches": [{"query": "x"}, {"query": [0.1] * 384, "rerank": {}}]}, "/collections/scifact/search/batch")
    assert (e["status"], e["param"]) == (422, "searches[1].query")
    e = err({"query": "x", "rerank": {"model": "nope"}})
    assert (e["status"], e["code"], e["param"]) == (404, "model_not_found", "rerank.model")
    e = err({"query": "x", "rerank": {"model": "all-minilm-l6-v2"}})
    assert (e["status"], e["code"], e["param"]) == (422, "not_a_reranker", "rerank.model")
    e = err({"query": "x", "rerank": {"candidates": 100000}})
    assert (e["status"], e["param"]) == (422, "rerank.candidates")
    bads = ({"candidates": 0}, {"top_n": 0}, {"candidates": "5"}, {"extra": 1}, {"model": 3}, {"weight": "0.5"})
    for bad in bads:
        assert err({"query": "x", "rerank": bad})["status"] == 422
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert c.post(f"/admin/models/{RERANKER}/unload", headers=auth).status_code == 200
    try:
        e = err({"query": "x", "rerank": {}})
        assert (e["status"], e["code"]) == (409, "model_unavailable") and "no reranker is loaded" in e["message"]
        assert c.post("/collections/scifact/search", json={"query": "x"}).status_code == 200  # no rerank: unaffected
    finally:
        assert c.post(f"/admin/models/{RERANKER}/load", headers=auth).status_code == 200
