"""The real service (uvicorn subprocess) on the default artifact, driven with real STS-B sentences.

One module-scoped server serves every test here: quality (STS-B Spearman through
/v1/embeddings, float and base64), agreement of /embed and /similarity with it,
every documented 4xx error (and that the server keeps serving after each),
concurrent clients getting exactly their own embeddings, and the meta routes.
"""

from __future__ import annotations

import base64
import json
import random
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.server_utils import run_server
from training.data.sts import cosine_spearman, load_task

pytestmark = pytest.mark.timeout(300)

REFERENCE_STSB = 82.03  # ../shared/data/README.md, all-MiniLM-L6-v2
CHUNK = 128
MAX_CLIENT_BATCH = 256
MAX_PAYLOAD = 256 * 1024


@pytest.fixture(scope="module")
def server(default_artifact: Path, tmp_path_factory):
    args = [
        "--default-model",
        default_artifact.name,
        "--max-client-batch-size",
        str(MAX_CLIENT_BATCH),
        "--max-payload-bytes",
        str(MAX_PAYLOAD),
        "--intra-op-threads",
        "1",
        "--log-level",
        "warning",
    ]
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("svc_api"), args=args) as srv:
        yield srv
        assert srv.alive(), srv.log()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120.0) as c:
        yield c


@pytest.fixture(scope="module")
def stsb():
    return load_task("STSBenchmark")


def _embed_all(client: httpx.Client, texts: list[str], encoding_format: str = "float") -> np.ndarray:
    rows = []
    for i in range(0, len(texts), CHUNK):
        chunk = texts[i : i + CHUNK]
        r = client.post("/v1/embeddings", json={"input": chunk, "encoding_format": encoding_format})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "list" and body["model"] == "all-minilm-l6-v2"
        assert [d["index"] for d in body["data"]] == list(range(len(chunk)))
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] >= 3 * len(chunk)
        for d in body["data"]:
            assert d["object"] == "embedding"
            if encoding_format == "base64":
                rows.append(np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4"))
            else:
                rows.append(np.asarray(d["embedding"], dtype=np.float32))
    return np.stack(rows)


@pytest.fixture(scope="module")
def reference(client, stsb) -> dict[str, np.ndarray]:
    """Every distinct STS-B test sentence → its /v1/embeddings float embedding."""
    uniq = list(dict.fromkeys(stsb.sent1 + stsb.sent2))
    emb = _embed_all(client, uniq, "float")
    return dict(zip(uniq, emb))


def _good(client: httpx.Client) -> None:
    r = client.post("/v1/embeddings", json={"input": "The server still answers."})
    assert r.status_code == 200, r.text
    assert len(r.json()["data"][0]["embedding"]) == 384


# ------------------------------------------------------------------ quality and agreement
def test_stsb_spearman_float(reference, stsb):
    e1 = np.stack([reference[s] for s in stsb.sent1])
    e2 = np.stack([reference[s] for s in stsb.sent2])
    assert e1.shape == (1379, 384) and e1.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(e1, axis=1), 1.0, atol=1e-5)
    rho = cosine_spearman(e1, e2, stsb.scores)
    assert abs(rho - REFERENCE_STSB) <= 0.10, rho


def test_stsb_base64_equals_float(client, stsb, reference):
    """base64 carries the float embeddings (whose Spearman the test above checks) to float32 precision: 400 STS-B
    sentences, in other batches than the reference's."""
    uniq = list(dict.fromkeys(stsb.sent1 + stsb.sent2))[::7][:400]
    emb = _embed_all(client, uniq, "base64")
    ref = np.stack([reference[s] for s in uniq])
    assert emb.dtype == np.float32 and emb.shape == ref.shape
    np.testing.assert_allclose(emb, ref, atol=1e-5)


def test_embed_tei_agrees(client, stsb, reference):
    texts = list(dict.fromkeys(stsb.sent1))[:300]
    got = []
    for i in range(0, len(texts), CHUNK):
        r = client.post("/embed", json={"inputs": texts[i : i + CHUNK]})
        assert r.status_code == 200, r.text
        got.extend(r.json())
    np.testing.assert_allclose(np.asarray(got, np.float32), np.stack([reference[t] for t in texts]), atol=1e-5)
    # a single string, unnormalised: same direction as the normalised one
    r = client.post("/embed", json={"inputs": texts[0], "normalize": False})
    raw = np.asarray(r.json()[0], np.float32)
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3
    np.testing.assert_allclose(raw / np.linalg.norm(raw), reference[texts[0]], atol=1e-5)


