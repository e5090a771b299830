"""Payload conditions beyond equality and numeric ranges, with their reference semantics (Qdrant's, so that a
collection answers as a Qdrant server does): key paths into arrays, full-text tokens, datetime ranges, value counts
and geo conditions. :mod:`.filters` parses them into its tree; the embedded backend evaluates them with the code here
(a SQLite function per row); the Milvus backend refuses them.

Sources (Qdrant API reference and concepts, https://qdrant.tech/documentation/concepts/filtering/):

* **key paths**: ``a.b`` nests, ``a[]`` takes every element of the array ``a``, ``a[2]`` its third element, a part in
  double quotes is one key as written (``a."b.c"``, ``""``: :func:`parse_path`); the values a path reaches are the
  values a condition tests, and a reached array is unwrapped one level ("Nested key");
* **full-text match** on a field without a text index: both sides split by Qdrant's default word tokenizer
  (runs of letters and digits, lowercased); ``text``: every query token is a token of the value, ``text_any``: one
  is, ``phrase``: the query tokens occur consecutively;
* **datetime range**: RFC 3339 values and bounds, or the other formats Qdrant parses (``YYYY-MM-DD[ T]HH:MM[:SS[.f]]``
  with an optional ``±HH[:MM]``/``Z`` offset, or a date), read as UTC without an offset; fractions past
  microseconds are cut;
* **is null** (``is_null``): one of the values the key reaches (arrays kept whole) is null or an array holding a
  null element, one level deep (``[null, 1]`` is null, ``[[null]]`` is not; a missing key is not), as qdrant-client's
  local mode and Qdrant's segment code test it;
* **values count**: how many values a key holds (an array's length, 1 for a scalar, 0 for null or a missing key),
  tested against ``gt``/``gte``/``lt``/``lte``;
* **geo**: a payload value ``{"lon": x, "lat": y}`` (finite numbers) within ``radius`` meters of a centre (haversine on
  a sphere of the IUGG mean Earth radius, 6,371,008.8 m), inside a bounding box (``top_left``, ``bottom_right``;
  across the antimeridian when ``top_left.lon > bottom_right.lon``), or inside a polygon (an ``exterior`` ring and
  optional ``interiors`` holes; a point on an edge of either is outside): tested in :mod:`.geo_area`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from service.collections.geo_area import EARTH_RADIUS_M as EARTH_RADIUS_M  # re-exported: the geo conditions
from service.collections.geo_area import any_inside
from service.collections.geo_area import finite as _finite
from service.collections.geo_area import geo_distance as geo_distance

_PATH_ITEM = re.compile(r"\[([0-9]*)\]")
_NAME = re.compile(r"^[^\"\\.$\[\]\x00-\x1f][^\"\\.\[\]\x00-\x1f]*")
_QUOTED = re.compile(r'"([^"]*)"')
MAX_INDEX = 2**64 - 1  # an array index in a path is a u64, as in Qdrant
_FORMATS = [
    f"%Y-%m-%d{sep}{t}{tz}"
    for tz in ("%z", " %z", "")
    for sep in ("T", " ")
    for t in ("%H:%M:%S.%f", "%H:%M:%S", "%H:%M")
] + ["%Y-%m-%d"]


class ConditionError(ValueError):
    """A condition's argument is malformed; the message says what is expected."""


# --- key paths ----------------------------------------------------------------------------------------------------
def parse_path(key: str) -> tuple[str | int | None, ...] | None:
    """The items of a key path: names (str), array indexes (int) and ``[]`` (None); None when ``key`` is not a valid
    path. Qdrant's JSON path (documentation, "Payload" and "Filtering", nested keys; qdrant-client's
    ``json_path_parser``): parts separated by single dots, each a name followed by ``[]`` / ``[N]`` brackets; a name
    is unquoted (no quote, backslash, dot, bracket or control character, not starting with ``$``: Qdrant's letters,
    digits, ``_`` and ``-``, and more) or double-quoted, then taken as written up to the next quote (``a."b.c"`` is
    the key ``b.c`` of ``a``, ``""`` the empty key). The one parser of key paths: filters, payload paths and key
    deletion read keys through it (:func:`key_names`)."""
    return _parse(key) if isinstance(key, str) else None


