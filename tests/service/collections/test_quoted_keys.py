"""Payload key paths with double-quoted parts (Qdrant's JSON path: ``a."b.c"`` is the key ``b.c`` of ``a``, ``""`` the
empty key): one parser (:func:`service.collections.conditions.parse_path`) held to qdrant-client's local mode
(``json_path_parser``, the oracle) on every key it accepts, then used by the filters (the embedded store's SQL and the
reference evaluation), ``set_payload``'s ``key``, payload key deletion and the milvus backend's translation."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from qdrant_client.local.json_path_parser import JsonPathItemType, parse_json_path

from service.collections.conditions import key_names, parse_path, payload_names
from service.collections.embedded import Collection
from service.collections.errors import InvalidCollectionRequest
from service.collections.filter_match import matches
from service.collections.filters import FilterError, parse_filter
from service.collections.index import IndexSpec
from service.collections.payload_update import set_at, without_keys
from service.collections.schema import VectorsConfig

MODEL = {"name": "test", "version": "1", "sha256": "0" * 64}


def oracle(key: str) -> tuple | None:
    """qdrant-client local mode's reading of ``key`` as this parser's items, or None where it refuses it."""
    try:
        items = parse_json_path(key)
    except ValueError:
        return None
    kinds = {JsonPathItemType.KEY: lambda i: i.key, JsonPathItemType.INDEX: lambda i: i.index,
             JsonPathItemType.WILDCARD_INDEX: lambda i: None}  # fmt: skip
    return tuple(kinds[i.item_type](i) for i in items) or None


def test_the_parser_reads_every_path_as_local_mode_does():
    """Over every key of up to 5 symbols of a small alphabet (names, quotes, dots, brackets, digits) and random longer
    ones: where local mode reads a path, the same items; where it refuses one, a refusal (local mode's names are
    letters, digits, ``_`` and ``-``; this parser also takes other characters, which these keys do not hold)."""
    alphabet = ["a", "b_", "-", ".", '"', "[", "]", "0", "12", "[]", '""']
    keys = {"".join(p) for n in range(1, 6) for p in itertools.product(alphabet, repeat=n)}
    rng = random.Random(7)
    keys |= {"".join(rng.choice(alphabet) for _ in range(rng.randint(6, 14))) for _ in range(20000)}
    wrong = [(k, parse_path(k), oracle(k)) for k in sorted(keys) if parse_path(k) != oracle(k)]
    assert not wrong, wrong[:20]
    assert parse_path('a."b.c"[1][]') == ("a", "b.c", 1, None) and parse_path('""') == ("",)
    assert parse_path('"a[0]".x') == ("a[0]", "x") and parse_path('"$and"') == ("$and",)
    for bad in ("", "a.", ".a", "a..b", '"a', 'a"b"', "$a", "a[x]", "a[0", '"a"b', "a b[", '"""'):
        assert parse_path(bad) is None, bad
    assert parse_path("préfixe-1.key with spaces") == ("préfixe-1", "key with spaces")  # beyond local mode's names
    assert key_names('a."b.c"') == ("a", "b.c") and key_names("a[0].b") is None and key_names("a.") is None
    # read, never refused (a facet, a payload selection, a key deletion): a key that is no path, at its dots
    assert payload_names('a."b.c"') == ("a", "b.c") and payload_names("g\n.x") == ("g\n", "x")
    assert payload_names("a[0].b") is None


