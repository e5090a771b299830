"""Qdrant answers held to qdrant-client's local mode (``QdrantClient(":memory:")``, the oracle), the same calls on
both over REST against one real server: ``is_null`` on arrays holding a null, collection ``metadata`` (create,
update, vector-name changes; kept across a reopen of the store), the vector of a point holding none of the vectors
asked for, and recommend / discover / context queries on multivectors (examples by point id and as matrices)."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.server_utils import run_server

pytest.importorskip("qdrant_client")
from qdrant_client import QdrantClient, models  # noqa: E402
from qdrant_client.http.exceptions import UnexpectedResponse  # noqa: E402

from service.collections.embedded import Collection  # noqa: E402
from service.collections.index import IndexSpec  # noqa: E402
from service.collections.schema import DenseVector, VectorsConfig  # noqa: E402
from service.collections.vector_names import with_vector, without_vector  # noqa: E402


@pytest.fixture(scope="module")
def clients(default_artifact: Path, tmp_path_factory):
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("parity")) as s:
        remote = QdrantClient(url=f"{s.url}/qdrant", https=False, timeout=60, check_compatibility=False)
        remote.url = s.url  # type: ignore[attr-defined]
        yield remote, QdrantClient(":memory:")


def both(clients, method: str, *args, **kw) -> tuple:
    """The answers of the server and of local mode to the same call."""
    return tuple(getattr(c, method)(*args, **kw) for c in clients)


# --- is_null ----------------------------------------------------------------------------------------------------------
NULLS = [
    {"n": [None, None]},
    {"n": None},
    {"n": [1, None]},
    {"n": [[None]]},
    {"n": 1},
    {},
    {"n": []},
    {"a": [{"b": None}, {"b": 1}]},
    {"a": [{"b": [None]}]},
    {"a": {"b": [None, "x"]}},
]


def test_is_null_matches_what_local_mode_matches(clients):
    for c in clients:
        c.create_collection("nulls", vectors_config=models.VectorParams(size=2, distance=models.Distance.DOT))
        c.upsert("nulls", [models.PointStruct(id=i, vector=[1.0, 0.5], payload=p) for i, p in enumerate(NULLS)])
    conds = [
        models.IsNullCondition(is_null=models.PayloadField(key="n")),
        models.IsNullCondition(is_null=models.PayloadField(key="a[].b")),
        models.IsNullCondition(is_null=models.PayloadField(key="a.b")),
        models.FieldCondition(key="n", is_null=True),
        models.FieldCondition(key="n", is_null=False),
    ]
    filters = [models.Filter(must=[c]) for c in conds] + [models.Filter(must_not=[conds[0]])]
    for f in filters:
        got, want = (
            [(p.id, p.payload) for p in a[0]] for a in both(clients, "scroll", "nulls", scroll_filter=f, limit=50)
        )
        assert got == want, f
        assert clients[0].count("nulls", count_filter=f).count == len(want), f
    assert [p.id for p in clients[0].scroll("nulls", scroll_filter=filters[0])[0]] == [0, 1, 2]


# --- metadata ---------------------------------------------------------------------------------------------------------
def test_collection_metadata_is_kept_and_updated_as_local_mode_keeps_it(clients):
    meta = {"owner": "Bart Simpson's property", "n": {"x": 1}, "tags": [1, "a"]}
    for c in clients:
        c.create_collection(
            "md", vectors_config=models.VectorParams(size=4, distance=models.Distance.DOT), metadata=meta
        )
        c.create_collection("md0", vectors_config=models.VectorParams(size=4, distance=models.Distance.DOT))

    def metadata(name: str):
        got, want = (info.config.metadata for info in both(clients, "get_collection", name))
        assert got == want
        return got

    assert metadata("md") == meta and metadata("md0") is None
    for c in clients:
        c.update_collection("md", metadata={"due": "12.12.2222", "n": None})
        c.update_collection("md0", metadata={"a": 1, "b": None})
    assert metadata("md") == {"owner": meta["owner"], "tags": [1, "a"], "due": "12.12.2222"}
    assert metadata("md0") == {"a": 1, "b": None}  # nothing kept before: taken whole, as local mode takes it
    extra = models.DenseVectorNameConfig(dense=models.DenseVectorConfig(size=2, distance=models.Distance.COSINE))
    for c in clients:
        c.create_vector_name("md", "extra", extra)
    assert metadata("md")["due"] == "12.12.2222"
    for c in clients:
        c.delete_vector_name("md", "extra")
    assert metadata("md")["due"] == "12.12.2222"
    body = {"vectors": {"size": 4, "distance": "Dot"}, "metadata": [1]}  # an object, as Qdrant's Payload
    assert httpx.put(f"{clients[0].url}/qdrant/collections/md-bad", json=body).status_code == 422


def test_metadata_is_stored_with_the_vectors_config(tmp_path):
    """The store keeps the metadata across an update, a vector-name change and a reopen."""
    spec = IndexSpec("flat", "dot", {}, 2)
    path = tmp_path / "c"
    c = Collection.create(path, VectorsConfig({"v": DenseVector("v", spec)}, metadata={"k": [1, {"x": None}]}))
    try:
        c.update_vectors(lambda cfg: cfg.with_metadata({"k": None, "z": "y"}))
        c.update_vectors(lambda cfg: with_vector(cfg, "w", {"size": 3, "metric": "l2"}))
        c.update_vectors(lambda cfg: without_vector(cfg, "v"))
    finally:
        c.close()
    c = Collection.open(path)
    try:
        assert c.vectors.metadata == {"z": "y"} and set(c.vectors.dense) == {"w"}
    finally:
        c.close()


# --- a point's vector -------------------------------------------------------------------------------------------------
def test_vector_of_a_point_holding_none_asked_for_is_empty_as_in_local_mode(clients):
    unnamed = models.VectorParams(size=4, distance=models.Distance.DOT)
    for c in clients:
        c.create_collection("nv", vectors_config=unnamed)
        c.upsert("nv", [models.PointStruct(id=i, vector=[1.0, 2.0, 3.0, float(i)]) for i in (1, 2)])
        c.delete_vectors("nv", vectors=[""], points=[1])
        c.create_collection("nv2", vectors_config={"": unnamed, "b": models.VectorParams(size=2, distance="Cosine")})
        c.upsert(
            "nv2",
            [
                models.PointStruct(id=1, vector={"": [1.0, 2.0, 3.0, 4.0]}),
                models.PointStruct(id=2, vector={"b": [0.6, 0.8]}),
            ],
        )
    for name, sel in [("nv", True), ("nv", [""]), ("nv2", True), ("nv2", [""]), ("nv2", ["b"])]:
        got, want = ([(p.id, p.vector) for p in a] for a in both(clients, "retrieve", name, [1, 2], with_vectors=sel))
        assert got == want, (name, sel)
        got, want = ([(p.id, p.vector) for p in a[0]] for a in both(clients, "scroll", name, with_vectors=sel))
        assert got == want, (name, sel)
    assert clients[0].retrieve("nv", [1], with_vectors=True)[0].vector == {}
    hits = clients[0].query_points("nv2", query=[1.0, 0.0, 0.0, 0.0], using="", with_vectors=True).points
    assert [(h.id, h.vector) for h in hits] == [(1, [1.0, 2.0, 3.0, 4.0])]


# --- multivectors -----------------------------------------------------------------------------------------------------
MULTI = {"cos": models.Distance.COSINE, "dot": models.Distance.DOT, "l2": models.Distance.EUCLID}
N_MULTI = 16


def test_recommend_and_discover_on_multivectors_answer_as_local_mode(clients):
    rng = np.random.default_rng(7)
    cfg = {
        n: models.VectorParams(size=3, distance=d, multivector_config=models.MultiVectorConfig(comparator="max_sim"))
        for n, d in MULTI.items()
    }
    points = [
        models.PointStruct(
            id=i, vector={n: rng.normal(size=(int(rng.integers(1, 4)), 3)).round(3).tolist() for n in MULTI}
        )
        for i in range(N_MULTI)
    ]
    for c in clients:
        c.create_collection("mv", vectors_config=cfg)
        c.upsert("mv", points)
    given = rng.normal(size=(2, 3)).round(3).tolist()
    pair = models.ContextPair
    queries = [
        models.RecommendQuery(recommend=models.RecommendInput(positive=[1, 2], negative=[3])),
        models.RecommendQuery(recommend=models.RecommendInput(positive=[given], negative=[4])),
        models.RecommendQuery(recommend=models.RecommendInput(positive=[1], negative=[4], strategy="best_score")),
        models.RecommendQuery(recommend=models.RecommendInput(negative=[5], strategy="best_score")),
        models.RecommendQuery(recommend=models.RecommendInput(positive=[1, 5], negative=[6], strategy="sum_scores")),
        models.DiscoverQuery(discover=models.DiscoverInput(target=8, context=[pair(positive=9, negative=10)])),
        models.DiscoverQuery(discover=models.DiscoverInput(target=given, context=[pair(positive=9, negative=given)])),
        models.ContextQuery(context=[pair(positive=11, negative=12), pair(positive=13, negative=2)]),
    ]
    for using in MULTI:
        for q in queries:
            got, want = (a.points for a in both(clients, "query_points", "mv", query=q, using=using, limit=N_MULTI))
            assert {h.id: h.score for h in got} == pytest.approx({h.id: h.score for h in want}, rel=1e-4, abs=1e-4)
            # the same scores in the same order: the same ranking, ties aside
            assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-4, abs=1e-4), (using, q)
    feedback = models.RelevanceFeedbackQuery(
        relevance_feedback=models.RelevanceFeedbackInput(
            target=1,
            feedback=[models.FeedbackItem(example=2, score=1.0)],
            strategy=models.NaiveFeedbackStrategy(naive=models.NaiveFeedbackStrategyParams(a=1, b=1, c=1)),
        )
    )
    with pytest.raises(UnexpectedResponse) as e:
        clients[0].query_points("mv", query=feedback, using="cos")
    assert e.value.status_code == 422 and b"multivector" in e.value.content
    with pytest.raises(UnexpectedResponse) as e:  # a single vector is no example of a multivector
        clients[0].query_points(
            "mv", query=models.RecommendQuery(recommend=models.RecommendInput(positive=[[1.0, 2.0, 3.0]])), using="dot"
        )
    assert e.value.status_code == 422
    remote = clients[0]
    remote.create_collection("one", vectors_config=models.VectorParams(size=2, distance=models.Distance.DOT))
    remote.upsert("one", [models.PointStruct(id=1, vector=[1.0, 2.0])])
    matrix = models.RecommendQuery(recommend=models.RecommendInput(positive=[[[1.0, 2.0], [3.0, 4.0]]]))
    with pytest.raises(UnexpectedResponse) as e:  # a matrix is no example of a single vector
        remote.query_points("one", query=matrix)
    assert e.value.status_code == 422 and b"not a multivector" in e.value.content
