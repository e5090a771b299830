"""Numeric payload indexes held in memory, for the allowed ids of a filtered search (Qdrant keeps its payload indexes in
RAM: Qdrant documentation, "Indexing", payload index). The entries of an ``integer``, ``float``, ``bool`` or
``datetime`` index (:mod:`.store.payload_index`: every number a key reaches, ``elem`` 1 for an array's element) are
copied from SQLite into sorted NumPy arrays, so that a match or a range over them is two binary searches and a slice
instead of a B-tree walk that hands every matching id through SQLite: at 10M points a 1 % match reads 100,000 ids
(~17 ms through SQLite) and a 10 % range 1M (~300 ms).

A held index is exact for the points it was read up to (internal ids are assigned in increasing order and never
reused: a point written later has a larger one): the entries of later points are read by internal id (the
``payload_index_iid`` index) when a search finds newer ones, kept beside the sorted copy and merged into it once
they grow past :data:`MERGE_FRACTION` of it. A deleted or replaced point's entries stay in the copy (its id is
gone from every vector index and from the store), so :meth:`HeldPayloadIndexes.allowed` is a superset of the live
matching points by exactly the dead ones: right for a search's allowed set, which only admits ids, never for a
count. The copy is read in a background thread the first time a search's filter needs it (seconds at 10M); the
search that asked, and any other until it is ready, is answered by SQLite. A filter with any condition these arrays
cannot answer exactly (a keyword, a ``not``, ids, an unindexed key, a number beyond 2^53 that float64 would round) is
answered by SQLite too.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.collections.arrays import sorted_unique
from service.collections.conditions import DateRange
from service.collections.embedded.store import Store
from service.collections.embedded.store.files import connect
from service.collections.embedded.store.payload_index import micros
from service.collections.filters import And, Match, Or, Range, value_kind
from service.collections.payload_indexes import PayloadIndex

log = logging.getLogger("service.collections")

#: the index types held (their entries are numbers)
HELD_TYPES = ("integer", "float", "bool", "datetime")
#: numbers float64 holds exactly (integers beyond are answered by SQLite)
EXACT = 2**53
#: later entries are merged into the sorted copy once they exceed this share of it
MERGE_FRACTION = 0.05
_FETCH = 1 << 16


@dataclass(frozen=True)
class Sorted:
    """Entries sorted by value: ``values`` float64 ``(n,)`` ascending, ``iids`` int64 ``(n,)`` beside them."""

    values: np.ndarray
    iids: np.ndarray

    @staticmethod
    def of(values: np.ndarray, iids: np.ndarray) -> Sorted:
        """The entries ``(values[i], iids[i])`` sorted by value (stable)."""
        order = np.argsort(values, kind="stable")
        return Sorted(values[order], iids[order])

    def equal(self, v: float) -> np.ndarray:
        """The iids of the entries equal to ``v`` (a view)."""
        return self.iids[np.searchsorted(self.values, v, "left") : np.searchsorted(self.values, v, "right")]

    def within(self, lo: float, lo_open: bool, hi: float, hi_open: bool) -> np.ndarray:
        """The iids of the entries in the interval from ``lo`` to ``hi`` (each end open or closed; a view)."""
        a = np.searchsorted(self.values, lo, "right" if lo_open else "left")
        b = np.searchsorted(self.values, hi, "left" if hi_open else "right")
        return self.iids[a : max(a, b)]


@dataclass(frozen=True)
class Held:
    """One payload index's entries for the points up to internal id ``upto``: ``every`` entry (a match tests them
    all) and the ``plain`` ones (``elem`` 0: not an array's element, which a range does not test), plus ``later``:
    the entries of points after ``upto`` read since, in the same two forms."""

    index: PayloadIndex
    upto: int
    every: Sorted
    plain: Sorted
    #: ``(every, plain)`` of the entries read after ``upto`` was first reached, not merged yet
    later: tuple[Sorted, Sorted] | None = None

    def parts(self, plain: bool) -> list[Sorted]:
        """The sorted copies to look up (``plain``: the entries a range tests)."""
        main = self.plain if plain else self.every
        return [main] if self.later is None else [main, self.later[1] if plain else self.later[0]]


def _exact(v: Any) -> float | None:
    """``v`` (an int or a float, not a bool) as a float64 that compares as SQLite compares it, or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if isinstance(v, float) or -EXACT <= v <= EXACT else None


def read_entries(conn: sqlite3.Connection, key: str, upto: int, after: int = -1) -> tuple[np.ndarray, ...] | None:
    """``(values float64, elem int8, iids int64)`` of the payload index of ``key`` for the points after internal id
    ``after`` up to ``upto``, or None when a value is not a number float64 holds exactly. (A write commits its
    points' entries together and ids grow with writes, so once ``upto`` is read no entry at or under it appears
    later, except by an index's creation, which replaces the index.)"""
    if after < 0:
        lo, hi = conn.execute("SELECT min(value), max(value) FROM payload_index WHERE field = ?", (key,)).fetchone()
        if lo is not None and (_exact(lo) is None or _exact(hi) is None):
            return None
        cur = conn.execute("SELECT value, elem, iid FROM payload_index WHERE field = ? AND iid <= ?", (key, upto))
    else:
        q = "SELECT value, elem, iid FROM payload_index INDEXED BY payload_index_iid WHERE iid > ? AND iid <= ? AND "
        cur = conn.execute(q + "field = ?", (after, upto, key))
    chunks = []
    while rows := cur.fetchmany(_FETCH):
        if after >= 0 and any(_exact(r[0]) is None for r in rows):
            return None
        chunks.append(np.asarray(rows, dtype=np.float64).reshape(-1, 3))
    a = np.concatenate(chunks) if chunks else np.zeros((0, 3))
    return a[:, 0].copy(), a[:, 1].astype(np.int8), a[:, 2].astype(np.int64)


def _forms(values: np.ndarray, elem: np.ndarray, iids: np.ndarray) -> tuple[Sorted, Sorted]:
    every = Sorted.of(values, iids)
    plain = every if not elem.any() else Sorted.of(values[elem == 0], iids[elem == 0])
    return every, plain


def _top_iid(conn: sqlite3.Connection) -> int:
    """The largest internal id any entry holds (-1: none)."""
    (top,) = conn.execute("SELECT max(iid) FROM payload_index INDEXED BY payload_index_iid").fetchone()
    return -1 if top is None else int(top)


class HeldPayloadIndexes:
    """The held copies of a store's numeric payload indexes (module docstring), read and refreshed on demand.

    Thread-safe: searches call :meth:`allowed` concurrently; copies are replaced whole, never changed in place.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._held: dict[str, Held] = {}
        self._reading: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def allowed(self, where: Any) -> np.ndarray | None:
        """The sorted internal ids (int64, each once) of the points satisfying ``where`` and of dead points that did,
        from held copies, or None when SQLite must answer (a condition the copies cannot answer, or a copy not read
        yet: its reading is then started)."""
        keys = _keys(where)
        if keys is None:
            return None
        indexes = self.store.payload_indexes
        if any(k not in indexes or indexes[k].data_type not in HELD_TYPES for k in keys):
            return None
        held = {k: h for k in keys if (h := self._held.get(k)) is not None and h.index == indexes[k]}
        if len(held) < len(keys):
            for k in keys - held.keys():
                self._start(k, indexes[k])
            return None
        held = self._caught_up(held)
        return None if held is None else _answer(where, held)

    def prepare(self, wait: float | None = None) -> list[str]:
        """Start reading the copy of every numeric index not held yet (after an index is created, so that the first
        filtered searches need not wait for it); with ``wait``, return once none is being read or after ``wait``
        seconds. Returns the keys being read then."""
        for key, index in self.store.payload_indexes.items():
            h = self._held.get(key)
            if index.data_type in HELD_TYPES and (h is None or h.index != index):
                self._start(key, index)
        threads = list(self._threads)
        for t in threads if wait is not None else []:
            t.join(wait)
        with self._lock:
            return sorted(self._reading)

    def _start(self, key: str, index: PayloadIndex) -> None:
        with self._lock:
            if key in self._reading:
                return
            self._reading.add(key)
            t = threading.Thread(target=self._read, args=(key, index), name=f"held-payload-{key}", daemon=True)
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _read(self, key: str, index: PayloadIndex) -> None:
        """Read the copy of ``key``'s index (a background thread)."""
        conn = None
        try:  # a connection of its own: a close of the collection meanwhile does not close it under the read
            conn = connect(self.store.db_path)
            conn.execute("PRAGMA query_only=ON")
            upto = _top_iid(conn)
            found = read_entries(conn, key, upto)
            if found is not None:
                with self._lock:
                    self._held[key] = Held(index, upto, *_forms(*found))
        except sqlite3.Error as e:  # the collection was deleted meanwhile
            log.info("payload index %s not held: %s", key, e)
        finally:
            if conn is not None:
                conn.close()
            with self._lock:
                self._reading.discard(key)

    def _caught_up(self, held: dict[str, Held]) -> dict[str, Held] | None:
        """``held`` with the entries of points written since each copy was read (None: a later value float64 cannot
        hold exactly)."""
        conn = self.store.reader()
        top = _top_iid(conn)
        out = {}
        for key, h in held.items():
            if top > h.upto:
                with self._lock:
                    h = self._held.get(key, h)
                    if h.index != held[key].index:  # replaced meanwhile by the copy of another index of the key
                        return None
                    if top > h.upto:
                        found = read_entries(conn, key, top, after=h.upto)
                        if found is None:
                            return None
                        h = _merged(h, top, *found)
                        self._held[key] = h
            out[key] = h
        return out


def _merged(h: Held, upto: int, values: np.ndarray, elem: np.ndarray, iids: np.ndarray) -> Held:
    """``h`` with the entries ``(values, elem, iids)`` of the points after ``h.upto`` up to ``upto``: kept beside the
    copy, or merged into it once they are more than :data:`MERGE_FRACTION` of it."""
    plain = elem == 0
    every_later = inserted(h.later[0] if h.later else None, values, iids)
    plain_later = inserted(h.later[1] if h.later else None, values[plain], iids[plain])
    if len(every_later.values) <= MERGE_FRACTION * len(h.every.values):
        return Held(h.index, upto, h.every, h.plain, (every_later, plain_later))
    every = inserted(h.every, every_later.values, every_later.iids)
    return Held(h.index, upto, every, inserted(h.plain, plain_later.values, plain_later.iids))


def inserted(into: Sorted | None, values: np.ndarray, iids: np.ndarray) -> Sorted:
    """``into`` (None: empty) with the entries ``(values, iids)`` inserted in value order: one binary search each and
    one copy (``np.insert``), not a sort of the whole."""
    add = Sorted.of(values, iids)
    if into is None or not len(into.values):
        return add
    at = np.searchsorted(into.values, add.values, "right")
    return Sorted(np.insert(into.values, at, add.values), np.insert(into.iids, at, add.iids))


def _keys(f: Any) -> set[str] | None:
    """The payload keys of a filter made of matches and ranges under and/or, or None for any other filter."""
    if isinstance(f, (And, Or)):
        keys: set[str] = set()
        for p in f.parts:
            if (k := _keys(p)) is None:
                return None
            keys |= k
        return keys
    return {f.key} if isinstance(f, (Match, Range, DateRange)) else None


def _answer(f: Any, held: dict[str, Held]) -> np.ndarray | None:
    """The sorted, unique ids ``f`` admits (and dead ones) from ``held``, or None when a condition cannot be answered
    exactly here (the same conditions :mod:`.store.payload_index` answers from an index, in float64)."""
    if isinstance(f, (And, Or)):
        parts = [_answer(p, held) for p in f.parts]
        if not parts or any(p is None for p in parts):
            return None
        if isinstance(f, Or):
            return sorted_unique(np.concatenate(parts))  # type: ignore[arg-type]
        out = parts[0]
        for p in parts[1:]:
            out = np.intersect1d(out, p, assume_unique=True)  # type: ignore[arg-type]
        return out
    h = held[f.key]
    t = h.index.data_type
    if isinstance(f, Match):
        kinds = {value_kind(v) for v in f.values}
        if not f.values or not (kinds == {"bool"} if t == "bool" else kinds <= {"int", "float"} and t != "datetime"):
            return None
        wanted = [float(v) for v in f.values] if t == "bool" else [_exact(v) for v in f.values]
        if any(v is None for v in wanted):
            return None
        found = [s.equal(v) for s in h.parts(plain=False) for v in wanted]  # type: ignore[arg-type]
    elif isinstance(f, Range) and t in ("integer", "float") or isinstance(f, DateRange) and t == "datetime":
        bounds = _bounds(f)
        if bounds is None:
            return None
        found = [s.within(*bounds) for s in h.parts(plain=isinstance(f, Range))]
    else:
        return None
    return sorted_unique(np.concatenate(found)) if found else np.empty(0, np.int64)


def _bounds(f: Range | DateRange) -> tuple[float, bool, float, bool] | None:
    """``(lo, lo open, hi, hi open)`` of a range (a datetime range's bounds in microseconds), or None when a bound is
    not a number float64 holds exactly."""
    conv = micros if isinstance(f, DateRange) else (lambda b: b)
    lo, lo_open, hi, hi_open = -np.inf, False, np.inf, False
    for b, open_ in ((f.gt, True), (f.gte, False)):
        if b is not None:
            if (v := _exact(conv(b))) is None:
                return None
            if v > lo or (v == lo and open_):
                lo, lo_open = v, open_
    for b, open_ in ((f.lt, True), (f.lte, False)):
        if b is not None:
            if (v := _exact(conv(b))) is None:
                return None
            if v < hi or (v == hi and open_):
                hi, hi_open = v, open_
    return lo, lo_open, hi, hi_open
