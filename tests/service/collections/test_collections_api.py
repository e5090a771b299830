"""Collections through the real service on real data (STS-B test sentences): quality, CRUD, filters, errors, restart.

Every test runs against every collections backend: ``embedded`` (SQLite + FAISS) and ``milvus`` (a real Milvus
standalone server). Stored vectors are read from each backend's own truth (the SQLite file, or Milvus directly).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import numpy as np
import pytest

from harness.milvus import milvus_client
from tests.server_utils import collections_server, run_server
from training.data.sts import load_task

TOP_K = 10


@pytest.fixture(scope="module")
def stsb():
    p = load_task("STSBenchmark")
    sentences = list(dict.fromkeys(p.sent1 + p.sent2))
    return p, sentences, {s: i for i, s in enumerate(sentences)}


@pytest.fixture(scope="module", params=["embedded", "milvus"])
def env(request, default_artifact: Path, tmp_path_factory):
    """A running service on a fixed port and data dir (restartable) with one collections backend, plus its state."""
    yield from collections_server(request, default_artifact, tmp_path_factory)


def stored_vectors(env, name: str) -> dict:
    """``{int id: stored vector}`` read from the backend's own storage."""
    if env["backend"] == "embedded":
        path = env["work"] / "data" / "collections" / name / "points.sqlite3"
        with sqlite3.connect(path) as conn:
            rows = conn.execute("SELECT key, vector FROM points").fetchall()
        return {int(k): np.frombuffer(v, dtype=np.float32) for k, v in rows}
    m = milvus_client(env["uri"])
    alias = env["prefix"] + name.replace("_", "_u").replace("-", "_d")
    rows = m.query(alias, filter='key != ""', output_fields=["key", "vector"], limit=16384)
    m.close()
    return {int(r["key"]): np.asarray(r["vector"], dtype=np.float32) for r in rows}


def milvus_collections(env) -> list[str]:
    m = milvus_client(env["uri"])
    names = [n for n in m.list_collections() if n.startswith(env["prefix"])]
    m.close()
    return names


def upsert_texts(c: httpx.Client, name: str, texts: list[str], batch: int = 256, start: int = 0) -> None:
    """Upsert ``texts[start:]`` with ids = their index in ``texts``."""
    for i in range(start, len(texts), batch):
        pts = [
            {"id": j, "text": texts[j], "payload": {"row": j, "parity": "even" if j % 2 == 0 else "odd"}}
            for j in range(i, min(i + batch, len(texts)))
        ]
        r = c.put(f"/collections/{name}/points", json={"points": pts})
        assert r.status_code == 200, r.text


def upsert_with_vectors(c: httpx.Client, name: str, texts: list[str], vecs: dict, stop: int, start: int = 0) -> None:
    """Upsert ``texts[start:stop]`` (ids = their index) with the vectors another collection of the same model
    stored for them: the index under test gets the same points without embedding them again."""
    for i in range(start, stop, 128):  # 128 vectors as JSON: ~1 MB, under max_payload_bytes
        pts = [{"id": j, "text": texts[j], "vector": vecs[j].tolist(), "payload": {"row": j}}
               for j in range(i, min(i + 128, stop))]  # fmt: skip
        r = c.put(f"/collections/{name}/points", json={"points": pts})
        assert r.status_code == 200, r.text


def search_batch(c: httpx.Client, name: str, queries: list, k: int = TOP_K, **kw) -> list[list[dict]]:
    out = []
    for i in range(0, len(queries), 200):
        r = c.post(
            f"/collections/{name}/search/batch",
            json={"searches": [{"query": q, "top_k": k, **kw} for q in queries[i : i + 200]]},
        )
        assert r.status_code == 200, r.text
        out.extend(r.json())
    return out


