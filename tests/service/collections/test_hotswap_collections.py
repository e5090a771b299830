"""Collections follow the active model, through the real service on STS-B sentences.

A flat cosine collection of STS-B test sentences is embedded by ``minilm:1`` (384 dims). A
different model, ``minilm:2`` (the same encoder cut to 256 dims by an ONNX Slice), is
published and activated. While the collection is re-embedded in the background:
searches keep answering (old model, old index), upserts/replacements/deletions are made,
and the old model cannot be unloaded. At the end the collection is on ``minilm:2`` with
256 dims, and its search results equal those of a fresh collection built with the new
model from the same final points; the state survives a restart. It runs on every collections backend (embedded,
and milvus on a real Milvus server).
"""

from __future__ import annotations

import os
import time
import uuid

import httpx
import numpy as np
import pytest

from tests.artifact_utils import NAME, sliced_artifact, versioned_copy
from tests.conftest import backend_args
from tests.server_utils import run_server
from training.data.sts import load_stsb

pytestmark = pytest.mark.timeout(600)

ADMIN = {"Authorization": "Bearer admin-secret"}
N = 300
TOP_K = 10


@pytest.fixture(scope="module")
def data():
    test, dev = load_stsb("test"), load_stsb("dev")
    base = list(dict.fromkeys(test.sent1 + test.sent2))[:N]
    seen = set(base)
    extra = [s for s in dict.fromkeys(dev.sent1 + dev.sent2) if s not in seen][:200]
    return base, extra


@pytest.fixture(scope="module", params=["embedded", "milvus"])
def env(request, default_artifact, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"hotswap_coll_{request.param}")
    uri = request.getfixturevalue("milvus_uri") if request.param == "milvus" else None
    models = root / "models"
    versioned_copy(default_artifact, models, NAME, "1")
    stage = root / "stage"
    sliced_artifact(default_artifact, stage, NAME, "2", 256)
    # a bounded re-embedding rate (points/s) makes the writes below overlap it on any machine
    args = [
        "--default-model",
        NAME,
        "--admin-api-keys",
        "admin-secret",
        "--log-level",
        "warning",
        "--collections-reembed-rate",
        str(REEMBED_RATE),
        *backend_args(request.param, uri, f"h{uuid.uuid4().hex[:12]}_"),
    ]
    return {"root": root, "models": models, "stage": stage, "args": args, "backend": request.param}


def _upsert(c: httpx.Client, coll: str, points: list[dict], chunk: int = 200) -> None:
    for i in range(0, len(points), chunk):
        r = c.put(f"/collections/{coll}/points", json={"points": points[i : i + chunk]})
        assert r.status_code == 200, r.text


def _search(c: httpx.Client, coll: str, queries: list[str]) -> list[list[dict]]:
    r = c.post(
        f"/collections/{coll}/search/batch",
        json={"searches": [{"query": q, "top_k": TOP_K, "with_payload": False} for q in queries]},
    )
    assert r.status_code == 200, r.text
    return r.json()


def _same_results(a: list[dict], b: list[dict], tol: float = 1e-4) -> bool:
    """Equal ids in equal order, except that points whose scores tie (within ``tol``) may swap places."""
    sa, sb = np.array([h["score"] for h in a]), np.array([h["score"] for h in b])
    if len(a) != len(b) or not np.allclose(sa, sb, atol=tol):
        return False
    for j, (x, y) in enumerate(zip(a, b)):
        if x["id"] != y["id"]:
            ties_a = {h["id"] for h in a if abs(h["score"] - sa[j]) <= tol}
            ties_b = {h["id"] for h in b if abs(h["score"] - sb[j]) <= tol}
            if y["id"] not in ties_a and j < len(a) - 1 or ties_a != ties_b and j < len(a) - 1:
                return False
    return True


REEMBED_RATE = 100


