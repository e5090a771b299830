"""Points ordered by a payload value, and uniform random samples of points, over any backend: Qdrant's ``order_by``
(Qdrant API reference, "Scroll points": ``order_by: {key, direction, start_from}``; "Query points": ``OrderByQuery``)
and ``{"sample": "random"}`` ("Query points": ``SampleQuery``).

Order (as Qdrant's, and qdrant-client's local mode, orders): every value the key reaches (keys into arrays
flattened, :func:`.conditions.values_at`) that is a number, or a datetime string Qdrant parses (as microseconds since
the epoch, UTC when it names no offset), is one entry of its point; booleans, other strings, objects and nulls give
none, and a point without an entry is left out. A point appears once per distinct value it holds. Entries are sorted
by value (``asc`` by default; ties in the backend's id order); ``start_from`` skips the entries before that value
(``asc``: smaller ones, ``desc``: greater ones).

Cost: no payload index is kept, so both read every matching point: a backend may order by its own means (the
embedded one orders a top-level key in SQL: :mod:`.embedded.ordering`); otherwise the payloads (for an order) or ids
(for a sample) are read page by page through the backend's scroll. O(matching points) per call either way
(docs/performance.md, "order_by and sample"); a filter narrows what is read. An order read by a scan is bounded: at
most ``collections_max_order_scan`` matching points (counted before the scan), read in one job off the event loop
that stops with its request.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from service.collections.conditions import parse_datetime, parse_path, values_at
from service.collections.errors import InvalidCollectionRequest
from service.collections.filters import Filter
from service.collections.point_reads import PointReads
from service.collections.stopping import check, every, for_collection
from service.collections.vector_backend import CollectionHandle

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROS_PER_DAY = 86_400_000_000


@dataclass(frozen=True)
class OrderBy:
    """The payload key to order by, the direction, and the first value (None: from the first entry)."""

    key: str
    descending: bool = False
    start_from: int | float | None = None


def order_value(v: Any) -> int | float | None:
    """The order value of one payload value: a number as it is, a datetime string as integer microseconds since the
    epoch (UTC), anything else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    dt = parse_datetime(v)
    if dt is None:
        return None
    d = dt - _EPOCH
    return d.days * _MICROS_PER_DAY + d.seconds * 1_000_000 + d.microseconds


def parse_order_by(raw: Any, param: str = "order_by") -> OrderBy:
    """An :class:`OrderBy` of ``"key"`` or ``{"key", "direction": "asc" | "desc", "start_from": number | datetime}``.

    Raises:
        InvalidCollectionRequest: anything else (an invalid key path, an unknown direction or field).
    """
    raw = {"key": raw} if isinstance(raw, str) else raw
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("key"), str)
        or set(raw) - {"key", "direction", "start_from"}
    ):
        raise InvalidCollectionRequest(f"{param} is a key or {{key, direction, start_from}}", param)
    if parse_path(raw["key"]) is None:
        raise InvalidCollectionRequest(f"{param}.key {raw['key']!r} is not a valid key path", f"{param}.key")
    direction = raw.get("direction") or "asc"
    if direction not in ("asc", "desc"):
        raise InvalidCollectionRequest(f"{param}.direction must be 'asc' or 'desc'", f"{param}.direction")
    start = raw.get("start_from")
    start_value = None if start is None else order_value(start)
    if start is not None and start_value is None:
        raise InvalidCollectionRequest(f"{param}.start_from must be a number or a datetime", f"{param}.start_from")
    return OrderBy(raw["key"], direction == "desc", start_value)


async def _pages(reads: PointReads, name: str, raw_filter: Any, payload: bool):
    """Every point matching ``raw_filter``, page by page (without text or vectors; with the payload if asked)."""
    start, page = None, reads.settings.max_top_k
    while True:
        points, start = await reads.scroll(name, start, page, raw_filter, False, None, False, payload)
        yield points
        if start is None:
            return


