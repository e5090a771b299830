"""Two service replicas sharing one real Milvus server and one models directory, on loopback.

* A point upserted through one replica is read and found through the other at once; a collection deleted through
  both at once is deleted once (one 200, the others 404).
* A model version published into the models directory reaches both (poll mode), and the collection's
  re-embedding towards it runs once (one replica holds the claim; the other only waits), after which both
  replicas answer with the new model, dimension and index.
* A replica killed (SIGKILL) in the middle of a re-embedding leaves the collection whole: the other replica's claim
  takes over once the dead one lapses, resumes and switches; the killed replica, restarted, finds the new state.

Real data: STS-B sentences; real models: the default encoder and the same encoder cut to 256 and 128 dimensions.
"""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.artifact_utils import NAME, sliced_artifact, versioned_copy
from tests.conftest import backend_args
from tests.server_utils import run_server
from training.data.sts import load_stsb

pytestmark = pytest.mark.timeout(900)

N = 250
RATE = 60  # re-embedding points/s: slow enough for the kill to land mid-way on any machine


@pytest.fixture(scope="module")
def sentences():
    t = load_stsb("test")
    return list(dict.fromkeys(t.sent1 + t.sent2))[: N + 50]


def _args(uri: str, prefix: str) -> list[str]:
    return [
        "--default-model", NAME, "--model-control", "poll", "--model-poll-interval-s", "0.5", "--log-level", "info",
        "--collections-reembed-rate", str(RATE), "--collections-milvus-claim-ttl-s", "6",
        *backend_args("milvus", uri, prefix),
    ]  # fmt: skip


