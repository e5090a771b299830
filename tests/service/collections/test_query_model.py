"""The core's query model and queries by example, without a server: the native API's ``SearchRequest`` compiles to
:class:`~service.collections.query_model.SearchQuery` field by field, and the sparse ``average_vector`` recommendation
(:func:`~service.collections.recommend.sparse_average`) averages index by index, as Qdrant's."""

from __future__ import annotations

from dataclasses import fields

from service.collections.query_model import Rerank, SearchQuery
from service.collections.recommend import Lookup, source, sparse_average
from service.http.native.models import SearchRequest


def test_native_search_compiles_to_the_query_model():
    body = SearchRequest.model_validate(
        {
            "query": {"indices": [3, 1], "values": [0.5, 2.0]},
            "using": "s",
            "top_k": 7,
            "filter": {"a": 1},
            "score_threshold": 0.25,
            "with_text": False,
            "exact": True,
            "rerank": {"model": "r", "candidates": 20},
        }
    )
    q = body.compiled()
    assert isinstance(q, SearchQuery)
    assert q.query == {"indices": [3, 1], "values": [0.5, 2.0]}  # a plain dict: no pydantic in the core's input
    got = {k: getattr(q, k) for k in ("using", "top_k", "filter", "score_threshold", "with_payload", "with_text")}
    assert got == {
        "using": "s",
        "top_k": 7,
        "filter": {"a": 1},
        "score_threshold": 0.25,
        "with_payload": True,
        "with_text": False,
    }
    assert q.exact is True
    assert q.rerank == Rerank("r", 20, None)
    assert (q.mode, q.fusion, q.rrf_k, q.candidates) == (None, "rrf", None, 100)


def test_query_model_defaults_are_the_native_api_defaults():
    body = SearchRequest.model_validate({"query": "a text"})
    compiled = body.compiled()
    for f in fields(SearchQuery):
        want = getattr(body, f.name)
        assert getattr(compiled, f.name) == want, f.name


def test_sparse_average_vector():
    p = [{"indices": [1, 2], "values": [1.0, 3.0]}, {"indices": [2, 5], "values": [1.0, 4.0]}]
    assert sparse_average(p, []) == {"indices": [1, 2, 5], "values": [0.5, 2.0, 2.0]}
    n = [{"indices": [1, 7], "values": [1.0, 2.0]}]  # avg(p) + (avg(p) - avg(n)), an index absent counting 0
    assert sparse_average(p, n) == {"indices": [1, 2, 5, 7], "values": [0.0, 4.0, 4.0, -2.0]}


def test_lookup_source():
    assert source("c", "v", None) == ("c", "v")
    assert source("c", "v", Lookup("other")) == ("other", "v")
    assert source("c", "v", Lookup("other", "w")) == ("other", "w")