def _scan(
    c: CollectionHandle, where: Filter | None, order_by: OrderBy, limit: int, page: int, cap: int
) -> list[tuple[int | str, Any]]:
    """The first ``limit`` entries of the points of the collection handle ``c`` matching the parsed filter ``where``,
    read page by page with their payloads (blocking: call it off the event loop; it stops at a stop request).

    Raises:
        InvalidCollectionRequest: more than ``cap`` matching points.
    """
    sign = -1 if order_by.descending else 1
    start_value = order_by.start_from
    entries: list[tuple[int | float, int, int | str]] = []  # (signed value, scan position, id): a stable order
    n, read, start = 0, 0, None
    while True:
        check()
        rows = c.scroll(start, page + 1, where, False, None, False, True)
        start = rows[page]["id"] if len(rows) > page else None
        read += min(len(rows), page)
        if read > cap:
            raise _too_many(order_by.key, cap)
        for i, p in enumerate(rows[:page]):
            every(i)
            seen: set[int | float] = set()
            for v in values_at(p.get("payload") or {}, order_by.key):
                ov = order_value(v)
                if ov is None or ov in seen or (start_value is not None and sign * ov < sign * start_value):
                    continue
                seen.add(ov)
                entries.append((sign * ov, n, p["id"]))
                n += 1
        if len(entries) > 4 * limit:  # keep the memory to the entries that can still be returned
            entries = heapq.nsmallest(limit, entries)
        if start is None:
            return [(pid, sign * v) for v, _, pid in heapq.nsmallest(limit, entries)]


def _too_many(key: str, cap: int) -> InvalidCollectionRequest:
    return InvalidCollectionRequest(
        f"order_by {key!r} reads every matching point's payload, and more than {cap} points match "
        "(collections_max_order_scan): narrow the filter, or order by a top-level key",
        "order_by",
    )


async def ordered_ids(
    reads: PointReads, name: str, order_by: OrderBy, limit: int, raw_filter: Any = None
) -> list[tuple[int | str, int | float]]:
    """The first ``limit`` entries ``(point id, order value)`` of the points matching ``raw_filter`` (native filter
    grammar) in ``order_by``'s order (module docstring). A backend's own order serves it when it can; otherwise the
    matching points are counted first (more than ``collections_max_order_scan``: refused before any is read) and
    read by one scan off the event loop, stopped with its request.

    Raises:
        CollectionNotFound; InvalidCollectionRequest: a bad filter, too many points to scan.
    """
    c = await reads.collection(name)
    where = reads.parse_filter(raw_filter, "filter", c.vectors)
    if (fast := getattr(c, "order_values", None)) is not None:  # a backend's own (embedded: SQL for top-level keys)
        rows = await reads.backend.run(fast, where, order_by.key, order_by.descending, order_by.start_from, limit)
        if rows is not None:
            return rows
    cap = reads.settings.max_order_scan
    if await reads.backend.run(c.count_matching, where) > cap:
        raise _too_many(order_by.key, cap)
    page = reads.settings.max_top_k
    return await reads.backend.run(for_collection(c.name, _scan, c, where, order_by, limit, page, cap))


async def sample_ids(reads: PointReads, name: str, limit: int, raw_filter: Any = None, seed: int | None = None) -> list:
    """Up to ``limit`` ids drawn uniformly without replacement from the points matching ``raw_filter`` (reservoir
    sampling, Vitter's algorithm R), in random order; ``seed`` makes it repeatable.

    Raises:
        CollectionNotFound; InvalidCollectionRequest: a bad filter.
    """
    rng = random.Random(seed)
    reservoir: list[int | str] = []
    seen = 0
    async for points in _pages(reads, name, raw_filter, False):
        for p in points:
            if len(reservoir) < limit:
                reservoir.append(p["id"])
            elif (j := rng.randrange(seen + 1)) < limit:
                reservoir[j] = p["id"]
            seen += 1
    rng.shuffle(reservoir)
    return reservoir
