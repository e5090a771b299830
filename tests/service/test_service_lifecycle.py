"""Request lifecycle on the real server: per-request time budget, cancellation on client disconnect, and the
drain window on SIGTERM. Assertions are on behaviour (status codes, inputs never embedded, what /ready says),
not on timings."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.server_utils import run_server

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


def test_disconnected_client_has_its_inputs_dropped(server):
    before = _inputs_embedded(server.url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/embed", json=HEAVY, timeout=httpx.Timeout(60, read=0.3))
    time.sleep(2.0)
    assert _inputs_embedded(server.url) - before < len(HEAVY["inputs"]) / 2
    metrics = httpx.get(f"{server.url}/metrics").text
    assert re.search(r'embed_requests_total\{[^}]*status="499"[^}]*\} [1-9]', metrics), "disconnect not recorded"
    assert httpx.post(f"{server.url}/embed", json={"inputs": ["Two dogs run."]}, timeout=60).status_code == 200


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
