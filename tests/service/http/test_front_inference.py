"""``--api-workers 2 --front-inference true``: the fronts run the core's models themselves, against the real service.

The fronts' answers are the model's (the artifact run directly), their batches are theirs (the core's internal call
is not used), a name the core does not have still gets the core's 404, and a hot swap under load through both
fronts fails no request, answers with the new model only once it is active and with nothing else after, and the
fronts then run the new model themselves and drop the one the core unloaded. SIGTERM lets a request that a front is
running itself finish, and the service exits 0.
"""

from __future__ import annotations

import os
import random
import re
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.inference.model_registry import resolve_id
from tests.artifact_utils import NAME, sliced_artifact, versioned_copy
from tests.server_utils import SwapLoad, embed_either, post_in_background, run_server
from training.data.sts import load_task

pytestmark = pytest.mark.timeout(400)

KEY, ADMIN = "user-key", "admin-key"
AUTH, ADMIN_AUTH = {"Authorization": f"Bearer {KEY}"}, {"Authorization": f"Bearer {ADMIN}"}
FRONT_BATCHES = "embed_front_inference_duration_seconds_count"


@pytest.fixture(scope="module")
def models(default_artifact, tmp_path_factory) -> Path:
    """``models/<NAME>/1``, a copy of the default artifact (the hot-swap test adds version 2 beside it)."""
    return versioned_copy(default_artifact, tmp_path_factory.mktemp("front-inference") / "models", NAME, "1").parents[1]


def _args(*extra: str) -> list[str]:
    """The service's arguments: the default model on one thread, two fronts running it themselves, and ``extra``."""
    base = ["--default-model", NAME, "--intra-op-threads", "1", "--api-keys", KEY]
    return [*base, "--api-workers", "2", "--front-inference", "true", *extra]


def _until_both_fronts_run(srv, needle: str) -> None:
    """Wait (up to 120 s) until the log says twice that a front runs a model itself (``needle``: that line's text)."""
    deadline = time.monotonic() + 120
    while srv.log().count(needle) < 2:
        assert time.monotonic() < deadline, srv.log()[-3000:]
        time.sleep(0.2)


@pytest.fixture(scope="module")
def fi(models, tmp_path_factory):
    args = _args("--admin-api-keys", ADMIN)
    with run_server(models, workdir=tmp_path_factory.mktemp("fi"), args=args) as srv:
        _until_both_fronts_run(srv, f"runs {NAME}:1 itself")
        yield srv
        assert srv.alive(), srv.log()[-3000:]


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    t = load_task("STSBenchmark")
    return sorted(set(t.sent1[:40]) | set(t.sent2[:40]))[:40]


def _sum(url: str, metric: str, **labels: str) -> float:
    """The sum of a metric's samples in ``/metrics`` whose labels include ``labels``."""
    text = httpx.get(f"{url}/metrics").text
    want = [f'{k}="{v}"' for k, v in labels.items()]
    rows = re.findall(rf"^{metric}\{{([^}}]*)\}} (\S+)$", text, re.M)
    return sum(float(v) for lab, v in rows if all(w in lab for w in want))


def _references(artifact_dir: Path, texts: list[str]) -> dict[str, np.ndarray]:
    from service.inference.onnx_encoder import OnnxModel

    m = OnnxModel(artifact_dir, providers=["CPUExecutionProvider"], intra_op_threads=1)
    return dict(zip(texts, m.embed_sync(texts)))


def test_resolve_id_is_the_registrys_rule():
    loaded = [("m:1", "m"), ("m:2", "m"), ("r:1", "r")]
    assert resolve_id(None, loaded, "m:1") == resolve_id("", loaded, "m:1") == "m:1"
    assert resolve_id("m", loaded, "m:1") == "m:1"  # the active model has that name
    assert resolve_id("m", loaded, "r:1") == "m:2"  # else the last added version
    assert resolve_id("m:2", loaded, "m:1") == "m:2" and resolve_id("x", loaded, "m:1") is None


