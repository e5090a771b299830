"""Payload filters: grammar, validation and the parsed tree (:mod:`.filter_tree`); helpers for the backends'
translations.

The grammar is MongoDB's query-operator subset that Pinecone and Chroma also use for metadata filters (``$eq``,
``$ne``, ``$in``, ``$nin``, ``$gt``, ``$gte``, ``$lt``, ``$lte``, ``$exists``, ``$and``, ``$or``, ``$not``), plus
``$empty`` and ``$ids`` for what Qdrant's filters can say (``is_empty``, ``has_id``; ``service.http.qdrant`` translates
Qdrant's ``must``/``should``/``must_not`` onto this grammar)::

    filter    := { CLAUSE, ... }                        # every clause must hold (AND); at least one
    CLAUSE    := KEY: condition
               | "$and": [filter, ...] | "$or": [filter, ...] | "$not": filter
               | "$ids": [ID, ...]                      # the point's id is one of these
               | "$has_vector": NAME                    # the point holds the collection's vector NAME
               | "$min_should": {"filters": [filter, ...], "count": N}   # at least N of the filters hold
               | "$nested": {"key": KEY, "filter": filter}  # one object element of the array KEY satisfies
                                                        # the whole filter (its keys relative to the element)
    condition := SCALAR                                 # the same as {"$eq": SCALAR}
               | { OP: ARG, ... }                       # several operators: all must hold
    OP: ARG   := "$eq": SCALAR | "$ne": SCALAR | "$in": [SCALAR, ...] | "$nin": [SCALAR, ...]
               | "$gt" | "$gte" | "$lt" | "$lte": NUMBER
               | "$gt" | "$gte" | "$lt" | "$lte": DATETIME  # a datetime range (every bound a datetime)
               | "$exists": BOOL | "$empty": BOOL | "$null": BOOL   # $null: null or an array holding a null
               | "$text" | "$text_any" | "$phrase": string  # full-text tokens (all / any / consecutive)
               | "$count": {"$gt" | "$gte" | "$lt" | "$lte": N, ...}  # how many values the key holds
               | "$geo_radius" | "$geo_box" | "$geo_polygon": AREA   # a geo point {"lon", "lat"} inside AREA
    SCALAR    := string | number | true | false | null
    KEY       := non-empty string; dots address nested objects ("meta.lang"); "a[]" every element of the
                 array a, "a[2]" its third ("meta.tags[].name"); a part in double quotes is one name as written
                 ('a."b.c"': the key "b.c" of a; '""': the empty key), Qdrant's JSON path
                 (:func:`.conditions.parse_path`)

The semantics, the same on every backend, are :func:`.filter_match.matches`' (the reference).

Size: a filter holds at most ``max_values`` values in all (each compared value, bound, ``$exists``/``$empty``,
listed id and full-text token counts one; the setting ``collections_max_filter_values``) and nests
``$and``/``$or``/``$not`` at most :data:`MAX_DEPTH` deep. Backends translate conjunctions and disjunctions as balanced trees, so a filter at the limit
runs on both (a left-deep chain of ~50 ``and`` overflowed Milvus's plan; ~1,000 overflowed SQLite's expression
depth). Anything malformed or over the limits raises :class:`FilterError`, answered as 422 ``invalid_filter``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from service.collections.conditions import (
    ConditionError,
    Null,
    bounds,
    count_bound,
    datetime_bound,
    geo,
    parse_path,
    tokens,
)
from service.collections.filter_tree import (  # noqa: F401 (the tree's types are part of this module's API)
    And,
    Count,
    DateRange,
    Empty,
    Exists,
    Filter,
    Geo,
    HasVector,
    Ids,
    Match,
    MinShould,
    Nested,
    Not,
    Or,
    Range,
    Text,
)

MAX_DEPTH = 16  # nesting of $and / $or / $not
DEFAULT_MAX_VALUES = 1024
_RANGE_OPS = {"$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}
_OPS = (
    "$eq",
    "$ne",
    "$in",
    "$nin",
    "$gt",
    "$gte",
    "$lt",
    "$lte",
    "$exists",
    "$empty",
    "$null",
    "$text",
    "$text_any",
    "$phrase",
    "$count",
    "$geo_radius",
    "$geo_box",
    "$geo_polygon",
)
_TEXT_MODES = {"$text": "all", "$text_any": "any", "$phrase": "phrase"}
INT64 = (-(2**63), 2**63 - 1)


class FilterError(ValueError):
    """A filter does not follow the grammar or exceeds its limits; the message says where."""


T = TypeVar("T")


# --- parsing -------------------------------------------------------------------------------------------------------
def _scalar(v: Any, where: str) -> Any:
    if v is None or isinstance(v, (str, bool)):
        return v
    if isinstance(v, int):
        if not INT64[0] <= v <= INT64[1]:
            raise FilterError(f"{where}: integer out of the signed 64-bit range")
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise FilterError(f"{where}: {v} is not a valid filter value")
        return v
    raise FilterError(f"{where}: expected a string, number, boolean or null, got {type(v).__name__}")


def _number(v: Any, where: str) -> int | float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise FilterError(f"{where}: a range bound must be a number, got {type(v).__name__}")
    return _scalar(v, where)


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not key or key[-1:] == "\n" or parse_path(key) is None:
        raise FilterError(
            f"filter key {key!r} is not a valid payload key (no '$' prefix or empty parts; quotes only around a "
            'whole part, as in a."b.c"; brackets only as [] or [N] after a name)'
        )
    return key


class _Parser:
    def __init__(self, max_values: int, vectors: dict[str, str] | None = None) -> None:
        self.max_values = max_values
        self.values = 0
        self.vectors = vectors

    def count(self, n: int, where: str) -> None:
        self.values += n
        if self.values > self.max_values:
            raise FilterError(
                f"{where}: the filter holds more than {self.max_values} values (collections_max_filter_values)"
            )

    def filter(self, raw: Any, where: str, depth: int) -> Filter:
        if depth > MAX_DEPTH:
            raise FilterError(f"{where}: $and/$or/$not nested more than {MAX_DEPTH} deep")
        if not isinstance(raw, dict):
            raise FilterError(f"{where} must be a JSON object, got {type(raw).__name__}")
        if not raw:
            raise FilterError(f"{where} must have at least one condition")
        parts = [self.clause(k, v, where, depth) for k, v in raw.items()]
        return parts[0] if len(parts) == 1 else And(tuple(parts))

    def clause(self, key: Any, arg: Any, where: str, depth: int) -> Filter:
        if key in ("$and", "$or"):
            if not isinstance(arg, list) or not arg:
                raise FilterError(f"{where}.{key} must be a non-empty list of filters")
            parts = tuple(self.filter(f, f"{where}.{key}[{i}]", depth + 1) for i, f in enumerate(arg))
            return parts[0] if len(parts) == 1 else (And if key == "$and" else Or)(parts)
        if key == "$not":
            return Not(self.filter(arg, f"{where}.$not", depth + 1))
        if key == "$ids":
            return self.ids(arg, f"{where}.$ids")
        if key == "$min_should":
            if not isinstance(arg, dict) or set(arg) != {"filters", "count"} or not isinstance(arg["filters"], list):
                raise FilterError(f"{where}.$min_should must be {{'filters': [filter, ...], 'count': N}}")
            n = arg["count"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 1 or not arg["filters"]:
                raise FilterError(f"{where}.$min_should needs a non-empty filters list and a count of 1 or more")
            self.count(1, where)
            fs = arg["filters"]
            return MinShould(tuple(self.filter(f, f"{where}.$min_should[{i}]", depth + 1) for i, f in enumerate(fs)), n)
        if key == "$nested":
            if not isinstance(arg, dict) or set(arg) != {"key", "filter"}:
                raise FilterError(f"{where}.$nested must be {{'key': KEY, 'filter': filter}}")
            return Nested(_check_key(arg["key"]), self.filter(arg["filter"], f"{where}.$nested.filter", depth + 1))
        if key == "$has_vector":
            if not isinstance(arg, str) or self.vectors is None or arg not in self.vectors:
                raise FilterError(f"{where}.$has_vector: {arg!r} is not a vector of the collection")
            self.count(1, where)
            return HasVector(arg, self.vectors[arg])
        key = _check_key(key)
        return self.condition(key, arg, f"{where}.{key}")

    def ids(self, arg: Any, where: str) -> Ids:
        if not isinstance(arg, list) or not arg:
            raise FilterError(f"{where} must be a non-empty list of point ids")
        for i, x in enumerate(arg):
            ok = (isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**64) or (
                isinstance(x, str) and 0 < len(x) <= 512
            )
            if not ok:
                raise FilterError(f"{where}[{i}]: a point id is an unsigned 64-bit integer or a string of 1-512 chars")
        self.count(len(arg), where)
        return Ids(tuple(arg))

    def leaf(self, key: str, op: str, arg: Any, where: str) -> Filter:
        """A :mod:`.conditions` leaf of operator ``op``."""
        try:
            if op in _TEXT_MODES:
                if not isinstance(arg, str):
                    raise ConditionError(f"{where} must be a string")
                return Text(key, tuple(tokens(arg)), _TEXT_MODES[op])
            if op == "$count":
                return Count(key, **bounds(arg, where, count_bound))
            return geo(key, op, arg, where)
        except ConditionError as e:
            raise FilterError(str(e)) from None

    def condition(self, key: str, cond: Any, where: str) -> Filter:
        if not isinstance(cond, dict):
            if isinstance(cond, list):
                raise FilterError(f"{where}: a list is not a value; use {{'$in': [...]}}")
            self.count(1, where)
            return Match(key, (_scalar(cond, where),))
        if not cond:
            raise FilterError(f"{where}: an operator object needs at least one of {', '.join(_OPS)}")
        out: list[Filter] = []
        bounds: dict[str, Any] = {}
        for op, arg in cond.items():
            at = f"{where}.{op}"
            if op in ("$eq", "$ne"):
                self.count(1, at)
                m = Match(key, (_scalar(arg, at),))
                out.append(m if op == "$eq" else Not(m))
            elif op in ("$in", "$nin"):
                if not isinstance(arg, list) or not arg:
                    raise FilterError(f"{at} must be a non-empty list")
                self.count(len(arg), at)
                m = Match(key, tuple(_scalar(v, f"{at}[{i}]") for i, v in enumerate(arg)))
                out.append(m if op == "$in" else Not(m))
            elif op in _RANGE_OPS:
                self.count(1, at)
                bounds[_RANGE_OPS[op]] = arg if isinstance(arg, str) else _number(arg, at)
            elif op in ("$exists", "$empty", "$null"):
                if not isinstance(arg, bool):
                    raise FilterError(f"{at} must be true or false")
                self.count(1, at)
                f = Exists(key) if op == "$exists" else Empty(key) if op == "$empty" else Null(key)
                out.append(f if arg else Not(f))
            elif op in _OPS:
                self.count(_points(arg) if op == "$geo_polygon" else _tokens(op, arg), at)
                out.append(self.leaf(key, op, arg, at))
            else:
                raise FilterError(f"{where}: unknown operator {op!r} (supported: {', '.join(_OPS)})")
        if bounds and all(isinstance(v, str) for v in bounds.values()):
            try:
                out.append(DateRange(key, **{k: datetime_bound(v, f"{where}.${k}") for k, v in bounds.items()}))
            except ConditionError as e:
                raise FilterError(str(e)) from None
        elif bounds:
            for k, v in bounds.items():
                _number(v, f"{where}.${k}")  # a string beside a number: not a datetime range
            out.append(Range(key, **bounds))
        return out[0] if len(out) == 1 else And(tuple(out))


def _tokens(op: str, arg: Any) -> int:
    """The tokens of a full-text argument (a token is a value: each is tested on every row), at least 1; 1 for any
    other operator."""
    return max(1, len(tokens(arg))) if op in _TEXT_MODES and isinstance(arg, str) else 1


def _points(arg: Any) -> int:
    """The points of a ``$geo_polygon`` argument, counted as filter values (at least 1)."""
    rings = [arg.get("exterior"), *(arg.get("interiors") or [])] if isinstance(arg, dict) else []
    return max(1, sum(len(r.get("points") or []) for r in rings if isinstance(r, dict)))


def parse_filter(raw: Any, max_values: int = DEFAULT_MAX_VALUES, vectors: dict[str, str] | None = None) -> Filter:
    """Validate ``raw`` against the grammar of the module docstring and return its tree; ``vectors`` maps the
    collection's vector names to their kind (``bound``, ``dense``, ``sparse``) for ``$has_vector``.

    Raises:
        FilterError: ``raw`` is malformed, holds more than ``max_values`` values, or nests deeper than
            :data:`MAX_DEPTH`.
    """
    return _Parser(max_values, vectors).filter(raw, "filter", 0)


# --- helpers for the backends' translations ----------------------------------------------------------------------
def balanced(parts: Sequence[T], join: Callable[[T, T], T]) -> T:
    """``parts`` combined pairwise as a balanced binary tree (depth ``ceil(log2(n))``): the backends' query planners
    recurse over a left-deep chain of ``and``/``or`` and fail at a few dozen (Milvus) or ~1,000 (SQLite) terms."""
    if len(parts) == 1:
        return parts[0]
    mid = len(parts) // 2
    return join(balanced(parts[:mid], join), balanced(parts[mid:], join))


def value_kind(v: Any) -> str:
    """A scalar's JSON kind for type-aware equality: ``null``, ``bool``, ``int``, ``float`` or ``str``."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    return "int" if isinstance(v, int) else "float" if isinstance(v, float) else "str"


def canonical(raw: Any) -> str:
    """A stable JSON text of a filter (for logs)."""
    return json.dumps(raw, sort_keys=True, separators=(",", ":"))
