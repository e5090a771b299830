"""Request lifecycle on the real server: per-request time budget, cancellation on client disconnect, and the
drain window on SIGTERM, idle and under load; on the same keyless server, the admin routes stay closed. Assertions
are on behaviour (status codes, inputs never embedded, what /ready says), not on timings."""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server_utils import run_server
from training.data.sts import load_task

pytestmark = pytest.mark.timeout(300)

HEAVY = {"inputs": ["word " * 300] * 400}  # 400 inputs of 256 tokens: seconds of work on one thread


def _inputs_embedded(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(float(v) for v in re.findall(r"^embed_inputs_total\{[^}]*\} (\S+)$", text, re.M))


@pytest.fixture(scope="module")
def server(default_artifact: Path, tmp_path_factory):
    args = ["--default-model", default_artifact.name, "--intra-op-threads", "1", "--max-batch-size", "8",
            "--request-timeout-s", "1.5", "--log-level", "warning"]  # fmt: skip
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("lifecycle"), args=args) as srv:
        yield srv
        assert srv.alive(), srv.log()[-3000:]


def test_request_past_its_budget_is_503_and_its_inputs_are_dropped(server):
    before = _inputs_embedded(server.url)
    r = httpx.post(f"{server.url}/embed", json=HEAVY, timeout=60)
    assert r.status_code == 503 and r.json()["error"]["code"] == "request_timeout"
    assert r.headers["retry-after"] == "1"
    time.sleep(1.0)  # a batch running at the cut may finish; nothing after it
    done = _inputs_embedded(server.url) - before
    assert done < len(HEAVY["inputs"]), "the timed-out request kept running"
    ok = httpx.post(f"{server.url}/embed", json={"inputs": ["A man is playing a guitar."]}, timeout=60)
    assert ok.status_code == 200


def test_a_write_past_its_budget_says_it_may_have_been_applied(server):
    """A write stopped at its time budget may have been applied already: the 503 says so (and that a retry is safe);
    a read's 503 does not."""
    assert httpx.put(f"{server.url}/collections/late", json={}).status_code == 200
    pts = [{"id": i, "text": "word " * 300} for i in range(400)]
    r = httpx.put(f"{server.url}/collections/late/points", json={"points": pts}, timeout=60)
    assert r.status_code == 503 and r.json()["error"]["code"] == "request_timeout"
    assert "may already have been applied" in r.json()["error"]["message"] and "safe" in r.json()["error"]["message"]
    r = httpx.post(f"{server.url}/embed", json=HEAVY, timeout=60)
    assert r.status_code == 503 and "applied" not in r.json()["error"]["message"]


