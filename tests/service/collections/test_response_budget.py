"""``collections_max_response_bytes`` bounds the Qdrant surface's responses with vectors, as the native searches are
bounded: one budget per request, spent by every search of a batch and by every read of the hits' vectors (dense
floats as JSON text, sparse indices and values, named vectors), so a batch whose each query fits but whose sum does
not is 413 ``response_too_large``; so are scrolls and retrieves of many points with their vectors.

Reproduced before the fix (reliability issue, row 2): ``/qdrant`` query batches with ``with_vector`` were never
bounded (8 x 1,000 hits answered 62.9 MB, 256 x 1,000 2.01 GB in 70 s, server RSS 699 -> 4,354 MB): here each
request below that is 413 answered 200.

A small ``collections_max_response_bytes`` (:data:`LIMIT`) keeps it fast: points given as vectors (nothing is
embedded), 30 hits of a 384-float vector (about 8.2 kB each as JSON) fit, 60 do not.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import backend_args
from tests.server_utils import free_port, run_server

LIMIT = 400_000  # bytes; a hit with its 384-float vector counts 384 * 21 + 2 * (64 + id) bytes
DIM = 384
N = 80


@pytest.fixture(scope="module", params=["embedded", "milvus"])
def env(request, default_artifact: Path, tmp_path_factory):
    """A server whose responses hold at most :data:`LIMIT` bytes, and its client."""
    backend = request.param
    uri = request.getfixturevalue("milvus_uri") if backend == "milvus" else None
    work = tmp_path_factory.mktemp(f"budget-{backend}")
    args = backend_args(backend, uri, f"t{uuid.uuid4().hex[:12]}_")
    env = {"EMBED_COLLECTIONS_MAX_RESPONSE_BYTES": str(LIMIT)}
    with run_server(default_artifact.parent, workdir=work, port=free_port(), args=args, env=env) as s:
        with httpx.Client(base_url=s.url, timeout=120) as c:
            yield {"client": c, "backend": backend}


def _vector(i: int) -> list[float]:
    return [((i * 7 + j * 13) % 17 - 8) / 17.0 + 0.01 for j in range(DIM)]


@pytest.fixture(scope="module")
def col(env) -> str:
    """Collection ``vb``: :data:`N` points given as vectors of the unnamed model-bound vector (384 floats)."""
    c = env["client"]
    r = c.put("/qdrant/collections/vb", json={"vectors": {"size": DIM, "distance": "Cosine"}})
    assert r.status_code == 200, r.text
    pts = [{"id": i, "vector": _vector(i), "payload": {"g": i % 2}} for i in range(N)]
    assert c.put("/qdrant/collections/vb/points", json={"points": pts}).status_code == 200
    return "vb"


def too_large(r: httpx.Response) -> None:
    assert r.status_code == 413, r.text[:300]
    assert "collections_max_response_bytes" in r.json()["status"]["error"]


def test_a_query_batch_with_vectors_shares_one_budget(env, col):
    """Each query of 30 hits with vectors fits; two of them in one batch do not (413), nor one of 60 hits; the same
    batch without vectors is answered; the legacy search batch is bounded the same way."""
    c, q = env["client"], _vector(3)
    one = {"query": q, "limit": 30, "with_vector": True}
    r = c.post(f"/qdrant/collections/{col}/points/query", json=one)
    assert r.status_code == 200 and len(r.json()["result"]["points"]) == 30
    assert all(len(p["vector"]) == DIM for p in r.json()["result"]["points"])
    too_large(c.post(f"/qdrant/collections/{col}/points/query/batch", json={"searches": [one, one]}))
    too_large(c.post(f"/qdrant/collections/{col}/points/query", json={**one, "limit": 60}))
    bare = {"searches": [{**one, "with_vector": False}] * 8}
    r = c.post(f"/qdrant/collections/{col}/points/query/batch", json=bare)
    assert r.status_code == 200 and [len(x["points"]) for x in r.json()["result"]] == [30] * 8
    legacy = {"vector": q, "limit": 30, "with_vector": True}
    assert c.post(f"/qdrant/collections/{col}/points/search", json=legacy).status_code == 200
    too_large(c.post(f"/qdrant/collections/{col}/points/search/batch", json={"searches": [legacy, legacy]}))
    fused = {"prefetch": [{"query": q, "limit": 60}], "query": {"fusion": "rrf"}, "limit": 60, "with_vector": True}
    too_large(c.post(f"/qdrant/collections/{col}/points/query", json=fused))


def test_scroll_and_retrieve_with_vectors_are_bounded(env, col):
    """Scroll (and a query without ``query``, which scrolls) and retrieve of 30 points with vectors are answered, of
    60 are 413; without vectors they are answered. The native routes keep their behaviour (a native scroll is
    bounded by its limit alone)."""
    c = env["client"]
    r = c.post(f"/qdrant/collections/{col}/points/scroll", json={"limit": 30, "with_vector": True})
    assert r.status_code == 200 and len(r.json()["result"]["points"]) == 30
    too_large(c.post(f"/qdrant/collections/{col}/points/scroll", json={"limit": 60, "with_vector": True}))
    r = c.post(f"/qdrant/collections/{col}/points/scroll", json={"limit": 60})
    assert r.status_code == 200 and len(r.json()["result"]["points"]) == 60
    too_large(c.post(f"/qdrant/collections/{col}/points/query", json={"limit": 60, "with_vector": True}))
    r = c.post(f"/qdrant/collections/{col}/points", json={"ids": list(range(30)), "with_vector": True})
    assert r.status_code == 200 and len(r.json()["result"]) == 30
    too_large(c.post(f"/qdrant/collections/{col}/points", json={"ids": list(range(60)), "with_vector": True}))
    r = c.post(f"/collections/{col}/points/scroll", json={"limit": N, "with_vector": True})
    assert r.status_code == 200 and len(r.json()["points"]) == N


def test_named_and_sparse_vectors_count(env):
    """Named dense and sparse vectors count as they are shown: 30 hits with one of them fit, with both do not."""
    if env["backend"] != "embedded":
        pytest.skip("the milvus backend holds one model-bound vector")
    c = env["client"]
    body = {"vectors": {"d": {"size": 200, "distance": "Dot"}}, "sparse_vectors": {"s": {}}}
    assert c.put("/qdrant/collections/nv", json=body).status_code == 200
    sparse = {"indices": list(range(0, 700, 2)), "values": [0.5] * 350}  # 350 entries: 11.2 kB as counted
    pts = [{"id": i, "vector": {"d": _vector(i)[:200], "s": sparse}} for i in range(40)]
    assert c.put("/qdrant/collections/nv/points", json={"points": pts}).status_code == 200
    q = {"query": _vector(1)[:200], "using": "d", "limit": 30}
    for sel in (["d"], ["s"]):
        r = c.post("/qdrant/collections/nv/points/query", json={**q, "with_vector": sel})
        assert r.status_code == 200 and all(set(p["vector"]) == set(sel) for p in r.json()["result"]["points"])
    too_large(c.post("/qdrant/collections/nv/points/query", json={**q, "with_vector": True}))
    too_large(c.post("/qdrant/collections/nv/points/scroll", json={"limit": 30, "with_vector": True}))