def _wait(pred, timeout: float = 180.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if v := pred():
            return v
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _info(c: httpx.Client) -> dict:
    r = c.get("/collections/stsb")
    assert r.status_code == 200, r.text
    return r.json()


def _ids(c: httpx.Client, queries: list[str]) -> list[list]:
    r = c.post("/collections/stsb/search/batch", json={"searches": [{"query": q, "top_k": 5} for q in queries]})
    assert r.status_code == 200, r.text
    return [[h["id"] for h in hits] for hits in r.json()]


def _started(log: str, version: str) -> int:
    return log.count(f"re-embedding from {NAME}:") and log.count(f"to {NAME}:{version}")


def test_two_replicas_share_collections_and_switch_once(milvus_uri, default_artifact, tmp_path, sentences):
    models, stage = tmp_path / "models", tmp_path / "stage"
    versioned_copy(default_artifact, models, NAME, "1")
    sliced_artifact(default_artifact, stage, NAME, "2", 256)
    sliced_artifact(default_artifact, stage, NAME, "3", 128)
    args = _args(milvus_uri, f"r{uuid.uuid4().hex[:12]}_")
    base, extra = sentences[:N], sentences[N:]
    queries = base[::30]
    with (
        run_server(models, workdir=tmp_path / "a", args=args) as a,
        run_server(models, workdir=tmp_path / "b", args=args) as b,
        httpx.Client(base_url=a.url, timeout=120) as ca,
        httpx.Client(base_url=b.url, timeout=120) as cb,
    ):
        # 1. shared reads and writes
        assert ca.put("/collections/stsb", json={"index": "hnsw", "metric": "cosine"}).status_code == 200
        for i in range(0, N, 200):
            pts = [{"id": j, "text": base[j], "payload": {"row": j}} for j in range(i, min(i + 200, N))]
            assert ca.put("/collections/stsb/points", json={"points": pts}).status_code == 200
        assert cb.get("/collections/stsb/points/17").json()["text"] == base[17]  # written by A, read through B
        assert cb.put("/collections/stsb/points", json={"points": [{"id": "b1", "text": extra[0]}]}).status_code == 200
        assert ca.get("/collections/stsb/points/b1").json()["text"] == extra[0]
        assert _ids(ca, queries) == _ids(cb, queries)
        assert _info(cb)["count"] == N + 1
        # an alias made through A answers through B once B's view refreshed (collections_milvus_refresh_s)
        r = ca.post("/collections/aliases", json={"actions": [{"create_alias": {"collection_name": "stsb",
                                                                                "alias_name": "live"}}]})  # fmt: skip
        assert r.status_code == 200, r.text
        _wait(lambda: cb.get("/collections/live/points/17").status_code == 200, 30, "the alias on replica B")
        assert cb.get("/collections/live/points/17").json()["text"] == base[17]
        assert cb.get("/aliases").json()["aliases"] == [{"alias_name": "live", "collection_name": "stsb"}]
        # concurrent deletes of one collection through both replicas: exactly one answers 200, the others 404
        assert ca.put("/collections/doomed", json={}).status_code == 200
        with ThreadPoolExecutor(8) as ex:
            codes = list(ex.map(lambda i: (ca, cb)[i % 2].delete("/collections/doomed").status_code, range(8)))
        assert sorted(codes) == [200] + [404] * 7, codes
        assert all(c.get("/collections/doomed").status_code == 404 for c in (ca, cb))

        # 2. publish v2: both replicas activate it, one re-embeds, both switch
        os.rename(stage / NAME / "2", models / NAME / "2")
        # the switch and the finished status are two registry writes: a view may show the new model a refresh
        # (0.5 s) before it shows the status "completed"
        _wait(
            lambda: all((i := _info(c))["model"]["version"] == "2" and i["reembedding"]["state"] == "completed"
                        for c in (ca, cb)),
            what="both replicas on v2, re-embedding completed",
        )  # fmt: skip
        for c in (ca, cb):
            st = _info(c)
            assert (st["dimension"], st["count"], st["reembedding"]["state"]) == (256, N + 1, "completed"), st
        assert sum(_started(s.log(), "2") > 0 for s in (a, b)) == 1, "the re-embedding ran on exactly one replica"
        v2 = _ids(ca, queries)
        assert v2 == _ids(cb, queries)

        # 3. publish v3 and kill the replica that re-embeds, mid-way
        os.rename(stage / NAME / "3", models / NAME / "3")
        st = _wait(
            lambda: (s := _info(ca)["reembedding"]) and s.get("owner") and s["target_model"]["version"] == "3"
            and 50 <= s["done"] < N // 2 and s,
            what="a re-embedding towards v3 under way",
        )  # fmt: skip
        pid = int(st["owner"].rsplit(":", 1)[1])
        owner, survivor, cs = (a, b, cb) if pid == a.proc.pid else (b, a, ca)
        assert pid == owner.proc.pid
        owner.kill()
        # writes through the survivor keep working while it takes over
        assert (
            cs.put("/collections/stsb/points", json={"points": [{"id": "late", "text": extra[1]}]}).status_code == 200
        )
        done = _wait(lambda: (i := _info(cs))["model"]["version"] == "3" and i, timeout=300, what="the takeover")
        assert (done["dimension"], done["count"]) == (128, N + 2)
        assert done["reembedding"]["owner"] != st["owner"]
        after = _ids(cs, queries)

    # the killed replica, restarted, finds the switched collection with every point
    with run_server(models, workdir=tmp_path / "a2", args=args) as a2, httpx.Client(base_url=a2.url, timeout=120) as c2:
        info = _info(c2)
        assert (info["model"]["version"], info["dimension"], info["count"]) == ("3", 128, N + 2)
        assert _ids(c2, queries) == after
        got = c2.get("/collections/stsb/points/late", params={"with_vector": "true"}).json()
        assert got["text"] == extra[1] and len(got["vector"]) == 128
        assert np.isclose(np.linalg.norm(got["vector"]), 1.0, atol=1e-4)
        # a fresh collection on v3 from the same points answers the same (nothing half-switched or stale)
        assert c2.put("/collections/fresh", json={"index": "flat", "metric": "cosine"}).status_code == 200
        pts = [{"id": j, "text": base[j]} for j in range(N)] + [
            {"id": "b1", "text": extra[0]},
            {"id": "late", "text": extra[1]},
        ]
        assert c2.put("/collections/fresh/points", json={"points": pts}).status_code == 200
        r = c2.post("/collections/fresh/search/batch", json={"searches": [{"query": q, "top_k": 5} for q in queries]})
        fresh = [[h["id"] for h in hits] for hits in r.json()]
        overlap = np.mean([len(set(x) & set(y)) / 5 for x, y in zip(after, fresh)])
        assert overlap >= 0.9, overlap  # hnsw vs flat on the same vectors
