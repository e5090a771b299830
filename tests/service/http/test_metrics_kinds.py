"""``GET /metrics`` with a collection of every kind open, through the real service (uvicorn subprocess).

The ``embed_collection_*`` gauges read each collection's info; a collection without a model-bound vector (client
vectors only, sparse vectors only, payloads only) has no index type, metric or model there. Every scrape must
answer 200 with one ``embed_collection_info`` sample per collection, such labels reading ``none``.
"""

from __future__ import annotations

import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server_utils import run_server

pytestmark = pytest.mark.timeout(180)

#: name -> (route, body): a collection of each kind, through the API that makes it
KINDS = {
    "bound": ("/collections/bound", {}),  # native, the model-bound vector only
    "bound-named": (
        "/collections/bound-named",
        {"vectors": {"m": {"model": True}, "c": {"size": 3, "metric": "l2"}}, "sparse_vectors": {"kw": {}}},
    ),
    "sparse-only": ("/collections/sparse-only", {"sparse_vectors": {"kw": {}}}),  # native, no dense vector
    "client-4": ("/qdrant/collections/client-4", {"vectors": {"size": 4, "distance": "Dot"}}),  # client vectors
    "client-named": (
        "/qdrant/collections/client-named",
        {"vectors": {"a": {"size": 2, "distance": "Cosine"}}, "sparse_vectors": {"s": {}}},
    ),
    "payload-only": ("/qdrant/collections/payload-only", {"vectors": {}}),
}


@pytest.fixture(scope="module")
def client(default_artifact, tmp_path_factory):
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("metrics-kinds")) as s:
        with httpx.Client(base_url=s.url, timeout=60) as c:
            yield c


def info_samples(text: str) -> dict[str, dict[str, str]]:
    """``{collection: labels}`` of the ``embed_collection_info`` samples of an exposition text."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "embed_collection_info":
            out.update({s.labels["collection"]: s.labels for s in fam.samples})
    return out


def test_metrics_answer_200_with_every_kind_of_collection(client):
    for name, (route, body) in KINDS.items():
        r = client.put(route, json=body)
        assert r.status_code == 200, (name, r.text)
    r = client.put("/qdrant/collections/client-4/points", json={"points": [{"id": 1, "vector": [1, 0, 0, 0]}]})
    assert r.status_code == 200, r.text
    sparse = {"kw": {"indices": [1, 2], "values": [0.5, 1.0]}}
    r = client.put("/collections/sparse-only/points", json={"points": [{"id": 1, "text": "a b", "vectors": sparse}]})
    assert r.status_code == 200, r.text
    deadline, seen = time.monotonic() + 30, {}
    while set(seen) != set(KINDS) and time.monotonic() < deadline:  # a scrape exports what has been read
        r = client.get("/metrics")
        assert r.status_code == 200, r.text[-2000:]
        seen = info_samples(r.text)
        time.sleep(0.1)
    assert set(seen) == set(KINDS), seen
    for name in ("bound", "bound-named"):
        assert seen[name]["index"] == "flat" and seen[name]["metric"] == "cosine", seen[name]
        assert seen[name]["model"] not in ("none", "None"), seen[name]
    for name in ("sparse-only", "client-4", "client-named", "payload-only"):
        assert {seen[name][k] for k in ("index", "metric", "model", "version")} == {"none"}, seen[name]
    text = client.get("/metrics").text
    families = [f for f in text_string_to_metric_families(text) if f.name == "embed_collection_points"]
    points = {s.labels["collection"]: s.value for f in families for s in f.samples}
    assert points["client-4"] == 1 and points["sparse-only"] == 1 and points["payload-only"] == 0, points
