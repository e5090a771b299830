"""Real clients, unchanged, against the Qdrant-compatible surface (``/qdrant``) and ``/v1`` of a real server process,
on both collections backends, on real data (STS-B sentences, the shared corpus): qdrant-client over REST with
``cloud_inference=True`` (``Document`` objects embedded by the server), LangChain's ``QdrantVectorStore`` with
``OpenAIEmbeddings``, LlamaIndex's ``QdrantVectorStore`` with ``OpenAILikeEmbedding``. Each returns the same top hits
as the native API (``POST /collections/{name}/search``) for the same queries. Also: the core additions behind the
surface (points given as vectors, scroll, count) through the native API, Qdrant's envelope and error shape, and the
refusal of token-id input.

The ``# --- snippet`` blocks are the README's "Use it from your client" snippets, verbatim (tests/test_readme.py
checks that README and this file agree).

One server per backend for the module; every test uses its own collections.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.server_utils import collections_server
from training.data.sts import data_root, load_task

pytest.importorskip("qdrant_client")
K = 5


@pytest.fixture(scope="module", params=["embedded", "milvus"])
def env(request, default_artifact: Path, tmp_path_factory):
    yield from collections_server(request, default_artifact, tmp_path_factory)


@pytest.fixture(scope="module")
def sts():
    """200 distinct STS-B test first sentences with their genre, and 6 second sentences as questions."""
    p = load_task("STSBenchmark")
    sentences = list(dict.fromkeys(p.sent1))[:200]
    genres = ["news" if i % 3 == 0 else "captions" for i in range(len(sentences))]
    return sentences, genres, [p.sent2[i] for i in (0, 17, 42, 77, 120, 199)]


@pytest.fixture(scope="module")
def corpus():
    with open(data_root() / "corpus" / "en_sentences.txt", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(150)]


def native_rows(c: httpx.Client, name: str, question: str, flt: dict | None = None) -> list[int]:
    """The payload ``row`` of the native API's top ``K`` hits for a text query."""
    r = c.post(f"/collections/{name}/search", json={"query": question, "top_k": K, "filter": flt})
    assert r.status_code == 200, r.text
    return [h["payload"].get("row", h["payload"].get("metadata", {}).get("row")) for h in r.json()]


def test_qdrant_client_documents_filter_scroll_count_delete(env, sts):
    from qdrant_client.http.exceptions import UnexpectedResponse

    url, c = env["server"].url, env["client"]
    sentences, genres, questions = sts
    question = questions[0]
    # --- snippet: qdrant-client
    from qdrant_client import QdrantClient, models

    client = QdrantClient(url=f"{url}/qdrant", cloud_inference=True, timeout=60)  # REST; the server embeds Documents
    client.create_collection("sts", vectors_config=models.VectorParams(size=384, distance=models.Distance.COSINE))
    client.upsert(
        "sts",
        points=[
            models.PointStruct(
                id=i, vector=models.Document(text=s, model="all-minilm-l6-v2"), payload={"row": i, "genre": g}
            )
            for i, (s, g) in enumerate(zip(sentences, genres))
        ],
    )
    news = models.Filter(must=[models.FieldCondition(key="genre", match=models.MatchValue(value="news"))])
    hits = client.query_points(
        "sts",
        query=models.Document(text=question, model="all-minilm-l6-v2"),
        query_filter=news,
        limit=5,
        with_payload=True,
    ).points
    page, next_offset = client.scroll("sts", limit=100)
    count = client.count("sts", exact=True).count
    client.delete("sts", points_selector=models.PointIdsList(points=[0, 1]))
    # --- end snippet
    kept = [h.id for h in hits if h.id not in (0, 1)]  # the native search runs after the delete
    assert kept == native_rows(c, "sts", question, {"genre": "news"})[: len(kept)]
    assert all(h.payload["genre"] == "news" for h in hits) and hits[0].score > 0.5
    assert count == len(sentences) and len(page) == 100 and next_offset is not None
    rest, end = client.scroll("sts", limit=200, offset=next_offset)
    assert end is None and {p.id for p in page} | {p.id for p in rest} == set(range(len(sentences)))
    assert client.count("sts").count == len(sentences) - 2
    assert client.count("sts", count_filter=news).count == sum(g == "news" for g in genres[2:])
    for q in questions[1:]:  # every query: the same top hits as the native API
        got = client.query_points("sts", query=models.Document(text=q, model="all-minilm-l6-v2"), limit=K).points
        assert [h.id for h in got] == native_rows(c, "sts", q)
    # a vector query, a point-id query (the point itself left out), retrieve, delete by filter
    vec = c.post("/v1/embeddings", json={"input": question}).json()["data"][0]["embedding"]
    assert [h.id for h in client.query_points("sts", query=vec, query_filter=news, limit=K).points] == (
        native_rows(c, "sts", question, {"genre": "news"})
    )
    by_id = client.query_points("sts", query=kept[0], limit=K).points
    assert kept[0] not in [h.id for h in by_id] and len(by_id) == K
    got = client.retrieve("sts", ids=[5, 3, 0], with_vectors=True)
    assert [p.id for p in got] == [5, 3] and len(got[0].vector) == 384
    client.delete("sts", points_selector=models.FilterSelector(filter=news))
    assert client.count("sts", count_filter=news).count == 0
    # a Document naming another model: a clear 4xx in Qdrant's error shape
    with pytest.raises(UnexpectedResponse) as e:
        client.query_points("sts", query=models.Document(text=question, model="text-embedding-3-small"))
    assert e.value.status_code == 422 and b"embedded by all-minilm-l6-v2" in e.value.content
    client.delete_collection("sts")
    assert not client.collection_exists("sts")


