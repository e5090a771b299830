"""Qdrant's gRPC API (qdrant_grpc_port), driven by qdrant-client with ``prefer_grpc=True``, unchanged: the same answers
as its REST twin and as qdrant-client's local mode (the oracle), API keys required as over HTTP, errors as gRPC
statuses."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.server_utils import free_port, run_server

qc = pytest.importorskip("qdrant_client")
from qdrant_client import QdrantClient, models  # noqa: E402

KEY = "grpc-test-key"


@pytest.fixture(scope="module")
def server(default_artifact: Path, tmp_path_factory):
    port = free_port()
    env = {"EMBED_QDRANT_GRPC_PORT": str(port), "EMBED_API_KEYS": KEY}
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("grpc"), env=env) as s:
        yield s, port


def clients(server) -> tuple[QdrantClient, QdrantClient]:
    s, port = server
    url = f"{s.url}/qdrant"
    return (QdrantClient(url=url, prefer_grpc=True, grpc_port=port, api_key=KEY, https=False, timeout=60),
            QdrantClient(url=url, api_key=KEY, https=False, timeout=60))  # fmt: skip


def test_grpc_answers_as_rest_and_local_mode(server):
    over_grpc, over_rest = clients(server)
    local = QdrantClient(":memory:")
    rng = np.random.default_rng(4)
    words = ["ape", "wolf", "cat", "dog"]
    points = [
        models.PointStruct(
            id=i,
            vector={"v": rng.standard_normal(6).round(3).tolist(),
                    "s": models.SparseVector(indices=[i % 7, 10 + i % 3], values=[1.0 + i / 100, 0.5])},
            payload={"w": words[i % 4], "n": i, "none": None, "tags": [words[i % 3]]},
        )
        for i in range(60)
    ]  # fmt: skip
    for c in (over_grpc, local):
        c.create_collection("gc", vectors_config={"v": models.VectorParams(size=6, distance=models.Distance.COSINE)},
                            sparse_vectors_config={"s": models.SparseVectorParams(modifier=models.Modifier.IDF)})  # fmt: skip
        c.upsert("gc", points)
        c.set_payload("gc", {"extra": 1}, points=[3, 4])
        c.delete("gc", points_selector=models.FilterSelector(filter=models.Filter(must=[
            models.FieldCondition(key="n", range=models.Range(gte=55))])))  # fmt: skip
        c.update_vectors("gc", [models.PointVectors(id=7, vector={"v": [1.0, 0, 0, 0, 0, 0]})])
        c.delete_vectors("gc", vectors=["s"], points=[8])
    flt = models.Filter(must=[models.FieldCondition(key="w", match=models.MatchAny(any=["ape", "cat"]))])
    q = rng.standard_normal(6).tolist()
    for c in (over_grpc, over_rest):
        assert c.count("gc").count == local.count("gc").count == 55
        assert c.count("gc", count_filter=flt).count == local.count("gc", count_filter=flt).count
        for kw in ({"query": q, "using": "v"}, {"query": q, "using": "v", "query_filter": flt},
                   {"query": models.SparseVector(indices=[1, 11], values=[1.0, 1.0]), "using": "s"},
                   {"query": 7, "using": "v"}):  # fmt: skip
            got, want = c.query_points("gc", limit=5, with_payload=True, **kw).points, local.query_points(
                "gc", limit=5, with_payload=True, **kw).points  # fmt: skip
            assert [p.id for p in got] == [p.id for p in want], kw
            assert np.allclose([p.score for p in got], [p.score for p in want], atol=1e-5)
            assert [p.payload for p in got] == [p.payload for p in want]
        page, nxt = c.scroll("gc", limit=10, offset=20, with_vectors=True)
        lpage, lnxt = local.scroll("gc", limit=10, offset=20, with_vectors=True)
        assert [p.id for p in page] == [p.id for p in lpage] and nxt == lnxt
        sv, lsv = page[0].vector["s"], lpage[0].vector["s"]  # stored as float32, as Qdrant stores them
        assert sv.indices == lsv.indices and np.allclose(sv.values, lsv.values, atol=1e-6)
        assert [r.id for r in c.retrieve("gc", [8, 3, 99])] == [8, 3]
        got8 = c.retrieve("gc", [8], with_vectors=True)[0]
        assert set(got8.vector) == {"v"} and got8.payload == {"w": "ape", "n": 8, "none": None, "tags": ["cat"]}
        batch = c.query_batch_points("gc", [models.QueryRequest(query=q, using="v", limit=3),
                                            models.QueryRequest(query=q, using="v", limit=2, filter=flt)])  # fmt: skip
        assert [len(r.points) for r in batch] == [3, 2]
        assert c.get_collection("gc").config.params.vectors["v"].size == 6
        assert c.collection_exists("gc") and not c.collection_exists("nope")
        assert "gc" in [x.name for x in c.get_collections().collections]
    over_grpc.update_collection_aliases(change_aliases_operations=[
        models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name="gc", alias_name="gca"))])  # fmt: skip
    assert [a.alias_name for a in over_grpc.get_collection_aliases("gc").aliases] == ["gca"]
    assert over_grpc.count("gca").count == 55


def test_grpc_errors_and_api_keys(server):
    over_grpc, over_rest = clients(server)
    s, port = server
    assert over_grpc.info().version == over_rest.info().version  # qdrant.Qdrant/HealthCheck; REST GET /qdrant/
    with pytest.raises(grpc.RpcError) as e:
        over_grpc.get_collection("missing")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "Not found: Collection" in e.value.details()
    over_grpc.create_collection("ge", vectors_config=models.VectorParams(size=3, distance=models.Distance.DOT))
    with pytest.raises(grpc.RpcError) as e:
        over_grpc.upsert("ge", [models.PointStruct(id=1, vector=[1.0, 2.0])])  # wrong dimension
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        over_grpc.create_collection("ge", vectors_config=models.VectorParams(size=3, distance=models.Distance.DOT))
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    no_key = QdrantClient(url=f"{s.url}/qdrant", prefer_grpc=True, grpc_port=port, https=False, timeout=30)
    with pytest.raises(grpc.RpcError) as e:
        no_key.get_collections()
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    wrong = QdrantClient(url=f"{s.url}/qdrant", prefer_grpc=True, grpc_port=port, api_key="nope", https=False)
    with pytest.raises(grpc.RpcError) as e:
        wrong.count("ge")
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_grpc_malformed_request_is_invalid_argument(server):
    """A message the converters cannot read (a PointsSelector with neither ids nor filter) is INVALID_ARGUMENT, not
    an internal error; the service keeps serving."""
    from qdrant_client import grpc as g
    from qdrant_client.grpc import points_service_pb2_grpc

    s, port = server
    clients(server)[0].create_collection("gm", vectors_config=models.VectorParams(size=3, distance=models.Distance.DOT))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = points_service_pb2_grpc.PointsStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.Delete(g.DeletePoints(collection_name="gm", points=g.PointsSelector()), metadata=[("api-key", KEY)])
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "PointsSelector" in e.value.details()
        assert stub.Count(g.CountPoints(collection_name="gm"), metadata=[("api-key", KEY)]).result.count == 0


def test_a_payload_index_created_over_grpc_keeps_its_params(server):
    """``CreateFieldIndex`` with ``field_index_params`` (a text tokenizer, an integer index's lookup/range) builds the
    index REST would with the same params object: ``payload_schema`` reports them over both transports."""
    over_grpc, over_rest = clients(server)
    over_grpc.create_collection("pidx", vectors_config=models.VectorParams(size=4, distance=models.Distance.DOT))
    text = models.TextIndexParams(type=models.TextIndexType.TEXT, tokenizer=models.TokenizerType.WHITESPACE,
                                  min_token_len=2, lowercase=False)  # fmt: skip
    num = models.IntegerIndexParams(type=models.IntegerIndexType.INTEGER, lookup=True, range=False)
    over_grpc.create_payload_index("pidx", field_name="body", field_schema=text)
    over_grpc.create_payload_index("pidx", field_name="n", field_schema=num)
    over_grpc.create_payload_index("pidx", field_name="kw", field_schema=models.PayloadSchemaType.KEYWORD)
    for c in (over_grpc, over_rest):
        schema = c.get_collection("pidx").payload_schema
        assert schema["body"].data_type == models.PayloadSchemaType.TEXT
        assert (schema["body"].params.tokenizer, schema["body"].params.min_token_len) == ("whitespace", 2)
        assert schema["body"].params.lowercase is False
        assert (schema["n"].params.lookup, schema["n"].params.range) == (True, False)
        assert schema["kw"].data_type == models.PayloadSchemaType.KEYWORD
