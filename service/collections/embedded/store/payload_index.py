"""The payload indexes of an embedded collection (:mod:`...payload_indexes`) in its SQLite file: one table
``payload_index(field, value, elem, iid)``, a B-tree on ``(field, value, elem, iid)`` (``WITHOUT ROWID``: the table
is its index) and one on ``iid`` (to drop a point's entries), kept in the same transaction as the points they index
(an upsert, a deletion, a payload update: every write of a point goes through :meth:`.points.Store.upsert` or
:meth:`.points.Store.delete`), with ``payload_index_points(field, points)``, how many points hold an entry of each
(kept by the same writes); the indexes' definitions are the ``meta`` value ``payload_indexes``
(``{key: {data_type, params?}}``).

An entry is one value the key reaches in a point's payload (:func:`entries`): a string (``keyword``, ``uuid``), a
number (``integer`` and ``float`` alike: every JSON number, as a filter compares numbers), ``0``/``1`` (``bool``),
microseconds since the Unix epoch (``datetime``: the strings :func:`...conditions.parse_datetime` reads), a token of
:func:`...conditions.tokens` (``text``); ``elem`` is 1 for an element of the array a plain key (``a.b``) holds, which
a numeric range does not test (:func:`...filter_match.matches`), else 0. A field holds values of one type only, so
SQLite's typed comparisons (numbers with numbers, text with text) are the filter's.

:func:`exact_set` turns a filter whose every leaf an index covers into one ``SELECT`` of the matching ``iid``s
(an and probes its other parts by ``iid``; ``UNION``/``EXCEPT`` for or/not); :func:`text_prefilter` gives the points that can satisfy a
full-text condition (then tested on their payloads). Conditions no index covers keep the JSON path of :mod:`.where`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from service.collections.conditions import DateRange, Text, key_names, parse_datetime, tokens, values_at
from service.collections.filters import And, Ids, Match, Not, Or, Range, value_kind
from service.collections.ids import encode_id
from service.collections.payload_indexes import PayloadIndex

SCHEMA = """
CREATE TABLE IF NOT EXISTS payload_index (
    field TEXT NOT NULL, value NOT NULL, elem INTEGER NOT NULL, iid INTEGER NOT NULL,
    PRIMARY KEY (field, value, elem, iid)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS payload_index_iid ON payload_index(iid);
CREATE TABLE IF NOT EXISTS payload_index_points (field TEXT PRIMARY KEY, points INTEGER NOT NULL);
"""
META = "payload_indexes"
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)
_MAX_PARTS = 400  # below SQLITE_MAX_COMPOUND_SELECT (500): a wider and/or keeps the JSON path
_CHUNK = 500
_INT64 = (-(2**63), 2**63 - 1)
Sql = tuple[str, list[Any]]
Indexes = Mapping[str, PayloadIndex]


def micros(dt: datetime) -> int:
    """An aware datetime as whole microseconds since the Unix epoch (exact: what a ``datetime`` entry holds)."""
    return (dt - _EPOCH) // _US


def _number(v: Any) -> int | float:
    return v if isinstance(v, float) or _INT64[0] <= v <= _INT64[1] else float(v)  # SQLite's integers are int64


def entries(index: PayloadIndex, payload: Any) -> set[tuple[Any, int]]:
    """The ``(value, elem)`` entries of ``payload`` (a point's payload object) in ``index`` (module docstring)."""
    names = key_names(index.key)
    if names is not None:  # a plain key: its value, or the elements of the array it holds
        x: Any = payload
        for n in names:
            if not isinstance(x, dict) or n not in x:
                return set()
            x = x[n]
        reached = [(e, 1) for e in x] if isinstance(x, list) else [(x, 0)]
    else:
        reached = [(v, 0) for v in values_at(payload, index.key)]
    out: set[tuple[Any, int]] = set()
    t = index.data_type
    for v, elem in reached:
        kind = value_kind(v) if v is None or isinstance(v, (bool, int, float, str)) else "other"
        if t in ("keyword", "uuid") and kind == "str":
            out.add((v, elem))
        elif t in ("integer", "float") and kind in ("int", "float"):
            out.add((_number(v), elem))
        elif t == "bool" and kind == "bool":
            out.add((int(v), elem))
        elif t == "datetime" and (dt := parse_datetime(v)) is not None:
            out.add((micros(dt), 0))
        elif t == "text" and kind == "str":
            out.update((tok, 0) for tok in tokens(v))
    return out


def load(meta: Mapping[str, Any]) -> dict[str, PayloadIndex]:
    """The indexes recorded in a collection's decoded ``meta``."""
    return {k: PayloadIndex.from_json(k, d) for k, d in (meta.get(META) or {}).items()}


def record(w: sqlite3.Connection, indexes: Indexes) -> None:
    """Inside a write: record ``indexes`` as the collection's (the ``meta`` value)."""
    value = json.dumps({k: i.to_json() for k, i in indexes.items()})
    w.execute(
        "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (META, value),
    )


def add(w: sqlite3.Connection, indexes: Iterable[PayloadIndex], rows: Iterable[tuple[int, str]]) -> None:
    """Inside a write: the entries of the points ``rows`` (``(iid, payload JSON)``) in ``indexes``."""
    indexes = list(indexes)
    if not indexes:
        return
    batch: list[tuple[str, Any, int, int]] = []
    held = dict.fromkeys((i.key for i in indexes), 0)
    for iid, text in rows:
        payload = json.loads(text)
        for index in indexes:
            found = entries(index, payload)
            held[index.key] += bool(found)
            batch.extend((index.key, v, e, int(iid)) for v, e in found)
        if len(batch) >= 50_000:
            w.executemany("INSERT OR IGNORE INTO payload_index(field, value, elem, iid) VALUES (?, ?, ?, ?)", batch)
            batch = []
    w.executemany("INSERT OR IGNORE INTO payload_index(field, value, elem, iid) VALUES (?, ?, ?, ?)", batch)
    _count(w, held)


def _count(w: sqlite3.Connection, change: Mapping[str, int]) -> None:
    w.executemany(
        "INSERT INTO payload_index_points(field, points) VALUES (?, ?) "
        "ON CONFLICT(field) DO UPDATE SET points = points + excluded.points",
        [(k, n) for k, n in change.items() if n],
    )


def remove(w: sqlite3.Connection, iids: list[int]) -> None:
    """Inside a write: drop every entry of the points ``iids``."""
    for i in range(0, len(iids), _CHUNK):
        part, marks = iids[i : i + _CHUNK], ",".join("?" * len(iids[i : i + _CHUNK]))
        q = f"SELECT field, -COUNT(DISTINCT iid) FROM payload_index WHERE iid IN ({marks}) GROUP BY field"
        _count(w, dict(w.execute(q, part).fetchall()))
        w.execute(f"DELETE FROM payload_index WHERE iid IN ({marks})", part)


def drop(w: sqlite3.Connection, key: str) -> None:
    """Inside a write: drop every entry of the index of ``key`` and its points count."""
    w.execute("DELETE FROM payload_index WHERE field = ?", (key,))
    w.execute("DELETE FROM payload_index_points WHERE field = ?", (key,))


def points_per_field(conn: sqlite3.Connection) -> dict[str, int]:
    """How many points each index holds a value of (Qdrant's ``payload_schema[key].points``)."""
    return dict(conn.execute("SELECT field, points FROM payload_index_points").fetchall())


# --- filters ----------------------------------------------------------------------------------------------------------
def _in(n: int) -> str:
    return "value = ?" if n == 1 else f"value IN ({','.join('?' * n)})"


def _covered_match(m: Match, t: str) -> list[Any] | None:
    """The entry values a match looks up in an index of type ``t``, or None when the index does not hold every
    value the match compares (a null, a value of another type: then the JSON path answers)."""
    kinds = {value_kind(v) for v in m.values}
    if not m.values or None in m.values:
        return None
    if t in ("keyword", "uuid") and kinds == {"str"}:
        return list(m.values)
    if t in ("integer", "float") and kinds <= {"int", "float"}:
        return [_number(v) for v in m.values]
    if t == "bool" and kinds == {"bool"}:
        return [int(v) for v in m.values]
    return None


def _bounds(f: Range | DateRange, conv: Any) -> Sql:
    conds, params = [], []
    for name, op in (("gt", ">"), ("gte", ">="), ("lt", "<"), ("lte", "<=")):
        b = getattr(f, name)
        if b is not None:
            conds.append(f"value {op} ?")
            params.append(conv(b))
    return "".join(f" AND {c}" for c in conds), params


def _leaf(f: Any, indexes: Indexes) -> Sql | None:
    """The condition on an index's ``field``, ``value`` and ``elem`` that selects the entries of the points
    satisfying the leaf ``f``, or None when no index covers it."""
    index = indexes.get(getattr(f, "key", None)) if hasattr(f, "key") else None
    if index is None:
        return None
    t = index.data_type
    if isinstance(f, Match) and (values := _covered_match(f, t)) is not None:
        return f"field = ? AND {_in(len(values))}", [f.key, *values]
    if isinstance(f, Range) and t in ("integer", "float"):
        s, p = _bounds(f, lambda b: b)
        return f"field = ? AND elem = 0{s}", [f.key, *p]
    if isinstance(f, DateRange) and t == "datetime":
        s, p = _bounds(f, micros)
        return f"field = ?{s}", [f.key, *p]
    return None


def exact_set(f: Any, indexes: Indexes) -> Sql | None:
    """A ``SELECT`` of the ``iid`` of every live point satisfying ``f`` (maybe repeated), read from the indexes (and
    the point ids), or None when a condition of ``f`` is not covered by one, or none of them reads an index: a match
    of values of the index's type, a numeric range (``integer``, ``float``), a datetime range (``datetime``), point
    ids; and/or/not of those. An ``and`` reads its likeliest narrowest part (ids, then a match, then an or, then a
    range, then a not) and tests its other parts on those points only (through the index on ``iid``)."""
    found = _set(f, indexes) if indexes else None
    return None if found is None or not found[2] else found[:2]


_RANK = {Ids: 0, Match: 1, Or: 2, And: 2, Range: 3, DateRange: 3, Not: 4}


def _set(f: Any, indexes: Indexes) -> tuple[str, list[Any], bool] | None:
    """:func:`exact_set`'s ``(sql, params, whether an index is read)``."""
    if isinstance(f, Ids):
        keys = [encode_id(i) for i in f.ids]
        return f"SELECT iid FROM points WHERE key IN ({','.join('?' * len(keys))})", keys, False
    if isinstance(f, (And, Or)):
        if len(f.parts) > _MAX_PARTS:
            return None
        parts = [_set(p, indexes) for p in f.parts]
        if any(p is None for p in parts):
            return None
        used = any(p[2] for p in parts)  # type: ignore[index]
        if isinstance(f, Or):
            sql = " UNION ".join(f"SELECT iid FROM ({p[0]})" for p in parts)  # type: ignore[index]
            return sql, [x for p in parts for x in p[1]], used  # type: ignore[index]
        order = sorted(range(len(parts)), key=lambda i: _RANK.get(type(f.parts[i]), 2))
        drive, rest = parts[order[0]], order[1:]
        conds, params = [], list(drive[1])  # type: ignore[index]
        for i in rest:
            if (leaf := _leaf(f.parts[i], indexes)) is not None:  # probed by iid
                conds.append(f"EXISTS (SELECT 1 FROM payload_index p WHERE p.iid = x.iid AND {leaf[0]})")
                params += leaf[1]
            else:
                conds.append(f"x.iid IN ({parts[i][0]})")  # type: ignore[index]
                params += parts[i][1]  # type: ignore[index]
        return f"SELECT x.iid AS iid FROM ({drive[0]}) AS x WHERE {' AND '.join(conds)}", params, used  # type: ignore[index]
    if isinstance(f, Not):
        part = _set(f.part, indexes)
        if part is None:
            return None
        return f"SELECT iid FROM points EXCEPT SELECT iid FROM ({part[0]})", part[1], part[2]
    leaf = _leaf(f, indexes)
    return None if leaf is None else (f"SELECT iid FROM payload_index WHERE {leaf[0]}", leaf[1], True)


def text_prefilter(f: Text, indexes: Indexes) -> Sql | None:
    """A ``SELECT`` of the ``iid`` of the points that hold the tokens a full-text condition needs (one of them for
    ``any``, all for ``all`` and ``phrase``), a superset of those satisfying it, from a ``text`` index of its key;
    None without one or without tokens."""
    index = indexes.get(f.key)
    if index is None or index.data_type != "text" or not f.tokens:
        return None
    head = "SELECT iid FROM payload_index WHERE field = ? AND "
    if f.mode == "any":
        return head + _in(len(f.tokens)), [f.key, *f.tokens]
    toks = sorted(set(f.tokens))[:_MAX_PARTS]
    return " INTERSECT ".join(head + "value = ?" for _ in toks), [x for t in toks for x in (f.key, t)]
