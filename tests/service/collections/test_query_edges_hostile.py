"""Query edges a careless or hostile client reaches through ``/qdrant``, on one real server for the module:

* a recommendation (``best_score``, ``sum_scores``), discovery or context query on a sparse vector with no candidate
  (an empty collection, a filter matching nothing) answers an empty result, as on a dense vector;
* a stored geo point whose coordinate is an integer too large for a float (10^400) is not a geo point: a geo filter
  or a formula's geo distance skips it instead of failing;
* a formula whose work runs past the request's time budget is answered 503 at the budget and its work stops there
  (the server's CPU use falls to idle within a second).
"""

from __future__ import annotations

import io
import os
import sqlite3
import tarfile
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server_utils import run_server

pytestmark = pytest.mark.timeout(300)

Q = "/qdrant/collections"
TIMEOUT_S = 2.0  # the server's request_timeout_s
HUGE = "1" + "0" * 400  # an integer literal past any float


@pytest.fixture(scope="module")
def server(default_artifact: Path, tmp_path_factory):
    args = ["--intra-op-threads", "1", "--log-level", "warning", "--request-timeout-s", str(TIMEOUT_S),
            "--collections-max-formula-work", str(10**9)]  # fmt: skip
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("edges"), args=args) as srv:
        yield srv
        assert srv.alive(), srv.log()[-3000:]


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


SPARSE = {"indices": [1, 7], "values": [0.5, 1.0]}
OTHER = {"indices": [2, 7], "values": [1.0, 0.25]}
SCORERS = {
    "best_score": {"recommend": {"positive": [SPARSE], "strategy": "best_score"}},
    "sum_scores": {"recommend": {"positive": [SPARSE], "strategy": "sum_scores"}},
    "best_score with negatives": {"recommend": {"positive": [SPARSE], "negative": [OTHER], "strategy": "best_score"}},
    "discover": {"discover": {"target": SPARSE, "context": [{"positive": SPARSE, "negative": OTHER}]}},
    "context": {"context": [{"positive": SPARSE, "negative": OTHER}]},
}


@pytest.mark.parametrize("modifier", ["none", "idf"])
def test_scorer_queries_on_a_sparse_vector_without_candidates_are_empty(client, modifier):
    name = f"sparse-{modifier}"
    r = client.put(f"{Q}/{name}", json={"vectors": {}, "sparse_vectors": {"s": {"modifier": modifier}}})
    assert r.status_code == 200, r.text

    def query(q: dict, flt: dict | None = None) -> httpx.Response:
        return client.post(f"{Q}/{name}/points/query", json={"query": q, "using": "s", "filter": flt, "limit": 5})

    for kind, q in SCORERS.items():  # an empty collection
        r = query(q)
        assert r.status_code == 200 and r.json()["result"]["points"] == [], (kind, r.status_code, r.text)
    pts = [{"id": i, "vector": {"s": SPARSE if i % 2 else OTHER}, "payload": {"k": i}} for i in range(4)]
    assert client.put(f"{Q}/{name}/points?wait=true", json={"points": pts}).status_code == 200
    nothing = {"must": [{"key": "k", "match": {"value": 99}}]}
    for kind, q in SCORERS.items():  # every point filtered out
        r = query(q, nothing)
        assert r.status_code == 200 and r.json()["result"]["points"] == [], (kind, r.status_code, r.text)
        r = query(q)  # and with candidates, still answered
        assert r.status_code == 200 and len(r.json()["result"]["points"]) == 4, (kind, r.text)


def _with_payload_text(archive: bytes, old: str, new: str, tmp: Path) -> bytes:
    """A collection snapshot (a tar archive) whose store's payload texts have ``old`` replaced by ``new``: what no
    write route accepts (a payload integer past 64 bits is refused at the door) but an uploaded snapshot can hold."""
    members = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for m in tar:
            members[m.name] = tar.extractfile(m).read()
    db = tmp / "points.sqlite3"
    db.write_bytes(members["points.sqlite3"])
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE points SET payload = replace(payload, ?, ?)", (old, new))
    conn.close()
    members["points.sqlite3"] = db.read_bytes()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