def test_qdrant_ids_payloads_and_errors(env, sts):
    from qdrant_client import QdrantClient, models
    from qdrant_client.http.exceptions import UnexpectedResponse

    url, c = env["server"].url, env["client"]
    sentences = sts[0][:20]
    client = QdrantClient(url=f"{url}/qdrant", cloud_inference=True, check_compatibility=False, timeout=60)
    client.create_collection("ids", vectors_config={"": models.VectorParams(size=384, distance=models.Distance.DOT)},
                             hnsw_config=models.HnswConfigDiff(m=0))  # fmt: skip
    info = client.get_collection("ids")
    assert info.config.params.vectors.distance == models.Distance.DOT and info.config.hnsw_config.m == 0
    assert c.get("/collections/ids").json()["index"]["type"] == "flat"
    u = uuid.uuid4()
    client.upsert("ids", points=models.Batch(ids=[u.hex.upper(), 7], vectors=[
        models.Document(text=sentences[0], model="all-minilm-l6-v2"),
        models.Document(text=sentences[1], model="all-minilm-l6-v2:1")]))  # fmt: skip
    assert [p.id for p in client.retrieve("ids", ids=[str(u), 7])] == [str(u), 7]  # UUIDs canonicalised
    client.set_payload("ids", payload={"tags": ["a", "b"], "n": 1}, points=[7])
    client.overwrite_payload("ids", payload={"n": None}, points=[str(u)])
    assert client.retrieve("ids", ids=[7])[0].payload == {"tags": ["a", "b"], "n": 1}
    is_null = models.Filter(must=[models.IsNullCondition(is_null=models.PayloadField(key="n"))])
    is_empty = models.Filter(must=[models.IsEmptyCondition(is_empty=models.PayloadField(key="tags"))])
    any_b = models.Filter(should=[models.FieldCondition(key="tags", match=models.MatchAny(any=["b", "z"]))],
                          must_not=[models.HasIdCondition(has_id=[str(u)])])  # fmt: skip
    assert [p.id for p in client.scroll("ids", scroll_filter=is_null)[0]] == [str(u)]
    assert [p.id for p in client.scroll("ids", scroll_filter=is_empty)[0]] == [str(u)]
    assert [p.id for p in client.scroll("ids", scroll_filter=any_b)[0]] == [7]
    rng = models.Filter(must=[models.FieldCondition(key="n", range=models.Range(gte=1, lt=2))])
    assert client.count("ids", count_filter=rng).count == 1
    for bad, status in [
        (lambda: client.upsert("ids", points=[models.PointStruct(id="not-a-uuid", vector=[0.1] * 384)]), 422),
        (lambda: client.upsert("ids", points=[models.PointStruct(id=1, vector=[0.1] * 3)]), 422),
        (lambda: client.create_collection("ids", vectors_config=models.VectorParams(size=384, distance="Cosine")), 409),
        (lambda: client.create_collection("man", vectors_config=models.VectorParams(size=384, distance="Manhattan")), 422),
        (lambda: client.get_collection("missing"), 404),
        (lambda: client.count("ids", count_filter=models.Filter(must=[models.FieldCondition(
            key="t", match=models.MatchPrefix(prefix="x"))])), 422),
    ]:  # fmt: skip
        with pytest.raises(UnexpectedResponse) as e:
            bad()
        assert e.value.status_code == status, e.value.content
    # payloads follow the native API's rules (an acknowledged point must stay readable): 422, nothing written
    for payload in ({"n": 2**70}, {"n": float("nan")}):
        raw = json.dumps({"points": [{"id": 99, "vector": [0.1] * 384, "payload": payload}]})  # NaN: json's extension
        r = c.put("/qdrant/collections/ids/points", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, r.text
        r = c.post("/qdrant/collections/ids/points/payload", content=json.dumps({"payload": payload, "points": [7]}),
                   headers={"Content-Type": "application/json"})  # fmt: skip
        assert r.status_code == 422, r.text
    assert c.get("/qdrant/collections/ids/points/99").status_code == 404
    many = {"payload": {"bulk": True}, "points": [*range(1000, 3000), 7]}  # more ids than one filter may hold
    assert c.post("/qdrant/collections/ids/points/payload", json=many).status_code == 200
    assert c.get("/qdrant/collections/ids/points/7").json()["result"]["payload"]["bulk"] is True
    assert c.post("/qdrant/collections/ids/points/scroll", json={"limit": 10}).status_code == 200
    # {"nearest": ...} takes what a top-level query takes: a UUID in any form, a Document; else a 422, not a 500
    r = c.post("/qdrant/collections/ids/points/query", json={"query": {"nearest": u.hex.upper()}, "limit": 1})
    assert r.status_code == 200 and r.json()["result"]["points"][0]["id"] == 7, r.text  # the point itself left out
    for bad in ({"text": ""}, {"foo": 1}, "not-a-uuid", -1):
        r = c.post("/qdrant/collections/ids/points/query", json={"query": {"nearest": bad}})
        assert r.status_code == 422 and "query.nearest" in r.text, (bad, r.text)
    deep: dict = {"key": "n", "match": {"value": 1}}
    for _ in range(300):  # a filter nested past the collections' limit: 422, not a RecursionError
        deep = {"must": deep}
    r = c.post("/qdrant/collections/ids/points/scroll", json={"filter": deep})
    assert r.status_code == 422 and "nested more than" in r.json()["status"]["error"], r.text
    bad_doc = {"batch": {"ids": [1, 2], "vectors": [[0.1] * 384, {"text": "x", "model": "another-model"}]}}
    r = c.put("/qdrant/collections/ids/points", json=bad_doc)  # the error names the batch's field, not points[]
    assert r.status_code == 422 and "batch.vectors[1]" in r.json()["status"]["error"], r.text
    r = c.post("/qdrant/collections/missing/points/count", json={})
    assert r.status_code == 404 and set(r.json()) == {"status", "time"} and "missing" in r.json()["status"]["error"]
    r = c.post("/qdrant/collections/ids/points/search", json={"vector": [1.0] * 384, "limit": 2, "with_payload": True})
    assert r.status_code == 200 and r.json()["status"] == "ok" and len(r.json()["result"]) == 2
    r = c.post("/qdrant/collections/ids/points/search/batch", json={"searches": [{"vector": [1.0] * 384, "limit": 1}]})
    assert r.status_code == 200 and len(r.json()["result"][0]) == 1
    client.delete_collection("ids")


def test_qdrant_payload_keys_clear_index_and_recommend(env, sts):
    """qdrant-client's delete_payload (dotted keys reach nested objects), clear_payload, delete_payload_index, and
    recommendations (``average_vector``: ``avg(pos) + (avg(pos) - avg(neg))``, examples as ids, vectors and
    Documents, the example points left out) against the native search with that vector computed here."""
    import numpy as np
    from qdrant_client import QdrantClient, models
    from qdrant_client.http.exceptions import UnexpectedResponse

    url, c = env["server"].url, env["client"]
    sentences, genres, questions = sts[0][:60], sts[1][:60], sts[2]
    client = QdrantClient(url=f"{url}/qdrant", cloud_inference=True, timeout=60)
    client.create_collection("reco", vectors_config=models.VectorParams(size=384, distance=models.Distance.COSINE))
    client.upsert("reco", points=[
        models.PointStruct(id=i, vector=models.Document(text=s, model="all-minilm-l6-v2"),
                           payload={"row": i, "genre": g, "tmp": 1, "meta": {"lang": "en", "src": "sts"}})
        for i, (s, g) in enumerate(zip(sentences, genres))])  # fmt: skip
    client.delete_payload("reco", keys=["tmp", "meta.src", "absent"], points=[0, 1])
    got = {p.id: p.payload for p in client.retrieve("reco", ids=[0, 1, 2])}
    assert got[0] == {"row": 0, "genre": genres[0], "meta": {"lang": "en"}} and "tmp" not in got[1]
    assert got[2] == {"row": 2, "genre": genres[2], "tmp": 1, "meta": {"lang": "en", "src": "sts"}}
    news = models.Filter(must=[models.FieldCondition(key="genre", match=models.MatchValue(value="news"))])
    client.delete_payload("reco", keys=["genre"], points=news)
    no_genre = models.Filter(must=[models.IsEmptyCondition(is_empty=models.PayloadField(key="genre"))])
    assert client.count("reco", count_filter=no_genre).count == genres.count("news")
    client.clear_payload("reco", points_selector=models.PointIdsList(points=[3]))
    late = models.Filter(must=[models.FieldCondition(key="row", range=models.Range(gte=50))])
    client.clear_payload("reco", points_selector=models.FilterSelector(filter=late))
    assert client.retrieve("reco", ids=[3])[0].payload == {} and client.count("reco", count_filter=late).count == 0
    assert client.count("reco").count == 60  # payloads cleared, points and vectors kept
    client.create_payload_index("reco", field_name="row", field_schema=models.PayloadSchemaType.INTEGER)
    client.delete_payload_index("reco", field_name="row")

    stored = {p.id: np.asarray(p.vector) for p in client.retrieve("reco", ids=list(range(60)), with_vectors=True)}
    question = c.post("/v1/embeddings", json={"input": questions[1]}).json()["data"][0]["embedding"]

    def unit(v):
        return v / np.linalg.norm(v)

    cases = [  # (positive, negative, the vector average_vector makes of them)
        ([10, 11], [12], 2 * (stored[10] + stored[11]) / 2 - stored[12]),
        ([models.Document(text=questions[1], model="all-minilm-l6-v2")], [5, [0.5] * 384],
         2 * unit(np.asarray(question)) - (stored[5] + unit(np.full(384, 0.5))) / 2),
        ([20], [], stored[20]),
    ]  # fmt: skip
    first = None
    for pos, neg, target in cases:
        hits = client.query_points("reco", query=models.RecommendQuery(
            recommend=models.RecommendInput(positive=pos, negative=neg)), limit=K).points  # fmt: skip
        examples = [x for x in pos + neg if isinstance(x, int)]
        r = c.post("/collections/reco/search", json={"query": target.tolist(), "top_k": K + len(examples)})
        want = [h["id"] for h in r.json() if h["id"] not in examples][:K]  # left out by hand: an unfiltered search
        assert [h.id for h in hits] == want and not set(examples) & {h.id for h in hits}
        assert abs(hits[0].score - float(unit(target) @ stored[hits[0].id])) < 1e-4
        first = first or [h.id for h in hits]
    # the examples left out with a filter too, and past an offset
    target = (2 * (stored[10] + stored[11]) / 2 - stored[12]).tolist()
    captions = models.Filter(must=[models.FieldCondition(key="genre", match=models.MatchValue(value="captions"))])
    rec = models.RecommendQuery(recommend=models.RecommendInput(positive=[10, 11], negative=[12]))
    for flt, native_flt in ((captions, {"genre": "captions"}), (None, None)):
        got = client.query_points("reco", query=rec, query_filter=flt, limit=3, offset=2).points
        r = c.post("/collections/reco/search", json={"query": target, "top_k": 8, "filter": native_flt})
        assert [h.id for h in got] == [h["id"] for h in r.json() if h["id"] not in (10, 11, 12)][2:5]
    batch = client.query_batch_points("reco", requests=[
        models.QueryRequest(query=models.RecommendQuery(recommend=models.RecommendInput(positive=[10, 11], negative=[12])),
                            limit=K),
        models.QueryRequest(query=10, limit=K)])  # fmt: skip
    assert [h.id for h in batch[0].points] == first
    assert 10 not in [h.id for h in batch[1].points] and len(batch[1].points) == K
    for rec, status, words in [
        *(
            [({"positive": [10], "strategy": "best_score"}, 422, "milvus backend")]
            if env["backend"] == "milvus"
            else []
        ),
        ({"negative": [10]}, 422, "positive"),
        ({"positive": [999]}, 404, "999"),
        ({"positive": [[0.1] * 3]}, 422, "dimension"),
        ({"positive": [{"text": "x", "model": "another-model"}]}, 422, "recommend.positive[0].model"),
        ({"positive": [10], "shuffle": True}, 422, "recommend"),
        ({"positive": list(range(1025))}, 413, "collections_max_filter_values"),
    ]:
        r = c.post("/qdrant/collections/reco/points/query", json={"query": {"recommend": rec}})
        assert r.status_code == status and words in r.json()["status"]["error"], (rec, r.text)
    for body in ({"keys": ["a[].b"], "points": [1]}, {"keys": ["a..b"], "points": [1]}, {"keys": ["tmp"]}):
        r = c.post("/qdrant/collections/reco/points/payload/delete", json=body)
        assert r.status_code == 422, (body, r.text)
    with pytest.raises(UnexpectedResponse) as e:
        client.delete_payload_index("missing", field_name="row")
    assert e.value.status_code == 404
    client.delete_collection("reco")


def test_qdrant_batch_update_points(env, sts):
    """qdrant-client's batch_update_points: the operations run in order, one UpdateResult each; a malformed
    operation changes nothing, one refused while running names itself and leaves the ones before it applied. And
    update_collection: storage settings accepted (Qdrant's bulk-upload recipe), an index change refused."""
    from qdrant_client import QdrantClient, models
    from qdrant_client.http.exceptions import UnexpectedResponse

    url, c = env["server"].url, env["client"]
    sentences = sts[0][:10]
    client = QdrantClient(url=f"{url}/qdrant", cloud_inference=True, timeout=60)
    client.create_collection("batch", vectors_config=models.VectorParams(size=384, distance=models.Distance.COSINE))
    # Qdrant's bulk-upload recipe: indexing off during the upload, back on after (accepted, no effect here)
    assert client.update_collection("batch", optimizers_config=models.OptimizersConfigDiff(indexing_threshold=0))
    client.upsert("batch", points=[models.PointStruct(id=i, vector=models.Document(text=s, model="all-minilm-l6-v2"),
                                                      payload={"row": i, "keep": True}) for i, s in enumerate(sentences)])  # fmt: skip
    doc = models.Document(text="A new sentence about a cat.", model="all-minilm-l6-v2")
    results = client.batch_update_points("batch", update_operations=[
        models.UpsertOperation(upsert=models.PointsList(points=[models.PointStruct(id=100, vector=doc, payload={"row": 100})])),
        models.SetPayloadOperation(set_payload=models.SetPayload(payload={"tag": "x"}, points=[100, 4])),
        models.DeletePayloadOperation(delete_payload=models.DeletePayload(keys=["row"], points=[4])),
        models.OverwritePayloadOperation(overwrite_payload=models.SetPayload(payload={"o": 1}, points=[5])),
        models.ClearPayloadOperation(clear_payload=models.PointIdsList(points=[6])),
        models.DeleteOperation(delete=models.FilterSelector(filter=models.Filter(must=[
            models.FieldCondition(key="row", match=models.MatchAny(any=[7, 8]))]))),
    ])  # fmt: skip
    assert len(results) == 6 and all(r.status == models.UpdateStatus.COMPLETED for r in results)
    got = {p.id: p.payload for p in client.retrieve("batch", ids=[100, 4, 5, 6, 7, 8, 9])}
    assert got == {100: {"row": 100, "tag": "x"}, 4: {"keep": True, "tag": "x"}, 5: {"o": 1}, 6: {},
                   9: {"row": 9, "keep": True}}  # fmt: skip
    hit = client.query_points("batch", query=doc, limit=1).points[0]
    assert hit.id == 100 and hit.score > 0.999
    assert client.update_collection("batch", optimizers_config=models.OptimizersConfigDiff(indexing_threshold=20000),
                                    hnsw_config=models.HnswConfigDiff(full_scan_threshold=100))  # fmt: skip
    for bad, status in [
        (lambda: client.update_collection("batch", hnsw_config=models.HnswConfigDiff(m=32),
                                          sparse_vectors_config={"s": models.SparseVectorParams()}), 422),
        (lambda: client.update_collection("batch", vectors_config={"": models.VectorParamsDiff(
            quantization_config=models.BinaryQuantization(binary=models.BinaryQuantizationConfig()))}), 422),
        (lambda: client.update_collection("missing", optimizers_config=models.OptimizersConfigDiff()), 404),
    ]:  # fmt: skip
        with pytest.raises(UnexpectedResponse) as e:
            bad()
        assert e.value.status_code == status, e.value.content
    up = {"upsert": {"points": [{"id": 200, "vector": [0.1] * 384}]}}
    for ops, status, words in [
        ([up, {"delete": {"points": ["not-a-uuid"]}}], 422, "operations[1].delete.points"),
        ([up, {"update_vectors": {"points": []}}], 422, "operations[1].update_vectors"),
        ([up, {"upsert": {}, "delete": {}}], 422, "exactly one"),
        ([up, {"rename": {}}], 422, "unknown operation"),
    ]:  # refused before the first operation runs: point 200 is not written
        r = c.post("/qdrant/collections/batch/points/batch", json={"operations": ops})
        assert r.status_code == status and words in r.json()["status"]["error"], (ops, r.text)
        assert c.get("/qdrant/collections/batch/points/200").status_code == 404
    other = {"upsert": {"points": [{"id": 201, "vector": {"text": "x", "model": "another-model"}}]}}
    r = c.post("/qdrant/collections/batch/points/batch", json={"operations": [up, other]})
    assert r.status_code == 422 and r.json()["status"]["error"].startswith("Wrong input: operations[1].upsert: "), (
        r.text
    )
    assert c.get("/qdrant/collections/batch/points/200").status_code == 200  # the operation before it stayed applied
    client.delete_collection("batch")


def test_qdrant_query_points_groups(env, sts):
    """qdrant-client's query_points_groups: groups by a payload value (an array groups a point under each element),
    ordered by their best hit, each the group's best hits, as grouping the native search's hits by hand gives."""
    from qdrant_client import QdrantClient, models

    url, c = env["server"].url, env["client"]
    sentences, _, questions = sts
    client = QdrantClient(url=f"{url}/qdrant", cloud_inference=True, timeout=60)
    client.create_collection("groups", vectors_config=models.VectorParams(size=384, distance=models.Distance.COSINE))
    payloads = [{"doc": i // 5, "meta": {"tags": [f"t{i % 7}", f"t{i % 3}"]}} for i in range(120)]
    payloads[3]["doc"] = None  # no group value: never in a doc group
    client.upsert("groups", points=[models.PointStruct(id=i, vector=models.Document(text=s, model="all-minilm-l6-v2"),
                                                       payload=p) for i, (s, p) in enumerate(zip(sentences, payloads))])  # fmt: skip
    for q in questions[:3]:
        native = c.post("/collections/groups/search", json={"query": q, "top_k": 120}).json()
        for key, limit, size in (("doc", 4, 2), ("meta.tags", 3, 5)):
            got = client.query_points_groups("groups", group_by=key, query=models.Document(text=q, model="all-minilm-l6-v2"),
                                             limit=limit, group_size=size, with_payload=["doc"]).groups  # fmt: skip
            want: dict = {}
            for h in native:
                value = h["payload"]["doc"] if key == "doc" else h["payload"]["meta"]["tags"]
                for v in dict.fromkeys(value) if isinstance(value, list) else [value] if value is not None else []:
                    if v in want or len(want) < limit:
                        want.setdefault(v, [])
                        if len(want[v]) < size:
                            want[v].append(h["id"])
            assert [(g.id, [h.id for h in g.hits]) for g in got] == list(want.items())
            assert all(set(h.payload) == {"doc"} for g in got for h in g.hits)
            scores = [g.hits[0].score for g in got]
            assert scores == sorted(scores, reverse=True)
    r = c.post("/qdrant/collections/groups/points/query/groups",
               json={"query": 0, "group_by": "doc", "limit": 2, "group_size": 3, "with_vector": True})  # fmt: skip
    groups = r.json()["result"]["groups"]
    assert r.status_code == 200 and len(groups) == 2 and len(groups[0]["hits"][0]["vector"]) == 384, r.text
    assert 0 not in [h["id"] for g in groups for h in g["hits"]]  # a point-id query leaves the point out
    client.create_collection("groups-docs", vectors_config=models.VectorParams(size=384, distance="Cosine"))
    client.upsert("groups-docs", [models.PointStruct(id=d, vector=models.Document(text=f"doc {d}", model="all-minilm-l6-v2"),
                                                     payload={"title": f"doc {d}"}) for d in range(0, 24, 2)])  # fmt: skip
    got = client.query_points_groups("groups", group_by="doc", query=0, limit=6, group_size=1,
                                     with_lookup=models.WithLookup(collection="groups-docs", with_payload=True)).groups  # fmt: skip
    assert len(got) == 6 and all(g.lookup.payload == {"title": f"doc {g.id}"} if g.id % 2 == 0 else g.lookup is None
                                 for g in got), got  # fmt: skip
    for body, words in [({"query": 0, "group_by": "doc", "with_lookup": "missing-collection"}, "not found"),
                        ({"group_by": "doc"}, "without a query"),
                        ({"query": 0, "group_by": "doc", "limit": 100, "group_size": 100}, "collections_max_top_k")]:  # fmt: skip
        r = c.post("/qdrant/collections/groups/points/query/groups", json=body)
        assert r.status_code in (404, 422) and words in r.json()["status"]["error"], (body, r.text)
    client.delete_collection("groups")
    client.delete_collection("groups-docs")


def test_qdrant_facet(env, sts):
    """qdrant-client's facet: exact value counts of a payload key (dotted; an array counts a point once per distinct
    element; True and 1 apart), most frequent first, under a filter, as counting the payloads by hand gives."""
    from collections import Counter

    import numpy as np
    from qdrant_client import QdrantClient, models

    url = env["server"].url
    genres = sts[1]
    client = QdrantClient(url=f"{url}/qdrant", timeout=60)
    client.create_collection("facet", vectors_config=models.VectorParams(size=384, distance=models.Distance.COSINE))
    vecs = np.random.default_rng(0).standard_normal((len(genres), 384))
    payloads = [{"genre": g, "meta": {"tags": [["a", "b"], ["a", "a"], [], "c"][i % 4], "lang": "fr" if i % 5 else 7},
                 "mixed": True if i % 2 else 1} for i, g in enumerate(genres)]  # fmt: skip
    client.upsert("facet", points=[models.PointStruct(id=i, vector=v.tolist(), payload=p)
                                   for i, (v, p) in enumerate(zip(vecs, payloads))])  # fmt: skip

    def by_hand(key, rows, limit):
        counts = Counter()
        for p in rows:
            v = p["meta"][key.split(".")[1]] if key.startswith("meta.") else p[key]
            counts.update({(0 if type(x) is bool else 2 if type(x) is str else 1, x)  # ties: bools, ints, strings
                           for x in (v if isinstance(v, list) else [v])})  # fmt: skip
        return [(type(x), x, n) for (_, x), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]]

    news = models.Filter(must=[models.FieldCondition(key="genre", match=models.MatchValue(value="news"))])
    for key, flt, limit in (("genre", None, 10), ("meta.tags", None, 10), ("meta.lang", news, 10), ("mixed", None, 10),
                            ("meta.tags", news, 2)):  # fmt: skip
        rows = [p for p in payloads if flt is None or p["genre"] == "news"]
        hits = client.facet("facet", key=key, facet_filter=flt, limit=limit, exact=True).hits
        assert [(type(h.value), h.value, h.count) for h in hits] == by_hand(key, rows, limit), key  # True != 1 here
    assert client.facet("facet", key="absent").hits == []
    client.delete_collection("facet")


def test_qdrant_snapshots_create_download_recover(env, sts):
    """qdrant-client's collection snapshots: create, list, download (its SHA-256 is the checksum listed), recover over
    later writes from a file:// location (the collection is back as it was: count, payloads, the same top hits), into
    a new collection from the download URL (how a collection moves between servers), delete; bad checksums,
    locations and URLs are 422; ``wait=false`` answers 202. The milvus backend keeps no snapshots: 422 naming
    milvus-backup."""
    import hashlib

    from qdrant_client import QdrantClient, models
    from qdrant_client.http.exceptions import UnexpectedResponse

    url, c = env["server"].url, env["client"]
    sentences, genres, questions = sts
    client = QdrantClient(url=f"{url}/qdrant", cloud_inference=True, timeout=60)
    if env["backend"] == "milvus":
        client.create_collection("snap", vectors_config=models.VectorParams(size=384, distance=models.Distance.COSINE))
        with pytest.raises(UnexpectedResponse) as e:
            client.create_snapshot("snap")
        assert e.value.status_code == 422 and "milvus-backup" in str(e.value)
        client.delete_collection("snap")
        return
    client.create_collection("snap", vectors_config=models.VectorParams(size=384, distance=models.Distance.COSINE))
    doc = lambda t: models.Document(text=t, model="all-minilm-l6-v2")  # noqa: E731
    client.upsert("snap", points=[models.PointStruct(id=i, vector=doc(s), payload={"row": i, "genre": g})
                                  for i, (s, g) in enumerate(zip(sentences, genres))])  # fmt: skip

    def top(name):
        return [(p.id, round(p.score, 5)) for p in client.query_points(name, query=doc(questions[1]), limit=K).points]

    before = top("snap")
    d = client.create_snapshot("snap")
    assert d.name.startswith("snap-") and d.name.endswith(".snapshot") and d.size > 0
    assert [x.name for x in client.list_snapshots("snap")] == [d.name]
    body = c.get(f"/qdrant/collections/snap/snapshots/{d.name}")
    assert (
        body.status_code == 200
        and hashlib.sha256(body.content).hexdigest() == d.checksum
        and len(body.content) == d.size
    )
    # later writes, then the recovery undoes them
    client.delete("snap", points_selector=models.PointIdsList(points=list(range(50))))
    client.upsert("snap", points=[models.PointStruct(id=999, vector=doc(questions[1]), payload={"row": 999})])
    assert top("snap") != before
    location = f"file://{env['work'] / 'data' / 'snapshots' / 'snap' / d.name}"
    assert client.recover_snapshot("snap", location=location, checksum=d.checksum) is True
    assert client.count("snap").count == len(sentences) and top("snap") == before
    assert client.retrieve("snap", [0, 999]) == [models.Record(id=0, payload={"row": 0, "genre": genres[0]})]
    # into a new collection, downloaded from this server's own URL
    download = f"{url}/qdrant/collections/snap/snapshots/{d.name}"
    assert client.recover_snapshot("snap-copy", location=download, priority=models.SnapshotPriority.SNAPSHOT)
    assert client.count("snap-copy").count == len(sentences) and top("snap-copy") == before
    for loc, code in ((location, "checksum_mismatch"), ("file:///etc/passwd", "invalid_value"),
                      (download + ".missing", "snapshot_unreachable"), ("ftp://x/y", "invalid_value")):  # fmt: skip
        r = c.put("/collections/snap/snapshots/recover", json={"location": loc, "checksum": "0" * 64})
        assert r.status_code == 422 and r.json()["error"]["code"] == code, (loc, r.text)
    # uploaded (qdrant-client's API for POST .../snapshots/upload, multipart)
    upload = env["work"] / "upload.snapshot"
    upload.write_bytes(body.content)
    with open(upload, "rb") as f:
        assert client.http.snapshots_api.recover_from_uploaded_snapshot("snap-up", snapshot=f).result is True
    assert client.count("snap-up").count == len(sentences) and top("snap-up") == before
    client.delete_collection("snap-up")
    r = c.put("/collections/-bad/snapshots/recover", json={"location": location})
    assert r.status_code == 422 and r.json()["error"]["param"] == "name", r.text
    assert top("snap") == before
    # wait=false: accepted at once, done in the background; delete; a missing one is 404
    assert c.post("/qdrant/collections/snap/snapshots", params={"wait": "false"}).status_code == 202
    for _ in range(100):
        if len(client.list_snapshots("snap")) == 2:
            break
        time.sleep(0.1)
    names = [x.name for x in client.list_snapshots("snap")]
    assert len(names) == 2 and names[0] == d.name
    assert client.delete_snapshot("snap", d.name) is True
    assert [x.name for x in client.list_snapshots("snap")] == names[1:]
    r = c.get(f"/collections/snap/snapshots/{d.name}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "snapshot_not_found"
    client.delete_collection("snap")
    assert [x["name"] for x in c.get("/collections/snap/snapshots").json()["snapshots"]] == names[1:]  # kept
    client.delete_collection("snap-copy")


def test_snapshot_upload_streams_past_the_payload_limit(env):
    """A snapshot larger than max_payload_bytes (2 MiB) uploads through the native route, streamed to disk: the
    collection comes back point for point; a wrong checksum, a form without a ``snapshot`` file and a body that is
    not multipart are 422; nothing is left behind in the snapshots directory's downloads."""
    import numpy as np

    c = env["client"]
    if env["backend"] == "milvus":
        r = c.post("/collections/any/snapshots/upload", files={"snapshot": ("a", b"x")})
        assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported", r.text
        return
    n = 1500
    x = np.random.default_rng(0).standard_normal((n, 384)).astype(np.float32)
    assert c.put("/qdrant/collections/big", json={"vectors": {"size": 384, "distance": "Dot"}}).status_code == 200
    for s in range(0, n, 150):
        pts = [{"id": i, "vector": x[i].tolist(), "payload": {"i": i}} for i in range(s, min(n, s + 150))]
        assert c.put("/qdrant/collections/big/points", json={"points": pts}).status_code == 200
    d = c.post("/collections/big/snapshots").json()
    data = c.get(f"/collections/big/snapshots/{d['name']}").content
    assert len(data) > 2 * 2**20
    for files, params, code in (({"snapshot": ("s", data)}, {"checksum": "0" * 64}, "checksum_mismatch"),
                                ({"other": ("s", data)}, {}, "invalid_value")):  # fmt: skip
        r = c.post("/collections/big-up/snapshots/upload", files=files, params=params)
        assert r.status_code == 422 and r.json()["error"]["code"] == code, r.text
    r = c.post("/collections/big-up/snapshots/upload", content=data, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "snapshot", r.text
    r = c.post(
        "/collections/big-up/snapshots/upload", files={"snapshot": ("s", data)}, params={"checksum": d["checksum"]}
    )
    assert r.status_code == 200 and r.json()["count"] == n, r.text
    for i in (0, 777, n - 1):
        a = c.get(f"/collections/big-up/points/{i}", params={"with_vector": "true"}).json()
        assert a["payload"] == {"i": i} and np.allclose(a["vector"], x[i])
    hits = c.post("/collections/big-up/search", json={"query": x[5].tolist(), "top_k": 1}).json()
    assert hits[0]["id"] == 5
    assert not [p for p in (env["work"] / "data" / "snapshots" / ".downloads").iterdir()]
    for name in ("big", "big-up"):
        assert c.delete(f"/collections/{name}").status_code == 200


def test_qdrant_aliases_blue_green_switch(env, sts):
    """qdrant-client's collection aliases: an alias answers as its collection (queries, upserts, counts); a delete +
    create in one request moves it to another collection atomically; a request with a failing action changes
    nothing; aliases and collections share one namespace (409); a collection is not deleted by an alias (404) and
    takes its aliases with it when deleted. The native routes list the same aliases."""
    from qdrant_client import QdrantClient, models
    from qdrant_client.http.exceptions import UnexpectedResponse

    url, c = env["server"].url, env["client"]
    sentences, _, questions = sts
    client = QdrantClient(url=f"{url}/qdrant", cloud_inference=True, timeout=60)
    doc = lambda t: models.Document(text=t, model="all-minilm-l6-v2")  # noqa: E731
    for name, part in (("blue", sentences[:100]), ("green", sentences[100:])):
        client.create_collection(name, vectors_config=models.VectorParams(size=384, distance=models.Distance.COSINE))
        client.upsert(name, points=[models.PointStruct(id=i, vector=doc(t), payload={"row": i, "in": name})
                                    for i, t in enumerate(part)])  # fmt: skip

    def top(name):
        return [(p.id, p.payload["in"]) for p in client.query_points(name, query=doc(questions[2]), limit=K).points]

    def create(coll, alias):
        return models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name=coll, alias_name=alias))

    delete = lambda alias: models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias))  # noqa: E731
    assert client.update_collection_aliases(change_aliases_operations=[create("blue", "prod")])
    assert [(a.alias_name, a.collection_name) for a in client.get_aliases().aliases] == [("prod", "blue")]
    assert [a.alias_name for a in client.get_collection_aliases("blue").aliases] == ["prod"]
    assert top("prod") == top("blue") and {x[1] for x in top("prod")} == {"blue"}
    client.upsert("prod", points=[models.PointStruct(id=999, vector=doc(questions[2]), payload={"in": "blue"})])
    assert client.count("blue").count == 101 and top("prod")[0] == (999, "blue")
    assert client.get_collection("prod").points_count == 101
    # the switch: one request, both actions
    assert client.update_collection_aliases(change_aliases_operations=[delete("prod"), create("green", "prod")])
    assert top("prod") == top("green") and {x[1] for x in top("prod")} == {"green"}
    # all or none: the rename is undone by the failing delete after it
    rename = models.RenameAliasOperation(rename_alias=models.RenameAlias(old_alias_name="prod", new_alias_name="live"))
    with pytest.raises(UnexpectedResponse) as e:
        client.update_collection_aliases(change_aliases_operations=[rename, delete("missing")])
    assert e.value.status_code == 404
    assert [(a.alias_name, a.collection_name) for a in client.get_aliases().aliases] == [("prod", "green")]
    for ops in ([create("green", "blue")], [create("nope", "x")]):  # a collection's name; a missing collection
        with pytest.raises(UnexpectedResponse) as e:
            client.update_collection_aliases(change_aliases_operations=ops)
        assert e.value.status_code in (404, 409)
    r = c.put("/qdrant/collections/prod", json={"vectors": {"size": 384, "distance": "Cosine"}})
    assert r.status_code == 409, r.text
    assert c.delete("/collections/prod").status_code == 404 and client.collection_exists("green")
    assert c.get("/aliases").json() == {"aliases": [{"alias_name": "prod", "collection_name": "green"}]}
    assert c.get("/collections/green/aliases").json()["aliases"] == [{"alias_name": "prod", "collection_name": "green"}]
    client.delete_collection("green")
    assert client.get_aliases().aliases == [] and c.get("/collections/prod").status_code == 404
    client.delete_collection("blue")