def test_the_fronts_run_the_model_and_answer_as_it_does(fi, models, sentences):
    refs = _references(models / NAME / "1", sentences)
    internal0 = _sum(fi.url, "embed_requests_total", route="/internal/embed")
    batches0 = _sum(fi.url, FRONT_BATCHES)
    rng = random.Random(0)
    for _ in range(30):  # a new connection each: the kernel hands them to either front
        texts = rng.sample(sentences, rng.choice([1, 5, 16]))
        post = lambda path, body: httpx.post(fi.url + path, json=body, headers=AUTH, timeout=60)  # noqa: E731
        r, rows = embed_either(post, texts, rng)
        assert rows is not None, r.text
        assert r.headers["x-model"] == f"{NAME}:1"
        np.testing.assert_allclose(np.asarray(rows, np.float32), np.stack([refs[t] for t in texts]), atol=1e-5)
    assert _sum(fi.url, "embed_requests_total", route="/internal/embed") == internal0  # the core ran none
    assert _sum(fi.url, FRONT_BATCHES) >= batches0 + 30
    per_front = {f: _sum(fi.url, FRONT_BATCHES, front=f) for f in ("0", "1")}
    assert all(v > 0 for v in per_front.values()), per_front


def test_a_model_the_core_lacks_gets_its_404(fi):
    r = httpx.post(f"{fi.url}/v1/embeddings", json={"input": "x", "model": "no-such-model"}, headers=AUTH)
    assert r.status_code == 404 and "no-such-model" in r.text


def test_hot_swap_under_load_then_the_fronts_run_the_new_model(fi, models, sentences):
    v2 = sliced_artifact(models / NAME / "1", models.parent / "stage", NAME, "2", dim=256)
    os.rename(v2, models / NAME / "2")
    refs = {"1": _references(models / NAME / "1", sentences), "2": _references(models / NAME / "2", sentences)}
    with SwapLoad(fi.url, sentences, refs, headers=AUTH, new_connections=True) as load:
        time.sleep(1.5)
        r = httpx.post(f"{fi.url}/admin/models/{NAME}/activate", headers=ADMIN_AUTH, json={"version": "2"}, timeout=120)
        swapped = time.monotonic()
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 60  # the fronts load v2 meanwhile; the core answers for them until then
        while fi.log().count(f"runs {NAME}:2 itself") < 2:
            assert time.monotonic() < deadline, fi.log()[-3000:]
            time.sleep(0.2)
        ran_v2 = _sum(fi.url, FRONT_BATCHES, model=f"{NAME}:2")
        time.sleep(1.5)
    assert not load.failures, load.failures[:5]
    assert all(ok for _, _, ok in load.results), [x for x in load.results if not x[2]][:5]
    before, after = load.split(swapped)
    assert "1" in before and len(after) > 5 and set(after) == {"2"}, (before[-5:], after[:5])
    assert _sum(fi.url, FRONT_BATCHES, model=f"{NAME}:2") > ran_v2  # the fronts ran v2 themselves
    r = httpx.post(f"{fi.url}/admin/models/{NAME}/unload", headers=ADMIN_AUTH, json={"version": "1"}, timeout=60)
    assert r.status_code == 200, r.text
    r = httpx.post(f"{fi.url}/v1/embeddings", json={"input": "x", "model": f"{NAME}:1"}, headers=AUTH)
    assert r.status_code == 404  # resolved in the core's registry: no front runs the unloaded model


def test_sigterm_drains_a_request_a_front_is_running_and_exits_0(models, tmp_path):
    heavy = {"inputs": ["word " * 300] * 24}  # 6 batches of 4 x 256 tokens on one thread, in a front's own batcher
    args = _args("--drain-s", "1", "--max-batch-size", "4")
    with run_server(models, workdir=tmp_path, args=args, env={"EMBED_DRAIN_S": "1"}) as srv:
        _until_both_fronts_run(srv, " itself")  # the default model, whichever version the module's tests left
        t, answer = post_in_background(srv.url, "/embed", heavy, AUTH)
        deadline = time.monotonic() + 60
        while _sum(srv.url, FRONT_BATCHES) < 1:  # a front has run the request's first batch; five are left
            assert time.monotonic() < deadline and t.is_alive(), answer
            time.sleep(0.02)
        srv.proc.send_signal(signal.SIGTERM)
        t.join(timeout=120)
        assert answer == {"status": 200, "rows": 24}
        assert srv.proc.wait(timeout=120) == 0, srv.log()[-3000:]
