"""Hostile input against the real service: unpaired surrogates, non-JSON bodies, admin rights, key files,
requests over the token budget, and the memory ONNX Runtime keeps after big batches.

Each case gets its 4xx with a JSON error body naming what is wrong, and the server keeps answering.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.http.middleware import unpaired_surrogate
from tests.server_utils import REPO_ROOT, run_server
from training.data.sts import load_task

pytestmark = pytest.mark.timeout(300)

USER, ADMIN = "user-key-1", "admin-key-1"


@pytest.fixture(scope="module")
def server(default_artifact: Path, tmp_path_factory):
    work = tmp_path_factory.mktemp("hardening")
    keys = work / "keys.txt"
    keys.write_text(f"# user keys, one per line\n{USER}\n")
    args = ["--default-model", default_artifact.name, "--intra-op-threads", "1", "--log-level", "warning",
            "--api-keys-file", str(keys), "--admin-api-keys", ADMIN, "--max-request-tokens", "4096"]  # fmt: skip
    with run_server(default_artifact.parent, workdir=work, args=args) as srv:
        yield srv
        assert srv.alive(), srv.log()[-3000:]


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {USER}"}) as c:
        yield c


def _post_raw(c: httpx.Client, path: str, raw: str, method: str = "POST") -> httpx.Response:
    return c.request(method, path, content=raw.encode(), headers={"Content-Type": "application/json"})


@pytest.mark.parametrize(
    "method, path, raw",
    [
        ("POST", "/v1/embeddings", '{"input": "\\udcff"}'),
        ("POST", "/v1/embeddings", '{"input": ["fine", "half an emoji \\ud83d"]}'),
        ("POST", "/embed", '{"inputs": ["\\ud800"]}'),
        ("POST", "/similarity", '{"source_sentence": "a", "sentences": ["\\udfff b"]}'),
        ("PUT", "/collections/hostile/points", '{"points": [{"id": 1, "text": "ok", "payload": {"\\udcff": 1}}]}'),
        ("POST", "/collections/hostile/search", '{"text": "q", "filter": {"genre": "\\udcff"}}'),
        ("POST", "/collections/hostile/points/delete", '{"filter": {"\\ud800k": 1}}'),
    ],
)
def test_unpaired_surrogates_are_422_everywhere(client, method, path, raw):
    assert client.put("/collections/hostile", json={"index": "flat", "metric": "cosine"}).status_code in (200, 409)
    r = _post_raw(client, path, raw, method)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_text" and "surrogate" in err["message"]
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize(
    "body, says",
    [
        (b'{"input": "a\xed\xa0\x80b"}', "not valid UTF-8"),  # a lone surrogate as bytes (CESU-8)
        (b'{"input": "caf\xe9"}', "not valid UTF-8"),  # Latin-1
        ('{"inputs": "\\ud800"}'.encode("utf-16-le"), "JSON decode error"),  # UTF-16: json.loads(bytes) took it
    ],
)
def test_a_body_that_is_not_utf8_is_422(client, body, says):
    for path in ("/v1/embeddings", "/embed"):
        r = client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and says in r.json()["error"]["message"], (path, r.text)
    assert client.get("/health").status_code == 200


def test_characters_that_make_no_token_do_not_hide_the_text(client):
    """A text whose first 25,600 characters (100 per token of the budget) make no token is embedded whole."""
    plain = "the quick brown fox jumps over the lazy dog"
    for pad in ("\u200b", " ", "\u0301"):  # zero-width space, whitespace, a combining accent
        r = client.post("/v1/embeddings", json={"input": [pad * 26_000 + plain, plain]})
        assert r.status_code == 200, r.text
        a, b = (np.asarray(d["embedding"]) for d in r.json()["data"])
        assert a @ b > 0.99, repr(pad)


def test_paired_surrogates_are_text(client):
    r = _post_raw(client, "/v1/embeddings", '{"input": "a smile \\ud83d\\ude00 and an escaped \\\\udcff"}')
    assert r.status_code == 200, r.text
    assert len(r.json()["data"][0]["embedding"]) == 384


def test_non_json_content_type_is_415(client):
    r = client.post(
        "/v1/embeddings", content=b"input=hello", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    ok = client.post(
        "/v1/embeddings", content=b'{"input": "hello"}', headers={"Content-Type": "application/json; charset=utf-8"}
    )
    assert ok.status_code == 200


def test_user_key_on_admin_is_403_admin_key_passes(server):
    real = load_task("STSBenchmark").sent1[0]
    with httpx.Client(base_url=server.url, timeout=60) as c:
        user = {"Authorization": f"Bearer {USER}"}
        admin = {"Authorization": f"Bearer {ADMIN}"}
        r = c.post("/admin/models/reload", headers=user)
        assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_permissions"
        assert "lacks admin rights" in r.json()["error"]["message"]
        assert c.post("/admin/models/reload", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.post("/admin/models/reload", headers=admin).status_code == 200
        # the key from --api-keys-file works for the API; no key is refused
        assert c.post("/v1/embeddings", json={"input": real}, headers=user).status_code == 200
        assert c.post("/v1/embeddings", json={"input": real}).status_code == 401


def test_surrogate_scanner_cases():
    assert unpaired_surrogate(b'{"a": "\\ud83d\\ude00"}') is None
    assert unpaired_surrogate(b'{"a": "\\\\udcff"}') is None  # an escaped backslash, then plain text
    assert unpaired_surrogate(b'{"a": "\\ud83d\\ud83d\\ude00"}') == "\\ud83d"
    assert unpaired_surrogate(b'{"a": "\\ud83d x"}') == "\\ud83d"
    assert unpaired_surrogate(b'{"a": "\\udcff"}') == "\\udcff"


@pytest.fixture(scope="module")
def sts_sentences() -> list[str]:
    s = load_task("STSBenchmark")
    return list(dict.fromkeys(s.sent1 + s.sent2))[:40]


def test_point_ids_are_all_addressable(client, sts_sentences):
    assert client.put("/collections/ids", json={"index": "flat", "metric": "cosine"}).status_code == 200
    ids = ["a/b", "007", 7, "7", "x/../y"]
    pts = [{"id": i, "text": t} for i, t in zip(ids, sts_sentences)]
    r = client.put("/collections/ids/points", json={"points": pts + [{"id": 7, "text": sts_sentences[9]}]})
    assert r.status_code == 200 and r.json()["upserted"] == 5  # the repeated 7 is one point (last one wins)
    assert client.get("/collections/ids").json()["count"] == 5
    got = lambda path: client.get(f"/collections/ids/points/{path}").json()  # noqa: E731
    assert got("a/b")["id"] == "a/b" and got("a/b")["text"] == sts_sentences[0]
    assert got("007")["id"] == "007"
    assert got("7")["id"] == 7 and got("7")["text"] == sts_sentences[9]
    assert client.get("/collections/ids/points/7", params={"id_type": "string"}).json()["id"] == "7"
    assert client.get("/collections/ids/points/007", params={"id_type": "int"}).status_code == 422
    assert client.get("/collections/ids/points/x%2F..%2Fy").json()["id"] == "x/../y"


@pytest.mark.parametrize(
    "body, param",
    [
        ('{"query": "a dog", "top_k": "5"}', "top_k"),
        ('{"query": "a dog", "with_text": 0}', "with_text"),
        ('{"query": "a dog", "score_threshold": NaN}', "score_threshold"),
        ('{"query": [NaN, 1.0]}', "query"),
    ],
)
def test_search_validation_is_strict(client, sts_sentences, body, param):
    client.put("/collections/strict", json={"index": "flat"})
    client.put("/collections/strict/points", json={"points": [{"id": 1, "text": sts_sentences[0]}]})
    r = _post_raw(client, "/collections/strict/search", body)
    assert r.status_code == 422, r.text
    assert param in (r.json()["error"]["param"] or "") + r.json()["error"]["message"]


def test_payload_integers_beyond_64_bits_are_refused(client, sts_sentences):
    client.put("/collections/strict", json={"index": "flat"})
    r = client.put(
        "/collections/strict/points", json={"points": [{"id": 2, "text": sts_sentences[1], "payload": {"n": 2**70}}]}
    )
    assert r.status_code == 422 and "64-bit" in r.text
    ok = client.put(
        "/collections/strict/points", json={"points": [{"id": 2, "text": sts_sentences[1], "payload": {"n": 2**62}}]}
    )
    assert ok.status_code == 200
    hits = client.post("/collections/strict/search", json={"query": "x", "filter": {"n": 2**62}}).json()
    assert [h["id"] for h in hits] == [2]


def test_extreme_query_vectors_score_like_their_direction(client, sts_sentences):
    client.put("/collections/vec_cos", json={"index": "flat", "metric": "cosine"})
    client.put("/collections/vec_l2", json={"index": "flat", "metric": "l2"})
    pts = [{"id": i, "text": t} for i, t in enumerate(sts_sentences)]
    for name in ("vec_cos", "vec_l2"):
        assert client.put(f"/collections/{name}/points", json={"points": pts}).status_code == 200
    direction = [1.0 if i % 3 else -0.5 for i in range(384)]

    def search(name, scale):
        r = client.post(f"/collections/{name}/search", json={"query": [scale * x for x in direction], "top_k": 5})
        return r

    ref = search("vec_cos", 1.0).json()
    for scale in (1e-30, 3e37):
        got = search("vec_cos", scale).json()
        assert [h["id"] for h in got] == [h["id"] for h in ref]
        assert [h["score"] for h in got] == pytest.approx([h["score"] for h in ref], abs=1e-5)
        assert abs(ref[0]["score"]) > 1e-3
    r = search("vec_l2", 3e37)
    assert r.status_code == 422 and "norm" in r.json()["error"]["message"]
    assert len(search("vec_l2", 1.0).json()) == 5


def test_huge_single_string_costs_a_max_length_one(client):
    """A ~1 MB string is read only up to the character budget: same embedding as a text with the same first
    tokens, and with truncate=false a 413 that gives a lower bound of its token count."""
    long_text = "the quick brown fox jumps over the lazy dog " * 23_000  # ~1 MB
    short = "the quick brown fox jumps over the lazy dog " * 60  # > 256 tokens: truncated the same way
    r = client.post("/embed", json={"inputs": [long_text, short]})
    assert r.status_code == 200, r.text
    a, b = r.json()
    assert sum(x * y for x, y in zip(a, b)) > 0.99999
    r = client.post("/embed", json={"inputs": [long_text], "truncate": False})
    assert r.status_code == 413 and "at least" in r.json()["error"]["message"]


def test_request_over_max_request_tokens_is_413(client, sts_sentences):
    """--max-request-tokens 4096: 16 inputs truncated to 256 tokens pass, 17 are refused before any inference."""
    long_text = " ".join(sts_sentences)  # real text, truncated to 256 tokens
    ok = client.post("/v1/embeddings", json={"input": [long_text] * 16})
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == 4096
    r = client.post("/embed", json={"inputs": [long_text] * 17})
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and err["param"] == "inputs" and "4352 tokens" in err["message"]
    assert client.get("/info").json()["limits"]["max_request_tokens"] == 4096


_ARENA_PROBE = """
import json, sys
from pathlib import Path
from service.inference.onnx_encoder import OnnxModel

def rss():
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024

shrink = json.loads(sys.argv[2])
m = OnnxModel(sys.argv[1], providers=["CPUExecutionProvider"], intra_op_threads=1, arena_shrink_tokens=shrink)
m.warm_up(batch_size=2)
before = rss()
m.embed_sync(["word " * 300] * 16)  # 16 x 256 tokens: activations of ~100 MB
print(json.dumps(rss() - before))
"""


def test_arena_shrinkage_returns_a_big_batch_memory(default_artifact):
    """ONNX Runtime's arena keeps a 16 x 256-token batch's activations for good, unless the batch is over
    ``arena_shrink_tokens`` (then its free regions go back to the OS after the run)."""

    def growth(shrink: int | None) -> float:
        cmd = [sys.executable, "-c", _ARENA_PROBE, str(default_artifact), json.dumps(shrink)]
        out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    kept, shrunk = growth(None), growth(2048)
    assert kept > 60, kept
    assert shrunk < kept / 3, (shrunk, kept)