def err(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    if code:
        assert e["code"] == code, e
    return e


def test_flat_matches_brute_force_numpy(env, stsb):
    c = env["client"]
    pairs, sentences, idx = stsb
    r = c.put("/collections/sts_flat", json={"index": "flat", "metric": "cosine"})
    assert r.status_code == 200, r.text
    info = r.json()
    assert (
        info["dimension"] == 384 and info["model"]["name"] == "all-minilm-l6-v2" and len(info["model"]["sha256"]) == 64
    )
    upsert_texts(c, "sts_flat", sentences)
    assert c.get("/collections/sts_flat").json()["count"] == len(sentences)

    good = [i for i in range(len(pairs)) if pairs.scores[i] >= 4.0]
    assert len(good) > 300
    results = search_batch(c, "sts_flat", [pairs.sent1[i] for i in good])
    service_hits = [idx[pairs.sent2[i]] in {h["id"] for h in res} for i, res in zip(good, results)]

    vecs = stored_vectors(env, "sts_flat")
    X = np.stack([vecs[j] for j in range(len(sentences))])
    assert np.allclose(np.linalg.norm(X, axis=1), 1, atol=1e-4)
    S = X[[idx[pairs.sent1[i]] for i in good]] @ X.T
    top = np.argsort(-S, axis=1, kind="stable")[:, :TOP_K]
    numpy_hits = [idx[pairs.sent2[i]] in set(top[q]) for q, i in enumerate(good)]
    assert sum(service_hits) == sum(numpy_hits), (sum(service_hits), sum(numpy_hits))
    assert np.mean(numpy_hits) > 0.8  # the encoder finds paraphrases: a real check on real data
    # scores are cosines and best first
    for q, res in enumerate(results[:20]):
        scores = [h["score"] for h in res]
        assert scores == sorted(scores, reverse=True)
        assert scores[0] == pytest.approx(float(S[q].max()), abs=1e-3)


def test_hnsw_recall_against_flat(env, stsb):
    c = env["client"]
    pairs, sentences, _ = stsb
    r = c.put(
        "/collections/sts_hnsw", json={"index": "hnsw", "params": {"M": 16, "ef_construction": 64, "ef_search": 32}}
    )
    assert r.status_code == 200, r.text
    vecs = stored_vectors(env, "sts_flat")  # the points of test_flat_matches_brute_force_numpy, as vectors
    upsert_with_vectors(c, "sts_hnsw", sentences, vecs, len(sentences))
    queries = [vecs[i].tolist() for i in range(0, 1000, 2)]
    flat = search_batch(c, "sts_flat", queries)
    hnsw = search_batch(c, "sts_hnsw", queries)
    recall = np.mean([len({h["id"] for h in a} & {h["id"] for h in b}) / TOP_K for a, b in zip(flat, hnsw)])
    assert recall >= 0.95, recall


def test_ivf_pq_trains_once_enough_points(env, stsb):
    c = env["client"]
    _, sentences, _ = stsb
    params = {"nlist": 16, "m": 16, "min_train_points": 1000}
    assert c.put("/collections/sts_ivf", json={"index": "ivf_pq", "params": params}).status_code == 200
    flat = stored_vectors(env, "sts_flat")  # the points of test_flat_matches_brute_force_numpy, as vectors
    upsert_with_vectors(c, "sts_ivf", sentences, flat, 512)
    info = c.get("/collections/sts_ivf").json()
    assert info["index"]["type"] == "ivf_pq" and info["count"] == 512
    if env["backend"] == "embedded":  # exact until min_train_points (Milvus builds IVF-PQ on sealed segments itself)
        assert info["trained"] is False and info["index"]["in_use"].startswith("flat")
    upsert_with_vectors(c, "sts_ivf", sentences, flat, 1200, start=512)
    import time

    deadline = time.monotonic() + 60
    while not c.get("/collections/sts_ivf").json()["trained"]:
        assert time.monotonic() < deadline, "ivf_pq never trained"
        time.sleep(0.2)
    vecs = stored_vectors(env, "sts_ivf")
    ids = np.array(sorted(vecs))
    X = np.stack([vecs[i] for i in ids])
    exact = ids[np.argsort(-(X[:100] @ X.T), axis=1, kind="stable")[:, :TOP_K]]  # queries: points 0..99
    ivf = search_batch(c, "sts_ivf", [flat[i].tolist() for i in range(100)])
    recall = np.mean([len(set(e.tolist()) & {h["id"] for h in b}) / TOP_K for e, b in zip(exact, ivf)])
    assert recall >= 0.8, recall


def test_upsert_replaces_delete_removes_filters_select(env):
    c = env["client"]
    assert c.put("/collections/small", json={"index": "hnsw"}).status_code == 200
    animals = ["cat", "dog", "horse", "cow", "sheep", "goat", "duck", "goose"]
    pts = [
        {
            "id": f"a-{a}",
            "text": f"A photo of a {a} standing in a field.",
            "payload": {
                "kind": "farm" if a in ("cow", "sheep", "goat", "horse") else "other",
                "legs": 2 if a in ("duck", "goose") else 4,
                "n": i,
            },
        }
        for i, a in enumerate(animals)
    ]
    pts.append({"id": 7, "text": "The stock market fell sharply today.", "payload": {"kind": "news"}})
    assert c.put("/collections/small/points", json={"points": pts}).json()["upserted"] == 9
    r = c.post("/collections/small/search", json={"query": "a picture of a dog", "top_k": 3})
    assert r.json()[0]["id"] == "a-dog" and set(r.json()[0]) == {"id", "score", "text", "payload"}
    # int and string ids are distinct; GET point
    assert c.get("/collections/small/points/7").json()["text"].startswith("The stock market")
    assert c.get("/collections/small/points/a-cat").json()["payload"]["n"] == 0
    err(c.get("/collections/small/points/8"), 404, "point_not_found")
    # filters: equality, $in, several keys (AND)
    r = c.post("/collections/small/search", json={"query": "animal", "top_k": 20, "filter": {"kind": "farm"}})
    assert {h["id"] for h in r.json()} == {"a-cow", "a-sheep", "a-goat", "a-horse"}
    r = c.post(
        "/collections/small/search",
        json={"query": "animal", "top_k": 20, "filter": {"legs": {"$in": [2]}, "kind": "other"}},
    )
    assert {h["id"] for h in r.json()} == {"a-duck", "a-goose"}
    r = c.post(
        "/collections/small/search",
        json={
            "query": "bird",
            "top_k": 1,
            "filter": {"kind": {"$in": ["farm", "news"]}},
            "with_payload": False,
            "with_text": False,
        },
    )
    assert len(r.json()) == 1 and set(r.json()[0]) == {"id", "score"}
    r = c.post("/collections/small/search", json={"query": "animal", "top_k": 20, "score_threshold": 0.99})
    assert r.json() == []
    # upsert replaces (same id, new text and payload)
    c.put(
        "/collections/small/points",
        json={
            "points": [
                {"id": "a-dog", "text": "Interest rates were raised by the central bank.", "payload": {"kind": "news"}}
            ]
        },
    )
    r = c.post("/collections/small/search", json={"query": "a picture of a dog", "top_k": 20})
    assert all(h["text"] != "A photo of a dog standing in a field." for h in r.json())
    assert c.get("/collections/small").json()["count"] == 9
    r = c.post(
        "/collections/small/search", json={"query": "banking and the economy", "top_k": 2, "filter": {"kind": "news"}}
    )
    assert {h["id"] for h in r.json()} == {"a-dog", 7}
    # delete by ids and by filter
    r = c.post("/collections/small/points/delete", json={"ids": ["a-cat", 12345]})
    assert r.json()["deleted"] == 1
    r = c.post("/collections/small/points/delete", json={"filter": {"legs": 2}})
    assert r.json()["deleted"] == 2
    r = c.post("/collections/small/search", json={"query": "a cat, a duck or a goose", "top_k": 20})
    assert {h["id"] for h in r.json()} == {"a-horse", "a-cow", "a-sheep", "a-goat", "a-dog", 7}
    assert c.get("/collections/small").json()["count"] == 6


def test_bad_input_answers_json_errors_and_keeps_serving(env):
    c = env["client"]
    err(c.get("/collections/nope"), 404, "collection_not_found")
    err(c.post("/collections/nope/search", json={"query": "x"}), 404, "collection_not_found")
    err(c.put("/collections/nope/points", json={"points": [{"id": 1, "text": "x"}]}), 404, "collection_not_found")
    err(c.delete("/collections/nope"), 404, "collection_not_found")
    err(c.put("/collections/sts_flat", json={"index": "flat"}), 409, "collection_exists")
    e = err(c.post("/collections/sts_flat/search", json={"query": [0.1] * 383}), 422, "wrong_dimension")
    assert e["param"] == "query"
    err(
        c.post("/collections/sts_flat/search/batch", json={"searches": [{"query": "ok"}, {"query": [1.0] * 385}]}),
        422,
        "wrong_dimension",
    )
    for bad in ({"parity": {"$gt": "1"}}, {"parity": [1, 2]}, "parity=even", {"parity": {"$in": []}}, {}):
        e = err(c.post("/collections/sts_flat/search", json={"query": "x", "filter": bad}), 422)
        assert e["param"] == "filter", e
    err(c.post("/collections/sts_flat/points/delete", json={"filter": {"a": {"$regex": "x"}}}), 422, "invalid_filter")
    err(c.post("/collections/sts_flat/points/delete", json={}), 422)
    err(c.put("/collections/sts_flat/points", json={"points": []}), 422)
    err(c.put("/collections/sts_flat/points", json={"points": [{"id": -1, "text": "x"}]}), 422)
    err(c.put("/collections/sts_flat/points", json={"points": [{"id": 1.5, "text": "x"}]}), 422)
    err(c.put("/collections/sts_flat/points", json={"points": [{"id": 1, "text": "x", "payload": [1]}]}), 422)
    err(c.put("/collections/bad name!", json={"index": "flat"}), 422)
    err(c.put("/collections/x1", json={"index": "annoy"}), 422)
    err(c.put("/collections/x1", json={"index": "ivf_pq", "params": {"m": 7}}), 422)
    err(c.put("/collections/x1", json={"index": "hnsw", "params": {"M": "big"}}), 422)
    err(c.post("/collections/sts_flat/search", json={"query": "x", "top_k": 0}), 422)
    assert c.get("/collections/x1").status_code == 404  # failed creates leave nothing behind
    assert c.get("/ready").status_code == 200
    assert (
        c.post("/collections/sts_flat/search", json={"query": "A man is playing a guitar.", "top_k": 1}).status_code
        == 200
    )


def test_delete_collection_and_recreate(env):
    c = env["client"]
    assert c.put("/collections/tmp1", json={}).status_code == 200
    c.put("/collections/tmp1/points", json={"points": [{"id": 1, "text": "hello"}]})
    assert c.delete("/collections/tmp1").json() == {"deleted": True, "name": "tmp1"}
    err(c.get("/collections/tmp1"), 404)
    if env["backend"] == "embedded":
        assert not (env["work"] / "data" / "collections" / "tmp1").exists()
    else:
        assert not [n for n in milvus_collections(env) if "tmp1" in n]
    assert c.put("/collections/tmp1", json={"index": "flat", "metric": "dot"}).json()["count"] == 0
    assert c.delete("/collections/tmp1").status_code == 200


def test_reads_take_a_consistency_and_say_which_they_got(env):
    """Every read takes ``consistency`` and ``after_sequence``; the embedded backend is always strong and says so.
    (A bounded read may miss the write just made on Milvus: its point read is checked with the write's token.)"""
    c = env["client"]
    assert c.put("/collections/cons", json={}).status_code == 200
    seq = c.put("/collections/cons/points", json={"points": [{"id": 1, "text": "hello"}]}).json()["sequence"]
    want = {"embedded": "strong", "milvus": "bounded"}[env["backend"]]
    for r in (
        c.get("/collections", params={"consistency": "bounded"}),
        c.get("/collections/cons", params={"consistency": "bounded"}),
        c.post("/collections/cons/search", params={"consistency": "bounded"}, json={"query": "hello"}),
        c.post(
            "/collections/cons/search/batch", params={"consistency": "bounded"}, json={"searches": [{"query": "x"}]}
        ),
    ):
        assert r.status_code == 200 and r.headers["x-read-consistency"] == want, r.text
    r = c.get("/collections/cons/points/1", params={"consistency": "eventual", "after_sequence": seq})
    assert r.json()["text"] == "hello"
    assert r.headers["x-read-consistency"] == {"embedded": "strong", "milvus": "session"}[env["backend"]]
    assert c.get("/collections/cons").headers["x-read-consistency"] == "strong"  # the default
    err(c.get("/collections/cons", params={"consistency": "quorum"}), 422, "invalid_value")
    assert c.delete("/collections/cons").status_code == 200


def test_concurrent_writers_lose_nothing(env, stsb):
    """Four clients write at once (disjoint ids, plus one id all of them replace) and a fifth deletes by filter:
    every acknowledged write is there afterwards, with its own text and vector."""
    from concurrent.futures import ThreadPoolExecutor

    c = env["client"]
    _, sentences, _ = stsb
    assert c.put("/collections/conc", json={"index": "hnsw"}).status_code == 200
    texts = sentences[:400]

    def writer(w: int) -> list[int]:
        acked = []
        with httpx.Client(base_url=c.base_url, timeout=120) as cw:
            for i in range(w * 100, w * 100 + 100, 25):
                pts = [{"id": j, "text": texts[j], "payload": {"writer": w}} for j in range(i, i + 25)]
                pts.append({"id": "shared", "text": texts[i], "payload": {"writer": w, "doomed": True}})
                r = cw.put("/collections/conc/points", json={"points": pts})
                assert r.status_code == 200, r.text
                acked.extend(range(i, i + 25))
        return acked

    with ThreadPoolExecutor(4) as ex:
        acked = sorted(j for part in ex.map(writer, range(4)) for j in part)
    assert acked == list(range(400))
    assert c.get("/collections/conc").json()["count"] == 401
    shared = c.get("/collections/conc/points/shared").json()
    assert shared["text"] in {texts[i] for i in range(0, 400, 25)}  # one whole write won, not a mix
    assert shared["payload"]["writer"] == [i for i in range(0, 400, 25) if texts[i] == shared["text"]][0] // 100
    r = c.post("/collections/conc/points/delete", json={"filter": {"doomed": True}})
    assert r.status_code == 200 and r.json()["deleted"] == 1
    vecs = stored_vectors(env, "conc")
    assert sorted(vecs) == list(range(400))
    hits = search_batch(c, "conc", texts[::40], k=1)
    assert [h[0]["id"] for h in hits] == list(range(0, 400, 40))  # each text finds its own point


def _check_restored(c2: httpx.Client, names, infos, queries, before, exact: bool) -> None:
    for n in names:
        info = c2.get(f"/collections/{n}").json()
        for key in ("count", "dimension", "metric", "model", "trained", "sequence"):
            assert info[key] == infos[n][key], (n, key)
        assert info["index"]["vectors"] - info["index"]["tombstones"] == info["count"]
        after = search_batch(c2, n, queries, 5)
        if exact or n in (
            "small",
            "sts_flat",
        ):  # (conc is hnsw)  # exact indexes answer identically however they were rebuilt
            for a, b in zip(before[n], after):
                assert [h["id"] for h in a] == [h["id"] for h in b], n
                assert np.allclose([h["score"] for h in a], [h["score"] for h in b], atol=1e-5)
        else:  # an approximate index rebuilt from SQLite is a different graph/codebook: same quality
            overlap = np.mean([len({h["id"] for h in a} & {h["id"] for h in b}) / 5 for a, b in zip(before[n], after)])
            assert overlap >= 0.9, (n, overlap)


def test_multivectors_through_the_native_api(env):
    """A multivector (``multivector: true``): matrices of rows per point, searched by MAX_SIM (the sum over the
    query's rows of their best dot product with a point's rows), as numpy computes it; Milvus refuses it."""
    c = env["client"]
    body = {"vectors": {"rows": {"size": 4, "metric": "dot", "multivector": True}}}
    if env["backend"] == "milvus":
        err(c.put("/collections/mv", json=body), 422, "unsupported")
        return
    assert c.put("/collections/mv", json=body).status_code == 200, c.put("/collections/mv", json=body).text
    rng = np.random.default_rng(2)
    mats = [rng.standard_normal((1 + i % 3, 4)).round(3) for i in range(25)]
    pts = [{"id": i, "vectors": {"rows": m.tolist()}} for i, m in enumerate(mats)]
    r = c.put("/collections/mv/points", json={"points": pts})
    assert r.status_code == 200, r.text
    q = rng.standard_normal((2, 4)).round(3)
    want = sorted(range(25), key=lambda i: -float((q @ mats[i].T).max(1).sum()))[:5]
    hits = c.post("/collections/mv/search", json={"query": q.tolist(), "using": "rows", "top_k": 5}).json()
    assert [h["id"] for h in hits] == want
    got = c.post("/collections/mv/points/scroll", json={"limit": 1, "start": 2, "with_vector": ["rows"]}).json()
    assert np.allclose(got["points"][0]["vectors"]["rows"], mats[2])
    err(c.post("/collections/mv/search", json={"query": [1.0] * 4, "using": "rows"}), 422, "wrong_dimension")
    assert c.delete("/collections/mv").status_code == 200


def test_named_dense_and_sparse_vectors_through_the_native_api(env, stsb):
    """Named vectors on the native API: a model-bound vector embedded from each text beside a client-supplied dense
    vector and a sparse one; searches by each (``using``), ``$has_vector``; bad input is 4xx. The milvus backend
    refuses them (422 unsupported, naming Milvus 2.3's limit)."""
    c = env["client"]
    _, sentences, _ = stsb
    body = {"vectors": {"meaning": {"model": True}, "tags": {"size": 3, "metric": "l2"}},
            "sparse_vectors": {"kw": {"modifier": "idf"}}}  # fmt: skip
    r = c.put("/collections/named", json=body)
    if env["backend"] == "milvus":
        err(r, 422, "unsupported")
        assert "Milvus 2.3" in r.json()["error"]["message"]
        return
    assert r.status_code == 200 and set(r.json()["vectors"]["dense"]) == {"meaning", "tags"}, r.text
    texts = sentences[:40]
    vocab = {w: i for i, w in enumerate(sorted({w for t in texts for w in t.lower().split()}))}
    pts = []
    for i, t in enumerate(texts):
        words = sorted({vocab[w] for w in t.lower().split()})
        v = {"kw": {"indices": words, "values": [1.0] * len(words)}}
        if i % 2 == 0:
            v["tags"] = [float(i), 0.0, 1.0]
        pts.append({"id": i, "text": t, "vectors": v, "payload": {"i": i}})
    r = c.put("/collections/named/points", json={"points": pts})
    assert r.status_code == 200, r.text
    hits = c.post("/collections/named/search", json={"query": texts[7], "top_k": 3}).json()
    assert hits[0]["id"] == 7  # the default vector: the model-bound one
    hits = c.post("/collections/named/search", json={"query": [4.2, 0, 1], "using": "tags", "top_k": 2}).json()
    assert [h["id"] for h in hits] == [4, 6] and hits[0]["score"] == pytest.approx(0.2, abs=1e-5)
    words = sorted({vocab[w] for w in texts[11].lower().split()})
    q = {"query": {"indices": words, "values": [1.0] * len(words)}, "using": "kw", "top_k": 1}
    assert c.post("/collections/named/search", json=q).json()[0]["id"] == 11
    # a mode beside an explicit vector searches that vector (it once recursed without end: a 500)
    assert c.post("/collections/named/search", json={**q, "mode": "dense", "fusion": "dbsf"}).json()[0]["id"] == 11
    r = c.post("/collections/named/search/batch", json={"searches": [{**q, "mode": "sparse"}]})
    assert r.status_code == 200 and r.json()[0][0]["id"] == 11, r.text
    r = c.post("/collections/named/points/count", json={"filter": {"$has_vector": "tags"}})
    assert r.json() == {"count": 20}
    r = c.post("/collections/named/points/scroll", json={"limit": 1, "with_vector": ["tags"], "start": 4})
    assert r.json()["points"][0]["vectors"] == {"tags": [4.0, 0.0, 1.0]}
    for bad, code in (
        ({"query": "a text", "using": "tags"}, "invalid_value"),  # a client-supplied vector has no model
        ({"query": [1.0, 2.0], "using": "tags"}, "wrong_dimension"),
        ({"query": [1.0] * 3, "using": "nope"}, "vector_not_found"),
        ({"query": [1.0] * 3, "using": "kw"}, "invalid_value"),  # a dense query of a sparse vector
    ):
        err(c.post("/collections/named/search", json=bad), 422, code)
    for pts_bad in (
        [{"id": 99, "vectors": {"tags": [1.0, 2.0, 3.0]}}],  # no text: the model-bound vector cannot be made
        [{"id": 99, "text": "x", "vectors": {"kw": {"indices": [1, 1], "values": [1.0, 2.0]}}}],  # repeated index
        [{"id": 99, "text": "x", "vectors": {"tags": [1.0, "NaN"]}}],
    ):
        assert c.put("/collections/named/points", json={"points": pts_bad}).status_code == 422
    err(c.put("/collections/named2", json={**body, "metric": "dot"}), 422)
    assert c.delete("/collections/named").status_code == 200


def test_bm25_and_hybrid_search_on_a_scifact_slice(env):
    """Server-side BM25 and hybrid search on real retrieval data (BEIR SciFact: the relevant abstracts of 12 test
    claims among 150), each held to an independent computation: the stored BM25 vectors to fastembed's own ``Bm25``
    run here as a client would, the sparse ranking to BM25 scored in numpy from them (IDF over the collection), and
    the hybrid ranking to fusing the dense and sparse rankings by hand and by qdrant-client's
    ``reciprocal_rank_fusion`` (the peer's own code)."""
    import json

    from fastembed.sparse.bm25 import Bm25
    from qdrant_client.http import models as qm
    from qdrant_client.hybrid.fusion import reciprocal_rank_fusion

    from service.inference.sparse import BUNDLED_BM25
    from training.data.sts import data_root

    c = env["client"]
    body = {
        "vectors": {"dense": {"model": True}},
        "sparse_vectors": {"bm25": {"modifier": "idf", "model": "qdrant/bm25"}},
    }
    if env["backend"] == "milvus":
        err(c.put("/collections/scifact", json=body), 422, "unsupported")
        return
    root = data_root() / "beir" / "scifact"
    with open(root / "qrels" / "test.tsv", encoding="utf-8") as f:
        qrels = [line.strip().split("\t") for line in list(f)[1:]]
    claims = list(dict.fromkeys(q for q, _, _ in qrels))[:12]
    wanted = {d for q, d, _ in qrels if q in claims}
    with open(root / "corpus.jsonl", encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    docs = [d for d in corpus if d["_id"] in wanted] + [d for d in corpus if d["_id"] not in wanted][
        : 150 - len(wanted)
    ]
    with open(root / "queries.jsonl", encoding="utf-8") as f:
        queries = {q["_id"]: q["text"] for q in map(json.loads, f) if q["_id"] in claims}
    texts = [f"{d['title']} {d['text']}" for d in docs]
    assert c.put("/collections/scifact", json=body).status_code == 200
    for i in range(0, len(texts), 100):
        pts = [{"id": j, "text": texts[j]} for j in range(i, min(i + 100, len(texts)))]
        assert c.put("/collections/scifact/points", json={"points": pts}).status_code == 200
    # the stored BM25 vectors are fastembed's, as a client computes them
    fe = Bm25("Qdrant/bm25", specific_model_path=str(BUNDLED_BM25))
    stored = c.post("/collections/scifact/points/scroll", json={"limit": 1000, "with_vector": ["bm25"]}).json()
    mine = {p["id"]: p["vectors"]["bm25"] for p in stored["points"]}
    for j, e in enumerate(fe.embed(texts)):
        order = np.argsort(e.indices)
        assert mine[j]["indices"] == e.indices[order].tolist()
        assert np.allclose(mine[j]["values"], e.values[order], rtol=1e-6)
    # BM25 in numpy: query terms (value 1 each) weighted by their IDF over the 150 documents
    df: dict[int, int] = {}
    for v in mine.values():
        for t in v["indices"]:
            df[t] = df.get(t, 0) + 1
    n, hits = len(texts), 0
    for qid, q in queries.items():
        terms = set(next(iter(fe.query_embed(q))).indices.tolist())
        score = {j: sum(np.log1p((n - df[t] + 0.5) / (df[t] + 0.5)) * x for t, x in zip(v["indices"], v["values"])
                        if t in terms) for j, v in mine.items()}  # fmt: skip
        expect = sorted((s for s in score.values() if s > 0), reverse=True)[:10]
        r = c.post("/collections/scifact/search", json={"query": q, "mode": "sparse", "top_k": 10}).json()
        assert np.allclose([h["score"] for h in r], expect, rtol=1e-4), qid
        dense = c.post("/collections/scifact/search", json={"query": q, "mode": "dense", "top_k": 50}).json()
        sparse = c.post("/collections/scifact/search", json={"query": q, "mode": "sparse", "top_k": 50}).json()
        hybrid = c.post("/collections/scifact/search",
                        json={"query": q, "mode": "hybrid", "candidates": 50, "top_k": 10}).json()  # fmt: skip
        by_hand: dict[int, float] = {}
        for ranking in (dense, sparse):
            for rank, h in enumerate(ranking, start=1):
                by_hand[h["id"]] = by_hand.get(h["id"], 0.0) + 1 / (rank + 1)  # RRF, Qdrant's k = 2
        assert np.allclose([h["score"] for h in hybrid], sorted(by_hand.values(), reverse=True)[:10]), qid
        peer = reciprocal_rank_fusion(
            [[qm.ScoredPoint(id=h["id"], version=0, score=h["score"]) for h in r] for r in (dense, sparse)], limit=10
        )
        assert [p.id for p in peer] == [h["id"] for h in hybrid], qid
        relevant = {docs.index(d) for d in (x for x in docs if any(x["_id"] == dd for qq, dd, _ in qrels if qq == qid))}
        hits += bool(relevant & {h["id"] for h in hybrid})
    assert hits >= 10  # most claims find a relevant abstract in the fused top 10
    assert c.delete("/collections/scifact").status_code == 200


def test_restart_restores_every_collection(env, stsb):  # last: it kills the module's server
    c = env["client"]
    _, sentences, _ = stsb
    names = ["conc", "small", "sts_flat", "sts_hnsw", "sts_ivf"]
    if not c.get("/collections").json()["collections"]:
        pytest.skip("needs the collections built by the earlier tests of this module")
    assert sorted(x["name"] for x in c.get("/collections").json()["collections"]) == names
    infos = {n: c.get(f"/collections/{n}").json() for n in names}
    queries = sentences[::50]
    before = {n: search_batch(c, n, queries, 5) for n in names}
    # 1. crash (SIGKILL): no final snapshot; restored from the latest snapshot, if any, plus replay of SQLite
    env["server"].kill()
    with run_server(env["models"], workdir=env["work"], port=env["port"], args=env["args"]) as s:
        with httpx.Client(base_url=s.url, timeout=120) as c2:
            _check_restored(c2, names, infos, queries, before, exact=False)
            before = {n: search_batch(c2, n, queries, 5) for n in names}
    # 2. clean stop (SIGTERM, on leaving the block): snapshots written, restored exactly
    with run_server(env["models"], workdir=env["work"], port=env["port"], args=env["args"]) as s:
        with httpx.Client(base_url=s.url, timeout=120) as c2:
            _check_restored(c2, names, infos, queries, before, exact=True)
            c2.put("/collections/small/points", json={"points": [{"id": 99, "text": "after restart"}]})
            assert c2.get("/collections/small/points/99").json()["text"] == "after restart"
