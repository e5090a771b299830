"""Hot swap through the real service: admin auth, failed loads, a swap under load, rollback, restart.

One models dir, built from the default fp32 artifact:

* ``minilm/1``: the default encoder (384 dims);
* ``minilm/2``: a genuinely different model — the same graph followed by a Slice to 256
  dimensions — published (atomically renamed in) while the service runs.

fp32 is used (not int8) because dynamic int8 quantisation makes an embedding depend on the
batch it was computed in, and the swap test needs exact per-model references to tell which
model made each response.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.artifact_utils import (
    NAME,
    corrupt_artifact,
    sliced_artifact,
    versioned_copy,
    wrong_dimension_artifact,
)
from tests.server_utils import SwapLoad, run_server
from training.data.sts import load_task

pytestmark = pytest.mark.timeout(400)

ADMIN = {"Authorization": "Bearer admin-secret"}


def publish(build, *args, models_dir: Path, version: str, **kw) -> Path:
    """Build an artifact in a staging dir next to ``models_dir``, then rename it into place (atomic publish)."""
    stage = models_dir.parent / f"stage-{version}-{time.monotonic_ns()}"
    d = build(*args, stage, NAME, version, **kw)
    (models_dir / NAME).mkdir(parents=True, exist_ok=True)
    os.rename(d, models_dir / NAME / version)
    shutil.rmtree(stage, ignore_errors=True)
    return models_dir / NAME / version


@pytest.fixture(scope="module")
def env(default_artifact, tmp_path_factory):
    root = tmp_path_factory.mktemp("hotswap")
    models = root / "models"
    versioned_copy(default_artifact, models, NAME, "1")
    return {"root": root, "models": models, "src": default_artifact}


def _args(extra: list[str] | None = None) -> list[str]:
    return [
        "--default-model",
        NAME,
        "--admin-api-keys",
        "admin-secret",
        "--intra-op-threads",
        "1",
        "--log-level",
        "warning",
        *(extra or []),
    ]


@pytest.fixture(scope="module")
def server(env):
    with run_server(env["models"], workdir=env["root"] / "work", args=_args()) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120.0) as c:
        yield c


@pytest.fixture(scope="module")
def sentences():
    t = load_task("STSBenchmark")
    return sorted(set(t.sent1[:200]) | set(t.sent2[:200]))[:200]


def _active(client) -> str:
    body = client.get("/v1/models").json()
    act = [m for m in body["data"] if m["active"]]
    assert len(act) == 1, body
    return f"{act[0]['id']}:{act[0]['version']}"


def test_models_list_and_admin_auth(client):
    body = client.get("/v1/models").json()
    assert [(m["id"], m["version"], m["active"]) for m in body["data"]] == [(NAME, "1", True)]
    assert [(a["id"], a["loaded"], a["active"]) for a in body["available"]] == [(f"{NAME}:1", True, True)]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = client.post(f"/admin/models/{NAME}/activate", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = client.post("/admin/models/nope/load", headers=ADMIN)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    "builder,version,needle",
    [
        (corrupt_artifact, "8", "cannot open model.onnx"),
        (wrong_dimension_artifact, "9", "256"),
    ],
)
def test_failed_load_keeps_the_old_model_serving(client, env, builder, version, needle):
    d = builder(env["src"], env["models"], NAME, version)
    try:
        for route in ("load", "activate"):
            r = client.post(f"/admin/models/{NAME}/{route}", headers=ADMIN, json={"version": version})
            assert r.status_code == 422, r.text
            err = r.json()["error"]
            assert err["code"] == "model_load_failed" and needle in err["message"], err
        assert _active(client) == f"{NAME}:1"
        avail = {a["id"]: a for a in client.get("/v1/models").json()["available"]}
        assert needle in avail[f"{NAME}:{version}"]["load_error"] and not avail[f"{NAME}:{version}"]["loaded"]
        r = client.post("/v1/embeddings", json={"input": ["still serving"]})
        assert r.status_code == 200 and r.json()["model_version"] == "1" and r.headers["x-model"] == f"{NAME}:1"
        assert len(r.json()["data"][0]["embedding"]) == 384
    finally:
        shutil.rmtree(d)


def _references(artifact_dir: Path, texts: list[str]) -> dict[str, np.ndarray]:
    from service.inference.onnx_encoder import OnnxModel

    m = OnnxModel(artifact_dir, providers=["CPUExecutionProvider"], intra_op_threads=1)
    emb = np.concatenate([m.embed_sync(texts[i : i + 32]) for i in range(0, len(texts), 32)])
    return dict(zip(texts, emb))


def test_swap_under_concurrent_load(client, server, env, sentences):
    v2 = publish(sliced_artifact, env["src"], models_dir=env["models"], version="2", dim=256)
    r = client.post("/admin/models/reload", headers=ADMIN)  # explicit mode: reported, not activated
    assert r.status_code == 200 and f"{NAME}:2" in r.json()["new"] and r.json()["activated"] is None, r.text
    assert _active(client) == f"{NAME}:1"
    refs = {"1": _references(env["models"] / NAME / "1", sentences), "2": _references(v2, sentences)}

    def same_model_fields(r, version: str) -> None:
        if r.request.url.path == "/v1/embeddings":
            name = r.headers["x-model"].rpartition(":")[0]
            assert r.json()["model"] == name and r.json()["model_version"] == version

    with SwapLoad(server.url, sentences, refs, threads=6, sizes=(1, 3, 8, 16), check=same_model_fields) as load:
        time.sleep(3.0)
        r = client.post(f"/admin/models/{NAME}/activate", headers=ADMIN, json={"version": "2"})
        swapped = time.monotonic()
        assert r.status_code == 200, r.text
        assert r.json()["active"]["version"] == "2" and r.json()["previous"]["version"] == "1"
        time.sleep(3.0)
    assert not load.failures, load.failures[:5]
    assert all(ok for _, _, ok in load.results), [r for r in load.results if not r[2]][:5]
    before, after = load.split(swapped)
    assert "1" in before and len(after) > 10, (len(before), len(after))
    assert set(after) == {"2"}  # every request that started after the activate answered came from the new model
    assert _active(client) == f"{NAME}:2"
    assert client.get("/info").json()["dimension"] == 256
    # the old version is still loaded and can be named explicitly
    r = client.post("/v1/embeddings", json={"input": [sentences[0]], "model": f"{NAME}:1"})
    assert r.status_code == 200 and r.json()["model_version"] == "1"
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], refs["1"][sentences[0]], atol=1e-4)


def test_unload_rules(client):
    r = client.post(f"/admin/models/{NAME}/unload", headers=ADMIN, json={"version": "2"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "model_in_use"
    r = client.post(f"/admin/models/{NAME}/unload", headers=ADMIN, json={"version": "1"})
    assert r.status_code == 200 and r.json()["unloaded"] == [f"{NAME}:1"]
    r = client.post("/v1/embeddings", json={"input": ["x"], "model": f"{NAME}:1"})
    assert r.status_code == 404
    assert [m["version"] for m in client.get("/v1/models").json()["data"]] == ["2"]


def test_restart_comes_back_on_last_activated_version(client, server, env):
    # roll back to version 1 (not the newest on disk, not what --default-model resolves to), then crash
    r = client.post(f"/admin/models/{NAME}/activate", headers=ADMIN, json={"version": "1"})
    assert r.status_code == 200 and r.json()["active"]["version"] == "1"
    state = json.loads((env["root"] / "work" / "data" / "active_model.json").read_text())
    assert (state["name"], state["version"]) == (NAME, "1")
    server.kill()
    with run_server(env["models"], workdir=env["root"] / "work", args=_args()) as srv2:
        with httpx.Client(base_url=srv2.url, timeout=60.0) as c:
            assert _active(c) == f"{NAME}:1"
            r = c.post("/v1/embeddings", json={"input": ["back again"]})
            assert r.status_code == 200 and r.headers["x-model"] == f"{NAME}:1"


def test_poll_mode_activates_a_published_version(env):
    root = env["root"] / "poll"
    models = root / "models"
    versioned_copy(env["src"], models, NAME, "1")
    with run_server(
        models, workdir=root / "work", args=_args(["--model-control", "poll", "--model-poll-interval-s", "0.5"])
    ) as srv:
        with httpx.Client(base_url=srv.url, timeout=60.0) as c:
            assert _active(c) == f"{NAME}:1"
            publish(corrupt_artifact, env["src"], models_dir=models, version="3")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                avail = {a["id"]: a for a in c.get("/v1/models").json()["available"]}
                if avail.get(f"{NAME}:3", {}).get("load_error"):
                    break
                time.sleep(0.3)
            assert "cannot open" in avail[f"{NAME}:3"]["load_error"]
            assert _active(c) == f"{NAME}:1"  # the broken publish changed nothing
            shutil.rmtree(models / NAME / "3")
            publish(versioned_copy, env["src"], models_dir=models, version="4")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and _active(c) != f"{NAME}:4":
                time.sleep(0.3)
            assert _active(c) == f"{NAME}:4"
            assert c.post("/v1/embeddings", json={"input": ["x"]}).headers["x-model"] == f"{NAME}:4"