def test_dimensions_truncate_and_renormalise(client, reference, stsb):
    s = stsb.sent1[:5]
    for route, key in (("/v1/embeddings", "input"), ("/embed", "inputs")):
        r = client.post(route, json={key: s, "dimensions": 64})
        assert r.status_code == 200, r.text
        rows = [d["embedding"] for d in r.json()["data"]] if route == "/v1/embeddings" else r.json()
        got = np.asarray(rows, np.float32)
        full = np.stack([reference[t] for t in s])[:, :64]
        np.testing.assert_allclose(got, full / np.linalg.norm(full, axis=1, keepdims=True), atol=1e-5)


def test_similarity_pairs_agree_with_embeddings(client, stsb, reference):
    """/similarity's pair scores are the cosines of the embeddings (whose STS-B Spearman is checked above): 300
    STS-B pairs, spread over the file, scored by their gold similarity's order too."""
    idx = list(range(0, len(stsb), 4))[:300]
    sent1, sent2 = [stsb.sent1[i] for i in idx], [stsb.sent2[i] for i in idx]
    scores = []
    for i in range(0, len(idx), 100):
        r = client.post("/similarity", json={"pairs": [[a, b] for a, b in zip(sent1[i : i + 100], sent2[i : i + 100])]})
        assert r.status_code == 200, r.text
        scores.extend(r.json()["scores"])
    want = np.array([float(reference[a] @ reference[b]) for a, b in zip(sent1, sent2)])
    np.testing.assert_allclose(np.asarray(scores), want, atol=1e-5)
    from scipy.stats import spearmanr

    assert spearmanr(scores, stsb.scores[idx]).correlation > 0.75  # the full set's is 0.82


def test_similarity_source_form_agrees(client, stsb, reference):
    src = stsb.sent1[0]
    sentences = stsb.sent2[:40]
    for body in (
        {"source_sentence": src, "sentences": sentences},
        {"inputs": {"source_sentence": src, "sentences": sentences}},
    ):
        r = client.post("/similarity", json=body)
        assert r.status_code == 200, r.text
        want = [float(reference[src] @ reference[s]) for s in sentences]
        got = r.json() if "inputs" in body else r.json()["scores"]  # TEI's form answers TEI's bare list
        np.testing.assert_allclose(got, want, atol=1e-5)


