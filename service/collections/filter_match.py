"""The reference semantics of payload filters (:mod:`.filters`' grammar): :func:`matches` evaluates a parsed tree on
a point's payload and id in Python; the embedded backend's SQL and the Milvus backend's expressions are held to it by
tests.

Semantics, the same on every backend:

* **equality** (``$eq``, ``$in``) is by JSON type *and* value: ``2020`` matches the number 2020 (``2020.0`` too),
  not the string ``"2020"``; ``true`` matches only ``true``; ``null`` matches an explicit ``null``, not a missing
  key. A stored **array** matches when one of its elements does (``{"tags": "a"}`` matches ``["a", "b"]``), as in
  MongoDB and Qdrant; ``null`` is not looked for inside arrays;
* **ranges** compare numbers only (a string, boolean, array or missing value never matches);
* ``$ne``/``$nin`` are the negation of ``$eq``/``$in``: they also match points that lack the key (MongoDB's rule);
* ``$exists: true``: the key is present (``null`` included); ``$empty: true``: the key is missing, ``null`` or
  ``[]`` (Qdrant's ``is_empty``);
* ``$not`` negates a whole filter; ``$or`` needs one of its filters; ``$ids`` lists point ids (unsigned integers or
  strings, as upserted);
* full text, datetime ranges, ``$count``, geo areas, ``$nested`` and keys into arrays follow Qdrant's semantics
  (:mod:`.conditions`, where AREA and DATETIME are defined); the embedded backend evaluates them with that code
  row by row, the Milvus backend refuses them (422).
"""

from __future__ import annotations

from typing import Any

from service.collections.conditions import LEAVES, Geo, Text, key_names, leaf_holds, values_at
from service.collections.filter_tree import (
    And,
    Empty,
    Exists,
    Filter,
    Ids,
    Match,
    MinShould,
    Nested,
    Not,
    Or,
    Range,
)

_MISSING = object()


def _lookup(payload: Any, key: str) -> Any:
    cur = payload
    for part in key_names(key) or ():
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def _key(v: Any) -> tuple[str, Any] | None:
    """A scalar's value tagged with its JSON kind, so that a set lookup is the typed equality of the module docstring
    (numbers compare as numbers: ``2020 == 2020.0``; ``true`` is not ``1``); None for arrays and objects (equal to no
    filter value) and for null (tested apart)."""
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, (int, float)):
        return ("num", v)
    return ("str", v) if isinstance(v, str) else None


_KEYS: dict[int, tuple[Match, frozenset, bool]] = {}  # id(match) -> (the match, its value keys, null among them)


def _keys(m: Match) -> tuple[frozenset, bool]:
    """The typed keys (:func:`_key`) of a match's non-null values and whether null is one of them, made once per
    match while it is in use (a filter is evaluated on many rows): a stored value is then tested in O(1), not against
    every value."""
    got = _KEYS.get(id(m))
    if got is None or got[0] is not m:
        if len(_KEYS) > 4096:
            _KEYS.clear()
        got = _KEYS[id(m)] = (m, frozenset(_key(v) for v in m.values if v is not None), None in m.values)
    return got[1], got[2]


def _in_range(x: Any, r: Range) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    return (
        (r.gt is None or x > r.gt)
        and (r.gte is None or x >= r.gte)
        and (r.lt is None or x < r.lt)
        and (r.lte is None or x <= r.lte)
    )


def matches(f: Filter | None, payload: dict[str, Any] | None, point_id: int | str | None = None) -> bool:
    """Whether a point (``payload``, ``point_id``) satisfies ``f`` (None: everything): the semantics of the module
    docstring, which the SQL and Milvus translations must agree with."""
    if f is None:
        return True
    if isinstance(f, And):
        return all(matches(p, payload, point_id) for p in f.parts)
    if isinstance(f, Or):
        return any(matches(p, payload, point_id) for p in f.parts)
    if isinstance(f, Not):
        return not matches(f.part, payload, point_id)
    if isinstance(f, Ids):
        return any(type(point_id) is type(i) and point_id == i for i in f.ids)
    if isinstance(f, MinShould):
        return sum(matches(p, payload, point_id) for p in f.parts) >= f.count
    if isinstance(f, Nested):
        return any(matches(f.part, e) for e in nested_elements(payload or {}, f.key))
    if isinstance(f, LEAVES):
        return leaf_holds(f, payload or {})
    if key_names(f.key) is None:  # a key into arrays
        return _projected(f, payload or {})
    x = _lookup(payload or {}, f.key)
    if isinstance(f, Exists):
        return x is not _MISSING
    if isinstance(f, Empty):
        return x is _MISSING or x is None or x == []
    if x is _MISSING:
        return False
    if isinstance(f, Range):
        return _in_range(x, f)
    keys, null = _keys(f)
    if isinstance(x, list):  # null is not looked for inside arrays
        return any(_key(e) in keys for e in x)
    return null if x is None else _key(x) in keys


def filter_size(f: Filter | None) -> int:
    """The values a parsed filter holds (0 for None): each compared value, listed id, full-text token and polygon
    point, 1 for any other leaf; what evaluating it on one point costs, as :func:`matches` runs it."""
    if f is None:
        return 0
    if isinstance(f, (And, Or, MinShould)):
        return sum(filter_size(p) for p in f.parts) + isinstance(f, MinShould)
    if isinstance(f, (Not, Nested)):
        return filter_size(f.part)
    if isinstance(f, Ids):
        return len(f.ids)
    if isinstance(f, Match):
        return len(f.values)
    if isinstance(f, Text):
        return max(1, len(f.tokens))
    if isinstance(f, Geo) and f.kind == "polygon":
        return sum(len(ring) for ring in f.area)
    return 1


def nested_elements(payload: Any, key: str) -> list[dict[str, Any]]:
    """The object elements of the arrays ``key`` reaches (``key`` may end in ``[]``): what a ``$nested`` filter
    tests, one element at a time (a value that is not an array has none)."""
    key = key[:-2] if len(key) > 2 and key.endswith("[]") else key
    return [e for v in values_at(payload, key, flat=False) if isinstance(v, list) for e in v if isinstance(e, dict)]


def _projected(f: Filter, payload: Any) -> bool:
    """A Match, Range, Exists or Empty on a key into arrays (``a[].b``, ``a[0]``): over every value it reaches."""
    if isinstance(f, (Exists, Empty)):
        vals = values_at(payload, f.key, flat=False)
        if isinstance(f, Exists):
            return bool(vals)
        return all(v is None or v == [] for v in vals)
    vals = values_at(payload, f.key)
    if isinstance(f, Range):
        return any(_in_range(x, f) for x in vals)
    keys, null = _keys(f)
    return any(null if x is None else _key(x) in keys for x in vals)
