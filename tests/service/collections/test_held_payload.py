"""Numeric payload indexes held in memory for searches (``embedded.held_payload``): for random filters over random
payloads (those of the payload-index tests), through writes that replace, add and delete points, the held answer is
SQLite's answer from the index plus only dead points' ids; a filter it cannot answer exactly is left to SQLite; a
search reads the held copy instead of SQLite once it is read."""

from __future__ import annotations

import random

import numpy as np
import pytest

from service.collections.embedded import held_payload
from service.collections.embedded.held_payload import HeldPayloadIndexes, Sorted, inserted
from service.collections.embedded.store import Store
from service.collections.filters import parse_filter
from service.collections.payload_indexes import payload_index
from tests.service.collections.test_payload_indexes import INDEXES, D, make, payload, raw_filter


def live_iids(c) -> np.ndarray:
    rows = c.store.reader().execute("SELECT iid FROM points").fetchall()
    return np.sort(np.asarray([r[0] for r in rows], dtype=np.int64))


def held_matches_sqlite(c, r: random.Random, n: int) -> int:
    """Check ``n`` random filters; returns how many the held copies answered."""
    live, answered = live_iids(c), 0
    assert c.held_payload.prepare(wait=30) == []
    for _ in range(n):
        where = parse_filter(raw_filter(r))
        got = c.held_payload.allowed(where)
        if got is None:
            continue
        answered += 1
        want = c.store.matching_iids(where)
        assert np.all(np.diff(got) > 0)
        assert np.array_equal(np.intersect1d(got, live), want), where  # the live matches, exactly
        assert not np.isin(np.setdiff1d(got, want), live).any(), where  # the rest: dead points only
    return answered


@pytest.mark.parametrize("merge_fraction", [held_payload.MERGE_FRACTION, 0.0])
def test_held_answers_are_sqlites_plus_dead_points_through_writes(tmp_path, monkeypatch, merge_fraction):
    """``merge_fraction`` 0: later entries merged into the copy at every catch-up (else kept beside it)."""
    monkeypatch.setattr(held_payload, "MERGE_FRACTION", merge_fraction)
    c = make(tmp_path / "c")
    r, rng = random.Random(11), np.random.default_rng(11)
    c.upsert(list(range(600)), ["t"] * 600, [payload(r) for _ in range(600)], rng.standard_normal((600, D)))
    for key, schema in INDEXES.items():
        c.create_payload_index(payload_index(key, schema))
    answered = held_matches_sqlite(c, r, 150)
    for _ in range(3):
        ids = r.sample(range(800), 120)  # replaces some, adds others
        c.upsert(ids, ["t"] * len(ids), [payload(r) for _ in ids], rng.standard_normal((len(ids), D)))
        c.delete(r.sample(range(800), 40))
        answered += held_matches_sqlite(c, r, 60)
    assert answered > 60  # the numeric keys' filters (num, price, flag, ts, items[].n) under and/or
    c.close()


def test_numbers_float64_cannot_hold_are_left_to_sqlite(tmp_path):
    c = make(tmp_path / "c")
    big = 2**60 + 1
    c.upsert([1, 2], ["t", "t"], [{"n": big, "m": 5}, {"n": 3, "m": 7}], np.eye(2, D))
    c.create_payload_index(payload_index("n", "integer"))
    c.held_payload.prepare(wait=30)
    assert c.held_payload.allowed(parse_filter({"n": 3})) is None  # the copy of n was not made
    assert [h.id for h in c.search(np.eye(1, D), 5, parse_filter({"n": big}))[0]] == [1]
    c.create_payload_index(payload_index("m", "integer"))
    c.held_payload.prepare(wait=30)
    assert (
        c.held_payload.allowed(parse_filter({"m": 5})).tolist()
        == c.store.matching_iids(parse_filter({"m": 5})).tolist()
    )
    assert c.held_payload.allowed(parse_filter({"m": 2**60 + 1})) is None  # the value asked for: not exact
    assert c.held_payload.allowed(parse_filter({"m": {"$gt": 2**61}})) is None
    c.upsert([3], ["t"], [{"m": 2**62}], np.eye(1, D))  # a later value float64 cannot hold
    assert c.held_payload.allowed(parse_filter({"m": 5})) is None
    c.close()


