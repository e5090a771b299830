"""Qdrant's ``search_params.hnsw_ef`` (and the native search's ``hnsw_ef``) on a real server, driven by qdrant-client
unchanged (REST and gRPC): the HNSW graph is searched with the breadth asked for, so a narrow search finds fewer of
the exact neighbours than a wide one, the default is the index's ``ef_search``, and a value out of range is a 422.

A sparse graph (``m`` 4, ``ef_construct`` 8) over 3,000 random 32-d vectors, and a server whose searches never fall
back to exact search (``--collections-exact-filter-threshold 0``), so that the graph alone answers."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server_utils import free_port, run_server

pytest.importorskip("qdrant_client")
from qdrant_client import QdrantClient, models  # noqa: E402

D, N, K, NQ = 32, 3000, 10, 40
NAME = "graph"


@pytest.fixture(scope="module")
def env(default_artifact: Path, tmp_path_factory):
    work, grpc_port = tmp_path_factory.mktemp("hnsw_ef"), free_port()
    args = ["--collections-exact-filter-threshold", "0", "--log-level", "warning"]
    env = {"EMBED_QDRANT_GRPC_PORT": str(grpc_port)}
    with run_server(default_artifact.parent, workdir=work, args=args, env=env) as s:
        rng = np.random.default_rng(11)
        X = rng.standard_normal((N, D)).astype(np.float32)
        Q = rng.standard_normal((NQ, D)).astype(np.float32)
        kw = {"https": False, "timeout": 60, "check_compatibility": False}
        rest = QdrantClient(url=f"{s.url}/qdrant", **kw)
        grpc = QdrantClient(url=f"{s.url}/qdrant", prefer_grpc=True, grpc_port=grpc_port, **kw)
        rest.create_collection(
            NAME,
            vectors_config=models.VectorParams(size=D, distance=models.Distance.COSINE),
            hnsw_config=models.HnswConfigDiff(m=4, ef_construct=8),
        )
        for a in range(0, N, 1000):
            rest.upsert(NAME, models.Batch(ids=list(range(a, a + 1000)), vectors=X[a : a + 1000].tolist()), wait=True)
        yield {"server": s, "rest": rest, "grpc": grpc, "Q": Q}
        rest.close()
        grpc.close()


def _ids(client: QdrantClient, Q: np.ndarray, params: models.SearchParams | None) -> list[list[int]]:
    return [
        [p.id for p in client.query_points(NAME, query=q.tolist(), limit=K, search_params=params).points] for q in Q
    ]


def _recall(got: list[list[int]], truth: list[list[int]]) -> float:
    return float(np.mean([len(set(g) & set(t)) / K for g, t in zip(got, truth)]))


def test_hnsw_ef_sets_the_graph_search_breadth_over_rest_and_grpc(env):
    rest, grpc, Q = env["rest"], env["grpc"], env["Q"]
    hnsw = rest.get_collection(NAME).config.hnsw_config
    assert (hnsw.m, hnsw.ef_construct) == (4, 8), hnsw
    truth = _ids(rest, Q, models.SearchParams(exact=True))
    narrow = _ids(rest, Q, models.SearchParams(hnsw_ef=K))
    wide = _ids(rest, Q, models.SearchParams(hnsw_ef=2048))
    default = _ids(rest, Q, None)
    assert default == _ids(rest, Q, models.SearchParams(hnsw_ef=64))  # the index's ef_search
    assert _recall(wide, truth) >= 0.98, _recall(wide, truth)
    assert _recall(narrow, truth) < _recall(wide, truth) - 0.05, (_recall(narrow, truth), _recall(wide, truth))
    assert narrow != default
    # gRPC carries it as REST does; a prefetch takes it too
    assert _ids(grpc, Q, models.SearchParams(hnsw_ef=K)) == narrow
    fused = rest.query_points(
        NAME,
        prefetch=[models.Prefetch(query=Q[0].tolist(), limit=K, params=models.SearchParams(hnsw_ef=K))],
        query=models.FusionQuery(fusion=models.Fusion.RRF),
        limit=K,
    )
    assert [p.id for p in fused.points] == narrow[0]


def test_native_search_takes_hnsw_ef(env):
    Q = env["Q"]
    with httpx.Client(base_url=env["server"].url, timeout=60) as c:

        def ids(**kw) -> list[list[int]]:
            body = {"searches": [{"query": q.tolist(), "top_k": K, **kw} for q in Q]}
            r = c.post(f"/collections/{NAME}/search/batch", json=body)
            assert r.status_code == 200, r.text
            return [[h["id"] for h in hits] for hits in r.json()]

        assert ids(hnsw_ef=K) == _ids(env["rest"], Q, models.SearchParams(hnsw_ef=K))
        assert ids() == ids(hnsw_ef=64)


@pytest.mark.parametrize("bad", [0, -1, 4097, 1.5, "64", True])
def test_an_hnsw_ef_out_of_range_is_a_422(env, bad):
    url, q = env["server"].url, env["Q"][0].tolist()
    r = httpx.post(f"{url}/qdrant/collections/{NAME}/points/query", json={"query": q, "params": {"hnsw_ef": bad}})
    assert r.status_code == 422 and "hnsw_ef" in r.text, r.text
    r = httpx.post(f"{url}/collections/{NAME}/search", json={"query": q, "hnsw_ef": bad})
    assert r.status_code == 422 and "hnsw_ef" in r.text, r.text