@functools.lru_cache(maxsize=4096)  # the reference evaluation reads a filter's keys once per row
def _parse(key: str) -> tuple[str | int | None, ...] | None:
    items: list[str | int | None] = []
    rest = key
    while True:
        m = _QUOTED.match(rest) or _NAME.match(rest)
        if m is None:
            return None
        items.append(m.group(1) if m.re is _QUOTED else m.group(0))
        rest = rest[m.end() :]
        while (b := _PATH_ITEM.match(rest)) is not None:
            if b.group(1) and int(b.group(1)) > MAX_INDEX:
                return None
            items.append(int(b.group(1)) if b.group(1) else None)
            rest = rest[b.end() :]
        if not rest:
            return tuple(items)
        if rest[0] != ".":
            return None
        rest = rest[1:]


def key_names(key: str) -> tuple[str, ...] | None:
    """The names of a key path that reaches into objects only (``("a", "b.c")`` for ``a."b.c"``); None for a path
    with array items (``a[]``, ``a[0]``) or no valid path (:func:`parse_path`)."""
    items = parse_path(key)
    return items if items is not None and all(isinstance(i, str) for i in items) else None  # type: ignore[return-value]


def payload_names(key: str) -> tuple[str, ...] | None:
    """The names a payload key reaches through where a key is read, never refused (a facet, a payload selection, a
    key deletion): its path's (:func:`key_names`), or, for a key that is no key path (a control character in a name,
    a stray quote), its text cut at its dots; None for a path into arrays."""
    items = parse_path(key)
    if items is None:
        return tuple(key.split("."))
    return items if all(isinstance(i, str) for i in items) else None  # type: ignore[return-value]


def values_at(payload: Any, key: str, flat: bool = True) -> list[Any]:
    """The values ``key`` reaches in ``payload`` (none when it reaches nothing); ``flat``: a reached array gives its
    elements (Qdrant's rule for conditions on values), else the array itself."""
    out: list[Any] = []

    def walk(x: Any, items: tuple[str | int | None, ...]) -> None:
        if not items:
            out.extend(x) if flat and isinstance(x, list) else out.append(x)
            return
        head, rest = items[0], items[1:]
        if isinstance(head, str):
            if isinstance(x, dict) and head in x:
                walk(x[head], rest)
        elif isinstance(x, list):
            for e in x if head is None else x[head : head + 1]:
                walk(e, rest)

    walk(payload, parse_path(key) or ())
    return out


# --- leaves ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Text:
    """``payload[key]`` is a string whose tokens hold the query's: all of them (``mode="all"``), one (``"any"``) or
    consecutively (``"phrase"``)."""

    key: str
    tokens: tuple[str, ...]
    mode: str


@dataclass(frozen=True, eq=False)
class DateRange:
    """``payload[key]`` is a datetime string within the bounds (aware datetimes; None: unbounded)."""

    key: str
    gt: datetime | None = None
    gte: datetime | None = None
    lt: datetime | None = None
    lte: datetime | None = None


@dataclass(frozen=True, eq=False)
class Count:
    """How many values ``payload[key]`` holds is within the bounds (None: unbounded)."""

    key: str
    gt: int | None = None
    gte: int | None = None
    lt: int | None = None
    lte: int | None = None


@dataclass(frozen=True, eq=False)
class Geo:
    """``payload[key]`` is a geo point ``{"lon", "lat"}`` inside the area: ``kind`` ``radius`` (``area``:
    ``(lat, lon, meters)``), ``box`` (``(top_left_lat, top_left_lon, bottom_right_lat, bottom_right_lon)``) or
    ``polygon`` (``(exterior ring, *interior rings)``, each a tuple of ``(lat, lon)``)."""

    key: str
    kind: str
    area: tuple[Any, ...]


