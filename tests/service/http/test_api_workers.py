"""``--api-workers 2``: a supervisor, one core process and two front processes on one port, against the real service.

One shared multi-process server and one single-process server (the reference) over the same models: the fronts'
embeddings (OpenAI floats and base64, TEI ``/embed``) and their 4xx answers are the single process's; collections
(native and Qdrant routes) work through the public port; a hot swap under load through both fronts fails no request
and no answer comes from a model other than the one active when it was asked; ``/metrics`` counts both fronts'
requests; the fronts tokenize, the core runs their ids; a killed front is restarted; SIGTERM drains an in-flight request and the service exits 0.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from harness.ports import free_port
from tests.artifact_utils import NAME, sliced_artifact, versioned_copy
from tests.server_utils import REPO_ROOT, SwapLoad, post_in_background, run_server
from training.data.sts import load_task

pytestmark = pytest.mark.timeout(400)

KEY, ADMIN = "user-key", "admin-key"
AUTH, ADMIN_AUTH = {"Authorization": f"Bearer {KEY}"}, {"Authorization": f"Bearer {ADMIN}"}


def _args(*extra: str) -> list[str]:
    return ["--default-model", NAME, "--intra-op-threads", "1", "--log-level", "info", "--api-keys", KEY,
            "--admin-api-keys", ADMIN, "--max-client-batch-size", "64", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def models(default_artifact, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("api-workers-models")
    versioned_copy(default_artifact, root / "models", NAME, "1")
    return root / "models"


@pytest.fixture(scope="module")
def multi(models, tmp_path_factory):
    with run_server(models, workdir=tmp_path_factory.mktemp("multi"), args=_args("--api-workers", "2")) as srv:
        yield srv
        assert srv.alive(), srv.log()[-3000:]


@pytest.fixture(scope="module")
def single(models, tmp_path_factory):
    with run_server(models, workdir=tmp_path_factory.mktemp("single"), args=_args()) as srv:
        yield srv


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    t = load_task("STSBenchmark")
    return sorted(set(t.sent1[:60]) | set(t.sent2[:60]))[:60]


def _children(pid: int) -> dict[int, str]:
    """``{pid: command line}`` of the processes whose parent is ``pid`` (from /proc)."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == pid:
                    out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, IndexError, ValueError):
                continue
    return out


def _fronts(pid: int) -> list[int]:
    return sorted(p for p, cmd in _children(pid).items() if "service.supervisor front" in cmd)


def _front_counts(url: str, route: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    counts: dict[str, float] = {}
    for labels, v in re.findall(r"^embed_front_requests_total\{([^}]*)\} (\S+)$", text, re.M):
        if f'route="{route}"' in labels:
            front = re.search(r'front="([^"]+)"', labels).group(1)
            counts[front] = counts.get(front, 0.0) + float(v)
    return counts


def test_processes_and_private_socket(multi):
    kids = _children(multi.proc.pid)
    assert len(_fronts(multi.proc.pid)) == 2, kids
    core = [cmd for cmd in kids.values() if "service.supervisor core" in cmd]
    assert len(core) == 1, kids
    runtime = Path(core[0].split()[-1])
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
    assert stat.S_IMODE((runtime / "core.sock").stat().st_mode) == 0o600
    assert stat.S_IMODE((runtime / "settings.json").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/embeddings", {"input": ["A man is playing a guitar.", "Zwei Hunde rennen."]}),
        ("/v1/embeddings", {"input": "one text", "encoding_format": "base64", "dimensions": 64}),
        ("/v1/embeddings", {"input": ["a query"], "input_type": "query", "encoding_format": "base64"}),
        ("/embeddings", {"input": ["no version prefix"]}),
        ("/embed", {"inputs": ["TEI's route", "second"], "normalize": False}),
        ("/embed", {"inputs": "word " * 600, "truncation_direction": "left", "dimensions": 8}),
        ("/", {"inputs": ["TEI's root route"]}),
    ],
)
def test_embeddings_equal_the_single_process(multi, single, path, body):
    a = httpx.post(multi.url + path, json=body, headers=AUTH, timeout=60)
    b = httpx.post(single.url + path, json=body, headers=AUTH, timeout=60)
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    for h in ("x-model", "x-model-sha256", "content-type"):
        assert a.headers[h] == b.headers[h]
    ja, jb = a.json(), b.json()
    if path == "/embed" or path == "/":
        np.testing.assert_allclose(np.asarray(ja), np.asarray(jb), atol=1e-6)
        return
    rows = [[np.frombuffer(base64.b64decode(d["embedding"]), "<f4") if isinstance(d["embedding"], str)
             else np.asarray(d["embedding"]) for d in j["data"]] for j in (ja, jb)]  # fmt: skip
    np.testing.assert_allclose(np.asarray(rows[0]), np.asarray(rows[1]), atol=1e-6)
    assert {k: v for k, v in ja.items() if k != "data"} == {k: v for k, v in jb.items() if k != "data"}
    assert [(d["object"], d["index"], type(d["embedding"])) for d in ja["data"]] == [
        (d["object"], d["index"], type(d["embedding"])) for d in jb["data"]
    ]