PAYLOADS = [
    {"": "xc", "a": {"b.c": 1, "b": {"c": 2}}, "x.y": ["p", "q"], "t\tab": 3, "back\\slash": 4, "é": {"": 5}},
    {"": "yy", "a": {"b.c": 2}, "x.y": "p", "t\tab": 4, "arr": [{"k.1": 1}, {"k.1": 2}]},
    {"a": {"b": {"c": 1}}, "x": {"y": "p"}, "": None, "arr": [{"k.1": 3}]},
    {},
]
FILTERS = [
    {'""': "xc"}, {'""': {"$in": ["xc", "yy"]}}, {'""': None}, {'""': {"$exists": True}}, {'""': {"$empty": True}},
    {'a."b.c"': 1}, {'a."b.c"': {"$gte": 2}}, {"a.b.c": {"$lte": 2}}, {'"x.y"': "p"}, {"x.y": "p"},
    {'"x.y"': {"$count": {"$gte": 2}}}, {'"t\tab"': {"$gt": 3}}, {'"back\\slash"': 4}, {'"é".""': 5},
    {'"arr"[]."k.1"': {"$in": [1, 3]}}, {"$nested": {"key": "arr", "filter": {'"k.1"': 2}}},
    {'"x.y"[0]': "p"}, {'"a"."b"': {"$exists": False}}, {"$not": {'""': {"$ne": "yy"}}},
]  # fmt: skip


def test_filters_on_quoted_keys_answer_as_the_reference_in_sql(tmp_path):
    """The embedded store's SQL (JSON paths; a name SQLite's paths cannot spell, a tab or a backslash, evaluated by
    the reference code instead) answers as :func:`matches` for every filter."""
    spec = IndexSpec("flat", "cosine", {}, 2)
    c = Collection.create(tmp_path / "c", VectorsConfig.single(spec, MODEL))
    c.upsert(list(range(len(PAYLOADS))), ["t"] * len(PAYLOADS), PAYLOADS, np.ones((len(PAYLOADS), 2), np.float32),
             model=MODEL)  # fmt: skip
    for raw in FILTERS:
        f = parse_filter(raw)
        want = [i for i, p in enumerate(PAYLOADS) if matches(f, p, i)]
        got = sorted(p["id"] for p in c.scroll(None, 10, f))
        assert got == want, raw
        assert c.count_matching(f) == len(want), raw
    assert [i for i, p in enumerate(PAYLOADS) if matches(parse_filter({'""': "xc"}), p)] == [0]
    assert [i for i, p in enumerate(PAYLOADS) if matches(parse_filter({'a."b.c"': 1}), p)] == [0]
    assert [i for i, p in enumerate(PAYLOADS) if matches(parse_filter({"a.b.c": 1}), p)] == [2]
    for bad in ("", '"a', "a..b", 'a"b'):
        with pytest.raises(FilterError):
            parse_filter({bad: 1})
    c.close()


def test_set_payload_key_and_key_deletion_follow_the_path():
    assert set_at({"": "xc"}, '""', {"n": 1}) == {"": {"n": 1}}
    assert set_at({"a": {"b.c": {"d": 1}}}, 'a."b.c"', {"e": 2}) == {"a": {"b.c": {"d": 1, "e": 2}}}
    assert set_at({}, '"x.y"[0]', {"e": 2}) == {"x.y": []}  # no array to write into: an empty one, as Qdrant
    assert set_at({"x.y": [{}, {}]}, '"x.y"[]', {"e": 2}) == {"x.y": [{"e": 2}, {"e": 2}]}
    p = {"": 1, "a": {"b.c": 2, "b": {"c": 3}}, "x.y": 4}
    assert without_keys(p, ['""', 'a."b.c"', '"x.y"']) == {"a": {"b": {"c": 3}}}
    assert without_keys(p, ["a.b.c", "x.y", "a[0]", 'bad"key']) == {"": 1, "a": {"b.c": 2, "b": {}}, "x.y": 4}


def test_the_milvus_translation_addresses_quoted_parts():
    from service.collections.milvus.expr import filter_expr

    assert filter_expr(parse_filter({'a."b.c"': 1})).count('payload["a"]["b.c"]') >= 1
    assert filter_expr(parse_filter({'"x.y"': "p"})).count('payload["x.y"]') >= 1
    with pytest.raises(InvalidCollectionRequest, match="empty key") as e:
        filter_expr(parse_filter({'""': "xc"}))
    assert e.value.code == "invalid_filter"