# ------------------------------------------------------------------ errors
def _err(r: httpx.Response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    if param is not None:
        assert e["param"] == param, e
    if code is not None:
        assert e["code"] == code, e
    return e


BAD_BODIES = [
    ("/v1/embeddings", {"input": []}, "input"),
    ("/v1/embeddings", {"input": ""}, "input"),
    ("/v1/embeddings", {"input": ["fine", ""]}, "input"),
    ("/v1/embeddings", {"input": 42}, "input"),
    ("/v1/embeddings", {"input": [1, 2, 3]}, "input"),
    ("/v1/embeddings", {"input": [["nested"]]}, "input"),
    ("/v1/embeddings", {"input": None}, "input"),
    ("/v1/embeddings", {}, "input"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ("/v1/embeddings", {"input": "x", "dimensions": 0}, "dimensions"),
    ("/v1/embeddings", {"input": "x", "dimensions": 385}, "dimensions"),
    ("/v1/embeddings", {"input": "x", "dimensions": "64"}, "dimensions"),
    ("/embed", {"inputs": []}, "inputs"),
    ("/embed", {"inputs": "x", "normalize": "yes"}, "normalize"),
    ("/similarity", {"source_sentence": "a"}, None),
    ("/similarity", {"source_sentence": "a", "sentences": []}, "sentences"),
    ("/similarity", {"pairs": [["a", "b", "c"]]}, None),
    ("/similarity", {"pairs": [["a", "b"]], "source_sentence": "a", "sentences": ["b"]}, None),
    ("/similarity", {"pairs": [["a", 3]]}, None),
]


@pytest.mark.parametrize("route,body,param", BAD_BODIES, ids=[f"{r}:{json.dumps(b)[:40]}" for r, b, _ in BAD_BODIES])
def test_invalid_input_422(client, route, body, param):
    token_ids = body.get("input") == [1, 2, 3]  # OpenAI's token-array form: refused with its own code
    e = _err(client.post(route, json=body), 422, code="token_ids_unsupported" if token_ids else "invalid_value")
    if param is not None:
        assert e["param"] is not None and e["param"].startswith(param), e
    _good(client)


def test_not_json_and_not_an_object(client):
    _err(client.post("/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"}), 422)
    _err(client.post("/v1/embeddings", json=["a", "b"]), 422)
    _good(client)


def test_too_many_inputs_413(client):
    texts = [f"sentence number {i}" for i in range(MAX_CLIENT_BATCH + 1)]
    _err(client.post("/v1/embeddings", json={"input": texts}), 413, "input", "too_many_inputs")
    _err(client.post("/embed", json={"inputs": texts}), 413, "inputs", "too_many_inputs")
    pairs = [[t, t + "!"] for t in texts[: MAX_CLIENT_BATCH // 2 + 1]]
    _err(client.post("/similarity", json={"pairs": pairs}), 413, "pairs", "too_many_inputs")
    ok = client.post("/v1/embeddings", json={"input": texts[:MAX_CLIENT_BATCH]})
    assert ok.status_code == 200 and len(ok.json()["data"]) == MAX_CLIENT_BATCH


def test_oversized_payload_413(client):
    big = {"input": ["word " * 1000] * 60}  # ~300 KB > MAX_PAYLOAD
    assert len(json.dumps(big)) > MAX_PAYLOAD
    _err(client.post("/v1/embeddings", json=big), 413, code="payload_too_large")
    _good(client)

    # no Content-Length (chunked upload): the size is checked while reading
    def chunks():
        data = json.dumps(big).encode()
        for i in range(0, len(data), 16384):
            yield data[i : i + 16384]

    r = client.post("/v1/embeddings", content=chunks(), headers={"content-type": "application/json"})
    _err(r, 413, code="payload_too_large")
    _good(client)


def test_truncate_false_long_input_413(client, default_artifact):
    long_text = " ".join(["embedding"] * 400)
    tok = Tokenizer.from_file(str(default_artifact / "tokenizer.json"))
    tok.no_truncation()
    n = len(tok.encode(long_text).ids)
    assert n > 256
    e = _err(
        client.post("/embed", json={"inputs": ["short", long_text], "truncate": False}), 413, "inputs", "input_too_long"
    )
    assert str(n) in e["message"] and "256" in e["message"] and "inputs[1]" in e["message"]
    # truncated by default: same as the first 256 tokens
    r = client.post("/embed", json={"inputs": [long_text]})
    assert r.status_code == 200
    r2 = client.post("/v1/embeddings", json={"input": long_text})
    assert r2.json()["usage"]["prompt_tokens"] == 256
    _err(client.post("/similarity", json={"pairs": [["a", long_text]], "truncate": False}), 413, code="input_too_long")
    _good(client)


def test_tei_routes_and_options(client, stsb):
    """TEI's ``POST /`` and the unversioned OpenAI ``POST /embeddings`` answer as ``/embed`` and ``/v1/embeddings``;
    ``truncate: null`` is the default; ``truncation_direction: "left"`` keeps an over-long input's end (also past
    the characters the tokenizer reads); a ``prompt_name`` is refused, not ignored: this model defines no prompts
    (prompts themselves: ``test_prompts.py``)."""
    texts = list(dict.fromkeys(stsb.sent1))[:8]
    want = client.post("/embed", json={"inputs": texts}).json()
    assert client.post("/", json={"inputs": texts, "truncate": None}).json() == want
    openai = client.post("/v1/embeddings", json={"input": texts}).json()
    assert client.post("/embeddings", json={"input": texts}).json()["data"] == openai["data"]

    tail = " ".join(list(dict.fromkeys(stsb.sent2))[:60])  # > 256 tokens by itself
    head = " ".join(list(dict.fromkeys(stsb.sent1))[100:160])
    pad = "filler " * 4000  # 28,000 characters: more than the 25,600 (100 x 256) the tokenizer reads of a text

    def emb(text: str, **kw) -> np.ndarray:
        r = client.post("/embed", json={"inputs": text, **kw})
        assert r.status_code == 200, r.text
        return np.asarray(r.json()[0], np.float32)

    left = emb(tail, truncation_direction="left")
    np.testing.assert_allclose(emb(head + " " + tail, truncation_direction="left"), left, atol=1e-5)
    np.testing.assert_allclose(emb(pad + head + " " + tail, truncation_direction="Left"), left, atol=1e-5)
    assert float(emb(head + " " + tail) @ left) < 0.99  # right truncation keeps the head instead
    np.testing.assert_allclose(emb(texts[0], truncation_direction="left"), np.asarray(want[0]), atol=1e-6)

    _err(client.post("/embed", json={"inputs": "x", "prompt_name": "query"}), 422, "prompt_name", "invalid_value")
    # /similarity takes the same options as TEI's "parameters"
    inputs = {"source_sentence": tail, "sentences": [head + " " + tail, head]}
    r = client.post("/similarity", json={"inputs": inputs, "parameters": {"truncation_direction": "left"}})
    assert r.status_code == 200 and r.json()[0] == pytest.approx(1.0, abs=1e-5), r.text
    assert client.post("/similarity", json={"inputs": inputs}).json()[0] < 0.99
    _err(client.post("/similarity", json={"inputs": inputs, "parameters": {"prompt_name": "q"}}), 422, "prompt_name")
    _err(client.post("/", json={"inputs": "x", "truncation_direction": "middle"}), 422, "truncation_direction")
    _good(client)


def test_tei_tokenize_and_decode(client, default_artifact):
    """``/tokenize`` gives the model's own tokens (the artifact's tokenizer.json), untruncated, with TEI's shape:
    special tokens without offsets, others with the input's characters at their offsets; ``/decode`` inverts it."""
    text = "Héllo wörld, a naïve café 😀 " + "word " * 300  # non-ASCII, an unknown token, > max_seq_length tokens
    tok = Tokenizer.from_file(str(default_artifact / "tokenizer.json"))
    tok.no_truncation()
    want = tok.encode(text)
    r = client.post("/tokenize", json={"inputs": text})
    assert r.status_code == 200, r.text
    (got,) = r.json()
    assert [t["id"] for t in got] == want.ids and len(got) > 300  # not cut to 256
    assert got[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert got[-1]["special"] and got[-1]["text"] == "[SEP]"
    for t in got[1:-1]:
        assert not t["special"] and text[t["start"] : t["stop"]] == t["text"]
    assert [t["text"] for t in got[1:4]] == ["Héllo", "wörld", ","]
    r = client.post("/tokenize", json={"inputs": ["a b", "c"], "add_special_tokens": False})
    assert [[t["text"] for t in x] for x in r.json()] == [["a", "b"], ["c"]]
    _err(client.post("/tokenize", json={"inputs": "x", "prompt_name": "query"}), 422, "prompt_name")
    e = _err(client.post("/tokenize", json={"inputs": "a," * 70_000}), 413, "inputs", "request_too_large")
    assert "140002 tokens" in e["message"]  # max_request_tokens (131072) bounds the answer as it does embeddings

    r = client.post("/decode", json={"ids": want.ids[:8]})
    assert r.status_code == 200 and r.json() == [tok.decode(want.ids[:8])], r.text
    r = client.post("/decode", json={"ids": [want.ids[:4], [101, 102]], "skip_special_tokens": False})
    assert r.json() == [tok.decode(want.ids[:4], skip_special_tokens=False), "[CLS] [SEP]"]
    _err(client.post("/decode", json={"ids": [101, 10**6]}), 422, "ids")  # the tokenizer would drop it silently
    _err(client.post("/decode", json={"ids": []}), 422)
    _err(client.post("/decode", json={"ids": [-1]}), 422)
    _good(client)


def test_unknown_model_404(client):
    _err(
        client.post("/v1/embeddings", json={"input": "x", "model": "text-embedding-3-small"}),
        404,
        "model",
        "model_not_found",
    )
    _err(client.post("/embed", json={"inputs": "x", "model": "nope"}), 404, "model", "model_not_found")
    ok = client.post("/v1/embeddings", json={"input": "x", "model": "all-minilm-l6-v2"})
    assert ok.status_code == 200
    _good(client)


def test_unknown_route_and_method(client):
    _err(client.get("/v2/nothing"), 404)
    _err(client.get("/v1/embeddings"), 405)
    _good(client)


# ------------------------------------------------------------------ concurrency
def test_concurrent_clients_get_their_own_embeddings(server, reference):
    sentences = sorted(reference)
    errors: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=server.url, timeout=120.0) as c:
            for _ in range(4):
                n = rng.choice([1, 2, 5, 17, 40, 96])
                texts = rng.sample(sentences, n)
                route = rng.choice(["/v1/embeddings", "/embed"])
                if route == "/v1/embeddings":
                    fmt = rng.choice(["float", "base64"])
                    r = c.post(route, json={"input": texts, "encoding_format": fmt})
                    if r.status_code != 200:
                        errors.append(r.text)
                        return
                    data = r.json()["data"]
                    rows = [
                        np.frombuffer(base64.b64decode(d["embedding"]), "<f4")
                        if fmt == "base64"
                        else np.asarray(d["embedding"], np.float32)
                        for d in data
                    ]
                else:
                    r = c.post(route, json={"inputs": texts})
                    if r.status_code != 200:
                        errors.append(r.text)
                        return
                    rows = [np.asarray(x, np.float32) for x in r.json()]
                got = np.stack(rows)
                want = np.stack([reference[t] for t in texts])
                if got.shape != want.shape or not np.allclose(got, want, atol=1e-5):
                    errors.append(f"client {seed}: wrong embeddings (max diff {np.abs(got - want).max():.3g})")
                    return

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:3]


# ------------------------------------------------------------------ meta routes
def test_health_ready_info_models(client):
    assert client.get("/health").json() == {"status": "ok"}
    r = client.get("/ready")
    assert r.status_code == 200 and r.json()["model"] == "all-minilm-l6-v2"
    info = client.get("/info").json()
    assert info["model_id"] == "all-minilm-l6-v2" and info["dimension"] == 384 and info["max_seq_length"] == 256
    assert info["limits"]["max_client_batch_size"] == MAX_CLIENT_BATCH
    assert info["limits"]["max_payload_bytes"] == MAX_PAYLOAD
    assert info["providers"][0] != "CPUExecutionProvider" or info["limits"]["max_batch_size"] == 16  # CPU's default
    assert len(info["manifest"]["sha256"]) == 64
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["all-minilm-l6-v2"]
    assert models["data"][0]["object"] == "model" and models["data"][0]["manifest"]["dimension"] == 384


def test_metrics_after_traffic(client):
    _good(client)
    text = client.get("/metrics").text
    for name in (
        "embed_requests_total",
        "embed_request_duration_seconds_bucket",
        "embed_queue_size",
        "embed_batch_size_bucket",
        "embed_batch_tokens_bucket",
        "embed_tokenization_duration_seconds_bucket",
        "embed_inference_duration_seconds_bucket",
        "embed_model_info",
        "embed_inputs_total",
    ):
        assert name in text, name
    assert 'embed_requests_total{method="POST",route="/v1/embeddings",status="200"}' in text
    assert 'status="422"' in text and 'status="413"' in text and 'status="404"' in text
    info = [line for line in text.splitlines() if line.startswith("embed_model_info{")]
    assert len(info) == 1 and 'name="all-minilm-l6-v2"' in info[0] and "sha256=" in info[0]


def test_api_docs_load_without_a_cdn(server):
    """/docs and /redoc reference only this server's own assets (air-gapped users see the pages)."""
    import re as _re

    for page in ("/docs", "/redoc"):
        r = httpx.get(f"{server.url}{page}", timeout=30)
        assert r.status_code == 200 and "text/html" in r.headers["content-type"]
        urls = _re.findall(r'(?:src|href)="([^"]+)"', r.text) + _re.findall(r"url: '([^']+)'", r.text)
        assert urls and not [u for u in urls if u.startswith(("http:", "https:", "//"))], urls
        for u in urls:
            if u.endswith((".js", ".css")):
                assert httpx.get(f"{server.url}{u}", timeout=30).status_code == 200, u
