"""Reads of an embedded collection's point rows by internal id or by filter (:class:`PointRows`, a part of
:class:`~.points.Store`): the ids a filter admits, the rows and vectors of hits, scroll pages, counts, one point by
id."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import numpy as np

from service.collections.arrays import sorted_unique
from service.collections.embedded.store import payload_index
from service.collections.embedded.store.named import chunks, marks
from service.collections.embedded.store.order import ORDER_KEY, order_key
from service.collections.embedded.store.where import to_sql
from service.collections.filters import Filter
from service.collections.payload_indexes import PayloadIndex
from service.collections.reads import HIT_OVERHEAD_BYTES


class PointRows:
    """The point-row reads of :class:`~.points.Store` (which provides :meth:`reader`, :meth:`count` and
    :attr:`payload_indexes`)."""

    payload_indexes: dict[str, PayloadIndex]
    reader: Callable[[], sqlite3.Connection]
    count: Callable[..., int]

    def matching_iids(self, where: Filter) -> np.ndarray:
        """Internal ids of points satisfying the filter ``where``, int64: read from the payload
        indexes alone where they cover the whole filter (:func:`.payload_index.exact_set`); sorted, each once.

        The ids come back as one ``group_concat`` string parsed by NumPy: SQLite makes no Python row per id (10,000
        ids of a 1 % payload-index match in ~2 ms instead of ~9 ms with ``fetchall``, docs/performance.md)."""
        if (found := payload_index.exact_set(where, self.payload_indexes)) is not None:
            q, params = found  # may repeat an id (an or, an array's elements): np.unique below
        else:
            sql, params = to_sql(where, indexes=self.payload_indexes)
            q = f"SELECT iid FROM points WHERE {sql}"
        (text,) = self.reader().execute(f"SELECT group_concat(iid) FROM ({q})", params).fetchone()
        return sorted_unique(np.fromstring(text, dtype=np.int64, sep=",")) if text else np.empty(0, np.int64)

    def vectors_for(self, iids: np.ndarray, dimension: int) -> tuple[np.ndarray, np.ndarray]:
        """``(iids, vectors)`` of the live rows among ``iids`` (order not kept)."""
        conn = self.reader()
        out_ids: list[int] = []
        blobs: list[bytes] = []
        for part in chunks([int(i) for i in iids]):
            for iid, vec in conn.execute(f"SELECT iid, vector FROM points WHERE iid IN ({marks(part)})", part):
                out_ids.append(iid)
                blobs.append(vec)
        return np.asarray(out_ids, dtype=np.int64), np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(
            len(out_ids), dimension
        )

    def rows_for(
        self,
        iids: list[int],
        with_text: bool = True,
        with_payload: bool = True,
        budget: Any = None,
        counts: dict[int, int] | None = None,
    ) -> dict[int, tuple[str, str | None, str | None]]:
        """``{iid: (key, text, payload_json)}`` for the live rows among ``iids`` (text/payload None when not asked).

        Args:
            budget: a :class:`~...backend.ResponseBudget`: the rows' sizes are read (and spent) before the rows.
            counts: how many hits of the response each iid is (a multi-query search can return a point once per
                query); 1 when missing.

        Raises:
            ResponseTooLarge: from ``budget``, before any text or payload is read.
        """
        conn = self.reader()
        if budget is not None:
            size = (
                "length(CAST(key AS BLOB))"
                + (" + length(CAST(text AS BLOB))" if with_text else "")
                + (" + length(CAST(payload AS BLOB))" if with_payload else "")
            )
            for part in chunks(iids):
                q = f"SELECT iid, {size} FROM points WHERE iid IN ({marks(part)})"
                n = (counts or {}).get
                budget.spend(
                    sum((int(nbytes) + HIT_OVERHEAD_BYTES) * n(iid, 1) for iid, nbytes in conn.execute(q, part))
                )
        cols = "iid, key, " + ("text" if with_text else "NULL") + ", " + ("payload" if with_payload else "NULL")
        out: dict[int, tuple[str, str | None, str | None]] = {}
        for part in chunks(iids):
            for iid, key, text, payload in conn.execute(
                f"SELECT {cols} FROM points WHERE iid IN ({marks(part)})", part
            ):
                out[iid] = (key, text, payload)
        return out

    def scroll(
        self,
        start_key: str | None,
        limit: int,
        where: Filter | None,
        with_vector: bool,
        text: bool = True,
        payload: bool = True,
    ) -> list[tuple[str, int, str | None, str | None, bytes | None]]:
        """``(key, iid, text, payload_json, vector_bytes)`` of up to ``limit`` rows matching ``where``, in id order
        (:data:`ORDER_KEY`, Qdrant's: integers numerically, then strings), from ``start_key`` (inclusive; None: the
        first); the text, payload and vector None where ``text``, ``payload``, ``with_vector`` are False."""
        sql, params = to_sql(where, indexes=self.payload_indexes) if where is not None else ("1", [])
        if start_key is not None:
            sql, params = f"{ORDER_KEY} >= ? AND ({sql})", [order_key(start_key), *params]
        cols = ", ".join(c if w else "NULL" for c, w in (("text", text), ("payload", payload), ("vector", with_vector)))
        q = f"SELECT key, iid, {cols} FROM points WHERE {sql} ORDER BY {ORDER_KEY} LIMIT ?"
        return self.reader().execute(q, [*params, int(limit)]).fetchall()

    def count_where(self, where: Filter | None) -> int:
        """Live points matching ``where`` (None: all)."""
        if where is None:
            return self.count()
        if (found := payload_index.exact_set(where, self.payload_indexes)) is not None:
            q = f"SELECT COUNT(*) FROM (SELECT DISTINCT iid FROM ({found[0]}))"
            return self.reader().execute(q, found[1]).fetchone()[0]
        sql, params = to_sql(where, indexes=self.payload_indexes)
        return self.reader().execute(f"SELECT COUNT(*) FROM points WHERE {sql}", params).fetchone()[0]

    def get(self, key: str) -> tuple[int, str, str, bytes] | None:
        """``(iid, text, payload_json, vector_bytes)`` of the point with encoded ``key``, or None."""
        return self.reader().execute("SELECT iid, text, payload, vector FROM points WHERE key=?", (key,)).fetchone()