def test_langchain_openai_embeddings_and_qdrant_store(env, sts):
    url, c = env["server"].url, env["client"]
    sentences, _, questions = sts
    question = questions[0]
    # --- snippet: LangChain
    from langchain_openai import OpenAIEmbeddings
    from langchain_qdrant import QdrantVectorStore

    embeddings = OpenAIEmbeddings(
        model="all-minilm-l6-v2", base_url=f"{url}/v1", api_key="none", check_embedding_ctx_length=False, chunk_size=256
    )
    store = QdrantVectorStore.from_texts(
        sentences,
        embeddings,
        metadatas=[{"row": i} for i in range(len(sentences))],
        url=f"{url}/qdrant",
        collection_name="sts-langchain",
    )
    docs = store.similarity_search_with_score(question, k=5)
    # --- end snippet
    assert [d.metadata["row"] for d, _ in docs] == native_rows(c, "sts-langchain", question)
    from qdrant_client import QdrantClient

    again = QdrantVectorStore(client=QdrantClient(url=f"{url}/qdrant", timeout=60), collection_name="sts-langchain",
                              embedding=embeddings)  # a pre-built client; the collection's config checked  # fmt: skip
    for q in questions[1:]:
        assert [d.metadata["row"] for d in again.similarity_search(q, k=K)] == native_rows(c, "sts-langchain", q)
    ids = [str(uuid.uuid4()) for _ in range(2)]
    again.add_texts(["A cat sleeps on the sofa.", "The stock market rallied."], ids=ids, metadatas=[{"row": -1}] * 2)
    assert [d.page_content for d in again.get_by_ids(ids)] == ["A cat sleeps on the sofa.", "The stock market rallied."]
    again.delete(ids=ids)
    assert again.get_by_ids(ids) == []
    assert c.delete("/collections/sts-langchain").status_code == 200


