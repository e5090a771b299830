"""Scalar quantization through the Qdrant-compatible API on a real server, driven by qdrant-client unchanged (REST
and gRPC): ``quantization_config`` at creation (reported in the collection's info, kept by an update that repeats
it), changed by an update on a filled collection (the index rebuilt in the background; ``Disabled`` removes it),
``search_params.quantization`` (``rescore``, ``ignore``, ``oversampling``) on queries and
prefetches, the native twin (``index: flat_sq``, ``quantization`` on a search), and a restart after SIGKILL keeping
it all. Recall against exact search and the candidate counts: tests/service/collections/test_quantization.py."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server_utils import free_port, run_server

pytest.importorskip("qdrant_client")
from qdrant_client import QdrantClient, models  # noqa: E402
from qdrant_client.http.exceptions import UnexpectedResponse  # noqa: E402

D, N, K = 384, 1100, 10  # the model's dimension (the vector is model-bound); past the default min_train_points
SCALAR = models.ScalarQuantization(
    scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, quantile=0.99, always_ram=True)
)


@pytest.fixture(scope="module")
def server(default_artifact: Path, tmp_path_factory):
    work, port, grpc_port = tmp_path_factory.mktemp("quantization"), free_port(), free_port()
    state = {"models": default_artifact.parent, "work": work, "port": port, "grpc": grpc_port}
    with run_server(state["models"], workdir=work, port=port, env={"EMBED_QDRANT_GRPC_PORT": str(grpc_port)}) as s:
        state["server"] = s
        yield state


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    X = rng.standard_normal((N, D)).astype(np.float32)
    Q = rng.standard_normal((8, D)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    return X, Q / np.linalg.norm(Q, axis=1, keepdims=True)


def clients(server) -> tuple[QdrantClient, QdrantClient]:
    url = f"{server['server'].url}/qdrant"
    kw = {"https": False, "timeout": 60, "check_compatibility": False}
    return QdrantClient(url=url, **kw), QdrantClient(url=url, prefer_grpc=True, grpc_port=server["grpc"], **kw)


def wait_trained(base_url: str, name: str) -> dict:
    with httpx.Client(base_url=base_url, timeout=60) as c:
        for _ in range(240):
            info = c.get(f"/collections/{name}").json()
            if info["index"]["trained"]:
                return info
            time.sleep(0.25)
    raise AssertionError(f"{name}: the index was not trained: {info['index']}")


def search(c: QdrantClient, name: str, q: np.ndarray, quantization=None):
    params = models.SearchParams(quantization=quantization) if quantization else None
    return c.query_points(name, query=q.tolist(), limit=K, search_params=params).points


def test_qdrant_client_creates_and_searches_a_quantized_collection(server, data):
    X, Q = data
    rest, over_grpc = clients(server)
    for remote, name in ((rest, "quant_rest"), (over_grpc, "quant_grpc")):
        remote.create_collection(
            name,
            vectors_config=models.VectorParams(size=D, distance=models.Distance.COSINE),
            hnsw_config=models.HnswConfigDiff(m=16),
            quantization_config=SCALAR,
        )
        got = remote.get_collection(name).config.quantization_config
        assert (
            got.scalar.type == models.ScalarType.INT8
            and got.scalar.quantile == pytest.approx(0.99)
            and got.scalar.always_ram
        )
    for start in range(0, N, 550):
        rest.upsert("quant_rest", [models.PointStruct(id=i, vector=X[i].tolist()) for i in range(start, start + 550)])
    info = wait_trained(server["server"].url, "quant_rest")
    assert info["index"]["type"] == "hnsw_sq" and info["index"]["params"]["M"] == 16
    assert info["index"]["params"]["quantization"] == {"type": "int8", "quantile": 0.99, "always_ram": True}
    for q in Q:
        exact = X @ q
        truth = np.argsort(-exact)[:K].tolist()
        hits = search(rest, "quant_rest", q)  # rescored by default: the originals' scores
        assert np.allclose([h.score for h in hits], exact[[h.id for h in hits]], atol=1e-5)
        approx = search(rest, "quant_rest", q, models.QuantizationSearchParams(rescore=False))
        assert np.abs(np.array([h.score for h in approx]) - exact[[h.id for h in approx]]).max() > 1e-4
        ignored = search(rest, "quant_rest", q, models.QuantizationSearchParams(ignore=True))
        assert [h.id for h in ignored] == truth
        more = search(over_grpc, "quant_rest", q, models.QuantizationSearchParams(oversampling=4.0))
        assert len({h.id for h in more} & set(truth)) >= len({h.id for h in hits} & set(truth)) - 1
    # a prefetch carries its own params
    fused = rest.query_points(
        "quant_rest",
        prefetch=[
            models.Prefetch(
                query=Q[0].tolist(),
                limit=K,
                params=models.SearchParams(quantization=models.QuantizationSearchParams(ignore=True)),
            )
        ],  # fmt: skip
        query=models.FusionQuery(fusion=models.Fusion.RRF),
        limit=K,
    ).points
    assert [h.id for h in fused] == np.argsort(-(X @ Q[0]))[:K].tolist()


def test_bad_quantization_is_refused_and_an_update_may_only_repeat_it(server):
    rest, _ = clients(server)
    for config in (
        models.ProductQuantization(product=models.ProductQuantizationConfig(compression=models.CompressionRatio.X16)),
        models.BinaryQuantization(binary=models.BinaryQuantizationConfig()),
    ):
        with pytest.raises(UnexpectedResponse) as e:
            rest.create_collection("quant_bad", models.VectorParams(size=4, distance="Dot"), quantization_config=config)
        assert e.value.status_code == 422
    rest.update_collection("quant_rest", quantization_config=SCALAR)  # the same: no change
    assert rest.get_collection("quant_rest").status == models.CollectionStatus.GREEN
    with pytest.raises(UnexpectedResponse) as e:
        rest.update_collection("quant_rest", quantization_config=models.ProductQuantization(
            product=models.ProductQuantizationConfig(compression=models.CompressionRatio.X16)))  # fmt: skip
    assert e.value.status_code == 422
    with httpx.Client(base_url=f"{server['server'].url}/qdrant", timeout=60) as c:
        for params in ({"quantization": {"oversampling": 0.5}}, {"quantization": {"rescore": "yes"}}):
            r = c.post("/collections/quant_rest/points/query", json={"query": [0.1] * D, "params": params})
            assert r.status_code == 422, r.text
            r = c.post("/collections/quant_rest/points/query", json={"prefetch": {"query": [0.1] * D, "params": params},
                                                                     "query": {"fusion": "rrf"}})  # fmt: skip
            assert r.status_code == 422 and r.json()["status"]["error"], r.text


def wait_green(c: QdrantClient, name: str) -> models.CollectionInfo:
    for _ in range(240):
        info = c.get_collection(name)
        if info.status == models.CollectionStatus.GREEN:
            return info
        time.sleep(0.25)
    raise AssertionError(f"{name}: still {info.status}")


def recall(c: QdrantClient, name: str, X: np.ndarray, Q: np.ndarray, **kw) -> tuple[float, float]:
    """``(recall@K against exact cosine search, largest score error)`` over the queries ``Q``."""
    found, err = 0, 0.0
    for q in Q:
        hits = c.query_points(name, query=q.tolist(), limit=K, **kw).points
        found += len({h.id for h in hits} & set(np.argsort(-(X @ q))[:K].tolist()))
        err = max(err, float(np.abs(np.array([h.score for h in hits]) - (X @ q)[[h.id for h in hits]]).max()))
    return found / (K * len(Q)), err


CHANGE_D, CHANGE_N = 48, 2000  # a client-supplied vector (not the model's dimension), past min_train_points


@pytest.fixture(scope="module")
def change_data():
    rng = np.random.default_rng(11)
    X = rng.standard_normal((CHANGE_N, CHANGE_D)).astype(np.float32)
    Q = rng.standard_normal((20, CHANGE_D)).astype(np.float32)
    return X / np.linalg.norm(X, axis=1, keepdims=True), Q / np.linalg.norm(Q, axis=1, keepdims=True)


def test_a_quantization_change_rebuilds_the_index_in_the_background(server, change_data):
    """PATCH with another ``quantization_config`` (Qdrant: the index rebuilt by the optimizer): accepted, reported
    at once, the index rebuilt from the stored vectors (searches answered meanwhile), then quantized scores (with
    ``rescore: false``) and a recall@10 >= 0.95 with rescoring; ``Disabled`` takes it away again. The restart test
    below checks it is kept."""
    X, Q = change_data
    rest, over_grpc = clients(server)
    no_rescore = models.SearchParams(quantization=models.QuantizationSearchParams(rescore=False))
    for c, name in ((rest, "quant_change"), (over_grpc, "quant_change_grpc")):
        c.create_collection(name, vectors_config=models.VectorParams(size=CHANGE_D, distance=models.Distance.COSINE),
                            hnsw_config=models.HnswConfigDiff(m=0))  # fmt: skip
        for start in range(0, CHANGE_N, 500):
            batch = range(start, start + 500)
            c.upsert(name, models.Batch(ids=list(batch), vectors=X[start : start + 500].tolist()), wait=True)
        assert c.get_collection(name).config.quantization_config is None
        assert recall(c, name, X, Q, search_params=no_rescore) == (1.0, pytest.approx(0, abs=1e-5))  # float32
        c.update_collection(name, quantization_config=SCALAR)
        assert c.query_points(name, query=Q[0].tolist(), limit=K).points  # answered during the rebuild
        info = wait_green(c, name)
        assert info.config.quantization_config.scalar.quantile == pytest.approx(0.99)
        got, err = recall(c, name, X, Q)
        assert got >= 0.95 and err < 1e-5  # rescored from the originals
        got, err = recall(c, name, X, Q, search_params=no_rescore)
        assert err > 1e-4  # int8 codes: the index was rebuilt quantized
    with httpx.Client(base_url=server["server"].url, timeout=60) as h:
        native = h.get("/collections/quant_change").json()
        assert native["vectors"]["dense"][""]["index"] == "flat_sq" and native["rebuilding"] == []
    over_grpc.update_collection("quant_change_grpc", quantization_config=models.Disabled.DISABLED)
    info = wait_green(rest, "quant_change_grpc")
    assert info.config.quantization_config is None
    assert recall(rest, "quant_change_grpc", X, Q, search_params=no_rescore) == (1.0, pytest.approx(0, abs=1e-5))


def test_an_hnsw_config_change_rebuilds_the_graph(server, change_data):
    """PATCH ``hnsw_config`` ``m``/``ef_construct`` (Qdrant: the graph rebuilt by the optimizer), over REST and gRPC:
    a flat collection (``m: 0``) gets an HNSW graph with those params (reported by ``get_collection`` and the native
    info), recall@10 >= 0.95 against exact search; a vector's own ``hnsw_config`` changes its graph; ``m: 0`` takes
    the graph away again (exact: recall 1.0)."""
    X, Q = change_data
    rest, over_grpc = clients(server)
    rest.create_collection("graph_change", vectors_config=models.VectorParams(size=CHANGE_D,
                           distance=models.Distance.COSINE), hnsw_config=models.HnswConfigDiff(m=0))  # fmt: skip
    for start in range(0, CHANGE_N, 1000):
        ids = list(range(start, start + 1000))
        rest.upsert("graph_change", models.Batch(ids=ids, vectors=X[start : start + 1000].tolist()), wait=True)
    assert over_grpc.update_collection("graph_change", hnsw_config=models.HnswConfigDiff(m=12, ef_construct=48))
    info = wait_green(rest, "graph_change")
    assert (info.config.hnsw_config.m, info.config.hnsw_config.ef_construct) == (12, 48)
    with httpx.Client(base_url=server["server"].url, timeout=60) as h:
        dense = h.get("/collections/graph_change").json()["vectors"]["dense"][""]
        assert dense["index"] == "hnsw" and (dense["params"]["M"], dense["params"]["ef_construction"]) == (12, 48)
    assert recall(rest, "graph_change", X, Q)[0] >= 0.95
    rest.update_collection("graph_change", vectors_config={"": models.VectorParamsDiff(
        hnsw_config=models.HnswConfigDiff(ef_construct=96))})  # fmt: skip
    info = wait_green(rest, "graph_change")
    assert (info.config.hnsw_config.m, info.config.hnsw_config.ef_construct) == (12, 96)
    rest.update_collection("graph_change", hnsw_config=models.HnswConfigDiff(m=0))
    info = wait_green(rest, "graph_change")
    assert info.config.hnsw_config.m == 0
    assert recall(rest, "graph_change", X, Q)[0] == 1.0


def test_native_twin_and_a_restart_after_sigkill_keep_it(server, data, change_data):
    X, Q = data
    s = server["server"]
    with httpx.Client(base_url=s.url, timeout=60) as c:
        r = c.put("/collections/quant_native", json={"index": "flat_sq", "params": {"min_train_points": 200}})
        assert r.status_code == 200, r.text
        for start in range(0, 300, 100):
            points = [{"id": i, "vector": X[i].tolist()} for i in range(start, start + 100)]
            r = c.put("/collections/quant_native/points", json={"points": points})
            assert r.status_code == 200, r.text
        wait_trained(s.url, "quant_native")
        body = {"query": Q[0].tolist(), "top_k": K, "quantization": {"rescore": False}}
        approx = c.post("/collections/quant_native/search", json=body).json()
        exact = X[:300] @ Q[0]
        assert np.abs(np.array([h["score"] for h in approx]) - exact[[h["id"] for h in approx]]).max() > 1e-4
        bad = c.post("/collections/quant_native/search", json={**body, "quantization": {"oversampling": 0}})
        assert bad.status_code == 422
    s.kill()  # a crash: the indexes are rebuilt (and trained) from SQLite, the configs read back
    with run_server(server["models"], workdir=server["work"], port=server["port"],
                    env={"EMBED_QDRANT_GRPC_PORT": str(server["grpc"])}) as s2:  # fmt: skip
        server["server"] = s2
        rest, _ = clients(server)
        assert rest.get_collection("quant_rest").config.quantization_config.scalar.quantile == 0.99
        info = wait_trained(s2.url, "quant_rest")
        assert info["index"]["type"] == "hnsw_sq" and info["count"] == N
        q = Q[1]
        hits = search(rest, "quant_rest", q)
        assert np.allclose([h.score for h in hits], (X @ q)[[h.id for h in hits]], atol=1e-5)
        info = wait_green(rest, "quant_change")  # the quantization set by an update, kept
        assert info.config.quantization_config.scalar.quantile == pytest.approx(0.99)
        no_rescore = models.SearchParams(quantization=models.QuantizationSearchParams(rescore=False))
        assert recall(rest, "quant_change", *change_data, search_params=no_rescore)[1] > 1e-4
        assert rest.get_collection("quant_change_grpc").config.quantization_config is None
        with httpx.Client(base_url=s2.url, timeout=60) as c:
            info = wait_trained(s2.url, "quant_native")
            assert info["index"]["type"] == "flat_sq" and info["index"]["in_use"] == "flat_sq"
            r = c.get("/qdrant/collections/quant_native").json()["result"]["config"]["quantization_config"]
            assert r == {"scalar": {"type": "int8", "quantile": None, "always_ram": None}}
