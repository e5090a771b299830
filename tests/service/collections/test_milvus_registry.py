"""The milvus backend's shared registry under faults, on the session's real Milvus server, with two backends on one
prefix as two replicas would be (in one process: no HTTP, no model):

* a registry read that comes back short (a row missing while Milvus still holds the collection's alias and points)
  never makes a collection read as absent: both replicas keep serving it from their last view, a look-up that
  needs the row answers 503 ``backend_unavailable``, never 404 (row 3 of the reliability issue);
* concurrent creates and deletes of one name through two replicas leave no orphan physical collection (one that no
  registry row points at), and the sweep removes those a crash leaves, never one whose create is still in flight
  (row 8).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import numpy as np
import pytest

from service.collections import open_backend
from service.collections.errors import BackendUnavailable, CollectionError, CollectionNotFound
from service.collections.vector_backend import single_config
from service.settings import Settings

M1 = {"name": "m", "version": "1", "sha256": "1" * 64}
DIM = 8


def _config(name: str):
    return single_config(name, "flat", None, "cosine", M1, DIM)


@pytest.fixture()
def replicas(milvus_uri):
    s = Settings(
        collections_backend="milvus", collections_milvus_uri=milvus_uri,
        collections_milvus_prefix=f"r{uuid.uuid4().hex[:10]}_", collections_milvus_refresh_s=0.2,
        collections_milvus_claim_ttl_s=3.0, collections_milvus_claim_settle_s=0.2,
        collections_milvus_write_timeout_s=5.0,
    )  # fmt: skip
    loop = asyncio.new_event_loop()
    a, b = open_backend(s), open_backend(s)
    loop.run_until_complete(a.start())
    loop.run_until_complete(b.start())
    yield loop, a, b
    for x in (a, b):
        loop.run_until_complete(x.close())
    loop.close()


def _referenced(backend) -> set[str]:
    """Every Milvus collection the registry points at (points, re-embedding targets, retired ones, itself)."""
    recs, _ = backend.registry.records()
    used = {backend.registry.name} | set(backend.registry.retired())
    for r in recs.values():
        used.add(r["physical"])
        if r.get("reembed"):
            used.add(r["reembed"]["physical"])
    return used


def _orphans(backend) -> set[str]:
    mine = {n for n in backend.client.list_collections() if n.startswith(backend.prefix)}
    return mine - _referenced(backend)


def test_a_short_registry_read_never_reads_as_absent(replicas):
    loop, a, b = replicas
    ca = loop.run_until_complete(a.create("kept", _config("kept")))
    ca.upsert([1, 2, 3], ["x", "y", "z"], [{}, {}, {}], np.ones((3, DIM), np.float32), model=M1)
    loop.run_until_complete(b.run(b.refresh))
    assert b.get("kept").count == 3
    row = a.registry.record("kept")

    a.registry.remove(["c:kept"])  # the registry read comes back without the row; Milvus still holds the collection
    for x in (a, b):
        loop.run_until_complete(x.run(x.refresh))
        assert "kept" in {c.name for c in x.list()}  # the last known map is kept
        h = x.handles["kept"]
        assert not h.closed
        time.sleep(0.3)  # the view is older than refresh_s: reads and writes look the row up, and answer 503
        with pytest.raises(BackendUnavailable):
            h.search(np.ones((1, DIM), np.float32), 3)
        with pytest.raises(BackendUnavailable):  # a look-up that needs the row: 503, retry; never 404
            x.refresh_one("kept")
        with pytest.raises(BackendUnavailable):
            loop.run_until_complete(x.run(h.upsert, [4], ["w"], [{}], np.ones((1, DIM), np.float32), model=M1))
    # a replica that never saw the collection: 503 too, not 404
    b.handles.pop("kept")
    with pytest.raises(BackendUnavailable):
        b.get("kept")
    # and nobody can create the name over it
    with pytest.raises(CollectionError) as e:
        loop.run_until_complete(b.create("kept", _config("kept")))
    assert not isinstance(e.value, CollectionNotFound)
    assert row["physical"] in a.client.list_collections()

    a.registry.put("c:kept", row)  # the row reads again: everything serves as before
    for x in (a, b):
        loop.run_until_complete(x.run(x.refresh))
        assert x.get("kept").count == 3
    # a real delete still reads as absent at once, on the other replica too
    loop.run_until_complete(a.delete("kept"))
    loop.run_until_complete(b.run(b.refresh))
    for x in (a, b):
        with pytest.raises(CollectionNotFound):
            x.get("kept")
    assert not _orphans(a)


async def _race(first, second, delay: float) -> None:
    """``first()`` now and ``second()`` ``delay`` s later (both coroutines), errors of the API kind swallowed."""

    async def later(fn, d):
        await asyncio.sleep(d)
        try:
            await fn()
        except CollectionError:
            pass

    await asyncio.gather(later(first, 0.0), later(second, delay))


def test_a_delete_between_a_create_s_record_and_alias_waits_its_turn(replicas):
    """The interleaving that used to break a create: another replica's delete lands after the record is written
    and before the alias is made (it dropped the new physical collection; the create then failed on the alias)."""
    loop, a, b = replicas
    point_alias, seen = a.physical.point_alias, []

    def delete_first(name, physical):
        try:
            b._delete(name)
            seen.append("deleted")
        except CollectionNotFound:
            seen.append("404")
        point_alias(name, physical)

    a.physical.point_alias = delete_first
    c = loop.run_until_complete(a.create("race", _config("race")))
    a.physical.point_alias = point_alias
    assert seen == ["404"]  # the delete is ordered before the create: the name did not exist yet
    assert a.client.describe_alias(a.physical.alias("race"))["collection_name"] == c.record["physical"]
    loop.run_until_complete(b.run(b.refresh))
    assert b.get("race").count == 0 and c.record["physical"] in a.client.list_collections()
    assert not _orphans(a)


def test_a_create_that_fails_after_making_its_collection_leaves_no_orphan(replicas):
    from pymilvus import MilvusException

    loop, a, b = replicas
    put_record = a.registry.put_record

    def timed_out(name, rec):
        raise MilvusException(message="simulated: the record write timed out")

    a.registry.put_record = timed_out
    with pytest.raises((MilvusException, BackendUnavailable)):  # the timeout, as Milvus's code 1 says it: 503
        loop.run_until_complete(a.create("broken", _config("broken")))
    a.registry.put_record = put_record
    assert not _orphans(a)
    with pytest.raises(CollectionNotFound):
        b.get("broken")
    loop.run_until_complete(b.create("broken", _config("broken")))  # the name is free
    assert not _orphans(a)


def test_concurrent_creates_and_deletes_leave_no_orphan(replicas):
    loop, a, b = replicas
    rng = random.Random(8)
    for i in range(2):
        x, y = (a, b) if i % 2 == 0 else (b, a)
        if i == 1:  # the name exists: a delete races a create of the same name
            loop.run_until_complete(x.create("race", _config("race")))
        loop.run_until_complete(
            _race(lambda x=x: x.create("race", _config("race")), lambda y=y: y.delete("race"), rng.uniform(0, 0.8))
        )
        assert not _orphans(a), f"round {i}: orphans {_orphans(a)}"
        for z in (a, b):
            loop.run_until_complete(z.run(z.refresh))
        assert {c.name for c in a.list()} == {c.name for c in b.list()}
        if "race" in a.handles:
            loop.run_until_complete(a.delete("race"))


def test_the_sweep_drops_what_a_crash_left_and_nothing_in_flight(replicas):
    loop, a, b = replicas
    from service.collections.milvus.schema import create_physical

    spec = _config("c").dense[""].spec
    crashed, in_flight = a.physical.physical_name("crashed"), a.physical.physical_name("flying")
    # a create that crashed after making its physical collection (its claim lapsed), and one still running
    a.registry.intend(crashed, "+crashed", at=time.time() - 60)
    create_physical(a.client, crashed, spec, "Strong")
    assert a.registry.claim("+flying", "create:x", 30.0) is not None
    a.registry.intend(in_flight, "+flying", at=time.time() - 60)
    create_physical(a.client, in_flight, spec, "Strong")
    live = loop.run_until_complete(a.create("live", _config("live")))
    stranger = f"{a.prefix}zz__g{time.time_ns() - 10**12:x}"  # never announced by the registry: never touched
    create_physical(a.client, stranger, spec, "Strong")

    b.physical.sweep()  # (or the refresh loops did already)
    names = set(a.client.list_collections())
    assert crashed not in names
    assert in_flight in names and live.record["physical"] in names and stranger in names
    a.registry.release("+flying")
    assert a.physical.sweep() == [in_flight]
    assert a.get("live").count == 0 and _orphans(a) == {stranger}
    a.client.drop_collection(stranger)
