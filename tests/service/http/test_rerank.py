"""The rerank routes on the real service (uvicorn subprocess) serving the session's tiny reranker beside the default
encoder: TEI's ``/rerank`` (httpx), Cohere's ``/v2/rerank`` through the ``cohere`` SDK unchanged, Cohere/Jina's
``/v1/rerank``; scores equal to ``CrossEncoder.predict`` on the same pairs; the batcher's limits; every 4xx."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from artifact_contract import load_manifest
from tests.conftest import reranker_config
from tests.server_utils import run_server
from training.data.scifact import load_scifact

pytestmark = pytest.mark.timeout(300)
MAX_CLIENT_BATCH = 16
ADMIN_KEY = "rerank-admin-key"


@pytest.fixture(scope="module")
def server(default_artifact: Path, reranker_artifact: Path, tmp_path_factory):
    assert default_artifact.parent == reranker_artifact.parent
    args = ["--default-model", default_artifact.name, "--rerank-models", reranker_artifact.name,
            "--max-client-batch-size", str(MAX_CLIENT_BATCH), "--max-batch-size", "4", "--intra-op-threads", "1",
            "--admin-api-keys", ADMIN_KEY, "--log-level", "warning"]  # fmt: skip
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("rerank"), args=args) as srv:
        yield srv
        assert srv.alive(), srv.log()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120.0) as c:
        yield c


@pytest.fixture(scope="module")
def cross_encoder():
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(Path(reranker_config().output_dir) / "model"), device="cpu")


@pytest.fixture(scope="module")
def claim():
    """A SciFact train claim, its judged abstracts and other abstracts (several over 128 tokens: truncated)."""
    data = load_scifact(max_queries=3, max_corpus=40, seed=7)
    q = sorted(data.qrels)[0]
    docs = [data.corpus[d] for d in sorted(data.qrels[q])] + [t for d, t in data.corpus.items()
                                                              if d not in data.qrels[q]][:9]  # fmt: skip
    return data.queries[q], docs


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def test_tei_scores_equal_crossencoder_predict(client, cross_encoder, claim, reranker_artifact):
    import torch

    query, docs = claim
    r = client.post("/rerank", json={"query": query, "texts": docs, "raw_scores": True})
    assert r.status_code == 200, r.text
    assert r.headers["x-model"].startswith("scifact-reranker-tiny:")
    served = np.empty(len(docs))
    for item in r.json():
        served[item["index"]] = item["score"]
    ref = cross_encoder.predict([(query, d) for d in docs], activation_fn=torch.nn.Identity())
    parity = load_manifest(reranker_artifact).parity.max_abs_diff
    # the served batches (4 pairs, other padding) differ from the export's: held to the export tolerance, 1e-4
    assert np.abs(served - ref).max() <= max(parity, 1e-4), (np.abs(served - ref).max(), parity)
    probs = client.post("/rerank", json={"query": query, "texts": docs}).json()
    ref_p = cross_encoder.predict([(query, d) for d in docs])  # sigmoid, CrossEncoder's default for one label
    for item in probs:
        assert abs(item["score"] - ref_p[item["index"]]) <= max(parity, 1e-4)


def test_tei_shape_and_order(client, claim):
    query, docs = claim
    out = client.post("/rerank", json={"query": query, "texts": docs, "return_text": True}).json()
    assert sorted(i["index"] for i in out) == list(range(len(docs)))
    scores = [i["score"] for i in out]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    assert all(i["text"] == docs[i["index"]] for i in out)
    raw = client.post("/rerank", json={"query": query, "texts": docs, "raw_scores": True}).json()
    assert [i["index"] for i in raw] == [i["index"] for i in out]
    assert np.allclose(sigmoid([i["score"] for i in raw]), scores, atol=1e-6)
    assert "text" not in raw[0]
    left = client.post("/rerank", json={"query": query, "texts": docs, "truncation_direction": "Left"})
    assert left.status_code == 200 and {i["index"] for i in left.json()} == set(range(len(docs)))


def test_cohere_sdk_v2_unchanged(server, client, claim):
    import cohere

    query, docs = claim
    co = cohere.ClientV2(base_url=server.url, api_key="unused")
    res = co.rerank(model="scifact-reranker-tiny", query=query, documents=docs, top_n=3)
    assert len(res.results) == 3 and res.id
    tei = client.post("/rerank", json={"query": query, "texts": docs}).json()
    assert [r.index for r in res.results] == [i["index"] for i in tei[:3]]
    assert np.allclose([r.relevance_score for r in res.results], [i["score"] for i in tei[:3]], atol=1e-6)
    assert res.meta.api_version.version == "2"
    everything = co.rerank(model="scifact-reranker-tiny", query=query, documents=docs)
    assert len(everything.results) == len(docs)


def test_cohere_v1_and_jina_shape(client, claim):
    query, docs = claim
    body = {"query": query, "documents": [{"text": d} for d in docs[:5]], "top_n": 10, "return_documents": True}
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert set(out) >= {"id", "results", "meta", "model", "usage"} and out["model"] == "scifact-reranker-tiny"
    assert len(out["results"]) == 5 and out["usage"]["total_tokens"] > 0
    scores = [x["relevance_score"] for x in out["results"]]
    assert scores == sorted(scores, reverse=True)
    assert all(x["document"] == {"text": docs[x["index"]]} for x in out["results"])
    bare = client.post("/v1/rerank", json={"query": query, "documents": docs[:5]}).json()  # no model: the reranker
    assert all("document" not in x for x in bare["results"]) and bare["meta"]["api_version"]["version"] == "1"


@pytest.mark.parametrize(
    "path, body, status, code, param",
    [
        ("/rerank", {"query": "q", "texts": []}, 422, "invalid_value", "texts"),
        ("/v2/rerank", {"model": "scifact-reranker-tiny", "query": "q", "documents": []}, 422, "invalid_value",
         "documents"),
        ("/v2/rerank", {"query": "q", "documents": ["a", ""]}, 422, "invalid_value", "documents.1"),
        ("/v2/rerank", {"query": "", "documents": ["a"]}, 422, "invalid_value", "query"),
        ("/v1/rerank", {"query": "q", "documents": [{"txt": "a"}]}, 422, "invalid_value", "documents.0"),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 422, "invalid_value", "top_n"),
        ("/rerank", {"query": "q", "texts": ["d"] * (MAX_CLIENT_BATCH + 1)}, 413, "too_many_inputs", "texts"),
        ("/v2/rerank", {"query": "q", "documents": ["d"] * (MAX_CLIENT_BATCH + 1)}, 413, "too_many_inputs",
         "documents"),
        ("/rerank", {"query": "q", "texts": ["word " * 400], "truncate": False}, 413, "input_too_long", "texts"),
        ("/v2/rerank", {"model": "all-minilm-l6-v2", "query": "q", "documents": ["a"]}, 422, "not_a_reranker",
         "model"),
        ("/rerank", {"model": "all-minilm-l6-v2", "query": "q", "texts": ["a"]}, 422, "not_a_reranker", "model"),
        ("/rerank", {"model": "no-such-model", "query": "q", "texts": ["a"]}, 404, "model_not_found", "model"),
        ("/v1/embeddings", {"model": "scifact-reranker-tiny", "input": "a"}, 422, "not_an_embedding_model",
         "model"),
        ("/embed", {"model": "scifact-reranker-tiny", "inputs": "a"}, 422, "not_an_embedding_model", "model"),
    ],
)  # fmt: skip
def test_errors(client, path, body, status, code, param):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param), err
    assert client.post("/rerank", json={"query": "q", "texts": ["a"]}).status_code == 200  # still serving


def test_reranker_is_listed_and_never_active(client):
    models = {m["id"].split(":")[0]: m for m in client.get("/v1/models").json()["data"]}
    assert models["scifact-reranker-tiny"]["manifest"]["task"] == "reranker"
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    r = client.post("/admin/models/scifact-reranker-tiny/activate", headers=auth)
    assert r.status_code == 422 and r.json()["error"]["code"] == "not_an_embedding_model", r.text
    info = client.get("/info").json()
    assert info["model_id"] == "all-minilm-l6-v2" and any(
        m.startswith("scifact-reranker-tiny:") for m in info["loaded_models"]
    )


def test_concurrent_requests_get_their_own_scores(server, client, claim):
    query, docs = claim
    want = {q: client.post("/rerank", json={"query": q, "texts": docs, "raw_scores": True}).json()
            for q in (query, "Cats sleep most of the day.", "Interest rates and stock prices")}  # fmt: skip

    async def main():
        async with httpx.AsyncClient(base_url=server.url, timeout=120.0) as ac:
            qs = list(want) * 4
            rs = await asyncio.gather(*(ac.post("/rerank", json={"query": q, "texts": docs, "raw_scores": True})
                                        for q in qs))  # fmt: skip
            return list(zip(qs, rs))

    for q, r in asyncio.run(main()):
        got = {i["index"]: i["score"] for i in r.json()}
        ref = {i["index"]: i["score"] for i in want[q]}
        assert all(abs(got[k] - ref[k]) <= 1e-4 for k in ref)


def test_pairs_go_through_the_batcher_with_its_limits(reranker_artifact, claim):
    """In process: a reranker's pairs are the batcher's inputs: batched scores equal one-batch scores, and the
    batcher's queue bound, truncate=false and max_request_tokens hold for pairs as for texts."""
    from service.inference.batch_errors import InputTooLong, QueueFull, RequestTooLarge
    from service.inference.batcher import Batcher
    from service.inference.model_registry import LoadedModel
    from service.inference.onnx_reranker import OnnxReranker, open_model
    from service.inference.reranker import Reranker
    from service.metrics import Metrics

    model = open_model(reranker_artifact, providers=["cpu"], intra_op_threads=1)
    assert isinstance(model, OnnxReranker)
    query, docs = claim
    want = model.scores_sync([(query, d) for d in docs])

    async def main():
        b = Batcher(model, Metrics(), max_batch_tokens=512, max_batch_size=3, max_queue_size=2, max_request_tokens=4000)
        b.start()
        try:
            lm = LoadedModel(model, b)
            rr = Reranker(type("OneModel", (), {"all": lambda self: [lm], "get": lambda self, name: lm})())
            got = await rr.rerank(query, docs)
            assert np.abs(got.scores - want).max() <= 1e-5 and got.prompt_tokens > 0
            with pytest.raises(InputTooLong) as e:
                await rr.rerank(query, ["word " * 300], truncate=False)
            assert e.value.param == "documents"
            with pytest.raises(RequestTooLarge):
                await rr.rerank(query, ["word " * 300] * 40)
            results = await asyncio.gather(*(rr.rerank(query, docs) for _ in range(3)), return_exceptions=True)
            assert sum(isinstance(r, QueueFull) for r in results) == 1  # max_queue_size=2
        finally:
            await b.close()

    asyncio.run(main())


def test_admin_unloads_and_loads_a_reranker(client):  # last: it changes what the server holds
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert client.post("/admin/models/scifact-reranker-tiny/unload", headers=auth).status_code == 200
    r = client.post("/v2/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
    assert "no reranker is loaded" in r.json()["error"]["message"]
    assert client.post("/embed", json={"inputs": "still embedding"}).status_code == 200
    r = client.post("/admin/models/scifact-reranker-tiny/load", headers=auth)
    assert r.status_code == 200, r.text
    assert client.post("/v2/rerank", json={"query": "q", "documents": ["a", "b"]}).status_code == 200
