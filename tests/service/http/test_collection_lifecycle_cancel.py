"""A collection's create or delete completes or rolls back whatever its caller does: cancelled at each await point of
the embedded backend's create and delete (in-process), or abandoned by HTTP clients with tiny timeouts (the
middleware cancels a request's work when its client leaves; qdrant-client's ``test_timeout_propagation`` did this
with a 10 ms timeout on ``delete_collection``). Afterwards the collection is either fully there (listed, readable,
its directory present) or fully gone (unlisted, 404, no directory), and create, read and delete work again."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from service.collections.embedded.backend import EmbeddedBackend
from service.collections.errors import CollectionExists, CollectionNotFound
from service.collections.vector_backend import single_config
from tests.server_utils import run_server

pytestmark = pytest.mark.timeout(300)

D = 8
MODEL = {"name": "test", "version": "1", "sha256": "0" * 64}
CONFIG = single_config("docs", "flat", None, "cosine", MODEL, D)


async def _settled(b: EmbeddedBackend) -> None:
    """Wait until no create or delete is under way (the lock is free, no hidden directory is left)."""
    for _ in range(200):
        async with b._lock:
            pass
        if not [p for p in b.root.iterdir() if p.name.startswith(".")]:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(sorted(p.name for p in b.root.iterdir()))


async def _whole(b: EmbeddedBackend, name: str) -> bool:
    """The collection ``name`` is fully there (True) or fully gone (False); anything in between fails."""
    await _settled(b)
    listed = name in {c.name for c in b.list()}
    assert listed == (b.root / name).is_dir(), (listed, sorted(p.name for p in b.root.iterdir()))
    if listed:
        assert b.get(name).count == 0  # open and readable
    else:
        with pytest.raises(CollectionNotFound):
            b.get(name)
    return listed


async def _cancelled_at(b: EmbeddedBackend, k: int, op) -> bool:
    """Run ``op()`` as a task and cancel it when the backend's ``run`` is called for the ``k``-th time (0: before
    it starts); True when it was cancelled before it ended."""
    calls, real, task = 0, b.run, None

    async def run(fn, *args, **kw):
        nonlocal calls
        calls += 1
        if calls == k and not task.done():
            task.cancel()
        return await real(fn, *args, **kw)

    b.run = run
    try:
        task = asyncio.ensure_future(op())
        if k == 0:
            task.cancel()
        try:
            await task
            return False
        except asyncio.CancelledError:
            return True
    finally:
        del b.run


def test_create_and_delete_cancelled_at_each_await_point(tmp_path: Path):
    async def main() -> None:
        b = EmbeddedBackend(tmp_path / "collections")
        await b.start()
        try:
            for what in ("create", "delete"):
                k = 0
                while True:
                    if what == "delete" and not await _whole(b, "docs"):
                        await b.create("docs", CONFIG)
                    if what == "create" and await _whole(b, "docs"):
                        await b.delete("docs")
                    op = (lambda: b.create("docs", CONFIG)) if what == "create" else (lambda: b.delete("docs"))
                    hit = await _cancelled_at(b, k, op)
                    there = await _whole(b, "docs")
                    if k > 0:  # begun: a create that was begun completes, as does a delete
                        assert there == (what == "create"), (what, k)
                    if there:  # and everything works after
                        with pytest.raises(CollectionExists):
                            await b.create("docs", CONFIG)
                        await b.delete("docs")
                    await b.create("docs", CONFIG)
                    assert b.get("docs").count == 0
                    await b.delete("docs")
                    assert not await _whole(b, "docs")
                    if not hit and k > 0:
                        break  # past the last await point
                    k += 1
                assert k >= 2, (what, k)  # it really was cancelled inside, at more than one point
            # cancelled while waiting for the backend's lock
            async with b._lock:
                task = asyncio.ensure_future(b.create("docs", CONFIG))
                await asyncio.sleep(0.01)
                task.cancel()
            assert await _whole(b, "docs")
            await b.delete("docs")
        finally:
            await b.close()

    asyncio.run(main())


@pytest.fixture(scope="module")
def server(default_artifact: Path, tmp_path_factory):
    work = tmp_path_factory.mktemp("lifecycle-cancel")
    args = ["--default-model", default_artifact.name, "--intra-op-threads", "1", "--log-level", "warning"]
    with run_server(default_artifact.parent, workdir=work, args=args) as srv:
        yield srv, work
        assert srv.alive(), srv.log()[-3000:]


def _state(c: httpx.Client, work: Path, name: str) -> bool:
    """Poll until the collection is fully there or fully gone (on the wire and on disk); True when there."""
    root = work / "data" / "collections"
    deadline = time.monotonic() + 10
    while True:
        listed = name in [x["name"] for x in c.get("/collections").json()["collections"]]
        got = c.get(f"/collections/{name}").status_code
        on_disk = (root / name).is_dir()
        hidden = [p.name for p in root.iterdir() if p.name.startswith(".")]
        if listed == on_disk == (got == 200) and not hidden:
            return listed
        assert time.monotonic() < deadline, (listed, got, on_disk, hidden)
        time.sleep(0.05)


def test_http_create_and_delete_abandoned_by_the_client(server):
    srv, work = server
    body = {"index": "flat", "metric": "cosine"}
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        for t in (0.001, 0.003, 0.01, 0.02, 0.05, 0.1):
            with httpx.Client(base_url=srv.url, timeout=t) as quick:
                try:
                    quick.put("/collections/gone", json=body)
                except httpx.TimeoutException:
                    pass
            if _state(c, work, "gone"):
                with httpx.Client(base_url=srv.url, timeout=t) as quick:
                    try:
                        quick.delete("/collections/gone")
                    except httpx.TimeoutException:
                        pass
                if _state(c, work, "gone"):
                    assert c.put("/collections/gone", json=body).status_code == 409
                    assert c.delete("/collections/gone").status_code == 200
            assert not _state(c, work, "gone")
            assert c.put("/collections/gone", json=body).status_code == 200, t
            assert c.get("/collections/gone").json()["count"] == 0
            assert c.delete("/collections/gone").status_code == 200
            assert c.get("/collections/gone").status_code == 404