def test_token_id_input_is_refused_with_the_flag_to_set(env):
    """LangChain's default (check_embedding_ctx_length=True) sends tiktoken cl100k ids. tiktoken cannot download
    cl100k_base here (no network), so a byte-level stand-in encoding is registered under that name: LangChain's code
    runs unchanged and sends token-id lists as it does with the real one; the service refuses them."""
    import openai
    import tiktoken
    import tiktoken.registry
    from langchain_openai import OpenAIEmbeddings

    url = env["server"].url
    stand_in = tiktoken.Encoding("cl100k_base", pat_str=r"\S+|\s+", mergeable_ranks={bytes([i]): i for i in range(256)},
                                 special_tokens={})  # fmt: skip
    saved = tiktoken.registry.ENCODINGS.get("cl100k_base")
    tiktoken.registry.ENCODINGS["cl100k_base"] = stand_in
    try:
        default = OpenAIEmbeddings(model="all-minilm-l6-v2", base_url=f"{url}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.UnprocessableEntityError) as e:
            default.embed_query("A man is playing a guitar.")
    finally:
        if saved is None:
            tiktoken.registry.ENCODINGS.pop("cl100k_base", None)
        else:
            tiktoken.registry.ENCODINGS["cl100k_base"] = saved
    err = e.value.body
    assert err["code"] == "token_ids_unsupported" and "check_embedding_ctx_length=False" in err["message"]
    r = env["client"].post("/v1/embeddings", json={"input": [[101, 2023, 102]], "model": "all-minilm-l6-v2"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "token_ids_unsupported"


def test_llamaindex_openai_like_embedding_and_qdrant_store(env, corpus):
    url, c = env["server"].url, env["client"]
    sentences, question = corpus, "What did the scientists discover about the climate?"
    # --- snippet: LlamaIndex
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.schema import TextNode
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding
    from llama_index.vector_stores.qdrant import QdrantVectorStore as LlamaQdrantStore
    from qdrant_client import QdrantClient

    embed_model = OpenAILikeEmbedding(model_name="all-minilm-l6-v2", api_base=f"{url}/v1", api_key="none")
    store = LlamaQdrantStore(collection_name="corpus-llama", client=QdrantClient(url=f"{url}/qdrant", timeout=60))
    index = VectorStoreIndex(
        [TextNode(text=s, metadata={"row": i}) for i, s in enumerate(sentences)],
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=embed_model,
    )
    nodes = index.as_retriever(similarity_top_k=5).retrieve(question)
    # --- end snippet
    assert [n.node.metadata["row"] for n in nodes] == native_rows(c, "corpus-llama", question)
    for q in ("A film about a family.", "The president spoke about the economy."):
        got = index.as_retriever(similarity_top_k=K).retrieve(q)
        assert [n.node.metadata["row"] for n in got] == native_rows(c, "corpus-llama", q)
    assert c.delete("/collections/corpus-llama").status_code == 200


def test_native_vectors_scroll_and_count(env, sts):
    """The core additions through the native API: points given as vectors, scroll pages, exact counts."""
    c = env["client"]
    sentences = sts[0][:30]
    assert c.put("/collections/native-scroll", json={"index": "hnsw"}).status_code == 200
    vecs = c.post("/v1/embeddings", json={"input": sentences[:10]}).json()["data"]
    pts = [{"id": i, "vector": v["embedding"], "payload": {"row": i}} for i, v in enumerate(vecs)]
    pts += [{"id": f"s{i}", "text": s, "payload": {"row": i}} for i, s in enumerate(sentences[10:], 10)]
    assert c.put("/collections/native-scroll/points", json={"points": pts}).status_code == 200
    hit = c.post("/collections/native-scroll/search", json={"query": sentences[3], "top_k": 1}).json()[0]
    assert hit["id"] == 3 and hit["text"] == "" and hit["score"] > 0.999
    seen, start = [], None
    while True:
        r = c.post("/collections/native-scroll/points/scroll", json={"limit": 7, "start": start}).json()
        seen += [p["id"] for p in r["points"]]
        if (start := r["next"]) is None:
            break
    if env["backend"] == "milvus":  # the stored keys' byte order (the id's JSON text)
        order = sorted(seen, key=lambda i: f'"{i}"' if isinstance(i, str) else str(i))
    else:  # Qdrant's: integer ids numerically, then string ids
        order = sorted(seen, key=lambda i: (1, i, 0) if isinstance(i, str) else (0, "", i))
    assert seen == order and len(set(seen)) == 30
    flt = {"row": {"$gte": 25}}
    assert c.post("/collections/native-scroll/points/count", json={"filter": flt}).json() == {"count": 5}
    r = c.post("/collections/native-scroll/points/scroll", json={"filter": flt, "limit": 10, "with_vector": True})
    assert len(r.json()["points"]) == 5 and len(r.json()["points"][0]["vector"]) == 384
    bad = c.put("/collections/native-scroll/points", json={"points": [{"id": 1}]})
    assert bad.status_code == 422 and "text" in bad.json()["error"]["message"]
    assert c.delete("/collections/native-scroll").status_code == 200


def test_openai_sdk_and_tei_client(env, sts, monkeypatch):
    """``/v1/embeddings`` through the OpenAI SDK and TEI's ``POST /`` through huggingface_hub's TEI client give the
    same vectors, and its ``sentence_similarity`` their cosines. The suite sets HF_HUB_OFFLINE=1 (no hub downloads), which huggingface_hub applies to every URL: it is
    lifted for this test, whose only URL is the loopback server."""
    import huggingface_hub.constants
    import numpy as np

    monkeypatch.setattr(huggingface_hub.constants, "is_offline_mode", lambda: False)

    url = env["server"].url
    sentences = sts[0][:8]
    # --- snippet: OpenAI SDK
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none")
    vectors = [d.embedding for d in client.embeddings.create(model="all-minilm-l6-v2", input=sentences).data]
    # --- end snippet
    # --- snippet: TEI client
    from huggingface_hub import InferenceClient

    tei = InferenceClient(model=url)  # TEI's POST / (or f"{url}/embed")
    vector = tei.feature_extraction(sentences[0])  # numpy array, shape (1, 384)
    scores = InferenceClient(model=f"{url}/similarity").sentence_similarity(sentences[0], sentences[1:])
    # --- end snippet
    assert len(vectors) == 8 and np.allclose(np.asarray(vector).reshape(-1), vectors[0], atol=1e-5)
    v = np.asarray(vectors)
    np.testing.assert_allclose(scores, v[1:] @ v[0], atol=1e-5)  # cosine of unit vectors


def _words(text: str) -> dict[str, list]:
    """A term-count sparse vector of a text (lower-cased words, each hashed to a 20-bit index)."""
    import zlib

    counts: dict[int, float] = {}
    for w in text.lower().replace(".", " ").replace(",", " ").split():
        t = zlib.crc32(w.encode()) % (1 << 20)
        counts[t] = counts.get(t, 0.0) + 1.0
    return {"indices": list(counts), "values": list(counts.values())}


def test_named_dense_and_sparse_vectors_agree_with_qdrant_client_local_mode(env, sts):
    """A collection of named vectors (one bound to the model, two client-supplied of other distances, a sparse one
    with IDF) answers as qdrant-client's own in-memory local mode (the oracle) for every vector, with filters,
    has_vector, update_vectors and delete_vectors; the milvus backend refuses what Milvus 2.3 cannot hold."""
    import numpy as np
    from qdrant_client import QdrantClient, models
    from qdrant_client.http.exceptions import UnexpectedResponse

    sentences, genres, questions = sts
    remote = QdrantClient(url=f"{env['server'].url}/qdrant", cloud_inference=True, timeout=120)
    config = {"meaning": models.VectorParams(size=384, distance=models.Distance.COSINE),
              "image": models.VectorParams(size=64, distance=models.Distance.DOT),
              "code": models.VectorParams(size=32, distance=models.Distance.EUCLID)}  # fmt: skip
    sparse = {"words": models.SparseVectorParams(modifier=models.Modifier.IDF)}
    if env["backend"] == "milvus":
        with pytest.raises(UnexpectedResponse) as e:
            remote.create_collection("named", vectors_config=config, sparse_vectors_config=sparse)
        assert e.value.status_code == 422 and "Milvus 2.3" in str(e.value.content)
        # one vector bound to the model, named: Milvus holds it, under its name
        remote.create_collection("one", vectors_config={"meaning": config["meaning"]})
        remote.upsert(
            "one",
            [
                models.PointStruct(
                    id=1, vector={"meaning": models.Document(text=sentences[0], model="all-minilm-l6-v2")}
                )
            ],
        )
        got = remote.query_points("one", query=models.Document(text=sentences[0], model="all-minilm-l6-v2"),
                                  using="meaning", with_vectors=True).points  # fmt: skip
        assert [p.id for p in got] == [1] and list(got[0].vector) == ["meaning"]
        return
    rng = np.random.default_rng(7)
    n = len(sentences)
    image, code = rng.standard_normal((n, 64)).round(4), rng.standard_normal((n, 32)).round(4)
    points = []
    for i, s in enumerate(sentences):
        v: dict = {
            "meaning": models.Document(text=s, model="all-minilm-l6-v2"),
            "words": models.SparseVector(**_words(s)),
        }
        if i % 5:
            v["image"] = image[i].tolist()
        if i % 7:
            v["code"] = code[i].tolist()
        points.append(models.PointStruct(id=i, vector=v, payload={"row": i, "genre": genres[i]}))
    remote.create_collection("named", vectors_config=config, sparse_vectors_config=sparse)
    remote.upsert("named", points)
    # the oracle gets the same points, the model-bound vectors as the server embedded them
    stored = {p.id: p.vector["meaning"] for p in remote.retrieve("named", list(range(n)), with_vectors=["meaning"])}
    local = QdrantClient(":memory:")
    local.create_collection("named", vectors_config=config, sparse_vectors_config=sparse)
    local.upsert("named", [models.PointStruct(id=p.id, vector={**p.vector, "meaning": stored[p.id]}, payload=p.payload)
                           for p in points])  # fmt: skip
    info = remote.get_collection("named").config.params
    assert info.vectors["image"].size == 64 and info.sparse_vectors["words"].modifier == models.Modifier.IDF

    def agree(a: list, b: list) -> None:
        """Same scores; the same ids, in order except among equal scores (Qdrant leaves ties unordered) and in the
        last group of equal scores (which of several tied points make the cut)."""
        assert np.allclose([p.score for p in a], [p.score for p in b], atol=1e-4)
        groups: dict[float, list[set]] = {}
        for hits in (a, b):
            for p in hits:
                groups.setdefault(round(p.score, 3), [set(), set()])[hits is b].add(p.id)
        last = round(a[-1].score, 3) if a else None
        assert all(x == y for s, (x, y) in groups.items() if s != last), groups

    exact = models.SearchParams(exact=True)
    news = models.Filter(must=[models.FieldCondition(key="genre", match=models.MatchValue(value="news"))])
    has_image = models.Filter(must=[models.HasVectorCondition(has_vector="image")])
    q_meaning = remote.query_points("named", query=stored[3], using="meaning", limit=1).points[0]
    assert q_meaning.id == 3
    queries = {"meaning": np.asarray(stored[11]) + 0.01, "image": rng.standard_normal(64),
               "code": rng.standard_normal(32), "words": models.SparseVector(**_words(questions[1]))}  # fmt: skip
    for using, q in queries.items():
        q = q.tolist() if isinstance(q, np.ndarray) else q
        for flt in (None, news, has_image):
            got = [c.query_points("named", query=q, using=using, query_filter=flt, limit=10, search_params=exact,
                                  with_vectors=[using]).points for c in (remote, local)]  # fmt: skip
            assert got[0], (using, flt)
            agree(*got)
            theirs = {p.id: p.vector[using] for p in got[1]}
            for a in got[0]:
                if a.id not in theirs:  # a tie at the cut
                    continue
                va, vb = a.vector[using], theirs[a.id]
                if using == "words":
                    assert va.indices == vb.indices and np.allclose(va.values, vb.values)
                else:
                    assert np.allclose(va, vb, atol=1e-5)
    # a Document queries the model-bound vector like its embedding does
    doc = models.Document(text=questions[1], model="all-minilm-l6-v2")
    by_doc = remote.query_points("named", query=doc, using="meaning", limit=5).points
    emb = remote.query_points("named", query=by_doc[0].id, using="meaning", limit=1).points
    assert by_doc and emb
    for c in (remote, local):
        c.update_vectors(
            "named",
            [
                models.PointVectors(id=5, vector={"image": [1.0] * 64}),
                models.PointVectors(id=6, vector={"words": models.SparseVector(indices=[3], values=[2.0])}),
            ],
        )
        c.delete_vectors("named", vectors=["code"], points=models.FilterSelector(filter=news))
        c.delete_vectors("named", vectors=["image", "words"], points=[8])
        c.set_payload("named", {"seen": True}, points=[5, 9])  # a payload rewrite keeps every vector
    for a, b in zip(
        *(c.retrieve("named", [5, 6, 8, 9], with_vectors=True, with_payload=True) for c in (remote, local))
    ):
        assert a.id == b.id and sorted(a.vector) == sorted(b.vector) and a.payload == b.payload, (a.id, a.vector.keys())
    has_code = models.Filter(must=[models.HasVectorCondition(has_vector="code")])
    assert remote.count("named", count_filter=has_code).count == local.count("named", count_filter=has_code).count
    agree(*(c.query_points("named", query=[1.0] * 64, using="image", limit=3).points for c in (remote, local)))
    for bad in (lambda: remote.query_points("named", query=[0.1] * 64, using="nope"),
                lambda: remote.query_points("named", query=models.Document(text="x", model="all-minilm-l6-v2"),
                                            using="image"),
                lambda: remote.delete_vectors("named", vectors=["meaning"], points=[1])):  # fmt: skip
        with pytest.raises(UnexpectedResponse) as e:
            bad()
        assert e.value.status_code == 422, e.value.content


def test_hybrid_search_snippets(env, sts):
    """README's hybrid search snippets: dense + server-side BM25 fused by RRF, through qdrant-client (Documents
    embedded by the server, prefetch + fusion) and the native API (``mode: hybrid``), with the same answer."""
    from qdrant_client.http.exceptions import UnexpectedResponse

    url = env["server"].url
    sentences, _, questions = sts
    question = questions[2]
    if env["backend"] == "milvus":  # Milvus 2.3: one vector per collection, no sparse vectors
        r = env["client"].put("/collections/docs", json={"sparse_vectors": {"bm25": {"model": "qdrant/bm25"}}})
        assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported"
        return
    # --- snippet: hybrid search (qdrant-client)
    from qdrant_client import QdrantClient, models

    client = QdrantClient(url=f"{url}/qdrant", cloud_inference=True, timeout=60)
    client.create_collection(
        "hybrid",
        vectors_config={"dense": models.VectorParams(size=384, distance=models.Distance.COSINE)},
        sparse_vectors_config={"bm25": models.SparseVectorParams(modifier=models.Modifier.IDF)},
    )
    client.upsert(
        "hybrid",
        points=[
            models.PointStruct(
                id=i,
                payload={"text": s},
                vector={
                    "dense": models.Document(text=s, model="all-minilm-l6-v2"),  # embedded by the service
                    "bm25": models.Document(text=s, model="qdrant/bm25"),  # BM25, made by the service too
                },
            )
            for i, s in enumerate(sentences)
        ],
    )
    hits = client.query_points(
        "hybrid",
        prefetch=[
            models.Prefetch(query=models.Document(text=question, model="all-minilm-l6-v2"), using="dense", limit=20),
            models.Prefetch(query=models.Document(text=question, model="qdrant/bm25"), using="bm25", limit=20),
        ],
        query=models.FusionQuery(fusion=models.Fusion.RRF),
        limit=5,
    ).points
    # --- end snippet
    # --- snippet: hybrid search (native API)
    import httpx

    httpx.put(
        f"{url}/collections/docs",
        json={
            "vectors": {"dense": {"model": True}},
            "sparse_vectors": {"bm25": {"modifier": "idf", "model": "qdrant/bm25"}},
        },
    )
    points = [{"id": i, "text": s} for i, s in enumerate(sentences)]
    httpx.put(f"{url}/collections/docs/points", json={"points": points})
    native = httpx.post(
        f"{url}/collections/docs/search", json={"query": question, "mode": "hybrid", "candidates": 20, "top_k": 5}
    ).json()
    # --- end snippet
    assert len(hits) == 5 and [h.id for h in hits] == [h["id"] for h in native]
    assert [round(h.score, 6) for h in hits] == [round(h["score"], 6) for h in native]
    with pytest.raises(UnexpectedResponse):  # BM25 is the service's: another sparse model is refused
        client.query_points("hybrid", query=models.Document(text=question, model="prithivida/splade"), using="bm25")


def test_lookup_from_reads_query_ids_from_another_collection(env):
    """``lookup_from``: a query by point id, a recommendation and a prefetch whose ids name points of another
    collection's vector, against qdrant-client's local mode (the ids are not left out of the hits there)."""
    if env["backend"] == "milvus":
        pytest.skip("client-supplied named vectors: embedded only (Milvus 2.3 holds one vector)")
    import numpy as np
    from qdrant_client import QdrantClient, models
    from qdrant_client.http.exceptions import UnexpectedResponse

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((40, 8)).round(3), rng.standard_normal((10, 8)).round(3)
    remote = QdrantClient(url=f"{env['server'].url}/qdrant", timeout=60)
    local = QdrantClient(":memory:")
    for c in (remote, local):
        c.create_collection("lk-a", vectors_config={"v": models.VectorParams(size=8, distance=models.Distance.DOT)})
        c.create_collection("lk-b", vectors_config={"w": models.VectorParams(size=8, distance=models.Distance.DOT)})
        c.upsert("lk-a", [models.PointStruct(id=i, vector={"v": x.tolist()}) for i, x in enumerate(a)])
        c.upsert("lk-b", [models.PointStruct(id=i, vector={"w": x.tolist()}) for i, x in enumerate(b)])
    lookup = models.LookupLocation(collection="lk-b", vector="w")
    queries = [
        dict(query=3),
        dict(query=models.RecommendQuery(recommend=models.RecommendInput(positive=[1, 2], negative=[5]))),
        dict(prefetch=models.Prefetch(query=4, using="v", lookup_from=lookup, limit=20), query=7),
    ]
    for q in queries:
        got = [
            [
                (p.id, round(p.score, 4))
                for p in c.query_points("lk-a", using="v", lookup_from=lookup, limit=5, **q).points
            ]
            for c in (remote, local)
        ]
        assert got[0] == got[1], q
    with pytest.raises(UnexpectedResponse) as e:  # an id the lookup collection lacks
        remote.query_points("lk-a", query=99, using="v", lookup_from=lookup)
    assert e.value.status_code == 404
    # a collection with no model-bound vector snapshots and recovers (its manifest names no model)
    snap = remote.create_snapshot("lk-b")
    location = f"{env['server'].url}/qdrant/collections/lk-b/snapshots/{snap.name}"
    assert remote.recover_snapshot("lk-b-copy", location=location, checksum=snap.checksum) is True
    pts = remote.retrieve("lk-b-copy", list(range(10)), with_vectors=True)
    assert [np.round(p.vector["w"], 3).tolist() for p in pts] == b.tolist()


def test_explore_queries_agree_with_local_mode(env):
    """Qdrant's Explore queries (recommend by best_score and sum_scores, discover with and without context, context)
    on cosine, dot and Euclid vectors score as qdrant-client's local mode scores them (the example points left out)."""
    if env["backend"] == "milvus":
        pytest.skip("client-supplied named vectors: embedded only (Milvus 2.3 holds one vector)")
    import numpy as np
    from qdrant_client import QdrantClient, models

    rng = np.random.default_rng(8)
    x = rng.standard_normal((80, 6)).round(3)
    remote = QdrantClient(url=f"{env['server'].url}/qdrant", timeout=60)
    local = QdrantClient(":memory:")
    dists = {"c": models.Distance.COSINE, "d": models.Distance.DOT, "e": models.Distance.EUCLID}
    sparse = [models.SparseVector(indices=sorted({i % 9, 9 + i % 5, 20 + i % 3}), values=[1.0 + i / 50, 0.5, 0.25])
              for i in range(len(x))]  # fmt: skip
    for c in (remote, local):
        c.create_collection("explore", vectors_config={n: models.VectorParams(size=6, distance=d) for n, d in dists.items()},
                            sparse_vectors_config={"s": models.SparseVectorParams(modifier=models.Modifier.IDF)})  # fmt: skip
        c.upsert("explore", [models.PointStruct(id=i, vector={**{n: v.tolist() for n in dists}, "s": sparse[i]})
                             for i, v in enumerate(x)])  # fmt: skip
    pair = models.ContextPair
    queries = [
        models.RecommendQuery(recommend=models.RecommendInput(positive=[1, 2], negative=[3], strategy="best_score")),
        models.RecommendQuery(recommend=models.RecommendInput(negative=[4, 5], strategy="best_score")),
        models.RecommendQuery(
            recommend=models.RecommendInput(positive=[6, x[7].tolist()], negative=[8], strategy="sum_scores")
        ),  # fmt: skip
        models.DiscoverQuery(
            discover=models.DiscoverInput(
                target=9, context=[pair(positive=10, negative=11), pair(positive=12, negative=13)]
            )
        ),  # fmt: skip
        models.DiscoverQuery(discover=models.DiscoverInput(target=x[14].tolist(), context=[])),
        models.ContextQuery(context=[pair(positive=15, negative=16), pair(positive=17, negative=18)]),
    ]
    queries.append(models.RecommendQuery(recommend=models.RecommendInput(positive=[22, 23], negative=[24])))
    for using in [*dists, "s"]:
        for q in queries:
            if using == "s" and (q is queries[2] or q is queries[4]):  # raw dense examples
                continue
            flt = models.Filter(must_not=[models.HasIdCondition(has_id=[20, 21])])
            got, want = (c.query_points("explore", query=q, using=using, limit=8, query_filter=flt).points
                         for c in (remote, local))  # fmt: skip
            assert np.allclose([p.score for p in got], [p.score for p in want], atol=1e-4), (using, q)
            # ties are unordered in Qdrant (and which tied points make the cut): the ids must agree where a score
            # is held by one point only and is not the last one's
            unique = [i for i, w in enumerate(want) if sum(abs(w.score - o.score) < 1e-4 for o in want) == 1
                      and abs(w.score - want[-1].score) >= 1e-4]  # fmt: skip
            assert [got[i].id for i in unique] == [want[i].id for i in unique], (using, q)
    r = httpx.post(f"{env['server'].url}/qdrant/collections/explore/points/query",
                   json={"query": {"discover": {"target": [1.0] * 5, "context": []}}, "using": "c"})  # fmt: skip
    assert r.status_code == 422 and "dimension" in r.text


def test_multivectors_agree_with_local_mode(env):
    """Multivectors (``multivector_config: max_sim``, as ColBERT's late interaction): matrices of varying row counts
    stored, returned and searched by MAX_SIM on cosine, dot and Euclid, as qdrant-client's local mode does."""
    if env["backend"] == "milvus":
        pytest.skip("client-supplied named vectors: embedded only (Milvus 2.3 holds one vector)")
    import numpy as np
    from qdrant_client import QdrantClient, models

    rng = np.random.default_rng(5)
    remote = QdrantClient(url=f"{env['server'].url}/qdrant", timeout=60)
    local = QdrantClient(":memory:")
    multi = models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)
    dists = {"c": models.Distance.COSINE, "d": models.Distance.DOT, "e": models.Distance.EUCLID}
    mats = {i: {n: rng.standard_normal((1 + (i + k) % 4, 5)).round(3).tolist() for k, n in enumerate(dists)}
            for i in range(40)}  # fmt: skip
    for c in (remote, local):
        c.create_collection("multi", vectors_config={n: models.VectorParams(size=5, distance=d, multivector_config=multi)
                                                     for n, d in dists.items()})  # fmt: skip
        c.upsert("multi", [models.PointStruct(id=i, vector=v if i % 6 else {"c": v["c"]}) for i, v in mats.items()])
        c.update_vectors("multi", [models.PointVectors(id=7, vector={"d": [[1.0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0]]})])
    info = remote.get_collection("multi").config.params.vectors["c"]
    assert info.multivector_config.comparator == models.MultiVectorComparator.MAX_SIM
    q = rng.standard_normal((3, 5)).round(3).tolist()
    for using in dists:
        for flt in (None, models.Filter(must=[models.HasVectorCondition(has_vector="e")])):
            got, want = (c.query_points("multi", query=q, using=using, limit=6, query_filter=flt, with_vectors=[using])
                         .points for c in (remote, local))  # fmt: skip
            assert [p.id for p in got] == [p.id for p in want], using
            assert np.allclose([p.score for p in got], [p.score for p in want], atol=1e-4), using
            assert np.allclose(got[0].vector[using], want[0].vector[using], atol=1e-5)
    assert remote.count("multi", count_filter=flt).count == local.count("multi", count_filter=flt).count
    from qdrant_client.http.exceptions import UnexpectedResponse

    with pytest.raises(UnexpectedResponse) as e:
        remote.query_points("multi", query=[[1.0] * 4], using="c")  # rows of another dimension
    assert e.value.status_code == 422


def test_order_by_and_sample_agree_with_local_mode(env):
    """Scroll and query ``order_by`` (numbers, arrays, datetimes; asc, desc, ``start_from``; a filter; over a
    query's prefetches) give the entries and order values qdrant-client's local mode gives; ``sample: random`` draws
    distinct matching points, all of them when the limit allows."""
    if env["backend"] == "milvus":
        pytest.skip("client-supplied named vectors: embedded only (Milvus 2.3 holds one vector)")
    import numpy as np
    from qdrant_client import QdrantClient, models

    rng = np.random.default_rng(11)
    remote = QdrantClient(url=f"{env['server'].url}/qdrant", timeout=60)
    local = QdrantClient(":memory:")

    def payload(i: int) -> dict:
        p = {
            "n": int(rng.integers(0, 40)),
            "x": float(rng.normal()),
            "arr": rng.integers(0, 9, i % 4).tolist(),
            "when": f"2024-0{1 + i % 9}-1{i % 10}T0{i % 10}:30:00" + ("Z" if i % 2 else "+02:00"),
            "kind": i % 3,
            "o": {"n": [int(rng.integers(0, 9)), 2.5] if i % 4 else int(rng.integers(0, 9))},
        }
        if i % 5 == 0:
            p["x"], p["when"] = "not a number", True
        if i % 7 == 0:
            del p["n"]
        return p  # fmt: skip

    points = [models.PointStruct(id=i, vector={"v": rng.standard_normal(4).tolist()}, payload=payload(i))
              for i in range(60)]  # fmt: skip
    for c in (remote, local):
        c.create_collection("ordered", vectors_config={"v": models.VectorParams(size=4, distance="Cosine")})
        c.upsert("ordered", points)

    flt = models.Filter(must=[models.FieldCondition(key="kind", match=models.MatchAny(any=[0, 1]))])
    orders = [models.OrderBy(key=k, direction=d, start_from=s) for k in ("n", "x", "arr", "when", "o.n")
              for d in ("asc", "desc") for s in (None, 3)] + ["n"]  # fmt: skip
    for ob in orders:
        for f in (None, flt):
            got, want = (c.scroll("ordered", limit=25, order_by=ob, scroll_filter=f, with_payload=True)[0]
                         for c in (remote, local))  # fmt: skip
            assert [p.order_value for p in got] == [p.order_value for p in want], (ob, f)
            # ties keep no particular order: the points must agree where a value is held once
            once = [i for i, p in enumerate(want) if sum(o.order_value == p.order_value for o in want) == 1]
            assert [got[i].id for i in once] == [want[i].id for i in once], (ob, f)
    q = rng.standard_normal(4).tolist()
    for prefetch in (
        None,
        [models.Prefetch(query=q, using="v", limit=15), models.Prefetch(query=[-x for x in q], using="v", limit=5)],
    ):
        got, want = (c.query_points("ordered", prefetch=prefetch, query=models.OrderByQuery(order_by="x"),
                                    query_filter=flt, limit=8, offset=2).points for c in (remote, local))  # fmt: skip
        assert [(p.order_value, p.score) for p in got] == [(p.order_value, p.score) for p in want]
        assert [p.id for p in got] == [p.id for p in want]  # x is a continuous value: no ties
    everything = remote.query_points("ordered", query=models.SampleQuery(sample="random"), limit=100).points
    assert sorted(p.id for p in everything) == list(range(60)) and {p.score for p in everything} == {1.0}
    some = remote.query_points("ordered", query=models.SampleQuery(sample="random"), query_filter=flt, limit=10)
    ids = [p.id for p in some.points]
    assert len(set(ids)) == 10 and all(points[i].payload["kind"] in (0, 1) for i in ids)
    r = httpx.post(f"{env['server'].url}/qdrant/collections/ordered/points/scroll",
                   json={"order_by": {"key": "n", "direction": "up"}})  # fmt: skip
    assert r.status_code == 422 and "direction" in r.text
    r = httpx.post(f"{env['server'].url}/qdrant/collections/ordered/points/scroll", json={"order_by": "n", "offset": 3})
    assert r.status_code == 422 and "offset" in r.text


def test_mmr_and_relevance_feedback_agree_with_local_mode(env):
    """MMR re-ranking (``nearest`` + ``mmr``: diversity, candidates_limit, offset, score_threshold) on cosine, dot,
    Euclid, sparse and multivector vectors, and relevance feedback (naive strategy) take the points, in the order and
    with the scores, qdrant-client's local mode gives."""
    if env["backend"] == "milvus":
        pytest.skip("client-supplied named vectors: embedded only (Milvus 2.3 holds one vector)")
    import numpy as np
    from qdrant_client import QdrantClient, models

    rng = np.random.default_rng(12)
    remote = QdrantClient(url=f"{env['server'].url}/qdrant", timeout=60)
    local = QdrantClient(":memory:")
    dists = {"c": models.Distance.COSINE, "d": models.Distance.DOT, "e": models.Distance.EUCLID}
    multi = models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)
    x = rng.standard_normal((70, 5)).round(3)
    for c in (remote, local):
        c.create_collection("mmr", vectors_config={**{n: models.VectorParams(size=5, distance=d) for n, d in dists.items()},
                                                   "m": models.VectorParams(size=5, distance="Cosine", multivector_config=multi)},
                            sparse_vectors_config={"s": models.SparseVectorParams(modifier=models.Modifier.IDF)})  # fmt: skip
        c.upsert("mmr", [models.PointStruct(id=i, vector={**{n: v.tolist() for n in dists}, "m": [v.tolist(), x[i - 1].tolist()],
                         "s": models.SparseVector(indices=[i % 7, 7 + i % 4], values=[1 + i / 70, 0.5])})
                         for i, v in enumerate(x)])  # fmt: skip
    q = rng.standard_normal(5).round(3).tolist()
    queries = {n: q for n in dists} | {
        "m": [q, x[3].tolist()],
        "s": models.SparseVector(indices=[1, 2, 8], values=[1.0, 0.5, 0.2]),
    }
    for using, vec in queries.items():
        for mmr, kw in [
            (models.Mmr(), {}),
            (models.Mmr(diversity=0.3, candidates_limit=30), {"offset": 2}),
            (models.Mmr(diversity=0.9, candidates_limit=20), {"score_threshold": 0.1 if using != "e" else None}),
        ]:
            got, want = (c.query_points("mmr", query=models.NearestQuery(nearest=vec, mmr=mmr), using=using, limit=6,
                                        **kw).points for c in (remote, local))  # fmt: skip
            assert [p.id for p in got] == [p.id for p in want], (using, mmr)
            assert np.allclose([p.score for p in got], [p.score for p in want], atol=1e-4), (using, mmr)
    fb = models.RelevanceFeedbackInput(target=q, feedback=[models.FeedbackItem(example=i, score=s) for i, s in
                                                           [(1, 0.9), (2, 0.8), (3, 0.7), (4, 0.6), (5, 0.6)]],
                                       strategy=models.NaiveFeedbackStrategy(naive=models.NaiveFeedbackStrategyParams(a=0.5, b=1.0, c=0.7)))  # fmt: skip
    for using in dists:
        got, want = (c.query_points("mmr", query=models.RelevanceFeedbackQuery(relevance_feedback=fb), using=using,
                                    limit=10).points for c in (remote, local))  # fmt: skip
        assert [p.id for p in got] == [p.id for p in want], using
        assert np.allclose([p.score for p in got], [p.score for p in want], atol=1e-4), using
    r = httpx.post(f"{env['server'].url}/qdrant/collections/mmr/points/query",
                   json={"query": {"nearest": q, "mmr": {"diversity": 2}}, "using": "c"})  # fmt: skip
    assert r.status_code == 422 and "diversity" in r.text


def test_distance_matrix_agrees_with_local_mode(env):
    """The distance matrix (pairs and offsets; a filter; dense cosine and Euclid, sparse) of a sample holding every
    matching point equals qdrant-client's local mode's; fewer than two sampled points give an empty matrix."""
    if env["backend"] == "milvus":
        pytest.skip("client-supplied named vectors: embedded only (Milvus 2.3 holds one vector)")
    import numpy as np
    from qdrant_client import QdrantClient, models

    rng = np.random.default_rng(13)
    remote = QdrantClient(url=f"{env['server'].url}/qdrant", timeout=60)
    local = QdrantClient(":memory:")
    points = [models.PointStruct(id=i, payload={"k": i % 3}, vector={
        "c": rng.standard_normal(4).tolist(), "e": rng.standard_normal(4).tolist(),
        "s": models.SparseVector(indices=[i % 5, 5 + i % 3], values=[1.0 + i / 40, 0.5 + i / 997])}) for i in range(40)]  # fmt: skip
    for c in (remote, local):
        c.create_collection("matrix", vectors_config={"c": models.VectorParams(size=4, distance="Cosine"),
                                                      "e": models.VectorParams(size=4, distance="Euclid")},
                            sparse_vectors_config={"s": models.SparseVectorParams()})  # fmt: skip
        c.upsert("matrix", points)
    flt = models.Filter(must=[models.FieldCondition(key="k", match=models.MatchValue(value=1))])
    for using in ("c", "e", "s"):
        for f in (None, flt):
            got, want = (c.search_matrix_pairs("matrix", sample=40, limit=3, using=using, query_filter=f)
                         for c in (remote, local))  # fmt: skip
            assert [(p.a, p.b) for p in got.pairs] == [(p.a, p.b) for p in want.pairs], (using, f)
            assert np.allclose([p.score for p in got.pairs], [p.score for p in want.pairs], atol=1e-4)
            got, want = (c.search_matrix_offsets("matrix", sample=40, limit=2, using=using, query_filter=f)
                         for c in (remote, local))  # fmt: skip
            assert (got.ids, got.offsets_row, got.offsets_col) == (want.ids, want.offsets_row, want.offsets_col)
            assert np.allclose(got.scores, want.scores, atol=1e-4)
    one = models.Filter(must=[models.HasIdCondition(has_id=[7])])
    assert remote.search_matrix_pairs("matrix", sample=10, using="c", query_filter=one).pairs == []
    r = httpx.post(f"{env['server'].url}/qdrant/collections/matrix/points/search/matrix/pairs",
                   json={"sample": 1, "using": "c"})  # fmt: skip
    assert r.status_code == 422 and "sample" in r.text


def test_qdrant_bodies_take_qdrants_request_limit(env):
    """A /qdrant body over ``max_payload_bytes`` (2 MiB, TEI's limit) but under ``qdrant_max_payload_bytes`` (32 MiB,
    Qdrant's) is served (qdrant-client uploads in such batches); the same size elsewhere is 413, naming its setting.
    A scroll's limit may pass ``collections_max_top_k``."""
    if env["backend"] == "milvus":
        pytest.skip("client-supplied named vectors: embedded only (Milvus 2.3 holds one vector)")
    url = env["server"].url
    r = httpx.put(f"{url}/qdrant/collections/bigbody", json={"vectors": {"v": {"size": 4, "distance": "Dot"}}})
    assert r.status_code == 200, r.text
    points = [{"id": i, "vector": {"v": [0.25, 0.5, 0.125, i / 999]}, "payload": {"t": "x" * 3000}}
              for i in range(1000)]  # fmt: skip
    body = json.dumps({"points": points})
    assert 2 * 1024 * 1024 < len(body) < 32 * 1024 * 1024
    r = httpx.put(f"{url}/qdrant/collections/bigbody/points?wait=true", content=body,
                  headers={"content-type": "application/json"}, timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text[:300]
    assert httpx.post(f"{url}/qdrant/collections/bigbody/points/count", json={}).json()["result"]["count"] == 1000
    r = httpx.post(f"{url}/v1/embeddings", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "max_payload_bytes" in r.text
    more = [{"id": 1000 + i, "vector": {"v": [0.5, 0.5, 0.5, 0.5]}} for i in range(200)]
    assert httpx.put(f"{url}/qdrant/collections/bigbody/points?wait=true", json={"points": more}).status_code == 200
    # a scroll past collections_max_top_k (1000) is read in pages, as Qdrant caps a scroll by nothing but its answer
    r = httpx.post(f"{url}/qdrant/collections/bigbody/points/scroll", json={"limit": 1100, "with_payload": False})
    page = r.json()["result"]
    assert [p["id"] for p in page["points"]] == list(range(1100)) and page["next_page_offset"] == 1100
