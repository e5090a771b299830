"""Payload filters (:mod:`...filters`) as SQLite ``WHERE`` expressions over the ``points`` table's JSON ``payload``
column and its ``key`` column (the encoded point id), with SQLite's JSON1 functions.

Every leaf is type-aware (``json_type``) and wrapped in ``IFNULL(..., 0)``: a missing key makes ``json_type`` NULL,
and SQL's three-valued logic would otherwise turn ``NOT (missing = 1)`` into NULL (no match) where the grammar says
true. Arrays are searched element by element with ``json_each``. ``AND``/``OR`` chains are balanced trees
(:func:`...filters.balanced`): a left-deep chain deeper than SQLite's ``SQLITE_MAX_EXPR_DEPTH`` (1,000) fails with
"Expression tree is too large".

Qdrant's richer conditions (:mod:`...conditions`: full text, datetime ranges, value counts, geo areas, ``$nested``,
keys into arrays) have no JSON1 form that keeps their semantics: they call the SQLite function ``filter_leaf``
(:func:`filter_leaf`, registered on every connection by :func:`register`), which evaluates the leaf with the
reference code (:func:`...filter_match.matches`) on the row's payload: a Python call per row tested (measured in
docs/performance.md).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import weakref
from typing import Any

from service.collections.conditions import LEAVES, Text, key_names
from service.collections.embedded.store.payload_index import Indexes, exact_set, text_prefilter
from service.collections.filter_match import matches
from service.collections.filters import (
    And,
    Empty,
    Exists,
    Filter,
    HasVector,
    Ids,
    Match,
    MinShould,
    Nested,
    Not,
    Or,
    Range,
    balanced,
    value_kind,
)
from service.collections.ids import encode_id
from service.collections.stopping import WorkStopped, interrupt_reads, stop_requested

#: held while a thread evaluates a Python leaf on a row (:func:`register`): one at a time in the whole process
_EVALUATING = threading.Lock()
_LIVE: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()  # id(leaf) -> leaf, while a query holds it


def filter_leaf(payload: str, leaf_id: int) -> int:
    """SQLite function ``filter_leaf(payload, leaf id)``: 1 when the row's payload (JSON text) satisfies the leaf
    :func:`to_sql` registered under ``leaf_id`` (the caller holds the filter while its statement runs), else 0."""
    leaf = _LIVE.get(leaf_id)
    if leaf is None:  # never: the statement's filter is alive; refuse rather than answer wrongly
        raise LookupError(f"filter leaf {leaf_id} is gone")
    return int(matches(leaf, _parsed(payload)))


def register(conn: sqlite3.Connection) -> None:
    """Make :func:`filter_leaf` callable on ``conn``; a read calling it stops at the first row after its request is
    cancelled (:func:`...stopping.stop_requested`; never inside a write transaction, which runs to its end), and any
    read at SQLite's next progress step (:func:`...stopping.interrupt_reads`).

    One thread of the process at a time evaluates a row (:data:`_EVALUATING`; the others wait without the GIL,
    SQLite releasing it between rows): Python code holds the GIL, so statements evaluating leaves on several
    threads at once would finish no sooner, but every other thread (the event loop, a light read of another
    collection) would queue for the GIL behind all of them, a few ms (``sys.getswitchinterval()``) per holder each
    time it takes the GIL back (measured in docs/performance.md, "Light requests beside heavy filters")."""

    def stopped() -> bool:
        return stop_requested() and not conn.in_transaction

    def leaf(payload: str, leaf_id: int) -> int:
        if stopped():
            raise WorkStopped("the request was stopped")  # SQLite ends the statement with an error
        while not _EVALUATING.acquire(timeout=0.1):  # a stopped statement waits no longer than that
            if stopped():
                raise WorkStopped("the request was stopped")
        try:
            return filter_leaf(payload, leaf_id)
        finally:
            _EVALUATING.release()

    conn.create_function("filter_leaf", 2, leaf)
    interrupt_reads(conn)


_ROW = threading.local()  # the last payload parsed on this thread: a row's leaves share one parse


def _parsed(payload: str) -> Any:
    """``json.loads(payload)``, parsed once for all the leaves a row is tested with (the leaves only read it)."""
    if getattr(_ROW, "text", None) != payload:
        _ROW.value, _ROW.text = json.loads(payload), payload
    return _ROW.value


def _python_leaf(f: Filter, column: str) -> Sql:
    _LIVE[id(f)] = f
    return f"filter_leaf({column}, ?)", [id(f)]


_RANGE_SQL = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
Sql = tuple[str, list[Any]]


def _path(key: str) -> str | None:
    """The SQLite JSON path of a key path into objects (every name double-quoted: ``$."a"."b.c"``), or None when it
    has array items or a name that SQLite's paths cannot spell (SQLite compares a path's name with the key as written
    in the stored JSON text: one that JSON escapes, a control character or a backslash, never matches)."""
    names = key_names(key)
    if names is None or any(json.dumps(n, ensure_ascii=False)[1:-1] != n for n in names):
        return None
    return "$" + "".join(f'."{n}"' for n in names)


def _in(expr: str, n: int) -> str:
    return f"{expr} = ?" if n == 1 else f"{expr} IN ({','.join('?' * n)})"


def _typed(type_sql: Sql, value_sql: Sql, values: tuple[Any, ...]) -> list[Sql]:
    """Alternatives testing that a JSON value, given as its type expression (``json_type`` names) and its SQL value
    expression, equals one of the non-null ``values`` by type and value."""
    (t, tp), (x, xp) = type_sql, value_sql
    nums = [v for v in values if value_kind(v) in ("int", "float")]
    strs = [v for v in values if value_kind(v) == "str"]
    bools = sorted({v for v in values if value_kind(v) == "bool"})
    out: list[Sql] = []
    if nums:
        out.append((f"({t} IN ('integer','real') AND {_in(x, len(nums))})", [*tp, *xp, *nums]))
    if strs:
        out.append((f"({t} = 'text' AND {_in(x, len(strs))})", [*tp, *xp, *strs]))
    out += [(f"{t} = '{'true' if b else 'false'}'", list(tp)) for b in bools]
    return out


def _or(parts: list[Sql]) -> Sql:
    return " OR ".join(s for s, _ in parts), [p for _, ps in parts for p in ps]


def _match(col: str, m: Match) -> Sql:
    path = _path(m.key)
    jtype: Sql = (f"json_type({col}, ?)", [path])
    alts = _typed(jtype, (f"json_extract({col}, ?)", [path]), m.values)
    if None in m.values:
        alts.append((f"json_type({col}, ?) = 'null'", [path]))
    elems = _typed(("e.type", []), ("e.value", []), m.values)
    if elems:  # an array matches when one of its elements does
        es, ep = _or(elems)
        alts.append(
            (
                f"(json_type({col}, ?) = 'array' AND EXISTS (SELECT 1 FROM json_each({col}, ?) AS e WHERE {es}))",
                [path, path, *ep],
            )
        )
    s, p = _or(alts)
    return f"IFNULL({s}, 0)", p


def _range(col: str, r: Range) -> Sql:
    path = _path(r.key)
    conds, params = [f"json_type({col}, ?) IN ('integer','real')"], [path]
    for name, op in _RANGE_SQL.items():
        bound = getattr(r, name)
        if bound is not None:
            conds.append(f"json_extract({col}, ?) {op} ?")
            params += [path, bound]
    return f"IFNULL({' AND '.join(conds)}, 0)", params


def to_sql(f: Filter, column: str = "payload", key_column: str = "key", indexes: Indexes | None = None) -> Sql:
    """A SQL boolean expression (never NULL) over the JSON text ``column`` and the encoded id ``key_column`` of the
    ``points`` table. ``indexes``: the collection's payload indexes (:mod:`.payload_index`): a part of the filter that
    they cover becomes ``points.iid IN (<the iids read from them>)`` (SQLite then reads those rows by id instead of
    every payload), a full-text condition on a ``text`` index is tested on the points holding its tokens only.

    Returns:
        ``(sql, params)`` to put after ``WHERE``.
    """
    if indexes and (found := exact_set(f, indexes)) is not None:
        return f"(points.iid IN ({found[0]}))", found[1]
    if indexes and isinstance(f, Text) and (pre := text_prefilter(f, indexes)) is not None:
        s, p = _python_leaf(f, column)
        return f"(points.iid IN ({pre[0]}) AND {s})", [*pre[1], *p]
    if isinstance(f, (And, Or)):
        op = " AND " if isinstance(f, And) else " OR "
        parts = [to_sql(p, column, key_column, indexes) for p in f.parts]
        return balanced(parts, lambda a, b: (f"({a[0]}{op}{b[0]})", a[1] + b[1]))
    if isinstance(f, Not):
        s, p = to_sql(f.part, column, key_column, indexes)
        return f"(NOT {s})", p
    if isinstance(f, Ids):
        keys = [encode_id(i) for i in f.ids]
        return f"({_in(key_column, len(keys))})", keys
    if isinstance(f, MinShould):  # every translated part is 0 or 1, never NULL
        parts = [to_sql(p, column, key_column, indexes) for p in f.parts]
        return f"(({' + '.join(s for s, _ in parts)}) >= {int(f.count)})", [x for _, ps in parts for x in ps]
    if isinstance(f, (Nested, *LEAVES)) or (hasattr(f, "key") and _path(f.key) is None):
        return _python_leaf(f, column)
    if isinstance(f, Match):
        return _match(column, f)
    if isinstance(f, Range):
        return _range(column, f)
    if isinstance(f, HasVector):
        if f.kind == "bound":  # the model-bound vector lives in points.vector (empty in a collection without one)
            return "(length(vector) > 0)", []
        table = "sparse_vectors" if f.kind == "sparse" else "named_dense"
        return f"EXISTS (SELECT 1 FROM {table} v WHERE v.field = ? AND v.iid = points.iid)", [f.name]
    path = _path(f.key)
    if isinstance(f, Exists):
        return f"(json_type({column}, ?) IS NOT NULL)", [path]
    if isinstance(f, Empty):
        return (
            f"IFNULL(json_type({column}, ?) IS NULL OR json_type({column}, ?) = 'null' OR "
            f"(json_type({column}, ?) = 'array' AND json_array_length({column}, ?) = 0), 0)",
            [path] * 4,
        )
    raise TypeError(f"not a filter: {f!r}")