BAD = [
    ("POST", "/v1/embeddings", {}, '{"input": []}'),
    ("POST", "/v1/embeddings", {}, '{"input": [1, 2, 3]}'),
    ("POST", "/v1/embeddings", {}, '{"input": "x", "dimensions": 0}'),
    ("POST", "/v1/embeddings", {}, '{"input": "x", "dimensions": 100000}'),
    ("POST", "/v1/embeddings", {}, '{"input": "x", "model": "no-such-model"}'),
    ("POST", "/v1/embeddings", {}, '{"input": ["x"], "input_type": "nope"}'),
    ("POST", "/v1/embeddings", {}, '{"input": ' + str(["t"] * 65).replace("'", '"') + "}"),
    ("POST", "/v1/embeddings", {}, '{"input": "\\udcff"}'),
    ("POST", "/v1/embeddings", {}, '{"input": '),
    ("POST", "/v1/embeddings", {"content-type": "text/plain"}, '{"input": "x"}'),
    ("POST", "/v1/embeddings", {"authorization": "Bearer wrong"}, '{"input": "x"}'),
    ("POST", "/embed", {}, '{"inputs": "x", "prompt_name": "nope"}'),
    ("POST", "/embed", {}, '{"inputs": "word ' + "word " * 600 + '", "truncate": false}'),
    ("POST", "/embed", {}, '{"inputs": "x", "normalize": "yes"}'),
    ("POST", "/tokenize", {}, '{"inputs": []}'),
    ("PUT", "/collections/bad name", {}, "{}"),
    ("POST", "/qdrant/collections/missing/points/query", {}, '{"query": [0.1]}'),
    ("GET", "/no/such/route", {}, ""),
    ("POST", "/internal/embed", {}, '{"texts": ["x"], "options": {}}'),
]


@pytest.mark.parametrize("method, path, headers, raw", BAD)
def test_bad_input_gets_the_same_answer(multi, single, method, path, headers, raw):
    hdrs = {"content-type": "application/json", **AUTH, **headers}
    a = httpx.request(method, multi.url + path, content=raw.encode(), headers=hdrs, timeout=60)
    b = httpx.request(method, single.url + path, content=raw.encode(), headers=hdrs, timeout=60)
    assert 400 <= a.status_code < 500 and a.status_code == b.status_code, (a.status_code, b.status_code, a.text)
    ja, jb = a.json(), b.json()
    if path.startswith("/qdrant"):  # Qdrant's envelope carries the time taken
        ja.pop("time", None), jb.pop("time", None)
    assert ja == jb


def test_collections_through_the_public_port(multi, sentences):
    c = httpx.Client(base_url=multi.url, headers=AUTH, timeout=60)
    assert c.put("/collections/docs", json={}).status_code == 200
    pts = [{"id": i, "text": t, "payload": {"i": i}} for i, t in enumerate(sentences[:20])]
    r = c.put("/collections/docs/points", json={"points": pts})
    assert r.status_code == 200, r.text
    r = c.post("/collections/docs/search", json={"query": sentences[3], "top_k": 3})
    assert r.status_code == 200, r.text
    hits = r.json()
    assert hits[0]["id"] in (3, "3") and hits[0]["payload"] == {"i": 3}
    q = c.post("/qdrant/collections/docs/points/scroll", json={"limit": 100}).json()
    assert len(q["result"]["points"]) == 20
    snap = c.post("/collections/docs/snapshots").json()  # a snapshot down and up again: bodies streamed both ways
    got = c.get(f"/collections/docs/snapshots/{snap['name']}")
    assert got.status_code == 200 and len(got.content) == snap["size"]
    r = c.post("/collections/copy/snapshots/upload", files={"snapshot": ("s.snapshot", got.content)})
    assert r.status_code == 200, r.text
    assert c.get("/collections/copy").json()["count"] == 20
    assert c.get("/console/").status_code == 200
    assert httpx.get(f"{multi.url}/collections").status_code == 401  # the core's key check, through the proxy


