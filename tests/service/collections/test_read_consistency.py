"""Read consistency on the milvus backend, through two service replicas sharing one real Milvus server:

* a write's ``sequence`` is a read-your-writes token: passed as ``after_sequence`` to an ``eventual`` read on the
  *other* replica, the read sees the write at once (point read, search with a filter, count);
* a ``bounded`` read may miss a write, for at most Milvus's ``common.gracefulTime`` (5 s by default);
* the applied consistency is answered in ``X-Read-Consistency`` (on success); bad values are 422.

Real data: STS-B test sentences.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from tests.conftest import backend_args
from tests.server_utils import run_server
from training.data.sts import load_stsb

pytestmark = pytest.mark.timeout(600)

GRACEFUL_S = 5.0  # Milvus 2.3's common.gracefulTime default: how far behind a bounded read may be


@pytest.fixture(scope="module")
def replicas(milvus_uri, default_artifact, tmp_path_factory):
    args = backend_args("milvus", milvus_uri, f"rc{uuid.uuid4().hex[:10]}_")
    work = tmp_path_factory.mktemp("consistency")
    with (
        run_server(default_artifact.parent, workdir=work / "a", args=args) as a,
        run_server(default_artifact.parent, workdir=work / "b", args=args) as b,
        httpx.Client(base_url=a.url, timeout=60) as ca,
        httpx.Client(base_url=b.url, timeout=60) as cb,
    ):
        assert ca.put("/collections/rc", json={"index": "hnsw"}).status_code == 200
        deadline = time.monotonic() + 30
        while cb.get("/collections/rc").status_code != 200:
            assert time.monotonic() < deadline, "replica B never saw the collection"
            time.sleep(0.2)
        yield ca, cb


def test_a_write_token_reads_the_write_on_the_other_replica(replicas):
    ca, cb = replicas
    sents = list(dict.fromkeys(load_stsb("test").sent1))[:20]
    for i, text in enumerate(sents):
        r = ca.put("/collections/rc/points", json={"points": [{"id": i, "text": text, "payload": {"i": i}}]})
        assert r.status_code == 200, r.text
        token = {"consistency": "eventual", "after_sequence": r.json()["sequence"]}
        got = cb.get(f"/collections/rc/points/{i}", params=token)
        assert got.status_code == 200 and got.json()["text"] == text, (i, got.text)
        assert got.headers["x-read-consistency"] == "session"
        hits = cb.post("/collections/rc/search", params=token, json={"query": text, "top_k": 1, "filter": {"i": i}})
        assert [h["id"] for h in hits.json()] == [i], hits.text
        assert cb.get("/collections/rc", params=token).json()["count"] == i + 1
    r = ca.post("/collections/rc/points/delete", json={"ids": [0]})
    token = {"consistency": "eventual", "after_sequence": r.json()["sequence"]}
    assert cb.get("/collections/rc/points/0", params=token).status_code == 404


def test_a_bounded_read_sees_a_write_within_the_graceful_time(replicas):
    ca, cb = replicas
    r = ca.put("/collections/rc/points", json={"points": [{"id": 1000, "text": "a bounded read finds me"}]})
    assert r.status_code == 200
    t0 = time.monotonic()
    while True:
        got = cb.get("/collections/rc/points/1000", params={"consistency": "bounded"})
        if got.status_code == 200:
            assert got.headers["x-read-consistency"] == "bounded"
            break
        assert got.status_code == 404, got.text
        assert time.monotonic() - t0 < GRACEFUL_S + 1.5, "a bounded read missed a write for longer than gracefulTime"
        time.sleep(0.1)
    strong = cb.post("/collections/rc/search", json={"query": "a bounded read finds me", "top_k": 1})
    assert strong.headers["x-read-consistency"] == "strong" and strong.json()[0]["id"] == 1000


def test_bad_consistency_values_are_422(replicas):
    ca, _ = replicas
    for params in ({"consistency": "majority"}, {"after_sequence": -1}, {"after_sequence": "x"}):
        r = ca.post("/collections/rc/search", params=params, json={"query": "x"})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_value", (params, r.text)