@dataclass(frozen=True, eq=False)
class Null:
    """``payload[key]`` is null, or an array with a null element (Qdrant's ``is_null``: module docstring)."""

    key: str


LEAVES = (Text, DateRange, Count, Geo, Null)


def tokens(text: str) -> list[str]:
    """Qdrant's default word tokenizer for a field without a text index: runs of letters and digits, lowercased."""
    return [t.lower() for t in re.findall(r"[^\W_]+", text)]


@functools.lru_cache(maxsize=64)  # a row's text is tested by every full-text leaf of a filter
def _tokens_of(text: str) -> tuple[str, ...]:
    return tuple(tokens(text))


def parse_datetime(text: Any) -> datetime | None:
    """An aware datetime of a string in one of the formats Qdrant parses (module docstring), or None."""
    if not isinstance(text, str):
        return None
    s = text.lstrip()
    if not (s[:4].isdigit() and s[4:5] == "-"):  # every format starts with a 4-digit year and "-": skip strptime
        return None
    s = s[:-4] + "+00:00" if s.endswith(" UTC") else s[:-1] + "Z" if s.endswith("z") else s
    if (dot := s.find(".")) != -1:  # fractions past microseconds are cut
        end = dot + 1
        while end < len(s) and s[end].isdigit():
            end += 1
        s = s[: dot + 7] + s[end:] if end - dot > 7 else s
    for candidate in (s, s + ":00") if re.search(r"[+-]\d\d\Z", s) else (s,):
        for fmt in _FORMATS:
            try:
                dt = datetime.strptime(candidate, fmt)
            except ValueError:
                continue
            return dt if dt.tzinfo is not None else dt.replace(tzinfo=timezone.utc)
    return None


def _within(n: Any, b: Count | DateRange) -> bool:
    return (
        (b.gt is None or n > b.gt)
        and (b.gte is None or n >= b.gte)
        and (b.lt is None or n < b.lt)
        and (b.lte is None or n <= b.lte)
    )


def leaf_holds(leaf: Any, payload: Any) -> bool:
    """Whether ``payload`` (a point's payload object) satisfies one of :data:`LEAVES` (module docstring)."""
    if isinstance(leaf, Null):
        return any(v is None or (isinstance(v, list) and None in v) for v in values_at(payload, leaf.key, False))
    if isinstance(leaf, Count):
        counts = [0 if v is None else len(v) if isinstance(v, list) else 1 for v in values_at(payload, leaf.key, False)]
        return any(_within(n, leaf) for n in counts or [0])
    values = values_at(payload, leaf.key)
    if isinstance(leaf, Geo):
        return any_inside(leaf.kind, leaf.area, values)
    if isinstance(leaf, DateRange):
        return any((dt := parse_datetime(v)) is not None and _within(dt, leaf) for v in values)
    want = set(leaf.tokens) if leaf.mode != "phrase" else set()
    # a phrase: a substring of the tokens joined by spaces (a token holds none)
    phrase = " " + " ".join(leaf.tokens) + " " if leaf.mode == "phrase" else ""
    for v in values:  # Text
        if not isinstance(v, str):
            continue
        have = _tokens_of(v)
        if leaf.mode == "any" and not want.isdisjoint(have):
            return True
        if leaf.mode == "all" and want and want.issubset(have):
            return True
        if leaf.mode == "phrase" and leaf.tokens and phrase in " " + " ".join(have) + " ":
            return True
    return False


# --- parsing of the operators' arguments ------------------------------------------------------------------------------
def _number(v: Any, where: str) -> float:
    if (f := _finite(v)) is None:
        raise ConditionError(f"{where} must be a finite number")
    return f