def test_metrics_count_both_fronts(multi):
    before = _front_counts(multi.url, "/v1/embeddings")
    for _ in range(40):  # a new connection each: the kernel hands them to either front
        r = httpx.post(f"{multi.url}/v1/embeddings", json={"input": "count me"}, headers=AUTH, timeout=60)
        assert r.status_code == 200
    after = _front_counts(multi.url, "/v1/embeddings")
    grown = {f: after[f] - before.get(f, 0.0) for f in after}
    assert sum(grown.values()) == 40 and len([v for v in grown.values() if v > 0]) == 2, grown
    text = httpx.get(f"{multi.url}/metrics").text
    assert re.search(r'^embed_requests_total\{[^}]*route="/internal/embed"[^}]*\} [1-9]', text, re.M)
    assert re.search(r'^embed_front_requests_total\{[^}]*route="proxied"[^}]*\} [1-9]', text, re.M)


def _counts(url: str, metric: str) -> dict[str, float]:
    """``{labels: value}`` of a metric's samples in ``/metrics``."""
    text = httpx.get(f"{url}/metrics").text
    return {labels: float(v) for labels, v in re.findall(rf"^{metric}\{{([^}}]*)\}} (\S+)$", text, re.M)}


def test_fronts_tokenize_and_the_core_runs_their_ids(multi, single):
    """Once a front has seen the core run the active model it tokenizes that model's requests itself: each request is
    tokenized once, by a front (``embed_front_tokenization_duration_seconds``), not by the core
    (``embed_tokenization_duration_seconds``), and the answer is still the single process's."""
    front, core = "embed_front_tokenization_duration_seconds_count", "embed_tokenization_duration_seconds_count"
    post = lambda url, body: httpx.post(f"{url}/v1/embeddings", json=body, headers=AUTH, timeout=60)  # noqa: E731
    deadline = time.monotonic() + 60
    while len({re.search(r'front="([^"]+)"', k).group(1) for k in _counts(multi.url, front)}) < 2:
        assert time.monotonic() < deadline, "a front never tokenized"
        assert post(multi.url, {"input": "teach the fronts"}).status_code == 200
    f0, c0 = sum(_counts(multi.url, front).values()), sum(_counts(multi.url, core).values())
    body = {"input": ["A man is playing a guitar.", "word " * 400], "encoding_format": "base64"}
    for _ in range(30):
        a = post(multi.url, body)
        assert a.status_code == 200, a.text
    b = post(single.url, body)
    f1, c1 = sum(_counts(multi.url, front).values()), sum(_counts(multi.url, core).values())
    assert (f1 - f0, c1 - c0) == (30, 0)
    assert a.json() == b.json()  # base64 rows and usage: the same bytes


def test_a_client_gone_stops_its_work_in_the_core(multi):
    """A client that disconnects from a front: the front drops its call to the core, whose middleware sees the
    disconnect (499) and cancels the request's queued inputs, as for a client of its own."""
    heavy = {"inputs": ["word " * 300] * 64}  # 64 inputs of 256 tokens: seconds on one thread
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{multi.url}/embed", json=heavy, headers=AUTH, timeout=httpx.Timeout(60, read=0.3))
    deadline = time.monotonic() + 30
    pattern = r'^embed_requests_total\{[^}]*route="/internal/embed"[^}]*status="499"[^}]*\} [1-9]'
    while not re.search(pattern, httpx.get(f"{multi.url}/metrics").text, re.M):
        assert time.monotonic() < deadline, "the core never saw the client go"
        time.sleep(0.1)
    assert httpx.post(f"{multi.url}/embed", json={"inputs": "next"}, headers=AUTH, timeout=60).status_code == 200


