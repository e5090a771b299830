"""Payload key paths with double-quoted parts (``'""'``, ``'a."b.c"'``) through the Qdrant-compatible API of a real
server, held to qdrant-client's local mode: filters, ``set_payload`` with ``key``, payload key deletion and payload
selection. The parser and the store: tests/service/collections/test_quoted_keys.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server_utils import run_server

pytest.importorskip("qdrant_client")
from qdrant_client import QdrantClient, models  # noqa: E402
from qdrant_client.http.exceptions import UnexpectedResponse  # noqa: E402

PAYLOADS = [
    {"": "xc", "a": {"b.c": 1, "b": {"c": 2}}, "x.y": ["p", "q"], "t\tab": 3, "back\\slash": {"k": 4}},
    {"": "yy", "a": {"b.c": 2}, "x.y": "p", "t\tab": 4, "arr": [{"k.1": 1}, {"k.1": 2}]},
    {"a": {"b": {"c": 1}}, "x": {"y": "p"}, "": None, "arr": [{"k.1": 3}]},
    {},
]


def cond(key: str, **kw) -> models.Filter:
    return models.Filter(must=[models.FieldCondition(key=key, **kw)])


FILTERS = [
    cond('""', match=models.MatchValue(value="xc")),
    cond('""', match=models.MatchAny(any=["xc", "yy"])),
    models.Filter(must=[models.IsNullCondition(is_null=models.PayloadField(key='""'))]),
    models.Filter(must=[models.IsEmptyCondition(is_empty=models.PayloadField(key='""'))]),
    cond('a."b.c"', match=models.MatchValue(value=1)),
    cond('a."b.c"', range=models.Range(gte=2)),
    cond("a.b.c", range=models.Range(lte=2)),
    cond('"x.y"', match=models.MatchValue(value="p")),
    cond("x.y", match=models.MatchValue(value="p")),
    cond('"x.y"', values_count=models.ValuesCount(gte=2)),
    cond('"t\tab"', range=models.Range(gt=3)),
    cond('"back\\slash".k', match=models.MatchValue(value=4)),
    cond('"arr"[]."k.1"', match=models.MatchAny(any=[1, 3])),
    models.Filter(must=[models.NestedCondition(nested=models.Nested(key="arr", filter=cond('"k.1"', match=models.MatchValue(value=2))))]),
    models.Filter(must_not=[cond('""', match=models.MatchValue(value="yy"))]),
]  # fmt: skip


@pytest.fixture(scope="module")
def clients(default_artifact: Path, tmp_path_factory):
    with run_server(default_artifact.parent, workdir=tmp_path_factory.mktemp("quoted-keys")) as s:
        remote = QdrantClient(url=f"{s.url}/qdrant", https=False, timeout=60, check_compatibility=False)
        local = QdrantClient(":memory:")
        for c in (remote, local):
            c.create_collection("qk", vectors_config=models.VectorParams(size=2, distance=models.Distance.DOT))
        yield remote, local


def put(clients, payloads: list[dict]) -> None:
    for c in clients:
        c.upsert("qk", [models.PointStruct(id=i, vector=[1.0, float(i)], payload=p) for i, p in enumerate(payloads)])


def payloads(c: QdrantClient, **kw) -> list:
    return [(p.id, p.payload) for p in c.scroll("qk", limit=20, **kw)[0]]


def test_filters_on_quoted_keys_answer_as_local_mode(clients):
    remote, local = clients
    put(clients, PAYLOADS)
    for f in FILTERS:
        assert payloads(remote, scroll_filter=f) == payloads(local, scroll_filter=f), f
        assert remote.count("qk", count_filter=f).count == local.count("qk", count_filter=f).count, f
    assert [p[0] for p in payloads(remote, scroll_filter=FILTERS[0])] == [0]
    for bad in ("", '"a', 'a"b', "a..b"):  # refused as local mode refuses them
        with pytest.raises(ValueError):
            local.count("qk", count_filter=cond(bad, match=models.MatchValue(value=1)))
        with pytest.raises(UnexpectedResponse) as e:
            remote.count("qk", count_filter=cond(bad, match=models.MatchValue(value=1)))
        assert e.value.status_code == 422


def test_set_payload_key_and_deletion_with_quoted_parts_answer_as_local_mode(clients):
    remote, local = clients
    for key, new in (('""', {"n": 1}), ('a."b.c"', {"e": 2}), ('"x.y"[]', {"f": 3}), ('"x.y"[0]', {"g": 4}),
                     ('"new.key".sub', {"h": 5}), ('"back\\slash"', {"k": None, "m": 6})):  # fmt: skip
        put(clients, PAYLOADS[:2] + [{"x.y": [{}, {"z": 1}]}])
        for c in clients:
            c.set_payload("qk", new, points=[0, 1, 2], key=key)
        assert payloads(remote) == payloads(local), key
    keys = ['""', 'a."b.c"', '"x.y"']
    excluded = models.PayloadSelectorExclude(exclude=keys)
    assert payloads(remote, with_payload=excluded) == payloads(local, with_payload=excluded)
    top = ['""', '"x.y"']  # (local mode answers an absent nested key as an empty parent object: not compared)
    assert payloads(remote, with_payload=top) == payloads(local, with_payload=top)
    assert payloads(remote, with_payload=['a."b.c"'])[:2] == [(0, {"a": {"b.c": 1}}), (1, {"a": {"b.c": 2}})]
    for c in clients:
        c.set_payload("qk", {"hit": True}, points=cond('""', match=models.MatchValue(value="yy")))
        c.delete_payload("qk", keys, points=[0, 1])
    assert payloads(remote) == payloads(local)
    with pytest.raises(ValueError):
        local.set_payload("qk", {"n": 1}, points=[0], key="")
    with pytest.raises(UnexpectedResponse) as e:
        remote.set_payload("qk", {"n": 1}, points=[0], key="")
    assert e.value.status_code == 422
