"""Limits of the real service: queue full (429), API keys (401), requests split over many batches.

One server with a tiny queue, tiny batches and two API keys.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server_utils import run_server
from training.data.sts import load_task

pytestmark = pytest.mark.timeout(300)

KEYS = ["k-alpha", "k-beta"]
AUTH = {"Authorization": f"Bearer {KEYS[1]}"}


@pytest.fixture(scope="module")
def server(default_artifact: Path, tmp_path_factory):
    args = [
        "--default-model",
        default_artifact.name,
        "--max-queue-size",
        "2",
        "--max-batch-size",
        "4",
        "--max-batch-tokens",
        "256",
        "--intra-op-threads",
        "1",
        "--log-level",
        "warning",
    ]
    env = {"EMBED_API_KEYS": ",".join(KEYS)}
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("svc_limits"), args=args, env=env) as srv:
        yield srv
        assert srv.alive(), srv.log()[-3000:]


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    s = load_task("STSBenchmark")
    return list(dict.fromkeys(s.sent1 + s.sent2))


def _good(url: str) -> None:
    r = httpx.post(f"{url}/v1/embeddings", json={"input": "still serving"}, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text


def test_api_keys(server):
    body = {"input": "a sentence"}
    r = httpx.post(f"{server.url}/v1/embeddings", json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert r.headers.get("www-authenticate") == "Bearer"
    for bad in ("Bearer wrong", "Basic k-alpha", "Bearer", "k-alpha"):
        r = httpx.post(f"{server.url}/v1/embeddings", json=body, headers={"Authorization": bad})
        assert r.status_code == 401, bad
        assert r.json()["error"]["type"] == "authentication_error"
    for route in ("/info", "/v1/models"):
        assert httpx.get(f"{server.url}{route}").status_code == 401
        assert httpx.get(f"{server.url}{route}", headers=AUTH).status_code == 200
    # open routes
    for route in ("/health", "/ready", "/metrics"):
        assert httpx.get(f"{server.url}{route}").status_code == 200, route
    for key in KEYS:
        r = httpx.post(f"{server.url}/v1/embeddings", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
    _good(server.url)


def test_request_split_over_many_batches(server, sentences):
    """With max_batch_size 4 and 256 padded tokens, 100 inputs span >25 batches; order must hold."""
    texts = sentences[:100]
    r = httpx.post(f"{server.url}/embed", json={"inputs": texts}, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    batched = np.asarray(r.json(), np.float32)
    one_by_one = []
    for t in texts[:20]:
        one_by_one.append(httpx.post(f"{server.url}/embed", json={"inputs": t}, headers=AUTH, timeout=60).json()[0])
    np.testing.assert_allclose(batched[:20], np.asarray(one_by_one, np.float32), atol=1e-5)
    cos = batched @ batched.T
    assert (np.argmax(cos, axis=1) == np.arange(len(texts))).all()
    metrics = httpx.get(f"{server.url}/metrics").text
    sizes = [line for line in metrics.splitlines() if line.startswith("embed_batch_size_bucket") and 'le="4.0"' in line]
    count = [line for line in metrics.splitlines() if line.startswith("embed_batch_size_count")]
    assert sizes and count and float(sizes[0].split()[-1]) == float(count[0].split()[-1])  # every batch <= 4


def test_flood_gets_429_and_recovers(server, sentences):
    results: list[httpx.Response] = []
    lock = threading.Lock()
    barrier = threading.Barrier(24)

    def flood(i: int) -> None:
        texts = sentences[i * 40 : (i + 1) * 40]
        with httpx.Client(timeout=120) as c:
            barrier.wait()
            r = c.post(f"{server.url}/v1/embeddings", json={"input": texts}, headers=AUTH)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=flood, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    codes = sorted(r.status_code for r in results)
    assert len(codes) == 24 and set(codes) <= {200, 429}, codes
    assert 429 in codes and 200 in codes, codes
    for r in results:
        if r.status_code == 429:
            assert r.headers.get("retry-after") == "1"
            assert r.json()["error"]["code"] == "queue_full"
            assert r.json()["error"]["type"] == "rate_limit_error"
        else:
            assert len(r.json()["data"]) == 40
    _good(server.url)
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'embed_rejected_total{model="all-minilm-l6-v2:1",reason="queue_full"}' in metrics
    assert 'status="429"' in metrics