def _lat_lon(p: Any, where: str) -> tuple[float, float]:
    if not isinstance(p, dict) or set(p) != {"lat", "lon"}:
        raise ConditionError(f"{where} must be {{'lat': number, 'lon': number}}")
    return _number(p["lat"], f"{where}.lat"), _number(p["lon"], f"{where}.lon")


def _ring(r: Any, where: str) -> tuple[tuple[float, float], ...]:
    pts = r.get("points") if isinstance(r, dict) else None
    if not isinstance(pts, list) or len(pts) < 4:
        raise ConditionError(f"{where} must be {{'points': [4 or more {{'lat', 'lon'}}, the first repeated last]}}")
    ring = tuple(_lat_lon(p, f"{where}.points[{i}]") for i, p in enumerate(pts))
    if ring[0] != ring[-1]:
        raise ConditionError(f"{where}: a ring must end where it starts")
    return ring


def geo(key: str, op: str, arg: Any, where: str) -> Geo:
    """A :class:`Geo` from ``$geo_radius`` (``{center: {lat, lon}, radius: meters}``), ``$geo_box``
    (``{top_left, bottom_right}``) or ``$geo_polygon`` (``{exterior: {points}, interiors: [{points}, ...]}``).

    Raises:
        ConditionError: a malformed argument.
    """
    if not isinstance(arg, dict):
        raise ConditionError(f"{where} must be an object")
    if op == "$geo_radius":
        if set(arg) != {"center", "radius"}:
            raise ConditionError(f"{where} must be {{'center': {{'lat', 'lon'}}, 'radius': meters}}")
        return Geo(key, "radius", (*_lat_lon(arg["center"], f"{where}.center"), _number(arg["radius"], where)))
    if op == "$geo_box":
        if set(arg) != {"top_left", "bottom_right"}:
            raise ConditionError(f"{where} must be {{'top_left': {{'lat', 'lon'}}, 'bottom_right': {{'lat', 'lon'}}}}")
        tl, br = _lat_lon(arg["top_left"], f"{where}.top_left"), _lat_lon(arg["bottom_right"], f"{where}.bottom_right")
        return Geo(key, "box", (*tl, *br))
    if not set(arg) <= {"exterior", "interiors"} or "exterior" not in arg:
        raise ConditionError(f"{where} must be {{'exterior': {{'points': [...]}}, 'interiors': [...]}}")
    holes = arg.get("interiors") or []
    if not isinstance(holes, list):
        raise ConditionError(f"{where}.interiors must be a list of rings")
    rings = [_ring(arg["exterior"], f"{where}.exterior")]
    rings += [_ring(h, f"{where}.interiors[{i}]") for i, h in enumerate(holes)]
    return Geo(key, "polygon", tuple(rings))


def bounds(arg: Any, where: str, read: Any) -> dict[str, Any]:
    """``{gt, gte, lt, lte}`` of an object of ``$gt``/``$gte``/``$lt``/``$lte``, each value read by ``read(value,
    where)`` (which raises :class:`ConditionError` on a bad one).

    Raises:
        ConditionError: not such an object.
    """
    if not isinstance(arg, dict) or not arg or set(arg) - {"$gt", "$gte", "$lt", "$lte"}:
        raise ConditionError(f"{where} must be an object of $gt, $gte, $lt, $lte")
    return {k[1:]: read(v, f"{where}.{k}") for k, v in arg.items()}


def count_bound(v: Any, where: str) -> int:
    """A values-count bound: a non-negative integer.

    Raises:
        ConditionError: anything else.
    """
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConditionError(f"{where} must be a non-negative integer")
    return v


def datetime_bound(v: Any, where: str) -> datetime:
    """A datetime range bound: a string Qdrant parses (:func:`parse_datetime`).

    Raises:
        ConditionError: anything else.
    """
    dt = parse_datetime(v)
    if dt is None:
        raise ConditionError(f"{where} must be an RFC 3339 datetime or date string")
    return dt
