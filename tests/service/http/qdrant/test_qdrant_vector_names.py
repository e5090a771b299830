"""Qdrant's create_vector_name / delete_vector_name on a real server, driven by qdrant-client unchanged over REST
and gRPC, held to qdrant-client's local mode (the oracle); the native routes' twin; a restart keeps the change. The
policy and the store: tests/service/collections/test_vector_names.py."""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from tests.server_utils import free_port, run_server

pytest.importorskip("qdrant_client")
from qdrant_client import QdrantClient, models  # noqa: E402
from qdrant_client.http.exceptions import UnexpectedResponse  # noqa: E402

DENSE = models.DenseVectorNameConfig(dense=models.DenseVectorConfig(size=3, distance=models.Distance.DOT))
MULTI = models.DenseVectorNameConfig(dense=models.DenseVectorConfig(
    size=2, distance=models.Distance.COSINE,
    multivector_config=models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM)))  # fmt: skip
SPARSE = models.SparseVectorNameConfig(sparse=models.SparseVectorConfig(modifier=models.Modifier.IDF))


@pytest.fixture(scope="module")
def server(default_artifact: Path, tmp_path_factory):
    work, port, grpc_port = tmp_path_factory.mktemp("vector-names"), free_port(), free_port()
    state = {"models": default_artifact.parent, "work": work, "port": port, "grpc": grpc_port}
    with run_server(state["models"], workdir=work, port=port, env={"EMBED_QDRANT_GRPC_PORT": str(grpc_port)}) as s:
        state["server"] = s
        yield state


def clients(server) -> tuple[QdrantClient, QdrantClient]:
    url = f"{server['server'].url}/qdrant"
    kw = {"https": False, "timeout": 60, "check_compatibility": False}
    return QdrantClient(url=url, **kw), QdrantClient(url=url, prefer_grpc=True, grpc_port=server["grpc"], **kw)


def points(rng: np.random.Generator, n: int) -> list[models.PointStruct]:
    return [models.PointStruct(id=i, payload={"i": i}, vector={
        "t": rng.standard_normal(4).round(3).tolist(), "img": rng.standard_normal(3).round(3).tolist(),
        "multi": rng.standard_normal((2, 2)).round(3).tolist(),
        "kw": models.SparseVector(indices=[i % 5, 7], values=[1.0 + i / 10, 0.5 + i / 100])}) for i in range(n)]  # fmt: skip


def records(c: QdrantClient, name: str) -> list:
    return [(p.id, p.vector) for p in c.retrieve(name, list(range(12)), with_vectors=True)]


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, models.SparseVector):
        return a.indices == b.indices and np.allclose(a.values, b.values, atol=1e-6)
    return np.allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), atol=1e-5)


def test_added_and_deleted_vectors_answer_as_local_mode_over_rest_and_grpc(server):
    rest, over_grpc = clients(server)
    local = QdrantClient(":memory:")
    rng = np.random.default_rng(3)
    first, later = points(rng, 6), points(rng, 12)[6:]
    for remote in (rest, over_grpc):
        name = f"vn_{'grpc' if remote is over_grpc else 'rest'}"
        for c in (remote, local):
            if c.collection_exists(name):
                c.delete_collection(name)
            c.create_collection(
                name, vectors_config={"t": models.VectorParams(size=4, distance=models.Distance.COSINE)}
            )
            c.upsert(name, [models.PointStruct(id=p.id, payload=p.payload, vector={"t": p.vector["t"]}) for p in first])
            for vector, config in (("img", DENSE), ("multi", MULTI), ("kw", SPARSE)):
                c.create_vector_name(name, vector, config)
            c.create_vector_name(name, "img", DENSE)  # the same definition again: no change
            c.upsert(name, later)
        info, want = remote.get_collection(name).config.params, local.get_collection(name).config.params
        assert info.vectors.keys() == want.vectors.keys() == {"t", "img", "multi"}
        assert info.vectors["multi"].multivector_config == want.vectors["multi"].multivector_config
        assert info.vectors["img"].size == 3 and info.sparse_vectors["kw"].modifier == models.Modifier.IDF
        got, expected = records(remote, name), records(local, name)
        assert [g[0] for g in got] == [e[0] for e in expected] and all(same(g[1], e[1]) for g, e in zip(got, expected))
        assert set(got[0][1]) == {"t"} and set(got[-1][1]) == {"t", "img", "multi", "kw"}  # stored before: none
        for q, using in ((rng.standard_normal(3).tolist(), "img"), (rng.standard_normal((1, 2)).tolist(), "multi"),
                         (models.SparseVector(indices=[1, 7], values=[1.0, 1.0]), "kw")):  # fmt: skip
            hits, lhits = (c.query_points(name, query=q, using=using, limit=4).points for c in (remote, local))
            assert [h.id for h in hits] == [h.id for h in lhits], using
            assert np.allclose([h.score for h in hits], [h.score for h in lhits], atol=1e-4)
        flt = models.Filter(must=[models.HasVectorCondition(has_vector="img")])
        assert remote.count(name, count_filter=flt).count == local.count(name, count_filter=flt).count == 6
        for c in (remote, local):
            for vector in ("img", "kw", "absent"):  # a name the collection lacks: no change
                c.delete_vector_name(name, vector)
            c.create_vector_name(name, "img", DENSE)  # again: empty, the old values are gone
        got, expected = records(remote, name), records(local, name)
        assert all(same(g[1], e[1]) for g, e in zip(got, expected)) and set(got[-1][1]) == {"t", "multi"}
        info = remote.get_collection(name).config.params
        assert set(info.vectors) == {"t", "img", "multi"} and not info.sparse_vectors
        assert remote.count(name, count_filter=flt).count == 0


