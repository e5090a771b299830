"""Payload order on the embedded backend in SQL (:mod:`service.collections.ordering`'s fast path): a top-level key's
values are read with SQLite's ``json_each`` (an array's elements, one level, as the reference flattens them), numbers
ordered and cut by SQLite, datetime strings (text values) parsed in Python with the reference code; the same entries
and order as :func:`service.collections.ordering.ordered_ids`' scan, ties in Qdrant's point order."""

from __future__ import annotations

from typing import Any

from service.collections.embedded.store.order import ORDER_KEY
from service.collections.embedded.store.where import to_sql
from service.collections.filters import Filter
from service.collections.ids import decode_id
from service.collections.ordering import order_value
from service.collections.stopping import every


def ordered_rows(conn: Any, where: Filter | None, key: str, descending: bool, start: Any, limit: int) -> list:
    """The first ``limit`` entries ``(point id, order value)`` of the points matching ``where`` by the top-level
    ``key``, read on the SQLite connection ``conn`` (its ``points`` table)."""
    sql_w, params = to_sql(where) if where is not None else ("1", [])
    path = '$."' + key + '"'
    base = (
        f"WITH m AS (SELECT key AS pkey, {ORDER_KEY} AS okey, payload FROM points WHERE {sql_w}) "
        "SELECT DISTINCT m.pkey, m.okey, j.value FROM m, json_each(m.payload, ?) j "
        "WHERE json_type(m.payload, ?) != 'object' AND j.type "
    )
    direction, cmp = ("DESC", "<=") if descending else ("ASC", ">=")
    bound = "" if start is None else f" AND j.value {cmp} ?"
    q = f"{base}IN ('integer', 'real'){bound} ORDER BY j.value {direction}, m.okey LIMIT ?"
    numbers = conn.execute(q, [*params, path, path, *([] if start is None else [start]), int(limit)]).fetchall()
    sign = -1 if descending else 1
    entries = [(sign * v, okey, pkey) for pkey, okey, v in numbers]
    for i, (pkey, okey, text) in enumerate(conn.execute(f"{base}= 'text'", [*params, path, path])):
        every(i)  # datetime strings parsed in Python: the loop stops with its request
        v = order_value(text)
        if v is not None and (start is None or sign * v >= sign * start):
            entries.append((sign * v, okey, pkey))
    entries.sort()
    return [(decode_id(pkey), sign * v) for v, _, pkey in entries[:limit]]