def test_a_killed_front_is_restarted(multi):
    old = _fronts(multi.proc.pid)
    os.kill(old[0], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while (now := _fronts(multi.proc.pid)) == old or len(now) < 2:
        assert time.monotonic() < deadline, "no front restarted"
        r = httpx.post(f"{multi.url}/embed", json={"inputs": "still served"}, headers=AUTH, timeout=60)
        assert r.status_code == 200  # the other front serves meanwhile
        time.sleep(0.1)
    assert old[0] not in now and old[1] in now
    assert "restarting it" in multi.log()


def _references(artifact_dir: Path, texts: list[str]) -> dict[str, np.ndarray]:
    from service.inference.onnx_encoder import OnnxModel

    m = OnnxModel(artifact_dir, providers=["CPUExecutionProvider"], intra_op_threads=1)
    return dict(zip(texts, m.embed_sync(texts)))


def test_hot_swap_under_load_through_both_fronts(multi, models, sentences):
    stage = models.parent / "stage"
    v2 = sliced_artifact(models / NAME / "1", stage, NAME, "2", dim=256)
    os.rename(v2, models / NAME / "2")
    refs = {"1": _references(models / NAME / "1", sentences), "2": _references(models / NAME / "2", sentences)}
    r = httpx.post(f"{multi.url}/admin/models/{NAME}/load", headers=ADMIN_AUTH, json={"version": "2"}, timeout=120)
    assert r.status_code == 200, r.text
    before_counts = _front_counts(multi.url, "/v1/embeddings")
    with SwapLoad(multi.url, sentences, refs, headers=AUTH, new_connections=True) as load:
        time.sleep(2.0)
        r = httpx.post(
            f"{multi.url}/admin/models/{NAME}/activate", headers=ADMIN_AUTH, json={"version": "2"}, timeout=120
        )
        swapped = time.monotonic()
        assert r.status_code == 200, r.text
        time.sleep(2.0)
    assert not load.failures, load.failures[:5]
    assert all(ok for _, _, ok in load.results), [x for x in load.results if not x[2]][:5]
    before, after = load.split(swapped)
    assert "1" in before and len(after) > 5 and set(after) == {"2"}, (before[-5:], after[:5])
    grown = {f: v - before_counts.get(f, 0.0) for f, v in _front_counts(multi.url, "/v1/embeddings").items()}
    assert len([v for v in grown.values() if v > 0]) == 2, grown  # both fronts served during the swap


def test_sigterm_drains_an_in_flight_request_and_exits_0(models, tmp_path):
    heavy = {"inputs": ["word " * 300] * 24}  # 6 batches of 4 x 256 tokens on one thread
    args = _args("--api-workers", "2", "--drain-s", "1", "--max-batch-size", "4")
    with run_server(models, workdir=tmp_path, args=args, env={"EMBED_DRAIN_S": "1"}) as srv:
        t, answer = post_in_background(srv.url, "/embed", heavy, AUTH)
        deadline = time.monotonic() + 60
        while not re.search(r"^embed_queue_size\{[^}]*\} 1\.0$", httpx.get(f"{srv.url}/metrics").text, re.M):
            assert time.monotonic() < deadline and t.is_alive(), answer  # until the request is in the core's queue
            time.sleep(0.02)
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        r = httpx.get(f"{srv.url}/ready", timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "draining"
        t.join(timeout=120)
        assert answer == {"status": 200, "rows": 24}
        assert srv.proc.wait(timeout=120) == 0, srv.log()[-3000:]
        assert "stopping: fronts first" in srv.log()


def test_a_core_that_cannot_start_stops_the_service(models, tmp_path):
    """The core fails its start (no such model): the supervisor stops the fronts and exits with an error."""
    cmd = [sys.executable, "-m", "service", "--api-workers", "2", "--models-dir", str(models), "--default-model",
           "no-such-model", "--port", str(free_port()), "--data-dir", str(tmp_path / "data")]  # fmt: skip
    p = subprocess.run(
        cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "EMBED_DRAIN_S": "0"}
    )
    assert p.returncode != 0 and "the core process exited" in p.stderr, p.stderr[-3000:]
