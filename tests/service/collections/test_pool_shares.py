"""Both backends' worker pools, without a server: one collection's work holds at most all but one thread (a trivial
piece of another collection's work runs while one collection's blocks every other thread), and work whose caller is
cancelled (a request's time budget, its client gone) is told to stop (:func:`service.collections.stopping.check`
raises in it). The milvus backend is exercised without a Milvus server: only its pool is used."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from service.collections.embedded.backend import EmbeddedBackend
from service.collections.milvus.backend import MilvusBackend
from service.collections.stopping import WorkStopped, check, for_collection
from service.collections.vector_backend import CollectionSettings
from service.settings import Settings

pytestmark = pytest.mark.timeout(60)
THREADS = 4


def _backend(kind: str, tmp_path):
    settings = CollectionSettings(Settings(collections_worker_threads=THREADS))
    return MilvusBackend(settings) if kind == "milvus" else EmbeddedBackend(tmp_path / "collections", settings)


@pytest.mark.parametrize("kind", ["embedded", "milvus"])
def test_one_collection_cannot_take_every_thread_and_cancelled_work_stops(kind, tmp_path):
    backend = _backend(kind, tmp_path)
    release = threading.Event()
    stopped: list[float] = []

    def heavy() -> None:
        release.wait(10)

    def spinning() -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            try:
                check()
            except WorkStopped:
                stopped.append(time.monotonic())
                raise
            time.sleep(0.01)

    async def main() -> None:
        blocked = [asyncio.ensure_future(backend.run(for_collection("heavy", heavy))) for _ in range(THREADS)]
        await asyncio.sleep(0.3)  # each thread the heavy collection may hold is held
        t0 = time.monotonic()
        assert await asyncio.wait_for(backend.run(for_collection("light", lambda: 7)), 5) == 7
        light_s = time.monotonic() - t0
        release.set()
        await asyncio.gather(*blocked)
        assert light_s < 1.0, light_s  # before the shares: it waited for a heavy piece to end (5 s timeout)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(backend.run(for_collection("heavy", spinning)), 0.3)
        cancelled = time.monotonic()
        for _ in range(100):
            if stopped:
                break
            await asyncio.sleep(0.02)
        assert stopped and stopped[0] - cancelled < 1.0, stopped  # told to stop, not left spinning for 10 s

    try:
        asyncio.run(main())
    finally:
        release.set()
        backend._pool.shutdown(wait=False)  # both pools have one