def test_a_geo_coordinate_past_any_float_is_not_a_geo_point(client, tmp_path):
    r = client.put("/collections/src", json={"index": "flat", "metric": "cosine"})  # the served model's vectors
    assert r.status_code == 200, r.text
    points = [
        {"id": 1, "text": "one", "payload": {"loc": {"lat": 1.0, "lon": 1.0}}},
        {"id": 2, "text": "two", "payload": {"loc": {"lat": 4242, "lon": 1.0}}},
        {"id": 3, "text": "three", "payload": {"loc": {"lat": 1.0, "lon": -4242}}},
    ]
    assert client.put("/collections/src/points", json={"points": points}).status_code == 200
    r = client.post(f"{Q}/src/snapshots")
    assert r.status_code == 200, r.text
    snap = r.json()["result"]["name"]
    archive = client.get(f"{Q}/src/snapshots/{snap}").content
    hostile = _with_payload_text(archive, "4242", HUGE, tmp_path)  # lat 10^400, lon -10^400
    r = client.post(f"{Q}/geo/snapshots/upload", files={"snapshot": ("s.snapshot", hostile)})
    assert r.status_code == 200, r.text
    ring = [{"lat": -5, "lon": -5}, {"lat": -5, "lon": 5}, {"lat": 5, "lon": 5}, {"lat": 5, "lon": -5}]
    for geo in (
        {"geo_radius": {"center": {"lat": 1.0, "lon": 1.0}, "radius": 100_000.0}},
        {"geo_bounding_box": {"top_left": {"lat": 5, "lon": -5}, "bottom_right": {"lat": -5, "lon": 5}}},
        {"geo_polygon": {"exterior": {"points": [*ring, ring[0]]}}},
    ):
        for flt, count in (({"must": [{"key": "loc", **geo}]}, 1), ({"must_not": [{"key": "loc", **geo}]}, 2)):
            r = client.post(f"{Q}/geo/points/count", json={"exact": True, "filter": flt})
            assert r.status_code == 200 and r.json()["result"]["count"] == count, (flt, r.status_code, r.text)
    formula = {"geo_distance": {"origin": {"lat": 1.0, "lon": 1.0}, "to": "loc"}}
    for pid, status in ((1, 200), (2, 422)):  # the honest point: its distance; the other: the formula's own error
        prefetch = {"query": 3, "filter": {"must": [{"has_id": [pid]}]}, "limit": 1}
        r = client.post(f"{Q}/geo/points/query", json={"prefetch": [prefetch], "query": {"formula": formula}})
        assert r.status_code == status, r.text
        assert r.json()["result"]["points"][0]["score"] == 0.0 if status == 200 else "geo point" in r.text, r.text


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _polygon(n: int) -> dict:
    """A closed ring of ``n`` points (a circle around the equator) as Qdrant's ``geo_polygon``."""
    a = np.linspace(0, 2 * np.pi, n - 1, endpoint=False)
    pts = [{"lat": float(50 * np.sin(t)), "lon": float(150 * np.cos(t))} for t in a]
    return {"exterior": {"points": [*pts, pts[0]]}}


def test_a_formula_running_past_the_time_budget_stops_within_a_second(server, client):
    """A thousand conditions, each a 31-point polygon, on 1,000 prefetched points (a million ring tests of 31 edges in
    Python, allowed by this server's raised ``collections_max_formula_work``; many seconds of work): 503 at ``request_timeout_s``,
    then nothing computes any more."""
    r = client.put(f"{Q}/formula", json={"vectors": {"size": 4, "distance": "Dot"}})
    assert r.status_code == 200, r.text
    rng = np.random.default_rng(0)
    pts = [{"id": i, "vector": [1, i % 7, 0, 1], "payload": {"loc": {"lat": float(rng.uniform(-60, 60)),
            "lon": float(rng.uniform(-170, 170))}}} for i in range(1000)]  # fmt: skip
    assert client.put(f"{Q}/formula/points?wait=true", json={"points": pts}).status_code == 200
    inside = {"key": "loc", "geo_polygon": _polygon(31)}  # under 32 points: tested edge by edge in Python
    body = {"prefetch": [{"query": [1, 1, 0, 1], "limit": 1000}], "query": {"formula": {"sum": [inside] * 1000}}}
    t0 = time.perf_counter()
    r = client.post(f"{Q}/formula/points/query", json=body)
    answered = time.perf_counter() - t0
    assert r.status_code == 503 and "request_timeout" in r.text, (r.status_code, r.text[:300])
    assert answered < TIMEOUT_S + 1.0, answered
    time.sleep(1.0)  # within a second of the deadline...
    before = _cpu_s(server.proc.pid)
    time.sleep(2.0)
    assert _cpu_s(server.proc.pid) - before < 0.5  # ...nothing is computing any more