def test_a_search_reads_the_held_copy_not_sqlite(tmp_path, monkeypatch):
    c = make(tmp_path / "c")
    n = 500
    c.upsert(list(range(n)), ["t"] * n, [{"g": i % 10} for i in range(n)], np.random.default_rng(0).random((n, D)))
    c.create_payload_index(payload_index("g", "integer"))
    assert c.held_payload.prepare(wait=30) == []
    where = parse_filter({"g": {"$gte": 8}})
    monkeypatch.setattr(Store, "matching_iids", lambda self, w: pytest.fail("read from SQLite"))
    hits = c.search(np.ones((1, D), np.float32), 20, where)[0]
    assert len(hits) == 20 and all(int(h.id) % 10 >= 8 for h in hits)
    c.upsert([n], ["t"], [{"g": 9}], np.ones((1, D)))  # a later point: read by internal id, not by a new copy
    assert n in [h.id for h in c.search(np.ones((1, D), np.float32), 200, where)[0]]
    c.close()


def test_inserted_keeps_value_order():
    rng = np.random.default_rng(0)
    base = Sorted.of(rng.integers(0, 50, 1000).astype(np.float64), np.arange(1000, dtype=np.int64))
    add = rng.integers(-5, 60, 300).astype(np.float64)
    got = inserted(base, add, np.arange(1000, 1300, dtype=np.int64))
    assert np.all(np.diff(got.values) >= 0) and sorted(got.iids.tolist()) == list(range(1300))
    for v in (-5.0, 7.0, 59.0):
        want = set(np.flatnonzero(np.concatenate([base.values[np.argsort(base.iids)], add]) == v).tolist())
        assert set(got.equal(v).tolist()) == want


def test_a_held_copy_is_dropped_with_its_index(tmp_path):
    c = make(tmp_path / "c")
    c.upsert([1, 2], ["t", "t"], [{"g": 1}, {"g": 2}], np.eye(2, D))
    c.create_payload_index(payload_index("g", "integer"))
    c.held_payload.prepare(wait=30)
    assert c.held_payload.allowed(parse_filter({"g": 1})) is not None
    c.delete_payload_index("g")
    assert c.held_payload.allowed(parse_filter({"g": 1})) is None
    c.create_payload_index(payload_index("g", "float"))  # another index of the key: another copy
    c.held_payload.prepare(wait=30)
    assert len(c.held_payload.allowed(parse_filter({"g": 1}))) == 1
    assert isinstance(HeldPayloadIndexes(c.store).allowed(parse_filter({"g": 1})), type(None))  # a new one: not read
    c.close()


def test_an_open_reads_the_copies(tmp_path):
    c = make(tmp_path / "c")
    c.upsert([1, 2], ["t", "t"], [{"g": 1}, {"g": 2}], np.eye(2, D))
    c.create_payload_index(payload_index("g", "integer"))
    c.close()
    c = type(c).open(tmp_path / "c")
    assert c.held_payload.prepare(wait=30) == []  # started by the open: nothing left to read
    assert (
        c.held_payload.allowed(parse_filter({"g": 2})).tolist()
        == c.store.matching_iids(parse_filter({"g": 2})).tolist()
    )
    c.close()


def test_a_close_while_a_copy_is_read_is_safe(tmp_path):
    """The copy is read on a connection of its own: closing the collection under it (which closes the store's
    connections) neither crashes the process nor leaves a copy behind in use."""
    n = 20_000
    for i in range(3):
        c = make(tmp_path / f"c{i}")
        c.upsert(list(range(n)), [""] * n, [{"g": j % 100} for j in range(n)], np.ones((n, D), np.float32))
        c.create_payload_index(payload_index("g", "integer"))  # its copy now read in the background
        c.close()
        c.held_payload.prepare(wait=30)  # whatever the read found, it ended without the store