def test_refusals_are_client_errors_as_local_mode_raises(server):
    rest, over_grpc = clients(server)
    local = QdrantClient(":memory:")
    for c in (rest, local):
        c.create_collection("vn_err", vectors_config={"t": models.VectorParams(size=4, distance=models.Distance.DOT)})
        c.create_vector_name("vn_err", "kw", SPARSE)
    for vector, config in (("t", DENSE), ("kw", DENSE), ("t", SPARSE)):  # another definition, another kind
        with pytest.raises(ValueError):
            local.create_vector_name("vn_err", vector, config)
        with pytest.raises(UnexpectedResponse) as e:
            rest.create_vector_name("vn_err", vector, config)
        assert e.value.status_code == 422 and "another definition" in e.value.content.decode()
        with pytest.raises(grpc.RpcError) as g:
            over_grpc.create_vector_name("vn_err", vector, config)
        assert g.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(UnexpectedResponse) as e:
        rest.create_vector_name("missing", "img", DENSE)
    assert e.value.status_code == 404
    with pytest.raises(grpc.RpcError) as g:
        over_grpc.delete_vector_name("missing", "img")
    assert g.value.code() == grpc.StatusCode.NOT_FOUND
    half = models.DenseVectorNameConfig(dense=models.DenseVectorConfig(size=3, distance=models.Distance.DOT,
                                                                       datatype=models.Datatype.FLOAT16))  # fmt: skip
    for c in (rest, over_grpc):
        with pytest.raises((UnexpectedResponse, grpc.RpcError), match="float16"):
            c.create_vector_name("vn_err", "half", half)
    url = f"{server['server'].url}/qdrant/collections/vn_err/vectors/x"
    for body in (
        {},
        {"dense": {"size": 3, "distance": "Dot"}, "sparse": {}},
        {"dense": {"size": 0, "distance": "Dot"}},
    ):
        assert httpx.put(url, json=body).status_code == 422, body


def test_native_routes_and_a_restart_keep_the_change(server):
    s = server["server"]
    with httpx.Client(base_url=s.url, timeout=60) as c:
        r = c.put("/collections/vn_native", json={})  # one model-bound unnamed vector
        assert r.status_code == 200, r.text
        assert c.put("/collections/vn_native/points", json={"points": [{"id": 1, "text": "a cat"}]}).status_code == 200
        r = c.put("/collections/vn_native/vectors/img", json={"dense": {"size": 3, "metric": "l2"}})
        assert r.status_code == 200 and r.json()["vectors"]["dense"]["img"]["points"] == 0, r.text
        r = c.put("/collections/vn_native/vectors/kw", json={"sparse": {"modifier": "idf"}})
        assert r.json()["vectors"]["sparse"]["kw"] == {"modifier": "idf", "model": None, "points": 0}
        point = {"id": 2, "text": "a dog", "vectors": {"img": [1, 2, 3], "kw": {"indices": [4], "values": [1.0]}}}
        assert c.put("/collections/vn_native/points", json={"points": [point]}).status_code == 200
        assert c.delete("/collections/vn_native/vectors/kw").json()["vectors"]["sparse"] == {}
        r = c.delete("/collections/vn_native/vectors/")  # the unnamed model-bound vector: no such route
        assert r.status_code in (404, 405)
        r = c.delete("/collections/vn_native/vectors/%20")
        assert r.status_code == 200  # a name the collection lacks: nothing to change
        r = c.put("/collections/vn_native/vectors/bound", json={"dense": {"model": True}})
        assert r.status_code == 422 and "supplied by the client" in r.json()["error"]["message"]
        r = c.put("/collections/vn_native/vectors/x", json={"dense": {"size": 3}, "sparse": {}})
        assert r.status_code == 422 and r.json()["error"]["param"] == "vector_config"
    s.kill()  # a crash: nothing more is written
    with run_server(server["models"], workdir=server["work"], port=server["port"],
                    env={"EMBED_QDRANT_GRPC_PORT": str(server["grpc"])}) as s2:  # fmt: skip
        server["server"] = s2
        with httpx.Client(base_url=s2.url, timeout=60) as c:
            info = c.get("/collections/vn_native").json()
            assert set(info["vectors"]["dense"]) == {"", "img"} and info["vectors"]["sparse"] == {}
            assert info["vectors"]["dense"]["img"]["points"] == 1
            p = c.get("/collections/vn_native/points/2", params={"with_vector": "true"}).json()
            assert p["vectors"] == {"img": [1.0, 2.0, 3.0]}
        rest, _ = clients(server)
        assert set(rest.get_collection("vn_rest").config.params.vectors) == {"t", "img", "multi"}