def test_collection_follows_the_active_model(env, data):
    base, extra = data
    work = env["root"] / "work"
    with (
        run_server(env["models"], workdir=work, args=env["args"]) as srv,
        httpx.Client(base_url=srv.url, timeout=300.0) as c,
    ):
        assert c.put("/collections/stsb", json={"index": "flat", "metric": "cosine"}).status_code == 200
        _upsert(c, "stsb", [{"id": i, "text": t, "payload": {"row": i}} for i, t in enumerate(base)])
        info = c.get("/collections/stsb").json()
        assert (info["model"]["version"], info["dimension"], info["count"]) == ("1", 384, N)
        queries = base[:: N // 40][:40]
        before = _search(c, "stsb", queries)
        snapshot = c.post("/collections/stsb/snapshots") if env["backend"] == "embedded" else None
        assert snapshot is None or snapshot.status_code == 200, snapshot.text

        # publish and activate a genuinely different model (256 dims)
        os.rename(env["stage"] / NAME / "2", env["models"] / NAME / "2")
        r = c.post(f"/admin/models/{NAME}/activate", headers=ADMIN, json={"version": "2"})
        assert r.status_code == 200, r.text

        # writes during the re-embedding: new points, replacements, deletions; searches keep working
        final = {i: t for i, t in enumerate(base)}
        writes_while_running, v1_unloaded = 0, False
        states = []
        for k in range(0, len(extra), 20):
            new = [{"id": N + k + j, "text": t} for j, t in enumerate(extra[k : k + 20])]
            _upsert(c, "stsb", new)
            final.update({p["id"]: p["text"] for p in new})
            rep = k // 20
            _upsert(c, "stsb", [{"id": rep, "text": extra[-1 - rep]}])
            final[rep] = extra[-1 - rep]
            r = c.post("/collections/stsb/points/delete", json={"ids": [100 + rep]})
            assert r.status_code == 200 and r.json()["deleted"] == 1
            final.pop(100 + rep)
            st = c.get("/collections/stsb").json()
            states.append(st["reembedding"])
            if st["reembedding"]["state"] == "running":
                writes_while_running += 1
                assert st["model"]["version"] == "1" and st["dimension"] == 384  # still the old model
                res = _search(c, "stsb", queries[:5])
                assert all(len(x) == TOP_K for x in res)
                u = c.post(f"/admin/models/{NAME}/unload", headers=ADMIN, json={"version": "1"})
                if u.status_code == 200:  # the switch came between the status read above and this call
                    assert c.get("/collections/stsb").json()["model"]["version"] == "2", u.text
                    v1_unloaded = True
                else:
                    assert u.status_code == 409 and u.json()["error"]["code"] == "model_in_use", u.text
        assert writes_while_running >= 3, states  # the writes really overlapped the re-embedding
        assert states[0]["target_model"]["version"] == "2" and states[0]["total"] >= N

        deadline = time.monotonic() + 300
        while (st := c.get("/collections/stsb").json())["reembedding"]["state"] != "completed":
            assert st["reembedding"]["state"] == "running", st["reembedding"]
            assert time.monotonic() < deadline, st
            time.sleep(0.5)
        assert (st["model"]["version"], st["dimension"], st["count"]) == ("2", 256, len(final))
        assert 0 < st["reembedding"]["rate_per_s"] <= REEMBED_RATE * 1.15  # collections_reembed_rate is honoured

        # a fresh collection built with the new model from the same final points
        assert c.put("/collections/fresh", json={"index": "flat", "metric": "cosine"}).status_code == 200
        assert c.get("/collections/fresh").json()["model"]["version"] == "2"
        _upsert(c, "fresh", [{"id": i, "text": t} for i, t in sorted(final.items())])
        got, want = _search(c, "stsb", queries + extra[:10]), _search(c, "fresh", queries + extra[:10])
        bad = [q for q, a, b in zip(queries + extra[:10], got, want) if not _same_results(a, b)]
        assert not bad, (bad[:3], got[0], want[0])
        assert got != before  # the model really changed the answers
        for pid in (0, 5, N + 3, N - 10):
            a = c.get(f"/collections/stsb/points/{pid}", params={"with_vector": "true"}).json()
            b = c.get(f"/collections/fresh/points/{pid}", params={"with_vector": "true"}).json()
            assert a["text"] == b["text"] == final[pid]
            np.testing.assert_allclose(a["vector"], b["vector"], atol=1e-5)
        assert c.get("/collections/stsb/points/101").status_code == 404

        # the old model is no longer needed by any collection
        if not v1_unloaded:
            u = c.post(f"/admin/models/{NAME}/unload", headers=ADMIN, json={"version": "1"})
            assert u.status_code == 200, u.text
        if snapshot is not None:  # a snapshot taken on minilm:1, recovered now (an admin loads its model first: a
            # recovery loads none, 409), then it follows the active model
            location = f"file://{work / 'data' / 'snapshots' / 'stsb' / snapshot.json()['name']}"
            r = c.put("/collections/restored/snapshots/recover", json={"location": location}, headers=ADMIN)
            assert r.status_code == 409 and r.json()["error"]["code"] == "model_unavailable", r.text
            assert c.post(f"/admin/models/{NAME}/load", headers=ADMIN, json={"version": "1"}).status_code == 200
            r = c.put("/collections/restored/snapshots/recover", json={"location": location}, headers=ADMIN)
            assert r.status_code == 200 and r.json()["model"]["version"] == "1" and r.json()["count"] == N, r.text
            while (st := c.get("/collections/restored").json())["reembedding"]["state"] != "completed":
                assert st["reembedding"]["state"] == "running" and time.monotonic() < deadline + 120, st
                time.sleep(0.5)
            assert (st["model"]["version"], st["dimension"], st["count"]) == ("2", 256, N)
            assert c.put("/collections/fresh0", json={"index": "flat", "metric": "cosine"}).status_code == 200
            _upsert(c, "fresh0", [{"id": i, "text": t} for i, t in enumerate(base)])
            got, want0 = _search(c, "restored", queries), _search(c, "fresh0", queries)
            assert all(_same_results(a, b) for a, b in zip(got, want0)), (got[0], want0[0])
            assert c.post(f"/admin/models/{NAME}/unload", headers=ADMIN, json={"version": "1"}).status_code == 200
        srv.kill()

    # restart: still on the new model and the same answers
    with (
        run_server(env["models"], workdir=work, args=env["args"]) as srv,
        httpx.Client(base_url=srv.url, timeout=300.0) as c,
    ):
        st = c.get("/collections/stsb").json()
        assert (st["model"]["version"], st["dimension"], st["count"]) == ("2", 256, len(final))
        again = _search(c, "stsb", queries + extra[:10])
        assert all(_same_results(a, b) for a, b in zip(again, want))