def test_disconnected_client_has_its_inputs_dropped(server):
    before = _inputs_embedded(server.url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/embed", json=HEAVY, timeout=httpx.Timeout(60, read=0.3))
    time.sleep(2.0)
    assert _inputs_embedded(server.url) - before < len(HEAVY["inputs"]) / 2
    metrics = httpx.get(f"{server.url}/metrics").text
    assert re.search(r'embed_requests_total\{[^}]*status="499"[^}]*\} [1-9]', metrics), "disconnect not recorded"
    assert httpx.post(f"{server.url}/embed", json={"inputs": ["Two dogs run."]}, timeout=60).status_code == 200


def test_admin_routes_are_closed_without_keys(server):
    for path in ("/admin/models/reload", "/admin/models/all-minilm-l6-v2/activate"):
        r = httpx.post(f"{server.url}{path}", timeout=30)
        assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled", r.text


def test_sigterm_drains_before_stopping(default_artifact, tmp_path):
    args = ["--default-model", default_artifact.name, "--intra-op-threads", "1", "--drain-s", "3",
            "--log-level", "info"]  # fmt: skip
    with run_server(default_artifact.parent, workdir=tmp_path, args=args) as srv:
        assert httpx.get(f"{srv.url}/ready").status_code == 200
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        r = httpx.get(f"{srv.url}/ready")
        assert r.status_code == 503 and r.json()["error"]["code"] == "draining"
        ok = httpx.post(f"{srv.url}/v1/embeddings", json={"input": "still served while draining"}, timeout=30)
        assert ok.status_code == 200
        assert srv.proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
        assert "draining for 3.0 s" in srv.log()


def _heavy_batches(url: str) -> float:
    """Inference batches of more than 1024 padded tokens so far (only the long inputs make such batches)."""
    text = httpx.get(f"{url}/metrics").text
    count = float(re.search(r"^embed_batch_tokens_count\{[^}]*\} (\S+)$", text, re.M).group(1))
    small = float(re.search(r'^embed_batch_tokens_bucket\{le="1024\.0"[^}]*\} (\S+)$', text, re.M).group(1))
    return count - small


def _wait_for(condition, what: str, limit_s: float = 120.0) -> None:
    """Poll ``condition`` every 50 ms (sequencing, not a timing assertion; ``limit_s`` only stops a hang)."""
    end = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < end, f"still waiting for {what}"
        time.sleep(0.05)


def test_sigterm_under_load_fails_no_request(default_artifact, tmp_path):
    """Four clients send real STS-B sentences without pause and a long request (128 inputs of 256 tokens) runs when
    SIGTERM arrives. A load balancer polling /ready sees 503 ``draining`` and stops sending; every request sent
    before that (during the drain too) answers 200, the long one included although the drain ends while it runs
    (uvicorn then waits for it), and the server exits cleanly."""
    s = load_task("STSBenchmark")
    sentences = list(dict.fromkeys(s.sent1 + s.sent2))
    n = len(sentences)
    long_inputs = [" ".join(sentences[(40 * k + j) % n] for j in range(40)) for k in range(128)]
    args = ["--default-model", default_artifact.name, "--intra-op-threads", "1", "--drain-s", "3",
            "--graceful-timeout-s", "240", "--request-timeout-s", "240", "--log-level", "info"]  # fmt: skip
    with run_server(default_artifact.parent, workdir=tmp_path, args=args) as srv:
        url = f"{srv.url}/v1/embeddings"
        stop, sigterm_sent = threading.Event(), threading.Event()
        outcomes: list[tuple[bool, object]] = []  # (answered after SIGTERM was sent, status or exception name)

        def send(body: dict) -> None:
            try:
                outcome: object = httpx.post(url, json=body, timeout=300).status_code
            except httpx.HTTPError as e:
                outcome = type(e).__name__
            outcomes.append((sigterm_sent.is_set(), outcome))

        def client(k: int) -> None:
            i = k * 500
            while not stop.is_set():
                send({"input": [sentences[(i + j) % n] for j in range(8)]})
                i += 8

        long_one = threading.Thread(target=send, args=({"input": long_inputs},), daemon=True)
        clients = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(4)]
        try:
            for t in clients:
                t.start()
            _wait_for(lambda: len(outcomes) >= 12, "the clients' first answers")  # the service is under load
            long_one.start()
            _wait_for(lambda: _heavy_batches(srv.url) >= 1, "the long request's first batch")
            srv.proc.send_signal(signal.SIGTERM)
            sigterm_sent.set()
            _wait_for(lambda: httpx.get(f"{srv.url}/ready").status_code == 503, "/ready 503")  # the load balancer
            ready = httpx.get(f"{srv.url}/ready")
        finally:
            stop.set()
        for t in (*clients, long_one):
            t.join(timeout=300)
        code = srv.proc.wait(timeout=300)
        log = srv.log()
    assert ready.status_code == 503 and ready.json()["error"]["code"] == "draining"
    failed = [o for _, o in outcomes if o != 200]
    assert not failed, failed
    assert sum(after for after, _ in outcomes) >= 5  # the four clients' requests in flight, and the long one
    assert len(outcomes) > 13 and outcomes[-1] == (True, 200)  # the long request finished last
    assert "Waiting for connections to close" in log  # the drain ended while the long request ran
    assert code in (0, -signal.SIGTERM)
